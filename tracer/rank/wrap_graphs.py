"""Wrappers of CUDA-graph capture and replay, make_graphed_callables, and host syncs (patch_graphs decides where
they go). On NCCL a rank whose collective never completes blocks in a host sync, not in the collective call.

None of them makes a CUDA call: while a capture is open, ranktrace makes none.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from .fastpath import MODE_SYNC, with_fastpath
from .slotwriter import C_GRAPH, C_SYNC, ENTER, ERROR, EXIT, F_CAPTURING, N32, N64
from .spans import error_id, error_text, finish_wrapper, run_meta_span, run_slot_span, unwound
from .tracestate import ThreadState, TraceState, recording_thread

__all__ = ["CAPTURE", "make_graph_enter_wrapper", "make_graph_exit_wrapper", "make_capture_wrapper",
           "make_replay_wrapper", "make_sync_wrapper", "make_graphed_callables_wrapper"]

CAPTURE = "cuda_graph_capture"


def _open_capture(st: TraceState, graph: Any, frame: Any) -> tuple[int, int, int, Any]:
    """Enter of a capture span, in the meta region while it has room (st.meta_room), else an op slot; returns (span,
    graph id, parent, nvtx) — a negative span id marks a slot-recorded one."""
    local = st.local
    gid = st.graph_id(graph)
    span = st.new_span()
    parent = local.span
    if st.meta_room():
        st.meta_event("enter", CAPTURE, "graph", span, local.tid, graph_id=gid, callsite=st.callsite_text(frame),
                      parent_span_id=parent or None)
    else:
        st.put(ENTER, C_GRAPH, 0, st.name_id(CAPTURE), 0, st.callsite(frame), 0, 0, 0, N32, gid, N64, N64, N64, span,
               parent, local.tid)
        span = -span
    nv = st.nv
    if nv is not None:
        nv.push(f"{CAPTURE} graph={gid}")
    return span, gid, parent, nv


def _begin_capturing(st: TraceState, gid: int, span: int) -> None:
    """From here until the capture closes, ops get capturing=true + graph_id and no seq; ranktrace makes no CUDA
    call (it never does), and backend counters are not read (captured ops move them without running)."""
    st.capturing = gid
    st.capture_span = abs(span)
    st.capture_tid = st.local.tid
    st.local.span = abs(span)


def _close_capture(st: TraceState, span: int, gid: int, parent: int, nv: Any, err: BaseException | None) -> None:
    st.capturing = None
    st.capture_span = 0
    st.local.span = parent
    if nv is not None:
        nv.pop()
    if span < 0:  # recorded in op slots (the meta region was half full)
        st.put(ERROR if err is not None else EXIT, C_GRAPH, 0, st.name_id(CAPTURE), 0, 0, 0, 0,
               error_id(st, err) if err is not None else 0, N32, gid, N64, N64, N64, -span, parent, st.local.tid)
    else:
        extra: dict[str, Any] = {"graph_id": gid}
        if err is not None:
            extra["error"] = error_text(err)
        st.meta_event("error" if err is not None else "exit", CAPTURE, "graph", span, st.local.tid, **extra)
    st.rebaseline(check=False)  # captured collectives moved backend counters; they are not untraced ops


def _graph_ctx_call(st: TraceState, local: ThreadState, opened: tuple[int, int, int, Any],
                    call: Callable[[], Any]) -> Any:
    """torch.cuda.graph's own __enter__ / __exit__ under the depth guard (its synchronize / capture_begin / end
    inside are not recorded separately); when it raises, the capture span closes as an error and the exception
    goes on unchanged."""
    local.depth += 1
    local.in_graph_ctx += 1
    try:
        return call()
    except BaseException as e:
        try:
            _close_capture(st, *opened, e)
        except Exception as e2:
            st.fail(e2)
        unwound(e)
        raise
    finally:
        local.depth -= 1
        local.in_graph_ctx -= 1


def make_graph_enter_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.graph.__enter__``: opens the capture span at the user's ``with`` line; torch's own
    synchronize / capture_begin inside it are not recorded separately."""

    def __enter__(self: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(self)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            graph = getattr(self, "cuda_graph", None)
            opened = _open_capture(st, graph if graph is not None else self, sys._getframe(1))
        except Exception as e:
            st.fail(e)
            try:
                return orig(self)
            except BaseException as e_:
                unwound(e_)
                raise
        st.capture_starting()  # first: it may wait out an agent's Flight Recorder dump (CaptureState)
        try:
            result = _graph_ctx_call(st, local, opened, lambda: orig(self))
            _begin_capturing(st, opened[1], opened[0])
            st.open_captures[("ctx", id(self))] = opened
        except BaseException as e_:
            unwound(e_)
            raise
        finally:
            st.capture_started()
        return result

    return finish_wrapper(__enter__, orig, name="__enter__")


def make_graph_exit_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.graph.__exit__``: closes the span opened by __enter__ (error kind when capture_end raised)."""

    def __exit__(self: Any, *args: Any) -> Any:
        local = st.local
        opened = st.open_captures.pop(("ctx", id(self)), None)
        if opened is None or not st.enabled:
            try:
                return orig(self, *args)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            result = _graph_ctx_call(st, local, opened, lambda: orig(self, *args))
        except BaseException as e_:
            unwound(e_)
            raise
        try:
            _close_capture(st, *opened, None)
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(__exit__, orig, name="__exit__")


def make_capture_wrapper(st: TraceState, which: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.capture_begin`` / ``capture_end`` called directly (not from torch.cuda.graph, which records the
    span itself): the same capture span, opened by capture_begin and closed by capture_end."""
    begin = which == "capture_begin"

    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None or local.in_graph_ctx:
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        opened = None
        try:
            if begin:
                opened = _open_capture(st, self, sys._getframe(1))
            else:
                opened = st.open_captures.pop(("graph", id(self)), None)
        except Exception as e:
            st.fail(e)
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        if begin:
            st.capture_starting()  # first: it may wait out an agent's Flight Recorder dump (CaptureState)
        local.depth += 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            if begin:
                st.capture_started()
            local.depth -= 1
            try:
                if opened is not None:
                    _close_capture(st, *opened, e)
                else:
                    st.capturing = None
            except Exception as e2:
                st.fail(e2)
            unwound(e)
            raise
        local.depth -= 1
        try:
            if begin:
                _begin_capturing(st, opened[1], opened[0])  # type: ignore[index]
                st.open_captures[("graph", id(self))] = opened  # type: ignore[assignment]
            elif opened is not None:
                _close_capture(st, *opened, None)
            else:
                st.capturing = None
        except Exception as e:
            st.fail(e)
        finally:
            if begin:
                st.capture_started()
        return result

    return finish_wrapper(capture, orig, name=which)


def make_replay_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.replay``: a ``replay`` span (category graph) with seq = this graph's replay count on this rank.
    Replay returns once the graph is launched, so an open replay span means the launch itself blocked."""
    nid = [0]

    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            tid = local.tid
            gid = st.graph_id(self)
            seq = st.replays.get(gid, 0) + 1
            st.replays[gid] = seq
            name_id = nid[0] or st.name_id("replay")
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            rec = (C_GRAPH, 0, name_id, 0, cs, 0, 0, 0, N32, gid, seq, N64, N64, st.new_span(), local.span, tid)
            st.put(ENTER, *rec)
            nv = st.nv
            if nv is not None:
                nv.push(f"replay graph={gid} seq={seq}")
        except Exception as e:
            st.fail(e)
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            return run_slot_span(st, local, orig, (self, *args), kwargs, rec, nv, guard=True)
        except BaseException as e_:
            unwound(e_)
            raise

    return finish_wrapper(replay, orig, name="replay")


def make_sync_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """A host sync (``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``): a span in category
    sync — on NCCL this is where a rank whose collective never completes actually blocks."""
    nid = [0]

    def sync(*args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            tid = local.tid
            name_id = nid[0] or st.name_id(name)
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            capturing = st.capturing_for(tid)
            flags, graph = (0, N32) if capturing is None else (F_CAPTURING, capturing)
            rec = (C_SYNC, flags, name_id, 0, cs, 0, 0, 0, N32, graph, N64, N64, N64, st.new_span(), local.span, tid)
            st.put(ENTER, *rec)
            nv = st.nv
            if nv is not None:
                nv.push(name)
        except Exception as e:
            st.fail(e)
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            return run_slot_span(st, local, orig, args, kwargs, rec, nv, guard=True)
        except BaseException as e_:
            unwound(e_)
            raise

    return finish_wrapper(with_fastpath(st, finish_wrapper(sync, orig), orig, name, MODE_SYNC, "sync"), orig)


def make_graphed_callables_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.make_graphed_callables``: a meta-region span (category graph); the warm-up and the captures it
    runs are recorded inside it (depth guard left open)."""

    def make_graphed_callables(*args: Any, **kwargs: Any) -> Any:
        try:
            return run_meta_span(st, "make_graphed_callables", "graph", orig, args, kwargs, sys._getframe(1))
        except BaseException as e_:
            unwound(e_)
            raise

    return finish_wrapper(make_graphed_callables, orig)
