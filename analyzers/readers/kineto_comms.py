"""Comm events of a Kineto trace and how they become ops: nested comm events fold into one op, NCCL kernels attach.

Why separate: this is the interpretation of PyTorch's collective annotations (``record_param_comms``,
``nccl:<op>``/``gloo:<op>``) and of kernel/launch correlations, the part that changes when PyTorch changes what it
records; the collector only gathers events and the table builder only turns ops into rows.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ranktrace.analyzers.opnames import canonical_op

if TYPE_CHECKING:
    from ranktrace.analyzers.readers.kineto_collector import _Collector

_BACKEND_PREFIX = re.compile(r"^(nccl|gloo|xccl|ucc|mpi|hccl|rccl|cncl|mccl):(.+)$", re.IGNORECASE)


@dataclass
class _Comm:
    """A CPU-side comm event (record_param_comms or a backend annotation) on one thread."""

    index: int
    pid: Any
    tid: Any
    ts: float
    end: float
    name: str                 # raw event name
    is_annotation: bool
    args: dict[str, Any]
    children: list["_Comm"] = field(default_factory=list)


@dataclass
class _Op:
    comm: _Comm
    name: str
    raw_name: str
    backend: str | None
    args: dict[str, Any]
    nested: int
    kernel_end: float | None = None
    kernel_name: str | None = None


def fold_ops(collector: _Collector) -> list[_Op]:
    """Fold nested comm events per thread into outermost ops (worked example in kineto.py's docstring)."""
    ops: list[_Op] = []
    for comms in collector.comms.values():
        comms.sort(key=lambda c: (c.ts, -c.end, c.index))
        stack: list[_Comm] = []
        roots: list[_Comm] = []
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


def attach_kernels(collector: _Collector, ops: list[_Op]) -> None:
    """Set each op's ``kernel_end``/``kernel_name`` from the last NCCL kernel launched inside it."""
    by_thread: dict[tuple[Any, Any], list[_Op]] = defaultdict(list)
    for op in ops:
        by_thread[(op.comm.pid, op.comm.tid)].append(op)
    starts: dict[tuple[Any, Any], list[float]] = {}
    for key, lst in by_thread.items():
        lst.sort(key=lambda o: o.comm.ts)
        starts[key] = [o.comm.ts for o in lst]
    launches = collector._launches({corr for corr, _, _ in collector.kernels})
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


def _fold(root: _Comm) -> _Op | None:
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
        m = _BACKEND_PREFIX.match(annotation.name)
        backend = m.group(1).lower() if m else None
    if annotation is not None and (len(annotations) == 1 or coll is None):
        raw, name = annotation.name, canonical_op(annotation.name)
    elif coll is not None and coll != "wait":
        # no annotation, or a coalesced block (several annotations under one record_param_comms): the block's name
        raw, name = f"record_param_comms {coll}", canonical_op(coll)
    else:
        return None
    used = {id(root)} | {id(c) for c in (annotation, param) if c is not None}
    return _Op(comm=root, name=name, raw_name=raw, backend=backend, args=args, nested=len(flat) - len(used))


_COMM_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
              "Process Group Description", "Process Group Ranks", "Process Group ID", "Global rank start",
              "Global rank stride", "Seq", "Src Rank", "Dst Rank", "Rank")


def _comm_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in _COMM_ARGS if k in args}


def _annotation_args(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        out["Input Dims"] = dims[0]
    types = args.get("Input type")
    if isinstance(types, list) and types and isinstance(types[0], str) and types[0]:
        out["Input type"] = types[0]
    return out
