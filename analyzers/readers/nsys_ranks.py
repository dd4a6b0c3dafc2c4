"""Ranks for an nsys export: pid → rank (and world) from the hints the other stages collected, in order of trust,
plus the launch-environment ``RANK=`` hint; and filling the null ``rank``/``world`` columns of the finished Arrow
tables from those maps.

Why separate: rank identity is decided once, after every stage has run, from evidence spread over several tables;
keeping the rules in one place makes "never guessed" easy to check.
"""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.readers.nsys_export import _ExportBase


class _RankStages(_ExportBase):
    """Stage: ranks (run last, after the stages that collect rank hints)."""

    # -- ranks

    def _resolve_ranks(self) -> tuple[dict[int, int], dict[int, int]]:
        """pid → rank from the hints, in order of trust; conflicting values from one source are dropped."""
        self._env_rank_hint()
        order = ("MPI_RANKS", "ranktrace NVTX rank=", "NVTX text rank=", "process name", "launch environment RANK=")
        pid_rank: dict[int, int] = {}
        rows = []
        for pid, by_source in sorted(self.rank_hints.items()):
            for src in order:
                values = by_source.get(src)
                if values and len(values) == 1:
                    pid_rank[pid] = next(iter(values))
                    rows.append(self._obs(pid, None, "pid_rank", rank=pid_rank[pid], value=pid_rank[pid],
                                          detail=f"rank from {src}"))
                    break
        self._emit_obs(rows)
        world = next(iter(self.world_hints)) if len(self.world_hints) == 1 else None
        pid_world = {pid: world for pid in pid_rank} if world is not None else {}
        return pid_rank, pid_world

    def _env_rank_hint(self) -> None:
        if "META_DATA_CAPTURE" not in self.columns or len(self.active_pids) != 1:
            return
        for name, value in self.conn.execute("SELECT name, value FROM META_DATA_CAPTURE "
                                             "WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"):
            m = re.fullmatch(r'(RANK|WORLD_SIZE)="?(\d+)"?', str(value or "").strip())
            if m and m.group(1) == "RANK":
                self.rank_hints[next(iter(self.active_pids))]["launch environment RANK="].add(int(m.group(2)))
            elif m:
                self.world_hints.add(int(m.group(2)))


def _fill_identity(table: pa.Table, pid_rank: dict[int, int], pid_world: dict[int, int]) -> pa.Table:
    """Fill null ``rank``/``world`` from the pid maps (vectorised; rows that already carry a rank keep it)."""
    if table.num_rows == 0:
        return table
    for column, mapping, typ in (("rank", pid_rank, pa.int32()), ("world", pid_world, pa.int32())):
        if not mapping or column not in table.column_names:
            continue
        keys = pa.array(list(mapping), pa.int64())
        values = pa.array(list(mapping.values()), typ)
        looked_up = pc.take(values, pc.index_in(table["pid"], value_set=keys))
        merged = pc.coalesce(table[column], looked_up)
        table = table.set_column(table.column_names.index(column), column, merged)
    return table
