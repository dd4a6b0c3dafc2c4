"""What the wrap_* modules share: the wrapped call inside a span (ring slots or the meta region), the error text a
record keeps, and a wrapper made to look like what it wraps.

These frames sit on a rank's stack during every traced call: analyzers/model/hoststate.py TRACER_FRAME knows this file.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Callable

from ..formats import redact
from .slotwriter import ERROR, EXIT
from .tracestate import ThreadState, TraceState, recording_thread

__all__ = ["run_slot_span", "run_meta_span", "error_text", "error_id", "finish_wrapper", "arg_positions", "unwound"]

_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def unwound(err: BaseException) -> None:
    """Drop ranktrace's own frames from the head of `err`'s traceback before a wrapper re-raises it with a bare
    ``raise`` (which keeps the traceback as it is, adding no frame): the job's traceback reads as if the wrapper
    were not there. When nothing else is left (a builtin such as a ProcessGroup method raised), the traceback starts
    again at the caller's frame, exactly as the builtin called directly would have it."""
    tb = err.__traceback__
    head = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
        tb = tb.tb_next
    if tb is not head:
        err.__traceback__ = tb


def run_slot_span(st: TraceState, local: ThreadState, orig: Callable[..., Any], args: tuple, kwargs: dict,
                  rec: tuple, nv: Any, *, guard: bool) -> Any:
    """The call half of an op-record wrapper, after it wrote its ENTER record: call `orig`, then write EXIT — or
    ERROR with the exception's text and re-raise it unchanged. `rec` is the ENTER record's fields after the kind
    (category, flags, name, group, call site, dtype, shape, error, peer, graph, seq, backend_seq, nbytes, span,
    parent, tid). `guard`: hold the depth guard (a leaf span: calls inside are not recorded); otherwise make the
    span the thread's current one (a container: calls inside are recorded as its children)."""
    if guard:
        local.depth = 1
    else:
        local.span = rec[13]
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        if guard:
            local.depth = 0
        else:
            local.span = rec[14]
        try:
            if nv is not None:
                nv.pop()
            st.put(ERROR, *rec[:7], error_id(st, e), *rec[8:])
        except Exception as e2:
            st.fail(e2)
        unwound(e)
        raise
    if guard:
        local.depth = 0
    else:
        local.span = rec[14]
    try:
        if nv is not None:
            nv.pop()
        st.put(EXIT, *rec)
    except Exception as e:
        st.fail(e)
    return result


def run_meta_span(st: TraceState, name: str, category: str, orig: Callable[..., Any], args: tuple, kwargs: dict,
                  frame: Any, extra: dict[str, Any] | None = None) -> Any:
    """Call orig inside an enter/exit pair in the meta region (never evicted), children parented to it: rare,
    precious spans (make_graphed_callables, profile phases and set-up steps); `extra` goes into the enter record
    (``detail``: the argument that names the instance)."""
    local = recording_thread(st)
    if local is None:
        try:
            return orig(*args, **kwargs)
        except BaseException as e_:
            unwound(e_)
            raise
    try:
        span = st.new_span()
        parent = local.span
        st.meta_event("enter", name, category, span, local.tid, callsite=st.callsite_text(frame),
                      parent_span_id=parent or None, **(extra or {}))
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
    local.span = span
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        local.span = parent
        try:
            if nv is not None:
                nv.pop()
            st.meta_event("error", name, category, span, local.tid, error=error_text(e))
        except Exception as e2:
            st.fail(e2)
        unwound(e)
        raise
    local.span = parent
    try:
        if nv is not None:
            nv.pop()
        st.meta_event("exit", name, category, span, local.tid)
    except Exception as e:
        st.fail(e)
    return result


def error_text(err: BaseException) -> str:
    """What a ring keeps of a job's exception: type and message, secrets redacted (a failed rendezvous names its
    URL, credentials included), cut to 500 characters. A message that cannot even be rendered is said so."""
    try:
        msg = str(err)
    except Exception as e:  # a broken __str__ of the job's exception must not become ranktrace's failure
        msg = f"<message not readable: {type(e).__name__}>"
    return redact.redact_value(f"{type(err).__name__}: {msg}")[:500]


def error_id(st: TraceState, err: BaseException) -> int:
    """String id of error_text(err) (also called by _fastspan.c for its ERROR records)."""
    return st.rec.intern(error_text(err))


def finish_wrapper(wrapper: Callable[..., Any], orig: Callable[..., Any], name: str | None = None,
                   qualname: str | None = None) -> Callable[..., Any]:
    """Make the wrapper look like what it wraps (name, doc, module) and mark it as ours (``__ranktrace__``: never
    wrapped twice)."""
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(orig, attr))
        except (AttributeError, TypeError):
            pass
    if name is not None and getattr(wrapper, "__name__", None) != name:
        wrapper.__name__ = name
    if qualname is not None:
        wrapper.__qualname__ = qualname
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__ranktrace__ = True  # type: ignore[attr-defined]
    return wrapper


def arg_positions(fn: Callable[..., Any]) -> dict[str, int]:
    """Parameter name -> position in `fn`'s signature (empty when it has none Python can read)."""
    try:
        return {p: i for i, p in enumerate(inspect.signature(fn).parameters)}
    except (TypeError, ValueError):
        return {}
