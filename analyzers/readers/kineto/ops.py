"""Comm events -> ops: nested comm events on a thread fold into one op (named from its ``nccl:<op>`` annotation,
else ``Collective name``), NCCL kernels attach to the op they were launched in, and an op's args become EVENTS
columns (group, ranks, backend, dtype, size, peer) — the part that changes when PyTorch changes what it records."""
from __future__ import annotations

import ast
import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

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
    key: tuple[Any, ...] = ()     # the window's group (window_key)
    tail: bool = False            # among its group's last ops: ops before it may have been only counted


_COMPACT_AT = 100_000   # comm events held before the settled ones are folded into the window (collect.Window)
_CARRY = 256            # the latest roots of a thread stay unfolded: an event nested in them may still come


def compact(collector: Collector, final: bool = False) -> None:
    """Fold the comm events held per thread into ops and hand them to the collector's window, which keeps a
    bounded number per group; all but the latest _CARRY roots of a thread unless `final`."""
    for thread, comms in collector.comms.items():
        if not comms:
            continue
        comms.sort(key=lambda c: (c.ts, -c.end, c.index))
        roots, starts = _nest(comms)
        cut = len(roots) if final else max(0, len(roots) - _CARRY)
        for root in roots[:cut]:
            op = _fold(root)
            if op is not None:
                collector.window.add(window_key(op), root.ts, root.index, op)
            elif root.args.get("Collective name") != "wait":  # Work.wait() is not an op: no note
                collector.skip_counts["record_param_comms without a collective name nor annotation"] += 1
        if cut:
            end = max(r.end for r in roots[:cut])
            collector.folded_end[thread] = max(end, collector.folded_end.get(thread, end))
            collector.comms[thread] = comms[starts[cut]:] if cut < len(roots) else []
    collector.buffered = sum(len(v) for v in collector.comms.values())
    collector.compact_at = max(_COMPACT_AT, 2 * collector.buffered)


def _nest(comms: list[Comm]) -> tuple[list[Comm], list[int]]:
    """The outermost comm events of one thread's sorted events (children attached), and where each starts."""
    stack: list[Comm] = []
    roots: list[Comm] = []
    starts: list[int] = []
    for i, c in enumerate(comms):
        c.children = []
        while stack and c.ts > stack[-1].end + 1e-3:
            stack.pop()
        if stack and c.end <= stack[-1].end + 1e-3:
            stack[-1].children.append(c)
        else:
            roots.append(c)
            starts.append(i)
        stack.append(c)
    return roots, starts


def window_key(op: Op) -> tuple[Any, ...]:
    """The group an op counts in, from its own args (the trace's pg_config may come after its events): what
    op_fields and the seq counter make of it is a function of this key."""
    a = op.args
    name, pg_id = a.get("Process Group Name"), a.get("Process Group ID")
    key: tuple[Any, ...] = (None if name is None else str(name),
                            None if name is not None or pg_id is None else str(pg_id), op.backend)
    if op.name in P2P_OPS:
        outgoing = op.name in ("send", "isend")
        key += ("p2p", outgoing, to_int(a.get("Dst Rank") if outgoing else a.get("Src Rank")))
    return key


def fold_ops(collector: Collector) -> list[Op]:
    """Fold nested comm events per thread into outermost ops (the rules are in ``kineto.read``'s docstring); the
    ops the window kept, each marked with its key and whether it is of its group's tail."""
    compact(collector, final=True)
    ops: list[Op] = []
    for key, head, tail, _middle in collector.window.kept():
        for op in head:
            op.key = key
        for op in tail:
            op.key, op.tail = key, True
        ops.extend(head)
        ops.extend(tail)
    return ops


def attach_kernels(collector: Collector, ops: list[Op]) -> None:
    """Set each op's ``kernel_end``/``kernel_name`` from the last NCCL kernel launched inside it (the launch with
    the kernel's correlation, the last one when a correlation repeats). Vectorised over the flat arrays: a trace
    holds millions of launches and kernels, and only the kept ops are looked up."""
    lc, lt, lth = collector.launch_arrays()
    kc, ke, kn = collector.kernel_arrays()
    tied = np.zeros(len(kc), dtype=bool)
    if len(kc) and len(lc):
        order = np.argsort(lc, kind="stable")
        pos = np.searchsorted(lc[order], kc, side="right") - 1
        has = pos >= 0
        has[has] = lc[order][pos[has]] == kc[has]
        launch = np.full(len(kc), -1, dtype=np.int64)
        launch[has] = order[pos[has]]
        by_thread: dict[int, list[Op]] = defaultdict(list)
        for op in ops:
            try:
                ti = collector.threads.get((op.comm.pid, op.comm.tid))
            except TypeError:
                ti = None
            if ti is not None:
                by_thread[ti].append(op)
        for ti, lst in by_thread.items():
            lst.sort(key=lambda o: o.comm.ts)
            starts = np.array([o.comm.ts for o in lst])
            ends = np.array([o.comm.end for o in lst])
            mine = np.flatnonzero(has & (lth[np.maximum(launch, 0)] == ti))
            ts = lt[launch[mine]]
            at = np.searchsorted(starts, ts, side="right") - 1
            inside = at >= 0
            inside[inside] = ts[inside] <= ends[at[inside]]
            mine, at = mine[inside], at[inside]
            tied[mine] = True
            # per op, its kernel that ends last (the first such in the file on a tie)
            pick = np.lexsort((-mine, ke[mine], at))
            last = np.ones(len(pick), dtype=bool)
            last[:-1] = at[pick][1:] != at[pick][:-1]
            for k, o in zip(mine[pick][last].tolist(), at[pick][last].tolist()):
                lst[o].kernel_end, lst[o].kernel_name = float(ke[k]), collector.kernel_names[int(kn[k])]
    for corr, end, name in collector.big_kernels:   # correlations beyond 64 bits: never in practice
        launch_at = collector.big_corr.get(corr)
        big_op = next((o for o in ops if launch_at is not None and (o.comm.pid, o.comm.tid) == launch_at[:2]
                   and o.comm.ts <= launch_at[2] <= o.comm.end), None)
        if big_op is None:
            continue
        if big_op.kernel_end is None or end > big_op.kernel_end:
            big_op.kernel_end, big_op.kernel_name = end, name
    orphans = int((~tied).sum()) if not collector.window.summarised else 0   # else: kernels of ops only counted
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
