"""Reader for Nsight Systems SQLite exports (``nsys export --type sqlite``).

Why: a user who profiled a hung job with ``nsys profile`` already holds per-rank evidence of what each process
was inside when the capture ended: NVTX ranges that never closed (ranktrace's own op ranges, PyTorch ``emit_nvtx``
ranges, NCCL's API ranges), NCCL kernels that finished, and kernel launches whose kernel never finished. This
module turns one export into the common tables (``analyzers.schema``) so the same wait-for engine can use it.

What comes out (reference: ``shared/reference/formats.md`` §2):

* EVENTS, ``source="nsys"``, ``file`` = the export, ``line`` = the SQLite ``rowid`` of the source row (the table is
  implied by the row: NVTX ranges/marks from ``NVTX_EVENTS``; kernels from ``CUPTI_ACTIVITY_KIND_KERNEL``;
  pending launches and sync calls from ``CUPTI_ACTIVITY_KIND_RUNTIME``).

  - NVTX ranges → ``enter`` at start, ``exit`` at end. A range still open at capture end (``end`` NULL, or event
    types 35/37 "push/start without pop/end") has only ``enter`` with ``detail="open at capture end"``; an end
    without a start (types 36/38, opened before the capture) has only ``exit`` with
    ``detail="opened before capture"``. Ranges in domain ``ranktrace`` whose text starts with an op
    (``all_reduce group=default_pg seq=12``) get ``category`` collective/p2p, ``name`` = ``canonical_op`` and the
    ``key=value`` tokens (:data:`NVTX_TOKENS`); every other range is ``category="user"`` with its raw text as
    ``name``. NVTX marks → ``mark``.
  - NCCL kernels (short name ``nccl*``: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_...``) →
    ``enter`` at kernel start and ``complete`` at kernel end with ``state="completed"`` (the GPU finished it: a
    ``complete`` row, as schema.py defines, never an ``exit``, which only means a host call returned).
    ``category`` p2p for SendRecv kernels, else collective. When the launching CUDA call lies inside an op range
    on the launching thread, the kernel rows take that range's ``name``/``group``/``seq`` (so rank 0's completed
    kernel of ``all_reduce`` seq 12 lines up with rank 1's), else ``name = canonical_op(<kernel op>)``.
  - **An unfinished kernel is absent, not open**: CUPTI writes a kernel row only when the kernel completes. Every
    kernel launch (``*LaunchKernel*``, ``*LaunchCooperativeKernel*``, ``*GraphLaunch*``) and every ``*Memcpy*``
    call with no matching kernel/memcpy row (same PID and ``correlationId``) becomes one ``enter`` row with
    ``detail="launched, no completion recorded"`` and ``state="scheduled"``; it takes the enclosing op range's
    name/group/seq as above, otherwise ``name="kernel_launch"``/``"memcpy"``, ``category="user"``.
  - Host-blocking CUDA calls (``*Synchronize*`` and non-async ``*Memcpy*``) → ``enter``/``exit``,
    ``category="sync"``, ``name`` = API name without its ``_vNNNN`` suffix. Other API calls are not emitted.

* OBSERVATIONS, ``source="nsys"`` (kinds listed in :data:`OBSERVATION_KINDS`): processes, thread names, GPUs,
  CUDA devices per process, the pid→rank evidence, the capture window, profiler diagnostics, and the captured
  stdout/stderr of profiled processes (``nsys_stream_text``: one row per line, ``name`` = stream file name,
  ``detail`` = the line, ``line`` = line number *inside that stream*; NCCL_DEBUG output lands here when the user
  set no ``NCCL_DEBUG_FILE``: hand these lines to the NCCL log parser).

Identities: ``pid``/``tid`` are decoded from ``globalTid``/``globalPid`` (bits 24–47 / 0–23, formats.md §2.4),
i.e. PIDs as nsys saw them (container namespace, truncated to 24 bits). ``rank`` per pid, first source wins:
``MPI_RANKS`` table; ``rank=N`` token in a ``ranktrace``-domain NVTX text; an unambiguous ``rank=N`` in any NVTX
text of that pid; a process name like ``..._rank3``/``..._TP3``; ``RANK=`` in the launch environment when exactly
one process shows CUDA/NVTX activity. Without any, ``rank`` stays null (never guessed from pid order or device).

Time: ``t_ns`` is the raw nsys session-clock timestamp (ns). ``wall_ns = utcEpochNs + (t - systemClockNs)`` from
``TARGET_INFO_SESSION_START_TIME`` (+ ``utcEpochNs + t`` when the export was time-normalized). Both rules are
**unverified** on multi-node captures (formats.md §2.3): compare hosts by wall clock with care.

Bounded memory: every large table is read with ``fetchmany`` in batches of :data:`BATCH_ROWS`, each batch turned
into an Arrow table at once; only op ranges (for kernel attribution) and small lookup tables stay in Python.

Bad input: a missing/empty/non-SQLite file, one cut inside its first page, a locked database (another process
holds an exclusive lock, e.g. nsys still writing: retry), a SQLite file without the nsys tables, or one whose
schema page is unreadable → :class:`ReaderError` naming the file. Otherwise what is readable is used: a database
shorter than its header declares (interrupted export or copy) is opened with ``writable_schema`` on the
read-only connection so SQLite reads the pages that are there, and each stage (processes, NVTX, kernels, ...)
that meets a missing or corrupt page becomes one :class:`Skipped` (keeping the batches read before it), plus one
note for the truncation. Tables that are absent (nsys creates tables lazily) or lack a needed column → one
:class:`Skipped` each, and the rest is still read.

Known limits: NVTX extended payloads (NCCL communicator id, message size, NCCL's own ``Rank``) are not decoded;
kernel → op attribution needs the launching CUDA call (runtime tracing) and an op range on the same thread;
PyTorch ``emit_nvtx`` ranges (``nccl:all_reduce, op_id = 7``) and NCCL-domain ranges stay ``category="user"``
(they carry no group/seq) but still name kernels launched inside them; multiple GPUs per process are reported
per kernel (``pid_device``) but not mapped to ranks; ``_V2``/``_V3`` table name suffixes are resolved by prefix.
"""
from __future__ import annotations

import bisect
import re
import sqlite3
import struct
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from analyzers import schema
from analyzers.opnames import COLLECTIVE_OPS, P2P_OPS, canonical_op
from analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = [
    "FORMAT",
    "sniff",
    "read",
    "FieldMap",
    "FIELD_MAP",
    "NVTX_TOKENS",
    "OBSERVATION_KINDS",
    "BATCH_ROWS",
    "OPEN_AT_END",
    "OPENED_BEFORE",
    "NO_COMPLETION",
    "decode_global_tid",
    "parse_nccl_kernel_name",
]

FORMAT = "nsys"
SOURCE = "nsys"
BATCH_ROWS = 50_000
OPEN_AT_END = "open at capture end"
OPENED_BEFORE = "opened before capture"
NO_COMPLETION = "launched, no completion recorded"
RANKTRACE_DOMAIN = "ranktrace"

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LOCK_TIMEOUT_S = 0.5
_T = TypeVar("_T")
_MASK24 = 0xFFFFFF


class FieldMap(NamedTuple):
    """One raw field of the export and where it goes (the reader's declared mapping, style.md point 3)."""

    raw: str        # TABLE.column (or a derived quantity)
    column: str     # TABLE.column in analyzers.schema ('' = used only inside the reader)
    type: str       # raw type and unit
    default: Any    # value when the raw field is absent/NULL
    since: str      # first export schema/version known to have it ('all' = every known export)


FIELD_MAP: tuple[FieldMap, ...] = (
    FieldMap("globalTid >> 24 & 0xFFFFFF", "EVENTS.pid", "int (24 bit)", None, "all"),
    FieldMap("globalTid & 0xFFFFFF", "EVENTS.tid", "int (24 bit)", None, "all"),
    FieldMap("NVTX_EVENTS.start", "EVENTS.t_ns", "int ns, session clock", None, "all"),
    FieldMap("NVTX_EVENTS.end", "EVENTS.t_ns (exit row)", "int ns, NULL = open", None, "all"),
    FieldMap("NVTX_EVENTS.eventType", "EVENTS.kind", "enum 34 mark, 59/60 range, 35/37 open, 36/38 end-only",
             None, "all"),
    FieldMap("COALESCE(NVTX_EVENTS.text, StringIds[textId])", "EVENTS.name / EVENTS.detail", "str", None,
             "textId: ~2021+"),
    FieldMap("NVTX_EVENTS.domainId → eventType 75 text", "EVENTS.category (ranktrace → op)", "int", 0, "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_KERNEL.shortName → StringIds", "EVENTS.name/dtype/category/detail", "str", None,
             "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_KERNEL.start/end", "EVENTS.t_ns (enter/exit)", "int ns", None, "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_KERNEL.correlationId", "", "int, per process", None, "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_KERNEL.graphId", "EVENTS.graph_id", "int", None, "3.x"),
    FieldMap("CUPTI_ACTIVITY_KIND_RUNTIME.nameId → StringIds", "EVENTS.name (sync) / launch detection", "str", None,
             "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_RUNTIME.correlationId", "", "int, joins KERNEL/MEMCPY", None, "all"),
    FieldMap("CUPTI_ACTIVITY_KIND_MEMCPY.correlationId", "", "int", None, "all"),
    FieldMap("TARGET_INFO_SESSION_START_TIME.utcEpochNs/systemClockNs", "EVENTS.wall_ns", "int ns", None,
             "unverified rule"),
    FieldMap("TARGET_INFO_SYSTEM_ENV[Hostname]", "*.host", "str", None, "all"),
    FieldMap("PROCESSES(globalPid, pid, name)", "OBSERVATIONS nsys_process", "", None, "all"),
    FieldMap("ThreadNames(nameId, globalTid)", "OBSERVATIONS nsys_thread", "", None, "all"),
    FieldMap("TARGET_INFO_GPU(id, name, busLocation, uuid, totalMemory, computeMajor/Minor)",
             "OBSERVATIONS gpu_device", "", None, "optional"),
    FieldMap("TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid, uuid)", "OBSERVATIONS cuda_device", "", None, "optional"),
    FieldMap("ProcessStreams(globalPid, filenameId, contentId)", "OBSERVATIONS nsys_stream_text", "", None,
             "2024+"),
    FieldMap("MPI_RANKS(globalTid, rank)", "EVENTS.rank", "int", None, "with --trace mpi (unverified)"),
    FieldMap("META_DATA_CAPTURE[PROCESS_0:ENVIRONMENT_VARIABLE] RANK/WORLD_SIZE", "EVENTS.rank/world", "str", None,
             "all"),
    FieldMap("META_DATA_EXPORT | EXPORT_META_DATA [EXPORT_PRODUCT_VERSION, EXPORT_SCHEMA_VERSION]",
             "ReadResult.version", "str", None, "both names probed"),
    FieldMap("ANALYSIS_DETAILS.startTime/stopTime", "OBSERVATIONS nsys_capture_window", "int ns", None, "2024+"),
    FieldMap("DIAGNOSTIC_EVENT.text", "OBSERVATIONS nsys_diagnostic", "str", None, "all"),
)

# key=value tokens understood in ranktrace-domain NVTX texts ("all_reduce group=default_pg seq=12").
NVTX_TOKENS: dict[str, tuple[str, type]] = {
    "group": ("group", str),
    "pg": ("group", str),
    "desc": ("group_desc", str),
    "group_desc": ("group_desc", str),
    "backend": ("backend", str),
    "seq": ("seq", int),
    "backend_seq": ("backend_seq", int),
    "peer": ("peer", int),
    "nbytes": ("nbytes", int),
    "dtype": ("dtype", str),
    "shape": ("shape", str),
    "graph_id": ("graph_id", int),
    "span": ("span_id", int),
    "span_id": ("span_id", int),
}

OBSERVATION_KINDS: dict[str, str] = {
    "nsys_process": "pid, name = process name (PROCESSES)",
    "nsys_thread": "pid, tid, name = OS thread name (ThreadNames, 15 chars)",
    "gpu_device": "name = GPU id, value = total memory MiB, detail = model; bus; uuid; compute capability",
    "cuda_device": "pid, name = CUDA ordinal in that process, value = GPU id, detail = uuid",
    "pid_device": "pid, name = CUDA deviceId its kernels ran on, value = number of kernels",
    "pid_rank": "pid, rank (and world when known), detail = which evidence gave the rank",
    "nsys_capture_window": "value = capture stop (session clock ns), detail = start/stop/duration",
    "nsys_diagnostic": "pid, detail = profiler diagnostic text (e.g. lost events)",
    "nsys_stream_text": "pid, name = stream file name, detail = one captured stdout/stderr line, line = its number",
}

# NVTX event types (formats.md §2.5)
_NVTX_MARKS = (34, 65)
_NVTX_RANGES = (59, 60, 70, 71)
_NVTX_OPEN = (35, 37, 66, 68)
_NVTX_END_ONLY = (36, 38, 67, 69)
_NVTX_DOMAIN_CREATE = 75

_BACKEND_PREFIX = re.compile(r"^(nccl|gloo|xccl|ucc|mpi|hccl|rccl|cncl):", re.IGNORECASE)
_RANK_TOKEN = re.compile(r"(?<![A-Za-z0-9_])rank\s*[=:]\s*(\d+)", re.IGNORECASE)
_WORLD_TOKEN = re.compile(r"(?<![A-Za-z0-9_])(?:world|world_size)\s*[=:]\s*(\d+)", re.IGNORECASE)
_RANKTRACE_TEXT = re.compile(r"^[a-z_]+(?: [a-z_]+=\S+)*? (?:group|seq)=\S+")
_PROC_RANK = re.compile(r"(?:rank[_=]?|_TP)(\d+)(?!\d)", re.IGNORECASE)
_API_VERSION = re.compile(r"_v\d+$")
_KERNEL_DTYPES = {
    "f32": "float32", "float": "float32", "f16": "float16", "half": "float16", "bf16": "bfloat16",
    "__nv_bfloat16": "bfloat16", "f64": "float64", "double": "float64", "i8": "int8", "int8_t": "int8",
    "u8": "uint8", "uint8_t": "uint8", "i32": "int32", "int32_t": "int32", "int": "int32", "u32": "uint32",
    "uint32_t": "uint32", "i64": "int64", "int64_t": "int64", "u64": "uint64", "uint64_t": "uint64",
    "f8e4m3": "float8_e4m3fn", "__nv_fp8_e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
    "__nv_fp8_e5m2": "float8_e5m2",
}
_KERNEL_DTYPE_RE = re.compile(
    r"_(" + "|".join(sorted((re.escape(k) for k in _KERNEL_DTYPES), key=len, reverse=True)) + r")(?=_|\(|$)"
)


def decode_global_tid(global_tid: int | None) -> tuple[int | None, int | None]:
    """(pid, tid) from an nsys serialized ``globalTid`` (or ``globalPid``, whose tid bits are 0).

    >>> decode_global_tid(0x1000090000090)
    (144, 144)
    """
    if global_tid is None:
        return None, None
    g = int(global_tid)
    return (g >> 24) & _MASK24, g & _MASK24


def parse_nccl_kernel_name(name: str) -> tuple[str, str | None]:
    """(raw op, dtype) from an NCCL kernel symbol, for both naming generations (formats.md §2.8).

    >>> parse_nccl_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    ('AllReduce', 'float32')
    >>> parse_nccl_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")
    ('AllReduce', 'float32')
    >>> parse_nccl_kernel_name("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096>)")
    ('SendRecv', None)
    """
    base = name.split("(", 1)[0].strip()
    parts = base.split("_")
    op = parts[1] if len(parts) > 1 else base
    if op == "SendRecv":  # one kernel for send/recv/all_to_all; its int8 type says nothing about the data
        return op, None
    m = _KERNEL_DTYPE_RE.search(base[len(parts[0]):])
    return op, (_KERNEL_DTYPES[m.group(1)] if m else None)


def sniff(path: Path, head: bytes) -> bool:
    """True for an SQLite file that holds nsys tables (the schema is read; SQLite headers alone do not tell)."""
    if not head.startswith(_SQLITE_MAGIC):
        return False
    try:
        conn = _connect(Path(path))
    except (ReaderError, sqlite3.Error):
        return False
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return _looks_like_nsys(names)


def read(path: Path) -> ReadResult:
    """Read one nsys SQLite export. Raises ReaderError when it cannot be opened or is not an nsys export."""
    path = Path(path)
    truncated = _check_file(path)
    conn = _connect(path)
    try:
        return _Export(conn, path, truncated).read()
    except sqlite3.OperationalError as e:
        if _is_lock_error(e):
            raise ReaderError(path, f"database is locked by another process ({e}); retry after nsys finishes") from e
        raise ReaderError(path, _unreadable(e, truncated)) from e
    except sqlite3.DatabaseError as e:
        raise ReaderError(path, _unreadable(e, truncated)) from e
    finally:
        conn.close()


def _is_lock_error(e: sqlite3.Error) -> bool:
    return "locked" in str(e).lower() or "busy" in str(e).lower()


def _unreadable(e: sqlite3.Error, truncated: str | None) -> str:
    return f"{truncated}; nothing readable ({e})" if truncated else \
        f"unreadable SQLite database ({e}); truncated or corrupt export?"


# ---------------------------------------------------------------------------------------------------- file checks

def _check_file(path: Path) -> str | None:
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
    if not header.startswith(_SQLITE_MAGIC):
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


def _connect(path: Path) -> sqlite3.Connection:
    """A read-only connection. For a truncated file, ``writable_schema`` makes SQLite use the pages that are there
    instead of refusing the whole file (nothing can be written: the connection is read-only); tables whose pages
    are missing then fail one by one."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=_LOCK_TIMEOUT_S)
    except sqlite3.Error as e:
        raise ReaderError(path, f"cannot open as SQLite: {e}") from e
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
        if len(header) == 100 and _short_by(header, path.stat().st_size):
            conn.execute("PRAGMA writable_schema=ON")
    except (OSError, sqlite3.Error):
        pass
    return conn


def _looks_like_nsys(names: set[str]) -> bool:
    if {"META_DATA_EXPORT", "EXPORT_META_DATA"} & names:
        return True
    markers = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_", "TARGET_INFO_", "ThreadNames", "ENUM_NSYS_")
    return "StringIds" in names and any(n.startswith(markers) for n in names)


# ---------------------------------------------------------------------------------------------------- the reader

@dataclass(frozen=True)
class _OpRange:
    """An NVTX range that names an op, kept to attribute kernels launched inside it."""

    start: int
    end: float          # inf when open at capture end
    name: str
    category: str
    fields: tuple[tuple[str, Any], ...]  # group/seq/... from ranktrace tokens (empty for other op-like ranges)
    ranktrace: bool


class _Export:
    """One open export; read() runs the stages in order and returns the common tables."""

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

    # -- orchestration

    def read(self) -> ReadResult:
        """Run the stages in order. Only the schema must be readable: a stage that hits a missing or corrupt page
        (truncated or damaged export) becomes one Skipped, keeps the batches it had read, and the next stage
        runs; a lock is never skipped over (it ends the read: retry later)."""
        if self.truncated:
            self._skip(self.truncated + "; reading the tables whose pages are there")
        self._load_schema()
        version = self._stage("export metadata", self._metadata)
        self._stage("host name and clock", self._host_and_clock)
        for what, stage in (("processes and threads", self._processes_and_threads), ("NVTX ranges", self._nvtx),
                            ("NCCL kernels", self._kernels), ("unfinished GPU work", self._pending_gpu_work),
                            ("synchronizing CUDA calls", self._sync_calls), ("GPUs", self._gpus),
                            ("captured stdout/stderr", self._streams), ("profiler diagnostics", self._diagnostics)):
            self._stage(what, stage)
        ranks = self._stage("ranks", self._resolve_ranks)
        pid_rank, pid_world = ranks if ranks is not None else ({}, {})
        events = _fill_identity(schema.concat(schema.EVENTS, self.event_tables), pid_rank, pid_world)
        observations = _fill_identity(schema.concat(schema.OBSERVATIONS, self.obs_tables), pid_rank, pid_world)
        if self.failed and not events.num_rows and not observations.num_rows:
            what, err = self.failed[0]
            raise ReaderError(self.path, _unreadable(err, self.truncated) + f" (first failure: {what})")
        world = next(iter(self.world_hints)) if len(self.world_hints) == 1 else None
        return ReadResult(file=self.file, format=FORMAT, version=version, events=events,
                          observations=observations, skipped=tuple(self.skipped), world_size=world)

    def _stage(self, what: str, fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except sqlite3.DatabaseError as e:   # OperationalError included
            if isinstance(e, sqlite3.OperationalError) and _is_lock_error(e):
                raise
            self.failed.append((what, e))
            cause = "the file is truncated" if self.truncated else "corrupt export?"
            self._skip(f"{what}: not read or only partly ({e}; {cause}); the rest of the export is used")
            return None

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

    # -- metadata, host, clock

    def _metadata(self) -> str | None:
        table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in self.columns), None)
        if table is None:
            self._skip("table META_DATA_EXPORT/EXPORT_META_DATA absent: export version unknown")
            return None
        meta: dict[str, str] = {}
        if {"name", "value"} <= self.columns[table]:
            meta = {str(n): str(v) for n, v in self.conn.execute(f'SELECT name, value FROM "{table}"')}
        self.normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
        product, schema_v = meta.get("EXPORT_PRODUCT_VERSION"), meta.get("EXPORT_SCHEMA_VERSION")
        if product or schema_v:
            return f"nsys {product or '?'}, schema {schema_v or '?'}"
        return None

    def _host_and_clock(self) -> None:
        if "TARGET_INFO_SYSTEM_ENV" in self.columns and {"name", "value"} <= self.columns["TARGET_INFO_SYSTEM_ENV"]:
            row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1"
                                    ).fetchone()
            self.host = str(row[0]) if row and row[0] else None
        t = self._table("TARGET_INFO_SESSION_START_TIME", ("utcEpochNs", "systemClockNs"), "wall_ns left null")
        if t:
            row = self.conn.execute(f'SELECT utcEpochNs, systemClockNs FROM "{t}" LIMIT 1').fetchone()
            if row and row[0] is not None and row[1] is not None:
                self.clock = (int(row[0]), int(row[1]))
        t = self._table("ANALYSIS_DETAILS", ("startTime", "stopTime"), "capture window unknown")
        if t:
            row = self.conn.execute(f'SELECT startTime, stopTime FROM "{t}" LIMIT 1').fetchone()
            if row and row[1] is not None:
                start, stop = row
                self._emit_obs([self._obs(None, None, "nsys_capture_window", name="capture", value=int(stop),
                                          detail=f"startTime={start} stopTime={stop} (session clock ns)"
                                                 + (f" duration_ns={int(stop) - int(start)}" if start is not None
                                                    else ""))])

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

    # -- processes, threads

    def _processes_and_threads(self) -> None:
        t = self._table("PROCESSES", ("globalPid",), "no process names")
        if t:
            name_col = "name" if self._has(t, "name") else "NULL"
            rows = []
            for rowid, gpid, name in self.conn.execute(f'SELECT rowid, globalPid, {name_col} FROM "{t}"'):
                pid, _ = decode_global_tid(gpid)
                rows.append(self._obs(pid, None, "nsys_process", name=name, line=rowid))
                if name:
                    m = _PROC_RANK.search(str(name))
                    if m and pid is not None:
                        self.rank_hints[pid]["process name"].add(int(m.group(1)))
            self._emit_obs(rows)
        t = self._table("ThreadNames", ("nameId", "globalTid"), "no thread names")
        if t and "StringIds" in self.columns:
            rows = []
            for batch in self._batches(f'SELECT t.rowid, t.globalTid, s.value FROM "{t}" t '
                                       f"LEFT JOIN StringIds s ON s.id = t.nameId"):
                for rowid, gtid, name in batch:
                    pid, tid = decode_global_tid(gtid)
                    rows.append(self._obs(pid, tid, "nsys_thread", name=name, line=rowid))
            self._emit_obs(rows)
        if {"globalTid", "rank"} <= self.columns.get("MPI_RANKS", set()):  # only with --trace mpi: absence is normal
            for gtid, rank in self.conn.execute('SELECT globalTid, rank FROM "MPI_RANKS"'):
                pid, _ = decode_global_tid(gtid)
                if pid is not None and rank is not None:
                    self.rank_hints[pid]["MPI_RANKS"].add(int(rank))

    # -- NVTX

    def _nvtx(self) -> None:
        t = self._table("NVTX_EVENTS", ("start", "eventType", "globalTid"), "no NVTX ranges")
        if not t:
            return
        has = lambda c: self._has(t, c)  # noqa: E731
        text = "COALESCE(n.text, s.value)" if has("textId") and "StringIds" in self.columns else (
            "n.text" if has("text") else "NULL")
        join = "LEFT JOIN StringIds s ON s.id = n.textId" if "s.value" in text else ""
        end = 'n."end"' if has("end") else "NULL"
        dom = "n.domainId" if has("domainId") else "0"
        for batch in self._batches(f'SELECT n.globalTid, {dom}, {text} FROM "{t}" n {join} '
                                   f"WHERE n.eventType = {_NVTX_DOMAIN_CREATE}"):
            for gtid, domain_id, name in batch:
                pid, _ = decode_global_tid(gtid)
                if pid is not None and name:
                    self.domains[(pid, int(domain_id or 0))] = str(name)
        types = ",".join(str(x) for x in _NVTX_MARKS + _NVTX_RANGES + _NVTX_OPEN + _NVTX_END_ONLY)
        sql = (f'SELECT n.rowid, n.start, {end}, n.eventType, n.globalTid, {dom}, {text} FROM "{t}" n {join} '
               f"WHERE n.eventType IN ({types})")
        for batch in self._batches(sql):
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, etype, gtid, domain_id, name in batch:
                pid, tid = decode_global_tid(gtid)
                if pid is not None:
                    self.active_pids.add(pid)
                domain = self.domains.get((pid or 0, int(domain_id or 0)))
                rows.extend(self._nvtx_rows(rowid, start, stop, int(etype), pid, tid, domain, name))
            self._emit_events(rows)
        for key, ranges in self.op_ranges.items():
            ranges.sort(key=lambda r: r.start)
            self.op_starts[key] = [r.start for r in ranges]

    def _nvtx_rows(self, rowid: int, start: int | None, stop: int | None, etype: int, pid: int | None,
                   tid: int | None, domain: str | None, text: Any) -> list[dict[str, Any]]:
        text = "" if text is None else str(text)
        # the domain-create row can be missing (sliced exports): fall back to the text's own shape
        is_ranktrace = (domain or "").lower() == RANKTRACE_DOMAIN or (domain is None and _RANKTRACE_TEXT.match(text)
                                                                      is not None)
        fields: dict[str, Any] = {}
        name, category = text, "user"
        if is_ranktrace:
            name, category, fields = self._ranktrace_text(text, pid)
        elif pid is not None:
            for m in _RANK_TOKEN.finditer(text):
                self.rank_hints[pid]["NVTX text rank="].add(int(m.group(1)))
        if etype in _NVTX_MARKS:
            return [self._event(pid, tid, start, "mark", name=name, category=category, line=rowid,
                                detail=_nvtx_detail(domain), **fields)]
        if etype in _NVTX_END_ONLY:
            t = stop if stop is not None else start
            return [self._event(pid, tid, t, "exit", name=name, category=category, line=rowid,
                                detail=OPENED_BEFORE, **fields)]
        is_open = etype in _NVTX_OPEN or stop is None
        self._remember_op_range(pid, tid, start, None if is_open else stop, name, category, fields, is_ranktrace,
                                text)
        if is_open:
            return [self._event(pid, tid, start, "enter", name=name, category=category, line=rowid,
                                detail=OPEN_AT_END, **fields)]
        detail = _nvtx_detail(domain)
        return [self._event(pid, tid, start, "enter", name=name, category=category, line=rowid, detail=detail,
                            **fields),
                self._event(pid, tid, stop, "exit", name=name, category=category, line=rowid, detail=detail,
                            **fields)]

    def _ranktrace_text(self, text: str, pid: int | None) -> tuple[str, str, dict[str, Any]]:
        """(name, category, fields) of a ranktrace-domain text ``<op> key=value ...``; rank/world become hints."""
        parts = text.split()
        head = parts[0] if parts else ""
        fields: dict[str, Any] = {}
        for tok in parts[1:]:
            key, sep, value = tok.partition("=")
            if not sep:
                continue
            key = key.lower()
            if key in ("rank", "world", "world_size"):
                if value.isdigit() and pid is not None:
                    if key == "rank":
                        self.rank_hints[pid]["ranktrace NVTX rank="].add(int(value))
                    else:
                        self.world_hints.add(int(value))
                continue
            spec = NVTX_TOKENS.get(key)
            if spec is None:
                continue
            column, typ = spec
            try:
                fields[column] = typ(value)
            except ValueError:
                continue
        op = canonical_op(head) if head else head
        if op in P2P_OPS:
            return op, "p2p", fields
        if op in COLLECTIVE_OPS:
            return op, "collective", fields
        return text, "user", fields

    def _remember_op_range(self, pid: int | None, tid: int | None, start: int | None, stop: int | None,
                           name: str, category: str, fields: dict[str, Any], ranktrace: bool, text: str) -> None:
        if pid is None or tid is None or start is None:
            return
        if not ranktrace:  # PyTorch emit_nvtx "nccl:all_reduce, op_id = 7" or NCCL's "ncclAllReduce"
            raw = text.split(",", 1)[0].strip()
            if _BACKEND_PREFIX.match(raw):
                op = canonical_op(raw)
            elif raw.startswith("nccl") and raw[4:5].isupper():
                op = canonical_op(raw[4:])
            else:
                return
            if op in P2P_OPS:
                name, category = op, "p2p"
            elif op in COLLECTIVE_OPS:
                name, category = op, "collective"
            else:
                return
        elif category == "user":
            return
        self.op_ranges[(pid, tid)].append(_OpRange(int(start), float("inf") if stop is None else int(stop),
                                                   name, category, tuple(fields.items()), ranktrace))

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

    # -- kernels and pending GPU work

    def _kernels(self) -> None:
        t = self._table("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId", "globalPid"),
                        "no completed kernels")
        if not t or "StringIds" not in self.columns:
            return
        name_col = "shortName" if self._has(t, "shortName") else ("demangledName" if self._has(t, "demangledName")
                                                                   else None)
        if name_col is None:
            self._skip(f"table {t} has no kernel name column: NCCL kernels not read")
            return
        graph = "k.graphId" if self._has(t, "graphId") else "NULL"
        device = "k.deviceId" if self._has(t, "deviceId") else "NULL"
        rt = self._resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
        launch_cols, launch_join = "NULL, NULL", ""
        if {"correlationId", "globalTid", "start"} <= self.columns.get(rt, set()):
            launch_cols = "r.globalTid, r.start"
            launch_join = (f'LEFT JOIN "{rt}" r ON r.correlationId = k.correlationId '
                           f"AND ((r.globalTid >> 24) & {_MASK24}) = ((k.globalPid >> 24) & {_MASK24})")
        names = self._string_ids("value LIKE 'nccl%'")
        sql = (f'SELECT k.rowid, k.start, k."end", {device}, k.globalPid, k.{name_col}, {graph}, {launch_cols} '
               f'FROM "{t}" k {launch_join} WHERE k.{name_col} IN ({",".join(map(str, names)) or "NULL"})')
        for batch in self._batches(sql) if names else ():
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, dev, gpid, kname_id, graph_id, launch_tid, launch_t in batch:
                kname = names[kname_id]
                pid, _ = decode_global_tid(gpid)
                _, tid = decode_global_tid(launch_tid)
                raw_op, dtype = parse_nccl_kernel_name(str(kname))
                fields = self._op_fields(pid, tid, launch_t, raw_op)
                fields.setdefault("dtype", dtype)
                detail = f"kernel {kname}" + (f" on device {dev}" if dev is not None else "")
                common = dict(line=rowid, detail=detail, graph_id=graph_id, **fields)
                rows.append(self._event(pid, tid, start, "enter", **common))
                if stop is not None:
                    rows.append(self._event(pid, tid, stop, "complete", state="completed", **common))
            self._emit_events(rows)
        if device != "NULL":
            rows = []
            for gpid, dev, count in self.conn.execute(f'SELECT globalPid, deviceId, COUNT(*) FROM "{t}" '
                                                      f"GROUP BY globalPid, deviceId"):
                pid, _ = decode_global_tid(gpid)
                if pid is not None:
                    self.active_pids.add(pid)
                rows.append(self._obs(pid, None, "pid_device", name=None if dev is None else str(dev), value=count))
            self._emit_obs(rows)

    def _op_fields(self, pid: int | None, tid: int | None, t: int | None, raw_op: str) -> dict[str, Any]:
        """name/category (+ group/seq/...) for GPU work launched at (pid, tid, t)."""
        op = self._op_at(pid, tid, t)
        if op is not None:
            fields = dict(op.fields)
            fields.update(name=op.name, category=op.category)
            return fields
        name = canonical_op(raw_op)
        category = "p2p" if raw_op == "SendRecv" or name in P2P_OPS else "collective"
        return {"name": name, "category": category}

    def _pending_gpu_work(self) -> None:
        rt = self._table("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "correlationId", "globalTid", "nameId"),
                         "launches without a finished kernel cannot be found")
        if not rt or "StringIds" not in self.columns:
            return
        kinds = (
            ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel_launch",
             "value LIKE '%LaunchKernel%' OR value LIKE '%LaunchCooperativeKernel%' OR value LIKE '%GraphLaunch%'"),
            ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy", "value LIKE '%Memcpy%'"),
        )
        for base, default_name, pred in kinds:
            gpu_table = self._resolve(base) or base
            # LEFT JOIN ... IS NULL, not NOT EXISTS: SQLite then builds one automatic index on the GPU table
            # instead of scanning it once per launch.
            join, missing = "", ""
            if gpu_table in self.columns and {"correlationId", "globalPid"} <= self.columns[gpu_table]:
                join = (f'LEFT JOIN "{gpu_table}" g ON g.correlationId = r.correlationId '
                        f"AND ((g.globalPid >> 24) & {_MASK24}) = ((r.globalTid >> 24) & {_MASK24})")
                missing = "AND g.correlationId IS NULL"
            apis = self._string_ids(pred)
            if not apis:
                continue
            sql = (f'SELECT r.rowid, r.start, r.globalTid, r.correlationId, r.nameId FROM "{rt}" r {join} '
                   f"WHERE r.nameId IN ({','.join(map(str, apis))}) {missing}")
            for batch in self._batches(sql):
                rows: list[dict[str, Any]] = []
                for rowid, start, gtid, corr, api_id in batch:
                    api = apis[api_id]
                    pid, tid = decode_global_tid(gtid)
                    op = self._op_at(pid, tid, start)
                    if op is not None:
                        fields: dict[str, Any] = dict(op.fields)
                        fields.update(name=op.name, category=op.category)
                    else:
                        fields = {"name": default_name, "category": "user"}
                    rows.append(self._event(pid, tid, start, "enter", line=rowid, detail=NO_COMPLETION,
                                            state="scheduled", callsite=f"{_API_VERSION.sub('', str(api))} "
                                                                        f"correlationId={corr}", **fields))
                self._emit_events(rows)

    def _sync_calls(self) -> None:
        rt = self._resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
        if rt not in self.columns or "StringIds" not in self.columns or not (
                {"start", "globalTid", "nameId"} <= self.columns[rt]):
            return  # already reported by _pending_gpu_work
        end = 'r."end"' if self._has(rt, "end") else "NULL"
        apis = self._string_ids("value LIKE '%Synchronize%' OR (value LIKE '%Memcpy%' AND value NOT LIKE '%Async%')")
        if not apis:
            return
        sql = (f'SELECT r.rowid, r.start, {end}, r.globalTid, r.nameId FROM "{rt}" r '
               f"WHERE r.nameId IN ({','.join(map(str, apis))})")
        for batch in self._batches(sql):
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, gtid, api_id in batch:
                api = apis[api_id]
                pid, tid = decode_global_tid(gtid)
                if pid is not None:
                    self.active_pids.add(pid)
                name = _API_VERSION.sub("", str(api))
                if stop is None or (start is not None and stop < start):
                    rows.append(self._event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                            detail=OPEN_AT_END))
                    continue
                rows.append(self._event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                        detail="CUDA API call"))
                rows.append(self._event(pid, tid, stop, "exit", name=name, category="sync", line=rowid,
                                        detail="CUDA API call"))
            self._emit_events(rows)

    # -- GPUs, streams, diagnostics

    def _gpus(self) -> None:
        rows: list[dict[str, Any]] = []
        t = self._table("TARGET_INFO_GPU", ("id",), "GPU models/bus ids unknown")
        if t:
            cols = [c for c in ("name", "busLocation", "uuid", "totalMemory", "computeMajor", "computeMinor")
                    if self._has(t, c)]
            sel = ", ".join(["id"] + cols)
            for rec in self.conn.execute(f'SELECT rowid, {sel} FROM "{t}"'):
                info = dict(zip(["rowid", "id"] + cols, rec))
                mem = info.get("totalMemory")
                cc = (f"sm {info.get('computeMajor')}.{info.get('computeMinor')}"
                      if info.get("computeMajor") is not None else None)
                detail = "; ".join(str(x) for x in (info.get("name"), info.get("busLocation") and
                                                     f"bus {info['busLocation']}", info.get("uuid"), cc) if x)
                rows.append(self._obs(None, None, "gpu_device", name=str(info["id"]), line=info["rowid"],
                                      value=None if mem is None else int(mem) // (1 << 20), detail=detail or None))
        elif "TARGET_INFO_SYSTEM_ENV" in self.columns:
            row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'GpuInfo' LIMIT 1"
                                    ).fetchone()
            if row and row[0] and str(row[0]).strip() not in ("{}", "[]", ""):
                rows.append(self._obs(None, None, "gpu_device", name=None, detail=str(row[0])[:4000]))
        t = self._table("TARGET_INFO_CUDA_DEVICE", ("gpuId", "cudaId", "pid"), "CUDA ordinal → GPU map unknown")
        if t:
            uuid = "uuid" if self._has(t, "uuid") else "NULL"
            for rowid, gpu_id, cuda_id, pid, uid in self.conn.execute(
                    f'SELECT rowid, gpuId, cudaId, pid, {uuid} FROM "{t}"'):
                rows.append(self._obs(pid, None, "cuda_device", name=None if cuda_id is None else str(cuda_id),
                                      value=gpu_id, detail=uid, line=rowid))
        self._emit_obs(rows)

    def _streams(self) -> None:
        t = self._table("ProcessStreams", ("globalPid", "filenameId", "contentId"), "captured stdout/stderr "
                        "(where NCCL_DEBUG output lands) not available")
        if not t or "StringIds" not in self.columns:
            return
        listing = self.conn.execute(f'SELECT p.rowid, p.globalPid, f.value, p.contentId FROM "{t}" p '
                                    f"LEFT JOIN StringIds f ON f.id = p.filenameId").fetchall()
        for rowid, gpid, fname, content_id in listing:
            base = str(fname or "").rsplit("/", 1)[-1]
            if not re.search(r"(stdout|stderr)", base):
                continue  # e.g. nsys-config.ini
            pid, _ = decode_global_tid(gpid)
            m = re.match(r"pid_(\d+)_", base)
            if m:
                pid = int(m.group(1))
            row = self.conn.execute("SELECT value FROM StringIds WHERE id = ?", (content_id,)).fetchone()
            if row is None or row[0] is None:
                self._skip(f"ProcessStreams {base}: content not in the export (StringIds id {content_id} missing)",
                           rowid)
                continue
            rows: list[dict[str, Any]] = []
            for n, line in enumerate(str(row[0]).splitlines(), start=1):
                rows.append(self._obs(pid, None, "nsys_stream_text", name=base, detail=line, line=n))
                if len(rows) >= BATCH_ROWS:
                    self._emit_obs(rows)
                    rows = []
            self._emit_obs(rows)

    def _diagnostics(self) -> None:
        t = "DIAGNOSTIC_EVENT"
        if t not in self.columns or "text" not in self.columns[t]:
            return
        gpid = "globalPid" if self._has(t, "globalPid") else "NULL"
        rows = []
        for rowid, g, text in self.conn.execute(f'SELECT rowid, {gpid}, text FROM "{t}" LIMIT 10000'):
            pid, _ = decode_global_tid(g)
            rows.append(self._obs(pid, None, "nsys_diagnostic", detail=text, line=rowid))
        self._emit_obs(rows)

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


def _nvtx_detail(domain: str | None) -> str:
    return f"NVTX domain {domain}" if domain else "NVTX"


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
