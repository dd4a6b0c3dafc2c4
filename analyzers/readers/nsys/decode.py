"""Raw nsys values decoded, no SQLite: ``globalTid`` bits, NCCL kernel symbols (op, dtype), NVTX event types and
the text patterns the stages match; and the reader's fixed vocabulary (the ``detail`` of open rows, NVTX tokens)."""
from __future__ import annotations

import re

__all__ = ["decode_global_tid", "parse_nccl_kernel_name", "SOURCE", "OPEN_AT_END", "OPENED_BEFORE", "NO_COMPLETION",
           "RANKTRACE_DOMAIN", "NVTX_TOKENS", "MASK24", "NVTX_MARKS", "NVTX_RANGES", "NVTX_OPEN", "NVTX_END_ONLY",
           "NVTX_DOMAIN_CREATE", "BACKEND_PREFIX", "RANK_TOKEN", "RANKTRACE_TEXT", "PROC_RANK", "API_VERSION"]

SOURCE = "nsys"
OPEN_AT_END = "open at capture end"
OPENED_BEFORE = "opened before capture"
NO_COMPLETION = "launched, no completion recorded"
RANKTRACE_DOMAIN = "ranktrace"

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

MASK24 = 0xFFFFFF

# NVTX event types (formats.md §2.5)
NVTX_MARKS = (34, 65)
NVTX_RANGES = (59, 60, 70, 71)
NVTX_OPEN = (35, 37, 66, 68)
NVTX_END_ONLY = (36, 38, 67, 69)
NVTX_DOMAIN_CREATE = 75

BACKEND_PREFIX = re.compile(r"^(nccl|gloo|xccl|ucc|mpi|hccl|rccl|cncl):", re.IGNORECASE)
RANK_TOKEN = re.compile(r"(?<![A-Za-z0-9_])rank\s*[=:]\s*(\d+)", re.IGNORECASE)
RANKTRACE_TEXT = re.compile(r"^[a-z_]+(?: [a-z_]+=\S+)*? (?:group|seq)=\S+")
PROC_RANK = re.compile(r"(?:rank[_=]?|_TP)(\d+)(?!\d)", re.IGNORECASE)
API_VERSION = re.compile(r"_v\d+$")
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
    return (g >> 24) & MASK24, g & MASK24


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
