"""Wrappers of what follows an async op: ``Work.wait()`` (a span linked to the op whose handle it is) and
``_coalescing_manager`` blocks (one span for the block; each call inside is counted by its own op wrapper).

Neither records an op of its own: both relate spans the op wrappers made.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

from .slotwriter import C_COLL, C_SYNC, COMPLETE, ENTER, ERROR, EXIT, F_ASYNC, F_CAPTURING, N32, N64
from .spans import arg_positions, error_id, finish_wrapper, unwound
from .tracestate import ThreadState, TraceState, recording_thread

__all__ = ["make_wait_wrapper", "make_coalescing_wrapper"]


def make_wait_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait()``: a ``wait`` span (category sync) whose parent is the op the handle came from (same group,
    seq and peer); on gloo a wait that returned also completes that op (gloo does the work before wait returns;
    on NCCL wait only orders streams, so nothing is claimed there: a returned call is not a finished op)."""
    nid = [0]

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
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
            wflags = flags & F_CAPTURING
            st.put(ENTER, C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push("wait" if seq == N64 else f"wait seq={seq}")
        except Exception as e:
            st.fail(e)
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        local.depth = 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.put(ERROR, C_SYNC, wflags, name_id, gid, cs, 0, 0, error_id(st, e), peer, graph, seq, N64, N64,
                       span, parent, tid)
            except Exception as e2:
                st.fail(e2)
            unwound(e)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            st.put(EXIT, C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            if op is not None and gloo and result is not False and not wflags:
                st.put(COMPLETE, op_cat, flags, op_name, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, op_span, 0,
                       tid)
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(wait, orig, name="wait", qualname="Work.wait")


def make_coalescing_wrapper(st: TraceState, orig_gen: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    """Wraps the generator function inside ``@contextmanager _coalescing_manager``.

    The block is its own span (name ``coalesced``, no seq: each call inside advances seq by itself).
    torch's own set-up and the flush at block exit (``allreduce_coalesced`` / ``_end_coalescing`` / ``work.wait``)
    run with the depth guard closed, so the one backend op a block makes is not recorded a second time; the user's
    body runs with it open and its ops become children of the block span. Async handles the block hands out
    (``cm.works``) are linked to the block span for ``wait``.
    """
    pos = arg_positions(orig_gen)
    gi = pos.get("group", 0)
    ai = pos.get("async_ops", 1 << 30)

    def _coalescing_manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        gen = orig_gen(*args, **kwargs)
        local = recording_thread(st)
        if local is None:
            return (yield from gen)
        try:
            pg = args[gi] if gi < len(args) else kwargs.get("group")
            aop = bool(args[ai] if ai < len(args) else kwargs.get("async_ops", False))
            block = _CoalescedBlock(st, local, pg, aop, sys._getframe(1))
        except Exception as e:
            st.fail(e)
            return (yield from gen)
        return (yield from _run_block(gen, local, block))

    return finish_wrapper(_coalescing_manager, orig_gen)


class _CoalescedBlock:
    """The span of one coalesced block: made with its ENTER record; close() writes EXIT (backend_seq = the counter
    after the block's one backend op) or ERROR, and links the async handles the block handed out to its span."""

    __slots__ = ("st", "pg", "g", "gid", "cs", "capturing", "name_id", "span", "parent", "aop", "flags", "graph",
                 "nv", "tid")

    def __init__(self, st: TraceState, local: ThreadState, pg: Any, aop: bool, frame: Any) -> None:
        self.st = st
        self.tid = tid = local.tid
        if pg is None:
            pg = st._world_of()
        self.pg = pg
        self.g = g = st.group(pg) if pg is not None else None
        self.gid = g[1] if g is not None else 0
        self.cs = st.callsite(frame)
        self.capturing = st.capturing_for(tid)
        if g is not None and self.capturing is None:
            st.check_gap(g, pg, self.cs, tid)
        self.name_id = st.name_id("coalesced")
        self.span = st.new_span()
        self.parent = local.span
        self.aop = aop
        self.flags = F_ASYNC if aop else 0
        self.graph = N32
        if self.capturing is not None:
            self.flags |= F_CAPTURING
            self.graph = self.capturing
        st.put(ENTER, C_COLL, self.flags, self.name_id, self.gid, self.cs, 0, 0, 0, N32, self.graph, N64, N64, N64,
               self.span, self.parent, tid)
        self.nv = nv = st.nv
        if nv is not None:
            nv.push(f"coalesced group={g[2] if g is not None else ''}")

    def close(self, err: BaseException | None, cm: Any) -> None:
        """`cm`: what torch's generator yielded last (it holds the block's Work handles)."""
        st, g, gid = self.st, self.g, self.gid
        try:
            if self.nv is not None:
                self.nv.pop()
            bseq = N64
            if err is None and g is not None and self.capturing is None and g[4] is not None:
                bseq = g[4](self.pg)
                st.bseq_last[gid] = bseq
            elif g is not None:
                st.bseq_last.pop(gid, None)
            st.put(ERROR if err is not None else EXIT, C_COLL, self.flags, self.name_id, gid, self.cs, 0, 0,
                   error_id(st, err) if err is not None else 0, N32, self.graph, N64, bseq, N64, self.span,
                   self.parent, self.tid)
            if err is None and self.aop and cm is not None:
                for work in getattr(cm, "works", None) or ():
                    st.register_work(work, (self.span, self.name_id, C_COLL, gid, N64, N32, self.graph, self.flags,
                                            g is not None and g[5]))
        except Exception as e:
            st.fail(e)


def _run_block(gen: Any, local: ThreadState, block: _CoalescedBlock) -> Iterator[Any]:
    """Drive torch's generator: its own steps (set-up, flush) with the depth guard closed, the user's body (while
    we are suspended at ``yield``) with the block as the thread's current span. Whatever torch's generator
    returns, yields or raises reaches the caller as without us."""
    try:
        running, cm = _torch_step(local, gen.send, None)  # torch's set-up (start coalescing)
    except BaseException as e:
        block.close(e, None)
        unwound(e)
        raise
    if not running:  # did not yield: contextmanager reports that, as without us
        block.close(None, None)
        return cm
    while True:
        local.span = block.span
        try:
            sent = yield cm
        except GeneratorExit:
            local.span = block.parent
            gen.close()
            block.close(None, cm)
            raise
        except BaseException as e:  # the block's body raised: torch's generator sees it, as without us
            local.span = block.parent
            step, arg = gen.throw, e
        else:
            local.span = block.parent
            step, arg = gen.send, sent  # torch's flush: one coalesced backend op
        try:
            running, value = _torch_step(local, step, arg)
        except BaseException as e2:
            block.close(e2, cm)
            unwound(e2)
            raise
        if not running:
            block.close(None, cm)
            return value
        cm = value


def _torch_step(local: ThreadState, step: Callable[[Any], Any], arg: Any) -> tuple[bool, Any]:
    """One step of torch's generator under the depth guard: (True, what it yielded) or (False, what it returned);
    what it raises propagates (the guard restored first)."""
    local.depth += 1
    try:
        return True, step(arg)
    except StopIteration as stop:
        return False, stop.value
    finally:
        local.depth -= 1
