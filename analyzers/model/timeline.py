"""From raw events to ops and open spans: one row per (rank, channel, seq) op with whether it was issued, returned
and completed, and what each rank has open now. Vectorised, so 8 ranks x 1M events stay interactive."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.model.values import OpenSpan

__all__ = ["OPS", "build_ops", "last_issued", "OpenSpan", "open_spans", "open_enter_rows",
           "last_phase", "BLOCKING_COMPLETE_BACKENDS"]

BLOCKING_COMPLETE_BACKENDS = ("gloo",)
# Sources that never say an op finished (our own hooks on NCCL or --hook backends record issue and return only;
# NCCL COLL lines, watchdog lines and Kineto annotations likewise): an op followed by a later one on the same channel
# of the same rank is taken as done, so the engine looks at where ranks diverge, not at every op still in flight.
NO_COMPLETION_SOURCES = ("nccl", "watchdog", "kineto", "events")

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


_SENDS = ("send", "isend", "send_object_list")
_FIRST_COLS = ("name", "category", "group", "group_desc", "backend", "peer", "dtype", "shape", "nbytes", "callsite",
               "error", "source", "file", "line")


Column: TypeAlias = pa.ChunkedArray | pa.Array


def _flat(col: Column) -> pa.Array:
    """One contiguous array (copies a many-chunk column: only for small tables)."""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _np(arr: Column) -> np.ndarray:
    """numpy values of an array or chunked array without nulls (a copy only where needed: chunks, booleans)."""
    return arr.to_numpy(zero_copy_only=False) if isinstance(arr, pa.Array) else arr.to_numpy()


def _ints(arr: Column) -> np.ndarray:
    """int64 values of an integer array without nulls."""
    return np.asarray(_np(arr), dtype=np.int64)


def _codes(arr: Column, value_set: list[str]) -> np.ndarray:
    """Index of each value in `value_set` (int32; -1 for null or any other value)."""
    idx = pc.index_in(arr, value_set=pa.array(value_set))
    return np.asarray(_np(pc.fill_null(idx, -1) if idx.null_count else idx), np.int32)


def _bools(arr: Column) -> np.ndarray:
    """A boolean array as numpy, null = False."""
    if arr.null_count:
        arr = pc.fill_null(arr, False)
    return np.asarray(_np(arr), dtype=bool)


def _bounds(values: np.ndarray, where: np.ndarray) -> tuple[int, int]:
    """(min, max) of `values` where `where` is set (some is)."""
    info = np.iinfo(values.dtype)
    return int(values.min(where=where, initial=info.max)), int(values.max(where=where, initial=info.min))


def _dict_codes(arr: Column) -> tuple[np.ndarray, pa.Array]:
    """Dictionary-encode: int32 codes (null -> -1, first-seen order) and the dictionary."""
    enc = pc.dictionary_encode(arr)
    if isinstance(enc, pa.ChunkedArray):  # one dictionary, shared by all chunks
        dictionary = enc.chunk(0).dictionary if enc.num_chunks else pa.array([], arr.type)
        indices = pa.chunked_array([c.indices for c in enc.chunks], pa.int32())
    else:
        dictionary, indices = enc.dictionary, enc.indices
    indices = pc.fill_null(indices, -1) if indices.null_count else indices
    return np.asarray(_np(indices), dtype=np.int32), dictionary


def _take(col: Column, idx: np.ndarray, missing: np.ndarray | None = None) -> Column:
    """``col[idx]`` (null where `missing`), taken chunk by chunk: a many-chunk column is never concatenated."""
    if isinstance(col, pa.Array) or col.num_chunks == 1:
        return _flat(col).take(pa.array(idx, mask=missing))
    ascending = idx.size < 2 or bool(np.all(idx[1:] >= idx[:-1]))
    order = None if ascending else np.argsort(idx, kind="stable")
    sidx = idx if order is None else idx[order]
    smissing = missing if order is None or missing is None else missing[order]
    bounds = np.cumsum([0] + [len(c) for c in col.chunks])
    cuts = np.searchsorted(sidx, bounds)
    pieces = [chunk.take(pa.array(sidx[lo:hi] - base, mask=None if smissing is None else smissing[lo:hi]))
              for chunk, base, lo, hi in zip(col.chunks, bounds[:-1], cuts[:-1], cuts[1:]) if hi > lo]
    out = pa.chunked_array(pieces, col.type)
    if order is None:
        return out
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return out.take(pa.array(inverse))


def _op_order(rank: np.ndarray, t: np.ndarray, t_missing: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Permutation sorting ops by (rank, t) ascending, missing t last, ties by `first` (a unique int per op)."""
    by_first = np.argsort(first, kind="stable")
    tv = np.where(t_missing, 0, t)
    t0, t1, r0 = int(tv.min()), int(tv.max()), int(rank.min())
    if (t1 - t0 + 1) * 2 * (int(rank.max()) - r0 + 1) < 2**62:
        # (rank, missing, t) packed into one int64; stable sorts of a few sorted runs are near-linear
        key = ((rank.astype(np.int64) - r0) * 2 + t_missing) * (t1 - t0 + 1) + (tv - t0)
        return by_first[np.argsort(key[by_first], kind="stable")]
    return pc.sort_indices(pa.table({"rank": rank, "t": pa.array(t, mask=t_missing), "first": first}),
                           sort_keys=[("rank", "ascending"), ("t", "ascending"), ("first", "ascending")]).to_numpy()


def build_ops(events: pa.Table) -> pa.Table:
    """One row per (rank, chan, seq) with issued / returned / errored / completed flags.

    Vectorised: the op rows are grouped by one stable numpy sort of a packed (rank, chan, seq) key (a rank's
    events arrive nearly in that order, so the sort is close to linear; every other row goes to one trailing group
    that is dropped), and every per-op value is a segment reduction (``ufunc.reduceat``) or one ``take`` of its
    column. Per op: the descriptive columns are the first non-null value in event order (``state`` the last one),
    t_enter/wall_enter the earliest enter, each flag whether any of its events says so. Ops come out ordered by
    (rank, t_enter), t_enter nulls last, ties in the order of their first event.

    The steps: which rows are ops (``_op_rows``) -> their channels (``_channels``) -> rows grouped per op
    (``_OpGroups``) -> per-op flags and enter times -> descriptive columns -> completion (``_completed``).
    """
    if events.num_rows == 0:
        return schema.empty(OPS)
    col = events.column
    category, is_op = _op_rows(col)
    if not is_op.any():
        return schema.empty(OPS)
    src, dst, chan = _channels(col, category, is_op)
    c, chan_dict = _dict_codes(chan)
    r = np.asarray(_np(pc.fill_null(col("rank"), 0)))  # int32
    s = _ints(pc.fill_null(col("seq"), 0))
    g = _OpGroups.of(r, c, s, is_op, len(chan_dict))

    kind = _codes(col("kind"), ["enter", "exit", "error", "complete"])
    issued, returned, errored, complete_row, async_op, capturing = g.flags(kind, col)
    is_enter = kind == 0
    t_enter, t_missing = g.enter_min(col("t_ns"), is_enter, issued)
    wall_enter, wall_missing = g.enter_min(col("wall_ns"), is_enter, issued)

    g_rank, g_chan, g_seq = r[g.first], c[g.first], s[g.first]  # ops are in (rank, chan, seq) order here
    seq_max = _channel_seq_max(g_rank, g_chan, g_seq)
    perm = _op_order(g_rank, t_enter, t_missing, g.first)  # from here on, every per-op array is in output order
    sources: dict[str, Column] = {name: col(name) for name in _FIRST_COLS + ("state",)}
    sources.update(src=src, dst=dst)
    out = g.pick_columns(sources, perm)
    issued, returned, errored, complete_row, async_op, capturing = (
        x[perm] for x in (issued, returned, errored, complete_row, async_op, capturing))
    completed = _completed(out, g_seq[perm], seq_max[perm], returned, errored, complete_row, async_op)
    out.update({
        "rank": pa.array(g_rank[perm], pa.int32()), "chan": chan_dict.take(pa.array(g_chan[perm])),
        "seq": pa.array(g_seq[perm], pa.int64()),
        "t_enter": pa.array(t_enter[perm], mask=t_missing[perm]),
        "wall_enter": pa.array(wall_enter[perm], mask=wall_missing[perm]),
        "issued": pa.array(issued | complete_row), "returned": pa.array(returned), "errored": pa.array(errored),
        "completed": pa.array(completed), "async_op": pa.array(async_op), "capturing": pa.array(capturing),
    })
    return pa.table({name: out[name] if out[name].type == OPS.field(name).type else out[name].cast(OPS.field(name).type)
                     for name in OPS.names}, schema=OPS)


def _op_rows(col: Callable[[str], Column]) -> tuple[np.ndarray, np.ndarray]:
    """(category code per row: 0 collective, 1 p2p, -1 other; which rows are ops: a collective or p2p row with a
    seq and a rank)."""
    category = _codes(col("category"), ["collective", "p2p"])
    is_op = (category >= 0) & _bools(pc.is_valid(col("seq"))) & _bools(pc.is_valid(col("rank")))
    return category, is_op


def _channels(col: Callable[[str], Column], category: np.ndarray, is_op: np.ndarray) -> tuple[Column, Column, Column]:
    """(src, dst, chan) per row: a collective's channel is its group; a p2p op's is ``group|src>dst`` (a send's
    src is its own rank, a recv's its peer)."""
    is_send = pc.is_in(col("name"), value_set=pa.array(_SENDS))
    if pc.any(is_send).as_py():
        src, dst = pc.if_else(is_send, col("rank"), col("peer")), pc.if_else(is_send, col("peer"), col("rank"))
    else:  # the common case, no sends: skip two passes
        src, dst = col("peer"), col("rank")
    grp = pc.fill_null(col("group"), "")
    is_p2p = pa.array(category == 1)
    if bool(np.any((category == 1) & is_op)):
        chan = pc.if_else(is_p2p, pc.binary_join_element_wise(grp, pc.cast(pc.fill_null(src, -1), pa.string()), "|"),
                          grp)
        chan = pc.if_else(is_p2p, pc.binary_join_element_wise(chan, pc.cast(pc.fill_null(dst, -1), pa.string()), ">"),
                          chan)
    else:
        chan = grp
    return src, dst, chan


@dataclass(frozen=True)
class _OpGroups:
    """The event rows grouped per op: ``order`` sorts the rows by (rank, chan, seq), stably (each op's rows stay
    in event order); op k's rows are ``order[starts[k]:starts[k + 1]]``. When some rows are not ops they form one
    trailing group, left out of every per-op array (``n_groups`` ops)."""

    n: int                  # event rows
    is_op: np.ndarray       # per row
    order: np.ndarray
    starts: np.ndarray
    n_groups: int
    first: np.ndarray       # per op: its first and last event row
    last: np.ndarray

    @classmethod
    def of(cls, r: np.ndarray, c: np.ndarray, s: np.ndarray, is_op: np.ndarray, n_chans: int) -> "_OpGroups":
        n = len(is_op)
        others = not bool(is_op.all())  # rows that are not ops: grouped last, dropped
        (rmin, rmax), (smin, smax) = _bounds(r, is_op), _bounds(s, is_op)
        spans = (rmax - rmin + 1, n_chans, smax - smin + 1)
        if spans[0] * spans[1] * spans[2] < 2**62:
            key = r.astype(np.int64)  # ((r - rmin) * chans + c) * seqs + (s - smin), built in place
            key -= rmin
            key *= spans[1]
            key += c
            key *= spans[2]
            key += s
            key -= smin
            if others:
                np.putmask(key, ~is_op, 2**62)
            order = np.argsort(key, kind="stable")
            ks = key[order]
            starts = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1])))
        else:
            if others:  # all non-op rows in one group
                r, c, s = (np.where(is_op, x, 0) for x in (r, c, s))
            order = np.lexsort((s, c, r, ~is_op))
            ro, co, so, oo = r[order], c[order], s[order], is_op[order]
            starts = np.flatnonzero(np.concatenate(([True], (ro[1:] != ro[:-1]) | (co[1:] != co[:-1])
                                                    | (so[1:] != so[:-1]) | (oo[1:] != oo[:-1]))))
        n_groups = len(starts) - (1 if others else 0)  # the trailing group of non-op rows is dropped
        first = order[starts][:n_groups]
        last = order[np.append(starts[1:], n) - 1][:n_groups]
        return cls(n, is_op, order, starts, n_groups, first, last)

    def reduce(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        """Per op: ufunc over its events' values."""
        return ufunc.reduceat(values[self.order], self.starts)[:self.n_groups]

    def valid_rows(self, a: Column) -> np.ndarray | None:
        """Which rows have a value in column `a` (None: every op row has one)."""
        if a.null_count == 0:
            return None
        valid = _bools(pc.is_valid(a))
        return None if bool(np.all(valid | ~self.is_op)) else valid

    def first_valid(self, a: Column) -> tuple[np.ndarray, np.ndarray | None]:
        """Per op: its first event where column `a` is not null, and the ops that have none (None: no such op)."""
        valid = self.valid_rows(a)
        if valid is None:
            return self.first, None
        if not np.any(valid & self.is_op):
            return self.first, np.ones(self.n_groups, dtype=bool)
        m = self.reduce(np.minimum, np.where(valid, np.arange(self.n), self.n))
        missing = m == self.n
        return np.minimum(m, self.n - 1), (missing if missing.any() else None)

    def last_valid(self, a: Column) -> tuple[np.ndarray, np.ndarray | None]:
        """Per op: its last event where column `a` is not null, and the ops that have none (None: no such op)."""
        valid = self.valid_rows(a)
        if valid is None:
            return self.last, None
        if not np.any(valid & self.is_op):
            return self.last, np.ones(self.n_groups, dtype=bool)
        m = self.reduce(np.maximum, np.where(valid, np.arange(self.n), -1))
        missing = m < 0
        return np.maximum(m, 0), (missing if missing.any() else None)

    def flags(self, kind: np.ndarray, col: Callable[[str], Column]) -> tuple[np.ndarray, ...]:
        """Per op (issued, returned, errored, complete_row, async_op, capturing): whether any of its events is an
        enter / exit / error / complete (`kind`: those codes 0-3 per row, -1 other), or marked async / capturing —
        one pass, the six as bits OR-ed per op."""
        bits = np.array([1, 2, 4, 8, 128], dtype=np.uint8)[kind]  # kind -1 (other) -> the last entry, bit 7
        bits |= _bools(col("async_op")).view(np.uint8) << 4
        bits |= _bools(col("capturing")).view(np.uint8) << 5
        anybits = self.reduce(np.bitwise_or, bits)
        return tuple((anybits >> k) & 1 == 1 for k in range(6))

    def enter_min(self, a: Column, is_enter: np.ndarray, issued: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Earliest value of column `a` over each op's enter events, and the ops without one (`issued`: the ops
        with an enter)."""
        valid = self.valid_rows(a)
        ok = is_enter if valid is None else is_enter & valid
        v = _ints(pc.fill_null(a, 0) if a.null_count else a)
        v = v if v.flags.writeable else v.copy()
        np.putmask(v, ~ok, np.iinfo(np.int64).max)
        has = issued if valid is None else self.reduce(np.logical_or, ok)
        return self.reduce(np.minimum, v), ~has

    def pick_columns(self, sources: dict[str, Column], perm: np.ndarray) -> dict[str, Column]:
        """Per op in output order (`perm`): each descriptive column's first non-null value, ``state``'s last."""
        picks = {name: self.first_valid(a) for name, a in sources.items() if name != "state"}
        picks["state"] = self.last_valid(sources["state"])
        rows_of: dict[int, np.ndarray] = {}

        def picked(name: str) -> Column:
            idx, missing = picks[name]
            if id(idx) not in rows_of:  # most columns share `first`
                rows_of[id(idx)] = idx[perm]
            return _take(sources[name], rows_of[id(idx)], None if missing is None else missing[perm])

        return {name: picked(name) for name in _FIRST_COLS + ("src", "dst", "state")}


def _channel_seq_max(g_rank: np.ndarray, g_chan: np.ndarray, g_seq: np.ndarray) -> np.ndarray:
    """Per op (ops in (rank, chan, seq) order): the highest seq its rank issued on its channel."""
    new_pair = np.concatenate(([True], (g_rank[1:] != g_rank[:-1]) | (g_chan[1:] != g_chan[:-1])))
    return np.maximum.reduceat(g_seq, np.flatnonzero(new_pair))[np.cumsum(new_pair) - 1]


def _completed(out: dict[str, Column], seq: np.ndarray, seq_max: np.ndarray, returned: np.ndarray,
               errored: np.ndarray, complete_row: np.ndarray, async_op: np.ndarray) -> np.ndarray:
    """Per op (all arrays in output order): did it finish? A call that returned is not an op that finished:
    1. a ``complete`` row (Flight Recorder state completed, CUDA event, kernel end) completes the op;
    2. on gloo a blocking call that *returned* (``exit``) has finished — gloo does the work inside the call;
    3. on gloo, an op followed by a later op on the same channel of the same rank has finished (FR's gloo entries
       stay "scheduled" forever); the same inference is made for sources that never report completion at all
       (NCCL COLL log lines, watchdog lines, our hooks on NCCL): the wait-for engine then looks at the last op
       each rank issued, where ranks diverge;
    4. nothing else: an NCCL ``exit`` means enqueued; ``error`` means the call failed (a timeout) — not done.
    """
    gloo = _bools(pc.is_in(out["backend"], value_set=pa.array(BLOCKING_COMPLETE_BACKENDS)))
    no_completion_info = _bools(pc.is_in(out["source"], value_set=pa.array(NO_COMPLETION_SOURCES)))
    completed = complete_row | (returned & gloo & ~async_op)
    # rule 3: on gloo, a later op on the same channel of the same rank means this one finished
    superseded = (seq < seq_max) & (gloo | no_completion_info)
    return (completed | superseded) & ~(errored & ~complete_row)


def last_issued(ops: pa.Table) -> dict[int, dict]:
    """Each rank's last issued op in (t_enter, seq) order, nulls last, ties: the later row.

    Vectorised: per rank, the rows are narrowed key by key to those holding the rank's maximum (numpy ``maximum.at``
    on rank codes) instead of sorting every op.
    """
    if ops.num_rows == 0:
        return {}
    rows = np.flatnonzero(_bools(ops["issued"]))
    if rows.size == 0:
        return {}
    code, ranks = _dict_codes(ops["rank"])
    code = code[rows]
    rows, code = rows[code >= 0], code[code >= 0]
    t, s = ops["t_enter"], ops["seq"]
    keys = [_bools(pc.is_null(t)).astype(np.int64), _ints(pc.fill_null(t, 0)),
            _bools(pc.is_null(s)).astype(np.int64), _ints(pc.fill_null(s, 0)), np.arange(ops.num_rows, dtype=np.int64)]
    for k in keys:  # keep, per rank, the rows with the largest value of this key
        v = k[rows]
        top = np.full(len(ranks), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(top, code, v)
        keep = v == top[code]
        rows, code = rows[keep], code[keep]
    table = ops.select(["rank", "name", "group", "seq"])
    picked = pa.concat_tables([table.slice(int(i), 1) for i in rows]).to_pylist() if rows.size else []
    return {r["rank"]: r for r in picked}


def _take_rows(table: pa.Table, idx: np.ndarray) -> pa.Table:
    """Rows `idx` of a table; a few rows are sliced out (``take`` on many-chunk columns copies whole columns)."""
    if idx.size > 256:
        return table.take(pa.array(idx))
    return pa.concat_tables([table.slice(int(i), 1) for i in idx]) if idx.size else table.slice(0, 0)


_OPEN_COLS = ["rank", "pid", "tid", "name", "category", "group", "seq", "t_ns", "callsite", "capturing", "graph_id",
              "source", "file", "line", "detail"]


def open_spans(events: pa.Table, rows: np.ndarray | None = None) -> list[OpenSpan]:
    """Spans opened (enter) and never closed, from sources that record exits (span_id set), in time order.
    `rows`: ``open_enter_rows(events)`` when the caller already has it."""
    idx = open_enter_rows(events) if rows is None else rows
    picked = _take_rows(events.select(_OPEN_COLS), idx).sort_by("t_ns").to_pylist()
    return [OpenSpan(**{**r, "capturing": bool(r["capturing"])}) for r in picked]


def open_enter_rows(events: pa.Table) -> np.ndarray:
    """Row indices of the enters never closed, from sources that record exits (span_id set), ascending.

    Spans are per process; the ring file names the process even when pids repeat (reuse, fixtures), so an enter is
    closed by an exit/error with the same (host, pid, file, span_id), none of them null. Vectorised: each
    (process, span) is packed into one int64 and the enters are looked up in the sorted closes.
    """
    none = np.zeros(0, dtype=np.int64)
    if events.num_rows == 0:
        return none
    span_col = events["span_id"]
    has_span = _bools(pc.not_equal(span_col, 0))  # null -> False
    kind = _codes(events["kind"], ["enter", "exit", "error"])
    enters = np.flatnonzero(has_span & (kind == 0))
    if enters.size == 0:
        return none
    closes = np.flatnonzero(has_span & (kind > 0))
    is_open = np.ones(enters.size, dtype=bool)
    if closes.size:
        both = np.concatenate([enters, closes])
        proc = np.zeros(both.size, dtype=np.int64)
        known = np.ones(both.size, dtype=bool)
        for name in ("host", "pid", "file"):  # process = (host, pid, file) as one int; a null never matches
            part = _dict_codes(events[name])[0][both]
            known &= part >= 0
            proc = proc * (int(part.max()) + 2) + part
            if int(np.abs(proc).max()) > 2**31:
                proc = _dict_codes(pa.array(proc))[0].astype(np.int64)
        span = _ints(pc.fill_null(span_col, 0))[both]
        s0, s1 = int(span.min()), int(span.max())
        if (int(np.abs(proc).max()) + 1) * (s1 - s0 + 1) < 2**62:
            key = proc * (s1 - s0 + 1) + (span - s0)
        else:  # sparse span ids: number them densely first
            code = _dict_codes(pa.array(span))[0]
            key = proc * (int(code.max()) + 1) + code
        key_e, key_c = key[:enters.size], np.sort(key[enters.size:][known[enters.size:]], kind="stable")
        if key_c.size:
            pos = np.minimum(np.searchsorted(key_c, key_e), key_c.size - 1)
            is_open = ~(known[:enters.size] & (key_c[pos] == key_e))
    return enters[is_open]


# marks recorded in the phase category that say what happened to the process, not which start-up step it is in
_NOT_PHASES = frozenset({"process_exit"})


def last_phase(events: pa.Table) -> dict[int, str]:
    """Latest phase mark per rank (server-log phases, --hook phase targets)."""
    ev = events.select(["rank", "name", "wall_ns", "t_ns"]).filter(
        pc.and_(pc.and_(pc.equal(events["category"], "phase"), pc.is_valid(events["rank"])),
                pc.invert(pc.is_in(events["name"], value_set=pa.array(sorted(_NOT_PHASES))))))
    if ev.num_rows == 0:
        return {}
    ev = ev.sort_by("wall_ns" if ev["wall_ns"].null_count < ev.num_rows else "t_ns")
    return dict(zip(ev["rank"].to_pylist(), ev["name"].to_pylist()))  # a rank's last mark wins
