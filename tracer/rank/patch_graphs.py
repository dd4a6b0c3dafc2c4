"""Which CUDA-graph and host-sync entry points are patched (the wrappers live in tracer.hooks).

Why these: a rank that never finishes a graph capture leaves its peers waiting in their next real collective, and
on NCCL a rank whose collective never completes blocks in a host sync, not in the collective call (DESIGN §2).
So we record
* graph captures — ``torch.cuda.graph`` enter/exit, or ``CUDAGraph.capture_begin``/``capture_end`` called
  directly — as ``cuda_graph_capture`` enter/exit events (category graph) in the non-wrapping meta region, and
  set ``TraceState.capturing`` to the graph id while the capture is open (ops then carry capturing=true,
  graph_id, and no seq);
* ``CUDAGraph.replay`` as ``replay`` spans counted per graph (seq = replay count of that graph on this rank);
* ``torch.cuda.make_graphed_callables`` as a meta-region span around the captures it makes;
* ``torch.cuda.synchronize``, ``torch.cuda.Stream.synchronize``, ``torch.cuda.Event.synchronize`` as sync spans.

None of this makes a CUDA call, so it is safe while a capture is open, and it works on CPU builds, where the classes
exist but cannot be instantiated. Installed when ``torch.cuda`` has finished importing (tracer.inject).
"""
from __future__ import annotations

from typing import Any

from . import hooks

__all__ = ["install_cuda", "SYNC_NAMES"]

SYNC_NAMES = {"synchronize": "cuda_synchronize", "Stream": "stream_synchronize", "Event": "event_synchronize"}


def install_cuda(st: hooks.TraceState, cuda: Any) -> dict[str, str]:
    """Patch `cuda` (the torch.cuda module) in place. Returns {target: how} for the ring meta."""
    how: dict[str, str] = {}
    graph_ctx = getattr(cuda, "graph", None)
    if isinstance(graph_ctx, type):
        how["graph.__enter__"] = _patch(graph_ctx, "__enter__", lambda f: hooks.make_graph_enter_wrapper(st, f))
        how["graph.__exit__"] = _patch(graph_ctx, "__exit__", lambda f: hooks.make_graph_exit_wrapper(st, f))
    cuda_graph = getattr(cuda, "CUDAGraph", None)
    if isinstance(cuda_graph, type):
        for which in ("capture_begin", "capture_end"):
            how[f"CUDAGraph.{which}"] = _patch(cuda_graph, which,
                                               lambda f, w=which: hooks.make_capture_wrapper(st, w, f))
        how["CUDAGraph.replay"] = _patch(cuda_graph, "replay", lambda f: hooks.make_replay_wrapper(st, f))
    how["make_graphed_callables"] = _patch_function(
        cuda, "make_graphed_callables", lambda f: hooks.make_graphed_callables_wrapper(st, f))
    how["synchronize"] = _patch_function(
        cuda, "synchronize", lambda f: hooks.make_sync_wrapper(st, SYNC_NAMES["synchronize"], f))
    for cls_name in ("Stream", "Event"):
        cls = getattr(cuda, cls_name, None)
        if isinstance(cls, type):
            how[f"{cls_name}.synchronize"] = _patch(
                cls, "synchronize", lambda f, n=SYNC_NAMES[cls_name]: hooks.make_sync_wrapper(st, n, f))
    return how


def _patch(cls: type, name: str, make: Any) -> str:
    """Replace a method defined on `cls` itself (not inherited: patching a base's method would reach other
    classes too)."""
    raw = cls.__dict__.get(name)
    if raw is None:
        return "absent"
    if getattr(raw, "__ranktrace__", False):
        return "done"
    if not callable(raw):
        return "not a plain method"
    try:
        setattr(cls, name, make(raw))
    except (TypeError, AttributeError) as e:
        return f"failed: {e}"
    return "class"


def _patch_function(module: Any, name: str, make: Any) -> str:
    fn = module.__dict__.get(name)
    if fn is None:
        return "absent"
    if getattr(fn, "__ranktrace__", False):
        return "done"
    wrapped = make(fn)
    module.__dict__[name] = wrapped
    # torch re-exports some of these from submodules (torch.cuda.graphs.make_graphed_callables): route those too
    for sub in ("graphs", "streams"):
        m = module.__dict__.get(sub)
        if m is not None and getattr(m, "__dict__", {}).get(name) is fn:
            m.__dict__[name] = wrapped
    return "attr"
