"""Which CUDA-graph and host-sync entry points are patched (the wrappers are in wrap_graphs).

Installed once ``torch.cuda`` has finished importing (inject); works on CPU builds, where the classes exist but
cannot be instantiated.
"""
from __future__ import annotations

import sys
from typing import Any

from .tracestate import TraceState
from .wrap_graphs import (make_capture_wrapper, make_graph_enter_wrapper, make_graph_exit_wrapper,
                          make_graphed_callables_wrapper, make_replay_wrapper, make_sync_wrapper)

__all__ = ["install_cuda", "SYNC_NAMES"]

SYNC_NAMES = {"synchronize": "cuda_synchronize", "Stream": "stream_synchronize", "Event": "event_synchronize"}
# the device-agnostic API vLLM's current releases sync through (capture, memory profiling), and empty_cache (it
# synchronizes the device before it frees): host waits for the GPU like torch.cuda.synchronize
ACCELERATOR_SYNCS = {"synchronize": "accelerator_synchronize", "empty_cache": "accelerator_empty_cache"}


def install_cuda(st: TraceState, cuda: Any) -> dict[str, str]:
    """Patch `cuda` (the torch.cuda module) in place. Returns {target: how} for the ring meta."""
    how: dict[str, str] = {}
    graph_ctx = getattr(cuda, "graph", None)
    if isinstance(graph_ctx, type):
        how["graph.__enter__"] = _patch(graph_ctx, "__enter__", lambda f: make_graph_enter_wrapper(st, f))
        how["graph.__exit__"] = _patch(graph_ctx, "__exit__", lambda f: make_graph_exit_wrapper(st, f))
    cuda_graph = getattr(cuda, "CUDAGraph", None)
    if isinstance(cuda_graph, type):
        for which in ("capture_begin", "capture_end"):
            how[f"CUDAGraph.{which}"] = _patch(cuda_graph, which,
                                               lambda f, w=which: make_capture_wrapper(st, w, f))
        how["CUDAGraph.replay"] = _patch(cuda_graph, "replay", lambda f: make_replay_wrapper(st, f))
    how["make_graphed_callables"] = _patch_function(
        cuda, "make_graphed_callables", lambda f: make_graphed_callables_wrapper(st, f))
    how["synchronize"] = _patch_function(
        cuda, "synchronize", lambda f: make_sync_wrapper(st, SYNC_NAMES["synchronize"], f))
    for cls_name in ("Stream", "Event"):
        cls = getattr(cuda, cls_name, None)
        if isinstance(cls, type):
            how[f"{cls_name}.synchronize"] = _patch(
                cls, "synchronize", lambda f, n=SYNC_NAMES[cls_name]: make_sync_wrapper(st, n, f))
    how["empty_cache"] = _patch_function(cuda, "empty_cache", lambda f: make_sync_wrapper(st, "empty_cache", f))
    accelerator = sys.modules.get("torch.accelerator")  # imported by torch itself (2.6+); never imported here
    if accelerator is not None:
        for name, label in ACCELERATOR_SYNCS.items():
            how[f"accelerator.{name}"] = _patch_function(
                accelerator, name, lambda f, n=label: make_sync_wrapper(st, n, f))
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
