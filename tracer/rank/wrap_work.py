"""Wrappers of what follows an async op: ``Work.wait()`` (linked to the op whose handle it is) and
``_coalescing_manager`` blocks (one span for the block; each call inside is counted by its own op wrapper).

Separate from ranktrace.tracer.rank.wrap_ops because neither records an op of its own: both relate spans the op wrappers made.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

from .state import (N32, N64, TraceState, _COMPLETE, _C_COLL, _C_SYNC, _ENTER, _ERROR, _EXIT, _F_ASYNC, _F_CAPTURING,
    _error_id, _finish, _positions)

__all__ = ["make_wait_wrapper", "_make_coalescing_wrapper"]  # private names too: tracer.hooks re-exports them


def make_wait_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait()``: a ``wait`` span (category sync) whose parent is the op the handle came from (same group,
    seq and peer); on gloo a wait that returned also completes that op (gloo does the work before wait returns;
    on NCCL wait only orders streams, so nothing is claimed there — DESIGN §2)."""
    nid = [0]

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(self, *args, **kwargs)
        try:
            tid = local.tid
            op = st.works.get(id(self))
            if op is not None and op[0]() is not self:
                op = None
            if op is not None:
                _ref, op_span, op_name, op_cat, gid, seq, peer, graph, flags, gloo = op
            else:
                op_span, op_name, op_cat, gid, seq, peer, graph, flags, gloo = 0, 0, 0, 0, N64, N32, N32, 0, False
            name_id = nid[0] or st.name_id("wait")
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            span = st.new_span()
            parent = op_span or local.span
            wflags = flags & _F_CAPTURING
            st.put(_ENTER, _C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push("wait" if seq == N64 else f"wait seq={seq}")
        except Exception as e:
            st.fail(e)
            return orig(self, *args, **kwargs)
        local.depth = 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.put(_ERROR, _C_SYNC, wflags, name_id, gid, cs, 0, 0, _error_id(st, e), peer, graph, seq, N64, N64,
                       span, parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            st.put(_EXIT, _C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            if op is not None and gloo and result is not False and not wflags:
                st.put(_COMPLETE, op_cat, flags, op_name, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, op_span, 0,
                       tid)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wait, orig, name="wait", qualname="Work.wait")


def _make_coalescing_wrapper(st: TraceState, orig_gen: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    """Wraps the generator function inside ``@contextmanager _coalescing_manager``.

    The block is its own span (name ``coalesced``, no seq: each call inside advances seq by itself, DESIGN §3).
    torch's own set-up and the flush at block exit (``allreduce_coalesced`` / ``_end_coalescing`` / ``work.wait``)
    run with the depth guard closed, so the one backend op a block makes is not recorded a second time; the user's
    body runs with it open and its ops become children of the block span. Async handles the block hands out
    (``cm.works``) are linked to the block span for ``wait``.
    """
    pos = _positions(orig_gen)
    gi = pos.get("group", 0)
    ai = pos.get("async_ops", 1 << 30)
    nid = [0]

    def _coalescing_manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        gen = orig_gen(*args, **kwargs)
        if local.depth or not st.enabled:
            return (yield from gen)
        span = 0
        try:
            tid = local.tid
            pg = args[gi] if gi < len(args) else kwargs.get("group")
            if pg is None:
                pg = st._world_of()
            g = st.group(pg) if pg is not None else None
            gid = g[1] if g is not None else 0
            cs = st.callsite(sys._getframe(1))
            capturing = st.capturing_for(tid)
            if g is not None and capturing is None:
                st.check_gap(g, pg, cs, tid)
            name_id = nid[0] or st.name_id("coalesced")
            nid[0] = name_id
            span = st.new_span()
            parent = local.span
            aop = bool(args[ai] if ai < len(args) else kwargs.get("async_ops", False))
            flags = _F_ASYNC if aop else 0
            graph = N32
            if capturing is not None:
                flags |= _F_CAPTURING
                graph = capturing
            st.put(_ENTER, _C_COLL, flags, name_id, gid, cs, 0, 0, 0, N32, graph, N64, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push(f"coalesced group={g[2] if g is not None else ''}")
        except Exception as e:
            st.fail(e)
            return (yield from gen)

        def close(err: BaseException | None) -> None:
            try:
                if nv is not None:
                    nv.pop()
                bseq = N64
                if err is None and g is not None and capturing is None and g[4] is not None:
                    bseq = g[4](pg)
                    st.bseq_last[gid] = bseq
                elif g is not None:
                    st.bseq_last.pop(gid, None)
                st.put(_ERROR if err is not None else _EXIT, _C_COLL, flags, name_id, gid, cs, 0, 0,
                       _error_id(st, err) if err is not None else 0, N32, graph, N64, bseq, N64, span, parent, tid)
                if err is None and aop and cm is not None:
                    for work in getattr(cm, "works", None) or ():
                        st.register_work(work, (span, name_id, _C_COLL, gid, N64, N32, graph, flags,
                                                g is not None and g[5]))
            except Exception as e:
                st.fail(e)

        cm = None
        local.depth += 1
        try:
            cm = gen.send(None)  # torch's set-up (start coalescing)
        except StopIteration as stop:  # did not yield: contextmanager reports that, as without us
            local.depth -= 1
            close(None)
            return stop.value
        except BaseException as e:
            local.depth -= 1
            close(e)
            raise
        local.depth -= 1
        while True:
            local.span = span
            try:
                sent = yield cm
            except GeneratorExit:
                local.span = parent
                gen.close()
                close(None)
                raise
            except BaseException as e:  # the block's body raised: torch's generator sees it, as without us
                local.span = parent
                local.depth += 1
                try:
                    cm = gen.throw(e)
                except StopIteration as stop:
                    local.depth -= 1
                    close(None)
                    return stop.value
                except BaseException as e2:
                    local.depth -= 1
                    close(e2)
                    raise
                local.depth -= 1
                continue
            local.span = parent
            local.depth += 1
            try:
                cm = gen.send(sent)  # torch's flush: one coalesced backend op
            except StopIteration as stop:
                local.depth -= 1
                close(None)
                return stop.value
            except BaseException as e:
                local.depth -= 1
                close(e)
                raise
            local.depth -= 1

    return _finish(_coalescing_manager, orig_gen)
