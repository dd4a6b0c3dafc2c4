"""Wrappers of init_process_group / new_group / destroy_process_group: recorded in the ring's meta region (a
serving loop's idle ops must never evict them), with the backend-counter bookkeeping init calls need.

Not ops: no seq, no fast path.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from .spans import arg_positions, error_text, finish_wrapper, unwound
from .tracestate import TraceState, recording_thread

__all__ = ["make_init_wrapper"]


def make_init_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """Recorded in the non-wrapping region. Init calls issue backend ops of their own on existing groups, so the
    counter gap check runs before them and every live group is re-based after them."""
    pos = arg_positions(orig)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        span = 0
        nv = None
        try:
            for fn in st.on_init:  # pending --hook targets: the script's classes exist by now
                fn()
            span = st.new_span()
            extra: dict[str, Any] = {"callsite": st.callsite_text(sys._getframe(1))}
            _before_init(st, name, pos, args, kwargs, extra)
            st.meta_event("enter", name, "init", span, local.tid, **extra)
            nv = st.nv
            if nv is not None:
                nv.push(name)
        except Exception as e:
            st.fail(e)
        local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.meta_event("error", name, "init", span, local.tid, error=error_text(e))
            except Exception as e2:
                st.fail(e2)
            unwound(e)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            _after_init(st, name, result)
            st.meta_event("exit", name, "init", span, local.tid)
            if name == "init_process_group":
                for fn in st.on_init:
                    fn()
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(wrapper, orig)


def _before_init(st: TraceState, name: str, pos: dict[str, int], args: tuple, kwargs: dict,
                 extra: dict[str, Any]) -> None:
    """Before the call: the rank and world it was given (into `extra`, what the enter event says about the call),
    and the counter gap check."""
    if name == "init_process_group":
        rank, world = _arg(pos, args, kwargs, "rank", -1), _arg(pos, args, kwargs, "world_size", -1)
        extra.update(backend=str(_arg(pos, args, kwargs, "backend")), rank=rank, world=world)
        if isinstance(rank, int) and rank >= 0:
            st.rank = rank
        if isinstance(world, int) and world > 0:
            st.world = world
        st.identity("init_args")
    elif name == "new_group":
        ranks = _arg(pos, args, kwargs, "ranks")
        extra.update(ranks=list(ranks) if ranks is not None else None)
    st.rebaseline(check=True)


def _after_init(st: TraceState, name: str, result: Any) -> None:
    """After the call returned: the identity and groups it made, and new counter baselines."""
    c10d = st.c10d
    if name == "init_process_group":
        st.rank, st.world = c10d.get_rank(), c10d.get_world_size()
        st.identity("init_process_group")
        st.group(c10d.GroupMember.WORLD)
    elif name == "new_group" and result is not None and result is not c10d.GroupMember.NON_GROUP_MEMBER:
        st.group(result)
    if name == "destroy_process_group":
        st.bseq_last.clear()  # groups are gone: never call into a destroyed backend
    else:
        st.rebaseline(check=False)


def _arg(pos: dict[str, int], args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    i = pos.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name, default)
