"""Op spans for the timeline renderers: each ENTER paired with the EXIT / ERROR / COMPLETE that closes it, decided
once for Perfetto and HTML (a span never closed is drawn to the end of the trace, marked open)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Span", "Mark", "SpanSet", "pair_spans", "span_table", "SPAN_COLUMNS", "as_of"]

_COLUMNS = ("rank", "pid", "tid", "kind", "name", "category", "group", "seq", "span_id", "callsite", "error",
            "capturing", "peer", "file", "detail", "source")


@dataclass(frozen=True)
class Span:
    """One call of one rank: `end` None when it never returned (drawn to the end of the trace, marked open)."""

    rank: int
    pid: int | None
    tid: int | None
    name: str
    category: str | None
    group: str | None
    seq: int | None
    callsite: str | None
    peer: int | None
    capturing: bool
    start: int
    end: int | None
    error: str | None
    source: str | None = None  # the reader's: events (our rings), fr, nsys, kineto, ...

    @property
    def open(self) -> bool:
        return self.end is None


@dataclass(frozen=True)
class Mark:
    rank: int
    tid: int | None
    name: str
    t: int


@dataclass(frozen=True)
class SpanSet:
    """Spans in the order they closed (open ones last), marks, and the trace's first / last time on `clock`."""

    spans: tuple[Span, ...]
    marks: tuple[Mark, ...]
    t0: int
    t_end: int
    clock: str
    ranks: tuple[int, ...] = ()  # every rank with a timed row, spans or not


def _key(r: dict[str, Any]) -> tuple:
    """Our events pair by span id within a process (ring file); readers' rows (nsys, Kineto) by what they are:
    the same rank, thread, op, group and seq, and the same kind of record (the first word of detail: an NVTX
    range closes an NVTX range, a kernel completion closes a kernel)."""
    if r["span_id"]:
        return ("span", r["file"], r["pid"], r["span_id"])
    return ("op", r["rank"], r["tid"], r["name"], r["group"], r["seq"], (r["detail"] or "").split(" ", 1)[0])


def _span(s: dict[str, Any], end: int | None, error: str | None, clock: str) -> Span:
    return Span(rank=s["rank"], pid=s["pid"], tid=s["tid"], name=s["name"] or "?", category=s["category"],
                group=s["group"], seq=s["seq"], callsite=s["callsite"], peer=s["peer"], capturing=bool(s["capturing"]),
                start=s[clock], end=end, error=error, source=s["source"])


def _tail_rows(group: np.ndarray, t: np.ndarray, tail: int) -> np.ndarray:
    """Positions (ascending) of each group's latest `tail` entries of `t`."""
    order = np.lexsort((t, group))  # by group, then time
    r = group[order]
    new = np.concatenate(([False], r[1:] != r[:-1]))
    last_of_group = np.append(np.flatnonzero(new) - 1, r.size - 1)  # position of each rank's last entry
    from_end = last_of_group[np.cumsum(new)] - np.arange(r.size)
    return np.sort(order[from_end < tail])


def _source_codes(col: pa.ChunkedArray) -> np.ndarray:
    """An int per distinct value of a string column (first-seen order), null -> -1."""
    codes = pc.index_in(col, value_set=pc.unique(col).drop_null())
    return np.asarray(pc.fill_null(codes, -1).to_numpy(), dtype=np.int64)


def pair_spans(events: pa.Table, clock: str = "t_ns", tail: int | None = None,
               open_rows: tuple[int, ...] = ()) -> SpanSet:
    """Pair the EVENTS rows that have a rank and a time on `clock` ("t_ns": one host's monotonic clock, exact
    within a host; "wall_ns": comparable across hosts).

    `tail`: only the latest `tail` rows of each (rank, source), plus the rows `open_rows` (``Analysis.open_rows``:
    every enter of ours, with a span id, never closed) — a page that shows the end of a long run need not turn
    millions of rows into objects. A reader's enter without a span id (nsys, Kineto, NCCL log) that never closed is
    found only among its source's latest rows."""
    timed = np.asarray(pc.and_(pc.is_valid(events["rank"]), pc.is_valid(events[clock])).to_numpy(
        zero_copy_only=False), dtype=bool) if events.num_rows else np.zeros(0, dtype=bool)
    idx = np.flatnonzero(timed)
    if idx.size == 0:
        return SpanSet((), (), 0, 0, clock)
    rank = np.asarray(pc.fill_null(events["rank"], -1).to_numpy(), dtype=np.int64)[idx]
    t = np.asarray(pc.fill_null(events[clock], 0).to_numpy(), dtype=np.int64)[idx]
    t0, t_end = int(t.min()), int(t.max())
    all_ranks = pc.unique(events["rank"].filter(pa.array(timed))).to_pylist()
    if tail is not None and idx.size > tail:
        # per (rank, source): a reader's dense rows (nsys kernels) never crowd out the rank's own ring records
        source = _source_codes(events["source"])[idx] + 1  # null -> 0
        group = (rank - rank.min()) * (int(source.max()) + 1) + source
        never_closed = np.asarray(open_rows, dtype=np.int64)
        idx = np.union1d(idx[_tail_rows(group, t, tail)], never_closed[timed[never_closed]])  # both small
    ev = events.select(list(dict.fromkeys(_COLUMNS + (clock,)))).take(pa.array(idx))
    rows = ev.select(list(_COLUMNS) + [clock]).to_pylist()
    spans: list[Span] = []
    marks: list[Mark] = []
    opened: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        kind = r["kind"]
        if kind == "enter":
            opened[_key(r)] = r
        elif kind in ("exit", "error", "complete"):
            s = opened.pop(_key(r), None)
            if s is not None:
                spans.append(_span(s, r[clock], r.get("error"), clock))
        elif kind == "mark":
            marks.append(Mark(r["rank"], r["tid"], r["name"] or "?", r[clock]))
    spans.extend(_span(s, None, None, clock) for s in opened.values())
    return SpanSet(tuple(spans), tuple(marks), t0, t_end, clock, tuple(sorted(all_ranks)))


# --- one row per call, for the whole run (columns, not objects) ---------------------------------------------------

SPAN_COLUMNS = ("host", "rank", "pid", "tid", "name", "category", "group", "group_desc", "backend", "seq", "peer",
                "dtype", "shape", "nbytes", "callsite", "capturing", "graph_id", "span_id", "parent_span_id",
                "source", "file", "line")


def span_table(events: pa.Table) -> pa.Table:
    """Every call of the inputs as one row: the enter's columns (SPAN_COLUMNS), ``start_t_ns`` / ``start_wall_ns``,
    ``end_t_ns`` / ``end_wall_ns`` of the first exit or error that closed it (null: it never returned),
    ``duration_ns``, ``outcome`` (returned | error | open), ``error`` and ``completed`` (the backend also reported it
    finished: a ``complete`` record, DESIGN §2's difference between returned and done).

    Our own records pair by (file, pid, span_id) in one hash join; a reader's rows without a span id (nsys,
    Kineto, NCCL log) are paired as :func:`pair_spans` pairs them, for the ranks our own records do not cover."""
    sch = _span_schema(events.schema)
    if events.num_rows == 0:
        return sch.empty_table()
    kind = events["kind"]
    has_id = pc.is_valid(events["span_id"])
    key_cols = ["file", "pid", "span_id"]
    ours = events.filter(has_id)
    enters = ours.filter(pc.equal(ours["kind"], "enter"))
    closing = ours.filter(pc.is_in(ours["kind"], value_set=pa.array(["exit", "error"])))
    closing = closing.append_column("_t", pc.fill_null(closing["t_ns"], pc.fill_null(closing["wall_ns"], 0)))
    closing = closing.sort_by([("_t", "ascending")])
    first = closing.select(key_cols + ["kind", "t_ns", "wall_ns", "error"]).group_by(
        key_cols, use_threads=False).aggregate([("kind", "first"), ("t_ns", "first"), ("wall_ns", "first"),
                                                ("error", "first")])
    completes = ours.filter(pc.equal(ours["kind"], "complete")).select(key_cols).group_by(
        key_cols, use_threads=False).aggregate([])
    completes = completes.append_column("completed", pa.array([True] * completes.num_rows, pa.bool_()))
    base = enters.select(list(SPAN_COLUMNS) + ["t_ns", "wall_ns"]).rename_columns(
        list(SPAN_COLUMNS) + ["start_t_ns", "start_wall_ns"])
    joined = base.join(first, key_cols, join_type="left outer", use_threads=False)
    joined = joined.join(completes, key_cols, join_type="left outer", use_threads=False)
    out = _finish(joined.rename_columns([{"kind_first": "_closer", "t_ns_first": "end_t_ns",
                                          "wall_ns_first": "end_wall_ns", "error_first": "error"}.get(c, c)
                                         for c in joined.column_names]), sch)
    foreign = events.filter(pc.and_(pc.invert(has_id), pc.is_in(kind, value_set=pa.array(
        ["enter", "exit", "error", "complete"]))))
    if foreign.num_rows and out.num_rows:
        # one source per rank: where our rings recorded a rank, its Flight Recorder / NCCL-log copies of the same
        # calls are left out (a gloo FR entry never retires: it would read as a call still open)
        foreign = foreign.filter(pc.invert(pc.fill_null(pc.is_in(foreign["rank"], value_set=pc.unique(
            out["rank"].drop_null())), False)))
    if foreign.num_rows:
        out = pa.concat_tables([out, _foreign_spans(foreign, sch)])
    return out.sort_by([("rank", "ascending"), ("start_wall_ns", "ascending"), ("start_t_ns", "ascending")])


_SPAN_SCHEMA_EXTRA = [("start_t_ns", pa.int64()), ("end_t_ns", pa.int64()), ("start_wall_ns", pa.int64()),
                      ("end_wall_ns", pa.int64()), ("duration_ns", pa.int64()), ("outcome", pa.string()),
                      ("error", pa.string()), ("completed", pa.bool_())]


def _span_schema(events: pa.Schema) -> pa.Schema:
    """The span table's schema: the enter's columns as the EVENTS table types them, then the pairing's."""
    return pa.schema([events.field(c) for c in SPAN_COLUMNS] + [pa.field(n, t) for n, t in _SPAN_SCHEMA_EXTRA])


def _finish(t: pa.Table, sch: pa.Schema) -> pa.Table:
    """Duration (monotonic clock when both ends have it, else wall), outcome, the columns in schema order."""
    mono = pc.subtract(t["end_t_ns"], t["start_t_ns"])
    wall = pc.subtract(t["end_wall_ns"], t["start_wall_ns"])
    closer = t["_closer"]
    outcome = pc.if_else(pc.is_null(closer), pa.scalar("open"),
                         pc.if_else(pc.equal(closer, "error"), pa.scalar("error"), pa.scalar("returned")))
    cols = {c: t[c] for c in SPAN_COLUMNS}
    cols.update(start_t_ns=t["start_t_ns"], end_t_ns=t["end_t_ns"], start_wall_ns=t["start_wall_ns"],
                end_wall_ns=t["end_wall_ns"], duration_ns=pc.coalesce(mono, wall), outcome=outcome,
                error=t["error"], completed=pc.fill_null(t["completed"], False))
    return pa.table({n: pc.cast(cols[n], sch.field(n).type) for n in sch.names}, schema=sch)


def _foreign_spans(rows: pa.Table, sch: pa.Schema) -> pa.Table:
    """Readers' enter/exit rows without span ids, paired by what they are (see :func:`_key`)."""
    data = rows.to_pylist()
    data.sort(key=lambda r: (r["t_ns"] if r["t_ns"] is not None else (r["wall_ns"] or 0)))
    opened: dict[tuple, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for r in data:
        if r["kind"] == "enter":
            opened[_key(r)] = r
            continue
        s = opened.pop(_key(r), None)
        if s is not None:
            out.append({**{c: s[c] for c in SPAN_COLUMNS}, "start_t_ns": s["t_ns"], "start_wall_ns": s["wall_ns"],
                        "end_t_ns": r["t_ns"], "end_wall_ns": r["wall_ns"], "error": r["error"],
                        "_closer": "error" if r["kind"] == "error" else "exit", "completed": r["kind"] == "complete"})
    for s in opened.values():
        out.append({**{c: s[c] for c in SPAN_COLUMNS}, "start_t_ns": s["t_ns"], "start_wall_ns": s["wall_ns"],
                    "end_t_ns": None, "end_wall_ns": None, "error": None, "_closer": None, "completed": False})
    if not out:
        return sch.empty_table()
    fields = [sch.field(c) for c in SPAN_COLUMNS] + [
        pa.field("start_t_ns", pa.int64()), pa.field("start_wall_ns", pa.int64()), pa.field("end_t_ns", pa.int64()),
        pa.field("end_wall_ns", pa.int64()), pa.field("error", pa.string()), pa.field("_closer", pa.string()),
        pa.field("completed", pa.bool_())]
    return _finish(pa.Table.from_pylist(out, schema=pa.schema(fields)), sch)


def as_of(analysis: Any, clock: str) -> int | None:
    """The moment the verdict speaks for, on `clock`: the latest record or stack sample (the watchdog's burst
    samples the hung ranks), the moment a live job was seen alive, or — for a job that ended with calls still
    open — its end. A call that never returned is drawn until then: a hang of minutes is minutes long."""
    times: list[int] = []
    ev = analysis.events
    if ev.num_rows and clock in ev.schema.names:
        t = pc.max(ev[clock]).as_py()
        if t is not None:
            times.append(t)
    st = analysis.stacks
    if st.num_rows and clock in st.schema.names:
        t = pc.max(st[clock]).as_py()
        if t is not None:
            times.append(t)
    if clock == "wall_ns":
        job = analysis.job
        if job.state == "running" and analysis.liveness is not None:
            times.append(int(analysis.liveness.checked_at * 1e9))
        elif job.ended and analysis.open_rows:
            end = max((h.meta or {}).get("end_wall_ns") or 0 for h in analysis.hosts) if analysis.hosts else 0
            if end:
                times.append(int(end))
    return max(times) if times else None
