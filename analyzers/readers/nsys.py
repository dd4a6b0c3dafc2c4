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

Bounded memory: every large table is read with ``fetchmany`` in batches of ``nsys_export.BATCH_ROWS`` (set it
there), each batch turned
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

One module per job; this one is the entry point (``FORMAT``, :func:`sniff`, :func:`read`) and re-exports the public
names:

* :mod:`analyzers.readers.nsys_fields` — the declared mapping (:data:`FIELD_MAP`), NVTX tokens, observation kinds,
  the ``detail`` texts of open/unfinished rows;
* :mod:`analyzers.readers.nsys_decode` — ``globalTid`` bits, NCCL kernel symbols, NVTX event types, text patterns;
* :mod:`analyzers.readers.nsys_sqlite` — file checks, the read-only connection, nsys detection, error wording;
* :mod:`analyzers.readers.nsys_export` — the open export's state, schema lookup, batched queries, row builders,
  Arrow batches, the op-range index;
* :mod:`analyzers.readers.nsys_observations` — metadata, host, clock, processes, threads, GPUs, streams,
  diagnostics;
* :mod:`analyzers.readers.nsys_nvtx` — NVTX ranges and marks → events;
* :mod:`analyzers.readers.nsys_cuda` — NCCL kernels, unfinished GPU work, synchronizing CUDA calls → events;
* :mod:`analyzers.readers.nsys_ranks` — pid → rank/world and filling them into the tables.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, TypeVar

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.base import ReaderError, ReadResult
from ranktrace.analyzers.readers.nsys_cuda import _CudaStages
from ranktrace.analyzers.readers.nsys_decode import decode_global_tid, parse_nccl_kernel_name
from ranktrace.analyzers.readers.nsys_export import BATCH_ROWS
from ranktrace.analyzers.readers.nsys_fields import (FIELD_MAP, NO_COMPLETION, NVTX_TOKENS, OBSERVATION_KINDS, OPEN_AT_END,
                                           OPENED_BEFORE, FieldMap)
from ranktrace.analyzers.readers.nsys_nvtx import _NvtxStages
from ranktrace.analyzers.readers.nsys_observations import _ObservationStages
from ranktrace.analyzers.readers.nsys_ranks import _fill_identity, _RankStages
from ranktrace.analyzers.readers.nsys_sqlite import (_SQLITE_MAGIC, _check_file, _connect, _is_lock_error, _looks_like_nsys,
                                           _unreadable)

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

_T = TypeVar("_T")


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


# ---------------------------------------------------------------------------------------------------- the reader

class _Export(_NvtxStages, _CudaStages, _ObservationStages, _RankStages):
    """One open export; read() runs the stages in order and returns the common tables."""

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
