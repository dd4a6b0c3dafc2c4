"""One open nsys export's shared state and the helpers every stage uses: the schema (table/column lookup with
``_V<n>`` variants, one :class:`Skipped` per absent table), batched queries (:data:`BATCH_ROWS`), turning row
batches into Arrow tables, the event/observation row builders with the wall clock, and the op-range index that
NVTX ranges fill and kernel attribution reads.

Why separate: the stage modules (:mod:`~analyzers.readers.nsys_nvtx`, :mod:`~analyzers.readers.nsys_cuda`,
:mod:`~analyzers.readers.nsys_observations`, :mod:`~analyzers.readers.nsys_ranks`) each subclass
:class:`_ExportBase`, so they share one state and one way of querying and emitting without depending on each
other; :class:`analyzers.readers.nsys._Export` combines them and runs the stages.
"""
from __future__ import annotations

import bisect
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.base import ReaderError, Skipped
from ranktrace.analyzers.readers.nsys_fields import SOURCE
from ranktrace.analyzers.readers.nsys_sqlite import _looks_like_nsys

__all__ = ["BATCH_ROWS"]

BATCH_ROWS = 50_000


@dataclass(frozen=True)
class _OpRange:
    """An NVTX range that names an op, kept to attribute kernels launched inside it."""

    start: int
    end: float          # inf when open at capture end
    name: str
    category: str
    fields: tuple[tuple[str, Any], ...]  # group/seq/... from ranktrace tokens (empty for other op-like ranges)
    ranktrace: bool


class _ExportBase:
    """One open export's state and the shared helpers; the stages are mixins (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, truncated: str | None = None) -> None:
        self.conn = conn
        self.path = path
        self.file = str(path)
        self.truncated = truncated
        self.failed: list[tuple[str, sqlite3.Error]] = []
        self.skipped: list[Skipped] = []
        self.event_tables: list[pa.Table] = []
        self.obs_tables: list[pa.Table] = []
        self.columns: dict[str, set[str]] = {}
        self.host: str | None = None
        self.clock: tuple[int, int] | None = None  # (utcEpochNs, systemClockNs)
        self.normalized = False
        self.domains: dict[tuple[int, int], str] = {}
        self.op_ranges: dict[tuple[int, int], list[_OpRange]] = defaultdict(list)
        self.op_starts: dict[tuple[int, int], list[int]] = {}
        self.rank_hints: dict[int, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self.world_hints: set[int] = set()
        self.active_pids: set[int] = set()

    # -- schema

    def _load_schema(self) -> None:
        names = [r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        if not _looks_like_nsys(set(names)):
            shown = ", ".join(sorted(names)[:12]) or "none"
            raise ReaderError(self.path, f"SQLite database without Nsight Systems tables (META_DATA_EXPORT / "
                                         f"StringIds + NVTX_EVENTS/CUPTI_*); tables found: {shown}")
        for n in names:
            self.columns[n] = {r[1] for r in self.conn.execute(f'PRAGMA table_info("{n}")')}

    def _resolve(self, base: str) -> str | None:
        """The table's name in this export: exact, else its highest ``_V<n>`` variant, else None."""
        if base in self.columns:
            return base
        variants = sorted((n for n in self.columns if re.fullmatch(re.escape(base) + r"_V\d+", n)),
                          key=lambda n: int(n.rsplit("_V", 1)[1]))
        return variants[-1] if variants else None

    def _table(self, base: str, needed: Sequence[str] = (), why: str = "") -> str | None:
        """Resolve a table name (see _resolve); one Skipped when it is absent or lacks needed columns."""
        name = self._resolve(base)
        if name is None:
            self._skip(f"table {base} absent (nsys creates tables only when it has such data): {why}")
            return None
        missing = [c for c in needed if c not in self.columns[name]]
        if missing:
            self._skip(f"table {name} lacks column(s) {', '.join(missing)}: {why}")
            return None
        return name

    def _has(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, set())

    def _skip(self, reason: str, line: int | None = None) -> None:
        self.skipped.append(Skipped(self.file, line, reason))

    def _batches(self, sql: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
        cur = self.conn.execute(sql, params)
        while True:
            rows = cur.fetchmany(BATCH_ROWS)
            if not rows:
                return
            yield rows

    def _emit_events(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.event_tables.append(schema.table_from_rows(schema.EVENTS, rows))

    def _emit_obs(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.obs_tables.append(schema.table_from_rows(schema.OBSERVATIONS, rows))

    def _string_ids(self, predicate: str) -> dict[int, str]:
        """StringIds rows matching an SQL predicate on ``value`` (kernel or API names: a few dozen at most).

        Filtering the dictionary first and joining by ``IN (ids)`` keeps the big activity tables to one scan each,
        whatever plan SQLite would pick for a join (nsys exports have no indexes).
        """
        return {int(i): str(v) for i, v in self.conn.execute(f"SELECT id, value FROM StringIds WHERE {predicate}")}

    # -- wall clock (clock and normalization set by the metadata/host stages)

    def _wall(self, t: int | None) -> int | None:
        if t is None or self.clock is None:
            return None
        utc, sys_clock = self.clock
        return utc + int(t) if self.normalized else utc + (int(t) - sys_clock)

    # -- row builders

    def _event(self, pid: int | None, tid: int | None, t: int | None, kind: str, **kw: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"host": self.host, "pid": pid, "tid": tid, "t_ns": None if t is None else int(t),
                               "wall_ns": self._wall(t), "kind": kind, "source": SOURCE, "file": self.file}
        row.update(kw)
        return row

    def _obs(self, pid: int | None, tid: int | None, kind: str, **kw: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"host": self.host, "pid": pid, "tid": tid, "kind": kind, "source": SOURCE,
                               "file": self.file}
        row.update(kw)
        return row

    # -- op ranges (filled by the NVTX stage, read by kernel attribution)

    def _op_at(self, pid: int | None, tid: int | None, t: int | None) -> _OpRange | None:
        """Innermost op range on (pid, tid) containing t; ranktrace ranges win over other op-like ranges."""
        if pid is None or tid is None or t is None:
            return None
        starts = self.op_starts.get((pid, tid))
        if not starts:
            return None
        ranges = self.op_ranges[(pid, tid)]
        i = bisect.bisect_right(starts, t)
        best: _OpRange | None = None
        for r in reversed(ranges[max(0, i - 256):i]):
            if r.start <= t <= r.end:
                if r.ranktrace:
                    return r
                best = best or r
        return best
