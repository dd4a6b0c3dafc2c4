"""Opening an nsys SQLite export and querying it: the file checks done before SQLite sees it (missing, empty, cut,
shorter than its header says), the read-only connection, nsys detection, error wording, and ``Export``: one open
export's state with schema lookup (``_V<n>`` variants), batched queries, row builders and the op-range index."""
from __future__ import annotations

import bisect
import re
import sqlite3
import struct
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReaderError, Skipped
from ranktrace.analyzers.readers.nsys.decode import SOURCE

__all__ = ["BATCH_ROWS", "SQLITE_MAGIC", "SQLITE_BUDGET_S", "over_budget", "is_lock_error", "unreadable", "check_file", "connect", "looks_like_nsys",
           "OpRange", "Export"]

SQLITE_MAGIC = b"SQLite format 3\x00"
_LOCK_TIMEOUT_S = 0.5
# The SQLite work one file may cost (docs/SAFETY.md): a view that never ends (a recursive CTE in a 12 KB file) would
# hold the analysis forever. Every query of a connection runs under one deadline, checked every _PROGRESS_STEPS
# virtual-machine steps; past it each query fails with "interrupted" and the stages say so (the rest is used).
SQLITE_BUDGET_S = 300.0
_PROGRESS_STEPS = 20_000


def is_lock_error(e: sqlite3.Error) -> bool:
    return "locked" in str(e).lower() or "busy" in str(e).lower()


def unreadable(e: sqlite3.Error, truncated: str | None) -> str:
    return f"{truncated}; nothing readable ({e})" if truncated else \
        f"unreadable SQLite database ({e}); truncated or corrupt export?"


def check_file(path: Path) -> str | None:
    """Refuse what SQLite would open lazily and fail on later: missing, empty, non-SQLite files, and files cut
    inside the first page. A file shorter than its header declares is read as far as it goes: returns a note."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if size == 0:
        raise ReaderError(path, "empty file, expected an Nsight Systems SQLite export")
    if not header.startswith(SQLITE_MAGIC):
        raise ReaderError(path, "not an SQLite database (no 'SQLite format 3' header); "
                                "export the report with `nsys export --type sqlite`")
    if len(header) < 100:
        raise ReaderError(path, f"truncated SQLite header ({len(header)} of 100 bytes)")
    note = _short_by(header, size)
    page_size = struct.unpack(">H", header[16:18])[0]
    if note and size < (65536 if page_size == 1 else page_size):
        raise ReaderError(path, f"{note}: not even the first page (schema) is there")
    return note


def _short_by(header: bytes, size: int) -> str | None:
    """A note when the file is shorter than the page count its SQLite header declares (an interrupted export or
    copy), else None."""
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, n_pages, valid_for = (struct.unpack(">I", header[i:i + 4])[0] for i in (24, 28, 92))
    if n_pages and change_counter == valid_for and size < n_pages * page_size:
        return (f"truncated SQLite database: header declares {n_pages} pages of {page_size} bytes "
                f"({n_pages * page_size} bytes), file has {size} bytes (interrupted export or copy?)")
    return None


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection. For a truncated file, ``writable_schema`` makes SQLite use the pages that are there
    instead of refusing the whole file (nothing can be written: the connection is read-only); tables whose pages
    are missing then fail one by one."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=_LOCK_TIMEOUT_S)
    except sqlite3.Error as e:
        raise ReaderError(path, f"cannot open as SQLite: {e}") from e
    deadline = time.monotonic() + SQLITE_BUDGET_S
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, _PROGRESS_STEPS)
    if len(_deadlines) > 256:  # connections long closed (a watchdog re-reads exports): their entries go
        _deadlines.clear()
    _deadlines[id(conn)] = deadline
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
        if len(header) == 100 and _short_by(header, path.stat().st_size):
            conn.execute("PRAGMA writable_schema=ON")
    except (OSError, sqlite3.Error):
        pass
    return conn


_deadlines: dict[int, float] = {}


def over_budget(conn: sqlite3.Connection) -> bool:
    """The connection's time bound (SQLITE_BUDGET_S) has passed: its queries are interrupted from here on."""
    d = _deadlines.get(id(conn))
    return d is not None and time.monotonic() > d


def looks_like_nsys(names: set[str]) -> bool:
    if {"META_DATA_EXPORT", "EXPORT_META_DATA"} & names:
        return True
    markers = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_", "TARGET_INFO_", "ThreadNames", "ENUM_NSYS_")
    return "StringIds" in names and any(n.startswith(markers) for n in names)


BATCH_ROWS = 50_000


@dataclass(frozen=True)
class OpRange:
    """An NVTX range that names an op, kept to attribute kernels launched inside it."""

    start: int
    end: float          # inf when open at capture end
    name: str
    category: str
    fields: tuple[tuple[str, Any], ...]  # group/seq/... from ranktrace tokens (empty for other op-like ranges)
    ranktrace: bool


class Export:
    """One open export: its state, filled by the stages (functions of :mod:`.events` and :mod:`.observations` that
    take it), and the helpers they share: schema lookup, batched queries, row builders, the op-range index."""

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
        self.budget_said = False   # the time bound's line was said (nsys._stage)
        self.domains: dict[tuple[int, int], str] = {}
        self.op_ranges: dict[tuple[int, int], list[OpRange]] = defaultdict(list)
        self.op_starts: dict[tuple[int, int], list[int]] = {}
        self.rank_hints: dict[int, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self.world_hints: set[int] = set()
        self.active_pids: set[int] = set()

    # -- schema

    def load_schema(self) -> None:
        names = [r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        if not looks_like_nsys(set(names)):
            shown = ", ".join(sorted(names)[:12]) or "none"
            raise ReaderError(self.path, f"SQLite database without Nsight Systems tables (META_DATA_EXPORT / "
                                         f"StringIds + NVTX_EVENTS/CUPTI_*); tables found: {shown}")
        for n in names:
            self.columns[n] = {r[1] for r in self.conn.execute(f'PRAGMA table_info("{n}")')}

    def resolve(self, base: str) -> str | None:
        """The table's name in this export: exact, else its highest ``_V<n>`` variant, else None."""
        if base in self.columns:
            return base
        variants = sorted((n for n in self.columns if re.fullmatch(re.escape(base) + r"_V\d+", n)),
                          key=lambda n: int(n.rsplit("_V", 1)[1]))
        return variants[-1] if variants else None

    def table(self, base: str, needed: Sequence[str] = (), why: str = "") -> str | None:
        """Resolve a table name (see _resolve); one Skipped when it is absent or lacks needed columns."""
        name = self.resolve(base)
        if name is None:
            self.skip(f"table {base} absent (nsys creates tables only when it has such data): {why}")
            return None
        missing = [c for c in needed if c not in self.columns[name]]
        if missing:
            self.skip(f"table {name} lacks column(s) {', '.join(missing)}: {why}")
            return None
        return name

    def has(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, set())

    def skip(self, reason: str, line: int | None = None) -> None:
        self.skipped.append(Skipped(self.file, line, reason))

    def batches(self, sql: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
        cur = self.conn.execute(sql, params)
        while True:
            rows = cur.fetchmany(BATCH_ROWS)
            if not rows:
                return
            yield rows

    def emit_events(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.event_tables.append(schema.table_from_rows(schema.EVENTS, rows))

    def emit_obs(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.obs_tables.append(schema.table_from_rows(schema.OBSERVATIONS, rows))

    def string_ids(self, predicate: str) -> dict[int, str]:
        """StringIds rows matching an SQL predicate on ``value`` (kernel or API names: a few dozen at most).

        Filtering the dictionary first and joining by ``IN (ids)`` keeps the big activity tables to one scan each,
        whatever plan SQLite would pick for a join (nsys exports have no indexes).
        """
        return {int(i): str(v) for i, v in self.conn.execute(f"SELECT id, value FROM StringIds WHERE {predicate}")}

    # -- wall clock (clock and normalization set by the metadata/host stages)

    def wall(self, t: int | None) -> int | None:
        if t is None or self.clock is None:
            return None
        utc, sys_clock = self.clock
        return utc + int(t) if self.normalized else utc + (int(t) - sys_clock)

    # -- row builders

    def event(self, pid: int | None, tid: int | None, t: int | None, kind: str, **kw: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"host": self.host, "pid": pid, "tid": tid, "t_ns": None if t is None else int(t),
                               "wall_ns": self.wall(t), "kind": kind, "source": SOURCE, "file": self.file}
        row.update(kw)
        return row

    def obs(self, pid: int | None, tid: int | None, kind: str, **kw: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"host": self.host, "pid": pid, "tid": tid, "kind": kind, "source": SOURCE,
                               "file": self.file}
        row.update(kw)
        return row

    # -- op ranges (filled by the NVTX stage, read by kernel attribution)

    def op_at(self, pid: int | None, tid: int | None, t: int | None) -> OpRange | None:
        """Innermost op range on (pid, tid) containing t; ranktrace ranges win over other op-like ranges."""
        if pid is None or tid is None or t is None:
            return None
        starts = self.op_starts.get((pid, tid))
        if not starts:
            return None
        ranges = self.op_ranges[(pid, tid)]
        i = bisect.bisect_right(starts, t)
        best: OpRange | None = None
        for r in reversed(ranges[max(0, i - 256):i]):
            if r.start <= t <= r.end:
                if r.ranktrace:
                    return r
                best = best or r
        return best
