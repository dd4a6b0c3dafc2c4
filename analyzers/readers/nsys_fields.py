"""The nsys reader's declared mapping and output vocabulary: which raw export field lands in which column
(:data:`FIELD_MAP`), the NVTX ``key=value`` tokens understood, the observation kinds emitted, and the fixed
``detail`` texts of open/unfinished rows.

Why separate: this is the reader's contract with ``analyzers.schema`` and with the docs (formats.md §2); tests and
people read it without SQLite or row logic in the way, and the stage modules share these names.
"""
from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "SOURCE",
    "OPEN_AT_END",
    "OPENED_BEFORE",
    "NO_COMPLETION",
    "RANKTRACE_DOMAIN",
    "FieldMap",
    "FIELD_MAP",
    "NVTX_TOKENS",
    "OBSERVATION_KINDS",
]

SOURCE = "nsys"
OPEN_AT_END = "open at capture end"
OPENED_BEFORE = "opened before capture"
NO_COMPLETION = "launched, no completion recorded"
RANKTRACE_DOMAIN = "ranktrace"


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
