"""``samples/stacks.arrow``: the monitor's periodic stack samples (py-spy, else the ranks' agents) as stack records,
and how long each thread's stack has stood still."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.common.stacks import StackRecord, stacks_table

__all__ = ["MAX_SNAPSHOTS", "read_stacks"]

MAX_SNAPSHOTS = 6


def read_stacks(t: pa.Table, host: str | None, file: str, with_stacks: bool) -> tuple[pa.Table, pa.Table]:
    """STACKS of the last ``MAX_SNAPSHOTS`` samples per process (``with_stacks``) and one ``stack_change``
    observation per thread: seconds its stack has not changed as of its last sample."""
    t = t.append_column("_row", pa.array(range(t.num_rows), pa.int64()))
    defs = t.filter(pc.equal(t["kind"], "stack"))
    samples = t.filter(pc.and_(pc.equal(t["kind"], "sample"), pc.is_valid(t["stack_id"])))
    if samples.num_rows == 0:
        return schema.empty(schema.STACKS), schema.empty(schema.OBSERVATIONS)
    # stack_change: per thread, seconds since its stack last changed (first sample counts as a change)
    changed = pc.fill_null(samples["changed"], True)
    s2 = samples.append_column("_chg", changed).append_column("_chg_i", pc.cast(changed, pa.int64()))
    per = s2.group_by(["pid", "tid"], use_threads=False).aggregate(
        [("wall_ns", "max"), ("wall_ns", "count"), ("_chg_i", "sum"), ("thread_name", "last"), ("rank", "last")])
    lastchg = s2.filter(s2["_chg"]).group_by(["pid", "tid"], use_threads=False).aggregate([("wall_ns", "max")])
    last_change = {(r["pid"], r["tid"]): r["wall_ns_max"] for r in lastchg.to_pylist()}
    obs = []
    for r in per.to_pylist():
        lc = last_change.get((r["pid"], r["tid"]), r["wall_ns_max"])
        still = max(0, (r["wall_ns_max"] - lc) // 1_000_000_000)
        obs.append({"host": host, "pid": r["pid"], "tid": r["tid"], "rank": r["rank_last"], "wall_ns": r["wall_ns_max"],
                    "kind": "stack_change", "name": r["thread_name_last"], "value": int(still),
                    "detail": f"samples={r['wall_ns_count']} changes={r['_chg_i_sum'] - 1} unchanged_s={still}",
                    "source": "pyspy", "file": file})
    obs_table = schema.table_from_rows(schema.OBSERVATIONS, obs)
    if not with_stacks:
        return schema.empty(schema.STACKS), obs_table
    # the last MAX_SNAPSHOTS samples of each process
    pairs = samples.group_by(["pid", "sample_id"], use_threads=False).aggregate([]).sort_by(
        [("pid", "ascending"), ("sample_id", "descending")])
    keep: list[int] = []
    count: dict[Any, int] = {}
    for pid, sid in zip(pairs["pid"].to_pylist(), pairs["sample_id"].to_pylist()):
        if count.get(pid, 0) < MAX_SNAPSHOTS:
            count[pid] = count.get(pid, 0) + 1
            keep.append((pid << 24) ^ sid)
    key = pc.bit_wise_xor(pc.shift_left(samples["pid"], 24), samples["sample_id"])
    kept = samples.filter(pc.is_in(key, value_set=pa.array(keep, pa.int64())))
    idx = pc.index_in(kept["stack_id"], value_set=defs["stack_id"])
    frames = defs["frames"].take(idx).to_pylist()
    rows = kept.select(["pid", "tid", "rank", "wall_ns", "t_ns", "thread_name", "thread_state", "sample_id",
                        "_row"]).to_pylist()
    records = [StackRecord("pyspy", file, r["_row"], fr, tid=r["tid"], thread_name=r["thread_name"],
                           state=r["thread_state"], pid=r["pid"], rank=r["rank"], host=host, wall_ns=r["wall_ns"],
                           t_ns=r["t_ns"], snapshot=None if r["sample_id"] is None or r["pid"] is None
                           else f"stacks.arrow[sample {r['sample_id']} pid {r['pid']}]")
               for r, fr in zip(rows, frames)]
    return stacks_table(records), obs_table
