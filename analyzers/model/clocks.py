"""Clocks across hosts (issue #19): one wall clock per host, each host's against one reference host, estimated from
collectives that ranks on both finished together, with how good the estimate is.

A rank records CLOCK_MONOTONIC (t_ns), shared by every process of its host; its ring converts to wall time with
one (monotonic, wall) pair read when it started. The two reads of a pair are not atomic: a process descheduled
between them (a loaded host) gets a pair milliseconds late, always in the same direction (wall read after). So a
host's wall time is its monotonic time plus the smallest (wall - monotonic) any of its processes recorded: one
conversion for every process of the host.

Hosts' wall clocks agree only as well as NTP keeps them (often milliseconds; a collective is microseconds). A
blocking symmetric collective (a gloo all_reduce: no member returns before every member arrived) bounds the
difference. For a host H against the reference R, and each such op k seen on both,

    max enter on H (k) - min exit on R (k)  <=  offset of H  <=  min exit on H (k) - max enter on R (k)

The intersection over every op bounds the offset; its middle is the estimate and half its width the error. Bounds
that do not intersect (an NTP step meanwhile, calls that return before the op is done) give the median of each op's
middle instead, marked approximate. A host with no such op in common with the reference keeps its clock ("not
aligned"). Aligned wall time = the host's wall time - its offset. With one host nothing changes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["HostClock", "estimate", "align", "BLOCKING", "SYMMETRIC"]

BLOCKING = ("gloo",)   # backends whose collective calls return only once the op completed everywhere
# ops no member leaves before every member arrived (a broadcast's root, a gather's sender may leave early)
SYMMETRIC = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object",
             "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
             "barrier", "monitored_barrier", "allreduce", "allgather", "alltoall", "alltoall_base")


@dataclass(frozen=True)
class HostClock:
    host: str
    offset_ns: int          # this host's wall clock minus the reference's
    error_ns: int | None    # the estimate is good to +- this; None: not aligned (offset 0 kept)
    ops: int                # collectives the estimate rests on
    basis: str              # reference | collectives | approximate | none
    base_ns: int | None = None  # the host's wall - monotonic (its records' wall time is t_ns + this)


def estimate(events: pa.Table) -> dict[str, HostClock]:
    """Per host of our own records (source "events"): its clock against the host with the most ranks. {} when the
    records come from fewer than two hosts."""
    ours = _own(events)
    if ours is None:
        return {}
    hosts = sorted(h for h in pc.unique(ours["host"]).to_pylist() if h is not None)
    per_host = ours.select(["host", "rank"]).filter(pc.is_valid(ours["rank"])).group_by(
        ["host"], use_threads=False).aggregate([("rank", "count_distinct")])
    counts = dict(zip(per_host["host"].to_pylist(), per_host["rank_count_distinct"].to_pylist()))
    ref = sorted(hosts, key=lambda h: (-counts.get(h, 0), h))[0]
    base = _host_bases(ours)
    ours = _rebased(ours, base)
    calls = ours.filter(pc.and_(
        pc.and_(pc.fill_null(pc.is_in(ours["name"], value_set=pa.array(SYMMETRIC)), False),
                pc.fill_null(pc.is_in(ours["backend"], value_set=pa.array(BLOCKING)), False)),
        pc.and_(pc.is_valid(ours["seq"]),
                pc.and_(pc.is_in(ours["kind"], value_set=pa.array(["enter", "exit"])),
                        pc.invert(pc.fill_null(ours["async_op"], False))))))
    out = {ref: HostClock(ref, 0, 0, 0, "reference", base[ref])}
    agg = calls.select(["host", "group", "seq", "kind", "wall_ns"]).group_by(
        ["host", "group", "seq", "kind"], use_threads=False).aggregate([("wall_ns", "min"), ("wall_ns", "max")])
    table = _by_op(agg)
    for h in hosts:
        if h != ref:
            c = _offset(h, table.get(ref, {}), table.get(h, {}))
            out[h] = HostClock(h, c.offset_ns, c.error_ns, c.ops, c.basis, base[h])
    return out


#: the columns estimate() reads (filtering only these is many times cheaper than the whole table's)
_OWN_COLUMNS = ("host", "rank", "source", "t_ns", "wall_ns", "name", "backend", "seq", "kind", "async_op", "group")


def _own(events: pa.Table) -> pa.Table | None:
    """Our own records with both clocks, when they come from two hosts or more."""
    if events.num_rows == 0:
        return None
    mask = pc.and_(pc.fill_null(pc.equal(events["source"], "events"), False),
                   pc.and_(pc.is_valid(events["t_ns"]), pc.is_valid(events["wall_ns"])))
    # the hosts first, from one column: a one-host run (the common case) never copies its millions of rows
    if len([h for h in pc.unique(events["host"].filter(mask)).to_pylist() if h is not None]) < 2:
        return None
    return events.select(list(_OWN_COLUMNS)).filter(mask)


def _host_bases(ours: pa.Table) -> dict[str, int]:
    """Per host: the smallest (wall - monotonic) of its records (each process's pair is late by how long it was
    descheduled between its two reads, never early)."""
    d = pc.subtract(ours["wall_ns"], ours["t_ns"])
    agg = pa.table({"host": ours["host"], "d": d}).group_by(["host"], use_threads=False).aggregate([("d", "min")])
    return dict(zip(agg["host"].to_pylist(), agg["d_min"].to_pylist()))


def _host_codes(table: pa.Table, hosts: list[str]) -> np.ndarray:
    """Per row: the index of its host in `hosts` (-1 for any other or none), one pass."""
    idx = pc.index_in(table["host"], value_set=pa.array(hosts, pa.string()))
    return np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _rebased(table: pa.Table, base: dict[str, int]) -> pa.Table:
    """Our records' wall_ns as t_ns + their host's base (rows of other hosts, or without t_ns, as they were)."""
    hosts = list(base)
    code = _host_codes(table, hosts)
    known = (code >= 0) & np.asarray(pc.fill_null(pc.and_(pc.equal(table["source"], "events"),
                                                          pc.is_valid(table["t_ns"])), False)
                                     .to_numpy(zero_copy_only=False), dtype=bool)
    if not known.any():
        return table
    offset = np.append(np.array([base[h] for h in hosts], dtype=np.int64), 0)[code]
    wall = np.asarray(pc.fill_null(table["wall_ns"], 0).to_numpy(), dtype=np.int64)
    t = np.asarray(pc.fill_null(table["t_ns"], 0).to_numpy(), dtype=np.int64)
    new = np.where(known, t + offset, wall)
    missing = ~known & np.asarray(pc.is_null(table["wall_ns"]).to_numpy(zero_copy_only=False), dtype=bool)
    return table.set_column(table.schema.get_field_index("wall_ns"), "wall_ns",
                            pa.array(new, pa.int64(), mask=missing if missing.any() else None))


def _by_op(agg: pa.Table) -> dict[str, dict[tuple, tuple[int, int]]]:
    """host -> (group, seq) -> (latest enter, earliest exit), for ops with both."""
    enters = agg.filter(pc.equal(agg["kind"], "enter")).select(["host", "group", "seq", "wall_ns_max"])
    exits = agg.filter(pc.equal(agg["kind"], "exit")).select(["host", "group", "seq", "wall_ns_min"])
    both = enters.join(exits, ["host", "group", "seq"], join_type="inner", use_threads=False)
    out: dict[str, dict[tuple, tuple[int, int]]] = {}
    cols = [both[c].to_pylist() for c in ("host", "group", "seq", "wall_ns_max", "wall_ns_min")]
    for h, g, sq, e, x in zip(*cols):
        out.setdefault(h, {})[(g, sq)] = (e, x)
    return out


def _offset(host: str, ref: dict[tuple, tuple[int, int]], mine: dict[tuple, tuple[int, int]]) -> HostClock:
    common = sorted(set(ref) & set(mine), key=str)
    if not common:
        return HostClock(host, 0, None, 0, "none")
    e_h = np.array([mine[k][0] for k in common], dtype=np.int64)
    x_h = np.array([mine[k][1] for k in common], dtype=np.int64)
    e_r = np.array([ref[k][0] for k in common], dtype=np.int64)
    x_r = np.array([ref[k][1] for k in common], dtype=np.int64)
    lower, upper = e_h - x_r, x_h - e_r
    lo, hi = int(lower.max()), int(upper.min())
    if lo <= hi:
        return HostClock(host, (lo + hi) // 2, (hi - lo + 1) // 2, len(common), "collectives")
    mids = (lower + upper) // 2
    mid = int(np.median(mids))
    spread = int(np.percentile(np.abs(mids - mid), 90)) if mids.size > 1 else int((upper - lower).max())
    return HostClock(host, mid, max(spread, 1), len(common), "approximate")


def align(table: pa.Table, clocks: dict[str, HostClock]) -> pa.Table:
    """`table`'s wall_ns on the reference host's clock: our records (with t_ns) as t_ns + their host's base, every
    row of a host then less that host's offset. Unchanged without clocks (one host)."""
    if not clocks or table.num_rows == 0 or "wall_ns" not in table.column_names:
        return table
    if "t_ns" in table.column_names and "source" in table.column_names:
        table = _rebased(table, {h: c.base_ns for h, c in clocks.items() if c.base_ns is not None})
    shifts = {h: c.offset_ns for h, c in clocks.items() if c.offset_ns}
    if not shifts:
        return table
    hosts = list(shifts)
    offset = np.append(np.array([shifts[h] for h in hosts], dtype=np.int64), 0)[_host_codes(table, hosts)]
    col = table["wall_ns"]
    values = np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=np.int64) - offset
    shifted = pa.array(values, col.type, mask=np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)
                       if col.null_count else None)
    return table.set_column(table.schema.get_field_index("wall_ns"), "wall_ns", shifted)
