"""Several data-parallel worlds in one run, kept apart.

SGLang without DP attention (and vLLM's external DP) starts one torch.distributed world per DP replica: every replica
has its own rank 0..tp-1, so two processes say "rank 0" and mean different GPUs. Their rings tell them apart by the
roles a profile read (process title ``sglang::scheduler_DP1_TP0``, ``VLLM::Worker_DP1_TP0``): when processes of
different DP replicas claim the same rank, each replica becomes its own block of ranks (``dp * world + rank``) and its
groups its own channels (``dp1:<group>``), so the wait-for graph never pairs rank 0 of one replica with rank 0 of
another. With DP attention (one world, global ranks) no rank is claimed twice and nothing changes.

Worked example: DP2 x TP2. Ring A: rank 0, DP0; ring B: rank 0, DP1; ring C: rank 1, DP0; ring D: rank 1, DP1.
Rank 0 is claimed by DP0 and DP1 -> separate worlds of 2: A stays rank 0, C rank 1, B becomes rank 2, D rank 3;
B's group "2" becomes "dp1:2", so A's all_reduce on "2" seq 5 and B's never meet.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["separate_dp_worlds"]

_DP = re.compile(r"\bDP(\d+)\b")


def separate_dp_worlds(events: pa.Table, stacks: pa.Table, observations: pa.Table) -> tuple[pa.Table, pa.Table,
                                                                                             pa.Table, int | None]:
    """(events, stacks, observations, world) with DP replicas that reuse ranks moved to ranks of their own; the
    tables unchanged (world None) when no rank is claimed by two replicas."""
    if events.num_rows == 0:
        return events, stacks, observations, None
    ids = events.filter(pc.and_(pc.equal(events["kind"], "identity"), pc.equal(events["name"], "roles")))
    dp_of: dict[tuple[Any, Any], int] = {}
    for r in ids.select(["host", "pid", "detail"]).to_pylist():
        m = _DP.search(r["detail"] or "")
        if m:
            dp_of[(r["host"], r["pid"])] = int(m.group(1))
    if len(set(dp_of.values())) < 2:
        return events, stacks, observations, None
    ranked = events.filter(pc.is_valid(events["rank"])).select(["host", "pid", "rank", "world"])
    claims: dict[int, set[int]] = {}
    worlds: list[int] = []
    for r in ranked.group_by(["host", "pid", "rank"], use_threads=False).aggregate([("world", "max")]).to_pylist():
        dp = dp_of.get((r["host"], r["pid"]))
        if dp is not None:
            claims.setdefault(r["rank"], set()).add(dp)
            if r["world_max"]:
                worlds.append(r["world_max"])
    if not any(len(d) > 1 for d in claims.values()):
        return events, stacks, observations, None
    world = max(worlds) if worlds else max(claims) + 1
    n_dp = max(dp_of.values()) + 1

    def remap(t: pa.Table, groups: bool) -> pa.Table:
        if t.num_rows == 0:
            return t
        keys = list(zip(t["host"].to_pylist(), t["pid"].to_pylist()))
        dp = np.array([dp_of.get(k, -1) for k in keys])
        if not (dp > 0).any():
            return t
        rank = t["rank"].to_numpy(zero_copy_only=False)
        mask = pc.is_null(t["rank"]).to_numpy(zero_copy_only=False)
        new = np.where(dp > 0, np.nan_to_num(rank.astype(float), nan=0) + dp * world, rank).astype(np.int64)
        t = t.set_column(t.schema.get_field_index("rank"), "rank", pa.array(new, pa.int32(), mask=mask))
        if groups and "group" in t.column_names:
            g = t["group"].to_pylist()
            t = t.set_column(t.schema.get_field_index("group"), "group",
                             pa.array([f"dp{d}:{x}" if d > 0 and x is not None else x for d, x in zip(dp, g)],
                                      pa.string()))
            gr = t["group_ranks"].to_pylist()
            t = t.set_column(t.schema.get_field_index("group_ranks"), "group_ranks",
                             pa.array([[m + d * world for m in x] if d > 0 and x else x for d, x in zip(dp, gr)],
                                      pa.list_(pa.int32())))
        if "world" in t.column_names:
            w = t["world"].to_pylist()
            t = t.set_column(t.schema.get_field_index("world"), "world",
                             pa.array([world * n_dp if x else x for x in w], pa.int32()))
        return t

    return remap(events, True), remap(stacks, False), remap(observations, False), world * n_dp
