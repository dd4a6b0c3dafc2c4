"""Comm events -> ops: nested comm events on a thread fold into one op (named from its ``nccl:<op>`` annotation,
else ``Collective name``), NCCL kernels attach to the op they were launched in, and an op's args become EVENTS
columns (group, ranks, backend, dtype, size, peer) — the part that changes when PyTorch changes what it records."""
from __future__ import annotations

import ast
import functools
import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

from ranktrace.tracer.formats.opnames import P2P_OPS, canonical_op
from ranktrace.analyzers.readers.kineto.collect import BACKEND_PREFIX, Collector, Comm

__all__ = ["DTYPES", "Op", "Pg", "fold_ops", "attach_kernels", "op_fields", "pg_config", "to_int"]

# element type name (Kineto dtype arg = c10 ScalarType name; annotation 'Input type' = C++ type name) → (torch
# dtype name, itemsize bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "float": ("float32", 4), "Double": ("float64", 8), "double": ("float64", 8),
    "Half": ("float16", 2), "c10::Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "c10::BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "long int": ("int64", 8), "long": ("int64", 8),
    "int64_t": ("int64", 8), "Int": ("int32", 4), "int": ("int32", 4), "Short": ("int16", 2),
    "short int": ("int16", 2), "Char": ("int8", 1), "signed char": ("int8", 1), "Byte": ("uint8", 1),
    "unsigned char": ("uint8", 1), "Bool": ("bool", 1), "bool": ("bool", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1), "c10::Float8_e5m2": ("float8_e5m2", 1),
    "ComplexFloat": ("complex64", 8), "c10::complex<float>": ("complex64", 8),
}


@dataclass
class Op:
    """One collective call on one thread: its outermost comm event, name, backend and merged args; the end of the
    last NCCL kernel launched inside it, when the trace has one."""

    comm: Comm
    name: str
    raw_name: str
    backend: str | None
    args: dict[str, Any]
    nested: int
    kernel_end: float | None = None
    kernel_name: str | None = None


def fold_ops(collector: Collector) -> list[Op]:
    """Fold nested comm events per thread into outermost ops (the rules are in ``kineto.read``'s docstring)."""
    ops: list[Op] = []
    for comms in collector.comms.values():
        comms.sort(key=lambda c: (c.ts, -c.end, c.index))
        stack: list[Comm] = []
        roots: list[Comm] = []
        for c in comms:
            while stack and c.ts > stack[-1].end + 1e-3:
                stack.pop()
            if stack and c.end <= stack[-1].end + 1e-3:
                stack[-1].children.append(c)
            else:
                roots.append(c)
            stack.append(c)
        for root in roots:
            op = _fold(root)
            if op is not None:
                ops.append(op)
            elif root.args.get("Collective name") != "wait":  # Work.wait() is not an op: no note
                collector.skip_counts["record_param_comms without a collective name nor annotation"] += 1
    return ops


def attach_kernels(collector: Collector, ops: list[Op]) -> None:
    """Set each op's ``kernel_end``/``kernel_name`` from the last NCCL kernel launched inside it."""
    by_thread: dict[tuple[Any, Any], list[Op]] = defaultdict(list)
    for op in ops:
        by_thread[(op.comm.pid, op.comm.tid)].append(op)
    starts: dict[tuple[Any, Any], list[float]] = {}
    for key, lst in by_thread.items():
        lst.sort(key=lambda o: o.comm.ts)
        starts[key] = [o.comm.ts for o in lst]
    launches = collector.launches({corr for corr, _, _ in collector.kernels})
    orphans = 0
    for corr, end, name in collector.kernels:
        launch = launches.get(corr)
        op = None
        if launch is not None:
            key = (launch[0], launch[1])
            lst = by_thread.get(key, [])
            i = bisect.bisect_right(starts.get(key, []), launch[2]) - 1
            if i >= 0 and lst[i].comm.ts <= launch[2] <= lst[i].comm.end:
                op = lst[i]
        if op is None:
            orphans += 1
            continue
        if op.kernel_end is None or end > op.kernel_end:
            op.kernel_end, op.kernel_name = end, name
    if orphans:
        collector.skip_counts["NCCL kernel not tied to a CPU-side collective (no launch inside one)"] += orphans


def _fold(root: Comm) -> Op | None:
    """One op from a root comm event and its nested ones; None when it is not a collective."""
    flat = [root]
    i = 0
    while i < len(flat):
        flat.extend(flat[i].children)
        i += 1
    annotations = [c for c in flat if c.is_annotation]
    annotation = annotations[0] if annotations else None
    param = next((c for c in flat if not c.is_annotation), None)
    args: dict[str, Any] = dict(annotation.args) if annotation else {}
    if param is not None:
        args.update(param.args)
    coll = args.get("Collective name")
    coll = coll if isinstance(coll, str) and coll else None
    backend = None
    if annotation is not None:
        m = BACKEND_PREFIX.match(annotation.name)
        backend = m.group(1).lower() if m else None
    if annotation is not None and (len(annotations) == 1 or coll is None):
        raw, name = annotation.name, canonical_op(annotation.name)
    elif coll is not None and coll != "wait":
        # no annotation, or a coalesced block (several annotations under one record_param_comms): the block's name
        raw, name = f"record_param_comms {coll}", canonical_op(coll)
    else:
        return None
    used = {id(root)} | {id(c) for c in (annotation, param) if c is not None}
    return Op(comm=root, name=name, raw_name=raw, backend=backend, args=args, nested=len(flat) - len(used))


def op_fields(op: Op, pgs: list["Pg"], default_backend: str | None) -> dict[str, Any]:
    """EVENTS column values of one op (group, ranks, backend, dtype, shape, nbytes, backend_seq, peer)."""
    a = op.args
    out: dict[str, Any] = {}
    group = a.get("Process Group Name")
    pg_id = a.get("Process Group ID")
    pg = None
    if group is not None:
        out["group"] = str(group)
        pg = next((p for p in pgs if p.name == str(group)), None)
    elif pg_id is not None:
        out["group"] = str(pg_id)
        pg = next((p for p in pgs if p.uid == to_int(pg_id)), None) or next(
            (p for p in pgs if p.name == str(pg_id)), None)
    out["group_desc"] = a.get("Process Group Description") or (pg.desc if pg else None)
    ranks = _int_list(a.get("Process Group Ranks"))
    if ranks is None and a.get("Global rank start") is not None and to_int(a.get("Group size")):
        start, stride = to_int(a.get("Global rank start")) or 0, to_int(a.get("Global rank stride")) or 1
        ranks = [start + i * stride for i in range(to_int(a.get("Group size")) or 0)]
    out["group_ranks"] = ranks if ranks is not None else (pg.ranks if pg else None)
    backend = op.backend or (pg.backend if pg else None) or default_backend
    out["backend"] = backend
    dtype_raw = a.get("dtype") or a.get("Input type")
    dtype = DTYPES.get(str(dtype_raw)) if dtype_raw is not None else None
    out["dtype"] = dtype[0] if dtype else (str(dtype_raw).lower() if dtype_raw else None)
    nelems = to_int(a.get("In msg nelems"))
    if nelems is None and a.get("Input Dims") is not None:
        nelems = _numel(a["Input Dims"])
    if a.get("Input Dims") is not None:
        out["shape"] = str(a["Input Dims"])
    if nelems is not None and dtype:
        out["nbytes"] = nelems * dtype[1]
    out["backend_seq"] = to_int(a.get("Seq"))
    if op.name in P2P_OPS:
        peer = a.get("Dst Rank") if op.name in ("send", "isend") else a.get("Src Rank")
        out["peer"] = to_int(peer)
    return out


class Pg(NamedTuple):
    """One ``distributedInfo.pg_config`` entry."""

    name: str
    desc: str | None
    uid: int | None
    backend: str | None
    size: int | None
    ranks: list[int] | None


def pg_config(raw: Any) -> list[Pg]:
    if not isinstance(raw, list):
        return []
    out = []
    for pg in raw:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        cfg = str(pg.get("backend_config") or "")
        backend = cfg.rsplit(":", 1)[-1] if cfg else None   # "cuda:nccl" → nccl; "cpu:gloo,cuda:gloo" → gloo
        desc = pg.get("pg_desc")
        out.append(Pg(str(pg["pg_name"]), str(desc) if desc is not None else None, to_int(pg.get("uid")), backend,
                       to_int(pg.get("pg_size")), _int_list(pg.get("ranks"))))
    return out


def to_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _int_list(v: Any) -> list[int] | None:
    if isinstance(v, str):
        got = _int_list_text(v)  # every op of a group repeats its ranks string: parsed once
        return list(got) if got is not None else None
    if isinstance(v, (list, tuple)) and all(to_int(x) is not None for x in v):
        return [int(x) for x in v]
    return None


@functools.lru_cache(maxsize=4096)
def _int_list_text(v: str) -> tuple[int, ...] | None:
    try:
        parsed = ast.literal_eval(v.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(parsed, (list, tuple)) and all(to_int(x) is not None for x in parsed):
        return tuple(int(x) for x in parsed)
    return None


def _numel(dims: Any) -> int | None:
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return None
