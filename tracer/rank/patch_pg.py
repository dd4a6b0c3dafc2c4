"""Which ProcessGroup and Work methods are patched, and under which torch.distributed op name.

Patched on the pybind class, so ``pg.allreduce([t])`` and ``work.wait()`` from any caller are recorded; method names
map to the torch.distributed spellings the analyzers compare across ranks (``_allgather_base`` ->
``all_gather_into_tensor``). The wrappers are in wrap_ops and wrap_work.
"""
from __future__ import annotations

from typing import Any

from .tracestate import TraceState
from .wrap_ops import make_pg_method_wrapper
from .wrap_work import make_wait_wrapper

__all__ = ["PG_METHODS", "install_process_group"]

# method -> (op name, category, index of the input tensor(s) in (self, ...), index of the peer group rank)
PG_METHODS: dict[str, tuple[str, str, int | None, int | None]] = {
    "allreduce": ("all_reduce", "collective", 1, None),
    "allreduce_coalesced": ("all_reduce_coalesced", "collective", 1, None),
    "broadcast": ("broadcast", "collective", 1, None),
    "reduce": ("reduce", "collective", 1, None),
    "allgather": ("all_gather", "collective", 2, None),
    "_allgather_base": ("all_gather_into_tensor", "collective", 2, None),
    "all_gather_single": ("all_gather_into_tensor", "collective", 2, None),
    "allgather_coalesced": ("all_gather_coalesced", "collective", 2, None),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "collective", 2, None),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", "collective", 2, None),
    "reduce_scatter": ("reduce_scatter", "collective", 2, None),
    "_reduce_scatter_base": ("reduce_scatter_tensor", "collective", 2, None),
    "reduce_scatter_single": ("reduce_scatter_tensor", "collective", 2, None),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "collective", 2, None),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", "collective", 2, None),
    "alltoall": ("all_to_all", "collective", 2, None),
    "alltoall_base": ("all_to_all_single", "collective", 2, None),
    "all_to_all_single": ("all_to_all_single", "collective", 2, None),
    "gather": ("gather", "collective", 2, None),
    "scatter": ("scatter", "collective", 1, None),
    "barrier": ("barrier", "collective", None, None),
    "monitored_barrier": ("monitored_barrier", "collective", None, None),
    "send": ("send", "p2p", 1, 2),
    "recv": ("recv", "p2p", 1, 2),
    "recv_anysource": ("recv_anysource", "p2p", 1, None),
}


def install_process_group(st: TraceState, c10d_ext: Any) -> dict[str, str]:
    """Patch ``ProcessGroup`` methods and ``Work.wait`` of ``torch._C._distributed_c10d``. Returns {name: how}."""
    how: dict[str, str] = {}
    pg_cls = getattr(c10d_ext, "ProcessGroup", None)
    if pg_cls is not None:
        for method, (op, category, tensor_index, peer_index) in PG_METHODS.items():
            how[f"ProcessGroup.{method}"] = _patch(
                pg_cls, method,
                lambda orig, m=method, o=op, c=category, ti=tensor_index, pi=peer_index:
                make_pg_method_wrapper(st, m, o, c, ti, pi, orig))
    work_cls = getattr(c10d_ext, "Work", None)
    if work_cls is not None:
        how["Work.wait"] = _patch(work_cls, "wait", lambda orig: make_wait_wrapper(st, orig))
    return how


def _patch(cls: type, name: str, make: Any) -> str:
    raw = cls.__dict__.get(name)
    if raw is None:
        return "absent"
    if getattr(raw, "__ranktrace__", False):
        return "done"
    orig = getattr(cls, name)  # the unbound function (pybind: a builtin taking self first)
    try:
        setattr(cls, name, make(orig))
    except (TypeError, AttributeError) as e:
        return f"failed: {e}"
    return "class"
