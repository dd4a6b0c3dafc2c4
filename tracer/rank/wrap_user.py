"""Wrappers of ``--hook MODULE:QUALNAME[=category]`` targets (patch_user resolves them): collective targets aligned
per bound object, phases in the meta region, ``async def`` targets kept coroutine functions.
"""
from __future__ import annotations

import inspect
import sys
import weakref
from typing import Any, Callable

from .nvtx_ranges import range_text
from .slotwriter import C_COLL, CAT, ENTER, ERROR, EXIT, F_CAPTURING, N32, N64
from .spans import error_id, error_text, finish_wrapper, run_meta_span, run_slot_span, unwound
from .tracestate import TraceState, recording_thread

__all__ = ["make_user_wrapper", "MAX_META_SPANS"]

MAX_META_SPANS = 4096  # --hook phase enter/exit records in the meta region before they spill to op slots
_GROUP_ATTRS = ("group", "pg", "process_group", "cpu_group", "device_group")


def make_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                      bound: bool) -> Callable[..., Any]:
    """A user-named function or method.

    collective: op records with group = "hook:<qualname>#<k>" where k is the k-th distinct bound object this rank
      called it on (module functions: "hook:<qualname>"), seq counted per (object, qualname) — so pynccl
      communicators and custom all-reduce objects, created in the same order on every rank, align across ranks;
    phase: enter/exit in the meta region like init events (analyzer's last_phase sees them);
    graph / sync / user: op records in that category.
    The depth guard is left open inside: torch.distributed calls the target makes are recorded as its children.
    """
    if inspect.isasyncgenfunction(orig):
        # a wrapper would have to re-yield every item and would hide that it is an async generator: not patched
        raise TypeError("async generator functions are not traced (hook the coroutine that iterates it)")
    if inspect.iscoroutinefunction(orig):
        return _make_async_user_wrapper(st, spec, qualname, category, orig, bound)
    if category == "phase":
        def phase_hook(*args: Any, **kwargs: Any) -> Any:
            try:
                if st.meta_spans >= MAX_META_SPANS:  # a hot "phase": stop spending the non-wrapping region on it
                    return _slot_span_call(st, qualname, CAT["phase"], None, False, orig, args, kwargs,
                                           sys._getframe(1))
                st.meta_spans += 1
                return run_meta_span(st, qualname, "phase", orig, args, kwargs, sys._getframe(1))
            except BaseException as e_:
                unwound(e_)
                raise

        return finish_wrapper(phase_hook, orig)
    cat = CAT[category]
    group_of = _bound_group_of(st, spec, qualname, bound) if cat == C_COLL else None

    def user_hook(*args: Any, **kwargs: Any) -> Any:
        try:
            return _slot_span_call(st, qualname, cat, group_of, bound, orig, args, kwargs, sys._getframe(1))
        except BaseException as e_:
            unwound(e_)
            raise

    return finish_wrapper(user_hook, orig)


def _bound_group_of(st: TraceState, spec: str, qualname: str, bound: bool) -> Callable[[Any], tuple[int, str]]:
    """obj -> (group id, group name) of a collective --hook target: "hook:<qualname>#<k>" for the k-th distinct
    object this rank called it on, "hook:<qualname>" for a plain function."""
    groups: dict[int, tuple[Any, int, str]] = {}
    plain_group: list[tuple[int, str] | None] = [None]

    def group_of(obj: Any) -> tuple[int, str]:
        if not bound:
            if plain_group[0] is None:
                plain_group[0] = _user_group(st, f"hook:{qualname}", spec, None)
            return plain_group[0]
        hit = groups.get(id(obj))
        if hit is not None and (hit[0] is None or hit[0]() is obj):
            return hit[1], hit[2]
        k = sum(1 for _ in groups)  # the k-th distinct object on this rank
        gid, gname = _user_group(st, f"hook:{qualname}#{k}", spec, obj)
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        groups[id(obj)] = (ref, gid, gname)
        return gid, gname

    return group_of


def _make_async_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                             bound: bool) -> Callable[..., Any]:
    """An ``async def`` target (a serving engine's scheduler step, a request handler): the wrapper is itself a
    coroutine function — frameworks check ``inspect.iscoroutinefunction`` — and its span runs from the first step
    of the coroutine to its return, across every await. Other coroutines interleave on this thread meanwhile, so
    the span is not made the parent of what runs during it (the thread-wide current span would mis-parent them)."""
    group_of = _bound_group_of(st, spec, qualname, bound) if category == "collective" else None

    async def async_hook(*args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return await orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            tid, parent, span = local.tid, local.span, st.new_span()
            frame = sys._getframe(1)
            if category == "phase" and st.meta_spans < MAX_META_SPANS:
                st.meta_spans += 1
                meta = True
                st.meta_event("enter", qualname, "phase", span, tid, callsite=st.callsite_text(frame),
                              parent_span_id=parent or None)
            else:
                meta = False
                cat = CAT[category]
                gid, seq = 0, N64
                if group_of is not None:
                    gid, gname = group_of(args[0] if bound and args else None)
                    seq = st.seq.get(gname, 0) + 1
                    st.seq[gname] = seq
                name_id, cs = st.name_id(qualname), st.callsite(frame)
                st.put(ENTER, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
            try:
                return await orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            result = await orig(*args, **kwargs)
        except BaseException as e:  # CancelledError included: the span ends where the task was cancelled
            try:
                if meta:
                    st.meta_event("error", qualname, "phase", span, tid, error=error_text(e))
                else:
                    st.put(ERROR, cat, 0, name_id, gid, cs, 0, 0, error_id(st, e), N32, N32, seq, N64, N64, span,
                           parent, tid)
            except Exception as e2:
                st.fail(e2)
            unwound(e)
            raise
        try:
            if meta:
                st.meta_event("exit", qualname, "phase", span, tid)
            else:
                st.put(EXIT, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(async_hook, orig)


def _user_group(st: TraceState, name: str, spec: str, obj: Any) -> tuple[int, str]:
    ranks = None
    c10d = st.c10d
    if obj is not None and c10d is not None:
        for attr in _GROUP_ATTRS:
            pg = getattr(obj, attr, None)
            if pg is not None and hasattr(pg, "_get_sequence_number_for_group"):
                try:
                    ranks = list(c10d.get_process_group_ranks(pg))
                    break
                except Exception:
                    continue
    st.rec.meta({"type": "group", "name": name, "desc": f"--hook {spec}", "backend": "hook", "ranks": ranks})
    return st.rec.intern(name), name


def _slot_span_call(st: TraceState, name: str, cat: int, group_of: Callable[[Any], tuple[int, str]] | None,
                    bound: bool, orig: Callable[..., Any], args: tuple, kwargs: dict, frame: Any) -> Any:
    """Call orig inside an enter/exit op-record pair (children parented to it, depth guard left open); with
    `group_of`, in the group of the object it is bound to (args[0]), seq counted per group."""
    local = recording_thread(st)
    if local is None:
        try:
            return orig(*args, **kwargs)
        except BaseException as e_:
            unwound(e_)
            raise
    try:
        grp = group_of(args[0] if bound and args else None) if group_of is not None else None
        tid = local.tid
        name_id = st.name_id(name)
        cs = st.callsite(frame)
        span = st.new_span()
        parent = local.span
        gid, seq = 0, N64
        capturing = st.capturing_for(tid)
        flags, graph = (0, N32) if capturing is None else (F_CAPTURING, capturing)
        if grp is not None:
            gid = grp[0]
            if capturing is None:
                seq = st.seq.get(grp[1], 0) + 1
                st.seq[grp[1]] = seq
        rec = (cat, flags, name_id, gid, cs, 0, 0, 0, N32, graph, seq, N64, N64, span, parent, tid)
        st.put(ENTER, *rec)
        nv = st.nv
        if nv is not None:
            nv.push(range_text(name, grp[1], seq, None) if grp is not None else name)
    except Exception as e:
        st.fail(e)
        try:
            return orig(*args, **kwargs)
        except BaseException as e_:
            unwound(e_)
            raise
    try:
        return run_slot_span(st, local, orig, args, kwargs, rec, nv, guard=False)
    except BaseException as e_:
        unwound(e_)
        raise


