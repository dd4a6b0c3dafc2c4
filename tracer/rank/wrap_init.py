"""Wrappers of init_process_group / new_group / destroy_process_group: recorded in the ring's non-wrapping
region (a serving loop's idle ops must never evict them), with the backend-counter bookkeeping init needs.

Separate from ranktrace.tracer.rank.wrap_ops because init calls are not ops: no seq, no fast path, their own ring region.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from .state import (TraceState, _callsite_text, _finish, _positions, error_text)

__all__ = ["_make_init_wrapper", "_arg"]  # private names too: tracer.hooks re-exports them


def _make_init_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """Recorded in the non-wrapping region. Init calls issue backend ops of their own on existing groups, so the
    counter gap check runs before them and every live group is re-based after them."""
    pos = _positions(orig)

    def record(kind: str, span: int, extra: dict[str, Any]) -> None:
        st.meta_event(kind, name, "init", span, st.local.tid, **extra)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not st.enabled or st.local.depth:
            return orig(*args, **kwargs)
        span = 0
        nv = None
        try:
            for fn in st.on_init:
                fn()
            span = st.new_span()
            extra: dict[str, Any] = {"callsite": _callsite_text(st, sys._getframe(1))}
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
            record("enter", span, extra)
            nv = st.nv
            if nv is not None:
                nv.push(name)
        except Exception as e:
            st.fail(e)
        st.local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            st.local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                record("error", span, {"error": error_text(e)})
            except Exception as e2:
                st.fail(e2)
            raise
        st.local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            if name == "init_process_group":
                st.rank, st.world = st.c10d.get_rank(), st.c10d.get_world_size()
                st.identity("init_process_group")
                st.group(st.c10d.GroupMember.WORLD)
            elif name == "new_group" and result is not None and result is not st.c10d.GroupMember.NON_GROUP_MEMBER:
                st.group(result)
            if name == "destroy_process_group":
                st.bseq_last.clear()  # groups are gone: never call into a destroyed backend
            else:
                st.rebaseline(check=False)
            record("exit", span, {})
            if name == "init_process_group":
                for fn in st.on_init:
                    fn()
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wrapper, orig)


def _arg(pos: dict[str, int], args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    i = pos.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name, default)
