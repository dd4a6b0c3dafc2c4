"""nsys: Nsight Systems SQLite exports (``nsys export --type sqlite``) read into the common tables: per rank the
NVTX ranges that never closed, the NCCL kernels that finished and the launches whose kernel never did. Stages:
:mod:`.export` (open, query) -> :mod:`.events` (NVTX, CUDA) and :mod:`.observations` (descriptive tables, pid ->
rank) -> this module (tables); raw values decoded in :mod:`.decode`."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, TypeVar

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.nsys import events, export, observations
from ranktrace.analyzers.readers.nsys.decode import (NO_COMPLETION, NVTX_TOKENS, OPEN_AT_END, OPENED_BEFORE,
                                                     decode_global_tid, parse_nccl_kernel_name)
from ranktrace.analyzers.readers.nsys.export import (BATCH_ROWS, SQLITE_MAGIC, Export, check_file, connect,
                                                     is_lock_error, looks_like_nsys, unreadable)

__all__ = [
    "FORMAT",
    "sniff",
    "read",
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

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("globalTid >> 24 & 0xFFFFFF", "EVENTS.pid", "int (24 bit)", "null", "all"),
    ColumnMap("globalTid & 0xFFFFFF", "EVENTS.tid", "int (24 bit)", "null", "all"),
    ColumnMap("NVTX_EVENTS.start", "EVENTS.t_ns", "int ns, session clock", "null", "all"),
    ColumnMap("NVTX_EVENTS.end", "EVENTS.t_ns (exit row)", "int ns, NULL = open", "null", "all"),
    ColumnMap("NVTX_EVENTS.eventType", "EVENTS.kind", "enum 34 mark, 59/60 range, 35/37 open, 36/38 end-only", "null",
              "all"),
    ColumnMap("COALESCE(NVTX_EVENTS.text, StringIds[textId])", "EVENTS.name / EVENTS.detail", "str", "null",
              "textId: ~2021+"),
    ColumnMap("NVTX_EVENTS.domainId → eventType 75 text", "EVENTS.category (ranktrace → op)", "int", "0", "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_KERNEL.shortName → StringIds", "EVENTS.name/dtype/category/detail", "str", "null",
              "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_KERNEL.start/end", "EVENTS.t_ns (enter/exit)", "int ns", "null", "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_KERNEL.correlationId", "", "int, per process", "null", "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_KERNEL.graphId", "EVENTS.graph_id", "int", "null", "3.x"),
    ColumnMap("CUPTI_ACTIVITY_KIND_RUNTIME.nameId → StringIds", "EVENTS.name (sync) / launch detection", "str", "null",
              "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_RUNTIME.correlationId", "", "int, joins KERNEL/MEMCPY", "null", "all"),
    ColumnMap("CUPTI_ACTIVITY_KIND_MEMCPY.correlationId", "", "int", "null", "all"),
    ColumnMap("TARGET_INFO_SESSION_START_TIME.utcEpochNs/systemClockNs", "EVENTS.wall_ns", "int ns", "null",
              "unverified rule"),
    ColumnMap("TARGET_INFO_SYSTEM_ENV[Hostname]", "*.host", "str", "null", "all"),
    ColumnMap("TARGET_INFO_SYSTEM_ENV[NvDriverVersion, CudaDriverVersion, OsDescription]",
              "OBSERVATIONS nsys_system", "str", "null", "all"),
    ColumnMap("PROCESSES(globalPid, pid, name)", "OBSERVATIONS nsys_process", "", "null", "all"),
    ColumnMap("ThreadNames(nameId, globalTid)", "OBSERVATIONS nsys_thread", "", "null", "all"),
    ColumnMap("TARGET_INFO_GPU(id, name, busLocation, uuid, totalMemory, computeMajor/Minor)",
              "OBSERVATIONS gpu_device", "", "null", "optional"),
    ColumnMap("TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid, uuid)", "OBSERVATIONS cuda_device", "", "null", "optional"),
    ColumnMap("ProcessStreams(globalPid, filenameId, contentId)", "OBSERVATIONS nsys_stream_text", "", "null", "2024+"),
    ColumnMap("MPI_RANKS(globalTid, rank)", "EVENTS.rank", "int", "null", "with --trace mpi (unverified)"),
    ColumnMap("META_DATA_CAPTURE[PROCESS_0:ENVIRONMENT_VARIABLE] RANK/WORLD_SIZE", "EVENTS.rank/world", "str", "null",
              "all"),
    ColumnMap("META_DATA_EXPORT | EXPORT_META_DATA [EXPORT_PRODUCT_VERSION, EXPORT_SCHEMA_VERSION]",
              "ReadResult.version", "str", "null", "both names probed"),
    ColumnMap("ANALYSIS_DETAILS.startTime/stopTime", "OBSERVATIONS nsys_capture_window", "int ns", "null", "2024+"),
    ColumnMap("DIAGNOSTIC_EVENT.text", "OBSERVATIONS nsys_diagnostic", "str", "null", "all"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "nsys_process": "pid, name = process name (PROCESSES)",
    "nsys_thread": "pid, tid, name = OS thread name (ThreadNames, 15 chars)",
    "gpu_device": "name = GPU id, value = total memory MiB, detail = model; bus; uuid; compute capability",
    "cuda_device": "pid, name = CUDA ordinal in that process, value = GPU id, detail = uuid",
    "pid_device": "pid, name = CUDA deviceId its kernels ran on, value = number of kernels",
    "pid_rank": "pid, rank (and world when known), detail = which evidence gave the rank",
    "nsys_capture_window": "value = capture stop (session clock ns), detail = start/stop/duration",
    "nsys_system": "name = NvDriverVersion | CudaDriverVersion | OsDescription, detail = the value (machine facts "
                   "trace compare sets side by side)",
    "nsys_diagnostic": "pid, detail = profiler diagnostic text (e.g. lost events)",
    "nsys_stream_text": "pid, name = stream file name, detail = one captured stdout/stderr line, line = its number",
}

_T = TypeVar("_T")

#: The stages after the export's metadata, host and clock, in order (each may fail alone on a corrupt page).
_STAGES: tuple[tuple[str, Callable[[Export], None]], ...] = (
    ("processes and threads", observations.processes_and_threads), ("NVTX ranges", events.nvtx),
    ("NCCL kernels", events.kernels), ("unfinished GPU work", events.pending_gpu_work),
    ("synchronizing CUDA calls", events.sync_calls), ("GPUs", observations.gpus),
    ("captured stdout/stderr", observations.streams), ("profiler diagnostics", observations.diagnostics),
)


def sniff(path: Path, head: bytes) -> bool:
    """True for an SQLite file that holds nsys tables (the schema is read; SQLite headers alone do not tell)."""
    if not head.startswith(SQLITE_MAGIC):
        return False
    try:
        conn = connect(Path(path))
    except (ReaderError, sqlite3.Error):
        return False
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return looks_like_nsys(names)


def read(path: Path) -> ReadResult:
    """Read one nsys SQLite export. Raises ReaderError when it cannot be opened or is not an nsys export.

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

    Bounded memory: every large table is read with ``fetchmany`` in batches of ``export.BATCH_ROWS`` (set it there),
    each batch turned into an Arrow table at once; only op ranges (for kernel attribution) and small lookup tables stay
    in Python.

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
    path = Path(path)
    truncated = check_file(path)
    conn = connect(path)
    try:
        return _read_export(Export(conn, path, truncated))
    except sqlite3.OperationalError as e:
        if is_lock_error(e):
            raise ReaderError(path, f"database is locked by another process ({e}); retry after nsys finishes") from e
        raise ReaderError(path, unreadable(e, truncated)) from e
    except sqlite3.DatabaseError as e:
        raise ReaderError(path, unreadable(e, truncated)) from e
    finally:
        conn.close()


def _read_export(ex: Export) -> ReadResult:
    """Run the stages in order. Only the schema must be readable: a stage that hits a missing or corrupt page
    (truncated or damaged export) becomes one Skipped, keeps the batches it had read, and the next stage runs; a
    lock is never skipped over (it ends the read: retry later)."""
    if ex.truncated:
        ex.skip(ex.truncated + "; reading the tables whose pages are there")
    ex.load_schema()
    version = _stage(ex, "export metadata", observations.metadata)
    _stage(ex, "host name and clock", observations.host_and_clock)
    for what, stage in _STAGES:
        _stage(ex, what, stage)
    ranks = _stage(ex, "ranks", observations.resolve_ranks)
    pid_rank, pid_world = ranks if ranks is not None else ({}, {})
    evs = observations.fill_identity(schema.concat(schema.EVENTS, ex.event_tables), pid_rank, pid_world)
    obs = observations.fill_identity(schema.concat(schema.OBSERVATIONS, ex.obs_tables), pid_rank, pid_world)
    if ex.failed and not evs.num_rows and not obs.num_rows:
        what, err = ex.failed[0]
        if ex.budget_said:
            raise ReaderError(ex.path, f"SQLite queries stopped after {export.SQLITE_BUDGET_S:.0f} s (the time bound "
                                       f"per file: a view or query that does not end, first in: {what}); nothing read")
        raise ReaderError(ex.path, unreadable(err, ex.truncated) + f" (first failure: {what})")
    world = next(iter(ex.world_hints)) if len(ex.world_hints) == 1 else None
    return ReadResult(file=ex.file, format=FORMAT, version=version, events=evs, observations=obs,
                      skipped=tuple(ex.skipped), world_size=world)


def _stage(ex: Export, what: str, fn: Callable[[Export], _T]) -> _T | None:
    try:
        return fn(ex)
    except sqlite3.DatabaseError as e:   # OperationalError included
        if isinstance(e, sqlite3.OperationalError) and is_lock_error(e):
            raise
        ex.failed.append((what, e))
        if export.over_budget(ex.conn):
            if not ex.budget_said:  # one line for the file, not one per stage
                ex.budget_said = True
                ex.skip(f"SQLite queries stopped after {export.SQLITE_BUDGET_S:.0f} s (the time bound per file: a "
                        f"view or query that does not end); {what} and later stages not read, what came before is "
                        f"used")
            return None
        cause = "the file is truncated" if ex.truncated else "corrupt export?"
        ex.skip(f"{what}: not read or only partly ({e}; {cause}); the rest of the export is used")
        return None
