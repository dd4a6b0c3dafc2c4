"""Op spans for the timeline renderers: each ENTER paired with the EXIT / ERROR / COMPLETE that closes it, decided
once for Perfetto and HTML (a span never closed is drawn to the end of the trace, marked open)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Span", "Mark", "SpanSet", "pair_spans"]

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
