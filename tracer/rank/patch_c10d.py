"""Which torch.distributed functions are patched, and how the patch reaches callers that bound them early.

torch's public c10d functions are ``_exception_logger`` closures whose cell holds the real function: swapping that
cell's content reaches even ``from torch.distributed import all_reduce`` bound before us. Functions that are not
closures are replaced in ``distributed_c10d`` before ``torch.distributed`` re-exports them (inject's hook).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .optable import COALESCING_MANAGER, INIT_OPS, OP_SPECS
from .tracestate import TraceState
from .wrap_init import make_init_wrapper
from .wrap_ops import make_op_wrapper
from .wrap_work import make_coalescing_wrapper

__all__ = ["install_c10d", "swap"]


def install_c10d(st: TraceState, c10d: Any) -> dict[str, str]:
    """Patch torch.distributed.distributed_c10d in place. Returns {function: how} for the ring meta."""
    import torch  # already imported: c10d is being imported

    st.c10d = c10d
    st.skip_prefixes = st.skip_prefixes + (os.path.dirname(os.path.abspath(torch.__file__)),)
    st.non_member = getattr(c10d.GroupMember, "NON_GROUP_MEMBER", st.non_member)
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(type(world), "default_pg"):
        st._world_of = lambda: world.default_pg
        if hasattr(world, "_default_pg"):  # the property's own storage: read directly on the op path
            st.c10d_world = world
    else:
        st._world_of = lambda: c10d.GroupMember.WORLD
    st.load_nvtx()
    how: dict[str, str] = {}
    for name in OP_SPECS:
        how[name] = swap(c10d, name, lambda f, n=name: make_op_wrapper(st, n, f))
    for name in INIT_OPS:
        how[name] = swap(c10d, name, lambda f, n=name: make_init_wrapper(st, n, f))
    how[COALESCING_MANAGER] = swap(c10d, COALESCING_MANAGER, lambda f: make_coalescing_wrapper(st, f))
    return how


def swap(module: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> str:
    """Route `module.name` through a wrapper. Returns how: 'cell' (reaches early-bound refs) or 'attr'."""
    fn = module.__dict__.get(name)
    if fn is None:
        return "absent"
    if getattr(fn, "__ranktrace__", False):
        return "done"
    inner = getattr(fn, "__wrapped__", None)
    closure = getattr(fn, "__closure__", None) or ()
    for cell in closure:
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        if inner is not None and content is inner and callable(content):
            if getattr(content, "__ranktrace__", False):
                return "done"
            cell.cell_contents = make(content)
            return "cell"
    module.__dict__[name] = make(fn)
    return "attr"
