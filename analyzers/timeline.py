"""From raw events to ops and open spans: one row per (rank, channel, seq) op, and what each rank has open now.

Vectorised (pyarrow group_by), so 8 ranks x 1M events stay interactive (DESIGN §7).

*Channel* is what ``seq`` counts on: a collective's channel is its group; a p2p op's channel is
``group|src>dst`` (the k-th send from A to B meets B's k-th recv from A, DESIGN §3).

Completion (DESIGN §2 — a call that returned is not an op that finished):
1. a ``complete`` row (Flight Recorder state completed, CUDA event, kernel end) completes the op;
2. on gloo a blocking call that *returned* (``exit``) has finished — gloo does the work inside the call;
3. on gloo, an op followed by a later op on the same channel of the same rank has finished (FR's gloo entries stay
   "scheduled" forever, platform-notes); the same inference is made for sources that never report completion at
   all (NCCL COLL log lines, watchdog lines): ops that matched and were followed by more ops on the communicator
   are taken as done, so the wait-for engine looks at the last op each rank issued, where ranks diverge;
4. nothing else: an NCCL ``exit`` means enqueued; ``error`` means the call failed (typically a timeout) — not done.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from analyzers import schema

__all__ = ["OPS", "build_ops", "OpenSpan", "open_spans", "last_phase", "BLOCKING_COMPLETE_BACKENDS"]

BLOCKING_COMPLETE_BACKENDS = ("gloo",)
NO_COMPLETION_SOURCES = ("nccl", "watchdog")

OPS = pa.schema(
    [
        ("rank", pa.int32()), ("chan", pa.string()), ("seq", pa.int64()), ("name", pa.string()),
        ("category", pa.string()), ("group", pa.string()), ("group_desc", pa.string()), ("backend", pa.string()),
        ("peer", pa.int32()), ("src", pa.int32()), ("dst", pa.int32()), ("dtype", pa.string()), ("shape", pa.string()),
        ("nbytes", pa.int64()), ("callsite", pa.string()), ("t_enter", pa.int64()), ("wall_enter", pa.int64()),
        ("issued", pa.bool_()), ("returned", pa.bool_()), ("errored", pa.bool_()), ("completed", pa.bool_()),
        ("async_op", pa.bool_()), ("capturing", pa.bool_()), ("error", pa.string()), ("source", pa.string()),
        ("file", pa.string()), ("line", pa.int64()), ("state", pa.string()),
    ]
)


def build_ops(events: pa.Table) -> pa.Table:
    """One row per (rank, chan, seq) with issued / returned / errored / completed flags."""
    ev = events.filter(
        pc.and_(pc.is_in(events["category"], value_set=pa.array(["collective", "p2p"])),
                pc.and_(pc.is_valid(events["seq"]), pc.is_valid(events["rank"])))
    )
    if ev.num_rows == 0:
        return schema.empty(OPS)
    is_p2p = pc.equal(ev["category"], "p2p")
    is_send = pc.is_in(ev["name"], value_set=pa.array(["send", "isend", "send_object_list"]))
    src = pc.if_else(is_send, ev["rank"], ev["peer"])
    dst = pc.if_else(is_send, ev["peer"], ev["rank"])
    grp = pc.fill_null(ev["group"], "")
    chan = pc.if_else(
        is_p2p,
        pc.binary_join_element_wise(grp, pc.cast(pc.fill_null(src, -1), pa.string()), "|"),
        grp,
    )
    chan = pc.if_else(is_p2p, pc.binary_join_element_wise(chan, pc.cast(pc.fill_null(dst, -1), pa.string()), ">"), chan)
    kind = ev["kind"]

    def flag(k: str) -> pa.Array:
        return pc.cast(pc.equal(kind, k), pa.int8())

    enter_t = pc.if_else(pc.equal(kind, "enter"), ev["t_ns"], pa.scalar(None, pa.int64()))
    enter_w = pc.if_else(pc.equal(kind, "enter"), ev["wall_ns"], pa.scalar(None, pa.int64()))
    t = pa.table(
        {
            "rank": ev["rank"], "chan": chan, "seq": ev["seq"], "name": ev["name"], "category": ev["category"],
            "group": ev["group"], "group_desc": ev["group_desc"], "backend": ev["backend"], "peer": ev["peer"],
            "src": src, "dst": dst, "dtype": ev["dtype"], "shape": ev["shape"], "nbytes": ev["nbytes"],
            "callsite": ev["callsite"], "t_enter": enter_t, "wall_enter": enter_w,
            "f_enter": flag("enter"), "f_exit": flag("exit"), "f_error": flag("error"), "f_complete": flag("complete"),
            "async_op": pc.cast(pc.fill_null(ev["async_op"], False), pa.int8()),
            "capturing": pc.cast(pc.fill_null(ev["capturing"], False), pa.int8()),
            "error": ev["error"], "source": ev["source"], "file": ev["file"], "line": ev["line"], "state": ev["state"],
        }
    )
    agg = t.group_by(["rank", "chan", "seq"], use_threads=False).aggregate(
        [(c, "first") for c in ("name", "category", "group", "group_desc", "backend", "peer", "src", "dst", "dtype",
                                "shape", "nbytes", "callsite", "error", "source", "file", "line")]
        + [("state", "last"), ("t_enter", "min"), ("wall_enter", "min"), ("f_enter", "max"), ("f_exit", "max"),
           ("f_error", "max"), ("f_complete", "max"), ("async_op", "max"), ("capturing", "max")]
    )
    names = {f"{c}_first": c for c in ("name", "category", "group", "group_desc", "backend", "peer", "src", "dst",
                                       "dtype", "shape", "nbytes", "callsite", "error", "source", "file", "line")}
    names.update({"state_last": "state", "t_enter_min": "t_enter", "wall_enter_min": "wall_enter"})
    agg = agg.rename_columns([names.get(n, n) for n in agg.column_names])
    issued = pc.greater(pc.fill_null(agg["f_enter_max"], 0), 0)
    returned = pc.greater(pc.fill_null(agg["f_exit_max"], 0), 0)
    errored = pc.greater(pc.fill_null(agg["f_error_max"], 0), 0)
    complete_row = pc.greater(pc.fill_null(agg["f_complete_max"], 0), 0)
    async_op = pc.greater(pc.fill_null(agg["async_op_max"], 0), 0)
    gloo = pc.is_in(pc.fill_null(agg["backend"], ""), value_set=pa.array(BLOCKING_COMPLETE_BACKENDS))
    completed = pc.or_(complete_row, pc.and_(pc.and_(returned, gloo), pc.invert(async_op)))
    # rule 3: on gloo, a later op on the same channel of the same rank means this one finished
    last_seq = agg.group_by(["rank", "chan"], use_threads=False).aggregate([("seq", "max")])
    joined = agg.select(["rank", "chan", "seq"]).append_column("i", pa.array(range(agg.num_rows), pa.int64())).join(
        last_seq, keys=["rank", "chan"], use_threads=False)
    joined = joined.sort_by("i")
    no_completion_info = pc.is_in(pc.fill_null(agg["source"], ""), value_set=pa.array(NO_COMPLETION_SOURCES))
    superseded = pc.and_(pc.less(joined["seq"], joined["seq_max"]), pc.or_(gloo, no_completion_info))
    completed = pc.and_(pc.or_(completed, superseded), pc.invert(pc.and_(errored, pc.invert(complete_row))))
    out = {
        "rank": agg["rank"], "chan": agg["chan"], "seq": agg["seq"],
        **{c: agg[c] for c in ("name", "category", "group", "group_desc", "backend", "peer", "src", "dst", "dtype",
                               "shape", "nbytes", "callsite", "t_enter", "wall_enter")},
        "issued": pc.or_(issued, complete_row), "returned": returned, "errored": errored, "completed": completed,
        "async_op": async_op, "capturing": pc.greater(pc.fill_null(agg["capturing_max"], 0), 0),
        "error": agg["error"], "source": agg["source"], "file": agg["file"], "line": agg["line"], "state": agg["state"],
    }
    return pa.table(out).cast(OPS).sort_by([("rank", "ascending"), ("t_enter", "ascending")])


@dataclass(frozen=True)
class OpenSpan:
    """An ENTER with no EXIT/ERROR yet: what a rank is inside right now (or was when it died)."""

    rank: int | None
    pid: int | None
    tid: int | None
    name: str
    category: str
    group: str | None
    seq: int | None
    t_ns: int | None
    callsite: str | None
    capturing: bool
    graph_id: int | None
    source: str | None
    file: str | None
    line: int | None
    detail: str | None


def open_spans(events: pa.Table) -> list[OpenSpan]:
    """Spans opened (enter) and never closed, from sources that record exits (span_id set)."""
    ev = events.filter(pc.and_(pc.is_valid(events["span_id"]), pc.not_equal(events["span_id"], 0)))
    if ev.num_rows == 0:
        return []
    # spans are per process; the ring file names the process even when pids repeat (reuse, fixtures)
    closing = ev.filter(pc.is_in(ev["kind"], value_set=pa.array(["exit", "error"]))).select(
        ["host", "pid", "file", "span_id"])
    opens = ev.filter(pc.equal(ev["kind"], "enter")).select(
        ["host", "rank", "pid", "tid", "name", "category", "group", "seq", "t_ns", "callsite", "capturing", "graph_id",
         "source", "file", "line", "detail", "span_id"])
    if closing.num_rows:
        closing = closing.append_column("closed", pa.array([True] * closing.num_rows))
        opens = opens.join(closing, keys=["host", "pid", "file", "span_id"], join_type="left outer",
                           use_threads=False)
        opens = opens.filter(pc.is_null(opens["closed"]))
    opens = opens.sort_by("t_ns")
    rows = opens.select(["rank", "pid", "tid", "name", "category", "group", "seq", "t_ns", "callsite", "capturing",
                         "graph_id", "source", "file", "line", "detail"]).to_pylist()
    return [OpenSpan(**{**r, "capturing": bool(r["capturing"])}) for r in rows]


def last_phase(events: pa.Table) -> dict[int, str]:
    """Latest phase mark per rank (server-log phases, --hook phase targets)."""
    ev = events.filter(pc.and_(pc.equal(events["category"], "phase"), pc.is_valid(events["rank"])))
    if ev.num_rows == 0:
        return {}
    ev = ev.sort_by("wall_ns" if ev["wall_ns"].null_count < ev.num_rows else "t_ns")
    out: dict[int, str] = {}
    for r, n in zip(ev["rank"].to_pylist(), ev["name"].to_pylist()):
        out[r] = n
    return out
