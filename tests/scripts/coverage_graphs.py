"""Drives ranktrace's CUDA-graph and host-sync wrappers on a CPU build (tests/test_capture_coverage.py).

Run with RANKTRACE_DIR set and tracer/rank/_inject first on PYTHONPATH, so the tracer is installed exactly as under
``trace run``. torch.cuda's classes exist on CPU builds but their C++ bases are dummies ("Tried to instantiate dummy
base class CUDAGraph"), so this script gives the dummy bases stand-in methods and builds instances with
``object.__new__``: the real torch.cuda.graph / CUDAGraph / Stream / Event Python code then runs, through our
wrappers, down to the stand-ins. Every torch.cuda entry point that would reach the GPU goes through
``torch.cuda._lazy_init``; a stand-in counts calls of it made while a capture is open (ranktrace must make none).

Prints one JSON line with what the stand-ins saw; the ring holds what ranktrace recorded.
"""
import contextlib
import json
import sys
import threading

import torch
import torch.distributed as dist

calls: list[str] = []
capture_open = [False]
cuda_calls_during_capture: list[str] = []


def stand_in(name: str, fail: bool = False):
    def fn(self=None, *args, **kwargs):
        calls.append(name)
        if name == "capture_begin":
            capture_open[0] = True
        if name == "capture_end":
            capture_open[0] = False
        if fail:
            raise RuntimeError(f"{name} failed (stand-in)")
        return None
    return fn


GraphBase = torch.cuda.CUDAGraph.__bases__[0]     # the dummy C++ bases (torch._utils._CUDAGraph, ...)
StreamBase = torch.cuda.Stream.__bases__[0]
EventBase = torch.cuda.Event.__bases__[0]
GraphBase.capture_begin = stand_in("capture_begin")
GraphBase.capture_end = stand_in("capture_end")
GraphBase.replay = stand_in("replay")
StreamBase.synchronize = stand_in("stream_sync")
EventBase.synchronize = stand_in("event_sync")
torch.cuda.empty_cache = lambda: calls.append("empty_cache")
torch._C._host_emptyCache = lambda: calls.append("host_empty_cache")


def lazy_init() -> None:
    if capture_open[0]:
        cuda_calls_during_capture.append("_lazy_init")
    raise RuntimeError("no CUDA here (stand-in _lazy_init)")


torch.cuda._lazy_init = lazy_init


def swap_inner(wrapper, replacement) -> None:
    """Point a ranktrace wrapper at a stand-in instead of the real (GPU-only) function it wraps."""
    assert getattr(wrapper, "__ranktrace__", False), wrapper
    slow = getattr(wrapper, "slow", None)
    if slow is not None:  # the compiled fast path (tracer/rank/_fastspan.c) calls its __wrapped__; unusual calls go to slow
        swap_inner(slow, replacement)
        wrapper._retarget(replacement)
        return
    for cell in wrapper.__closure__:
        if cell.cell_contents is wrapper.__wrapped__:
            cell.cell_contents = replacement
            return
    raise AssertionError("no inner function cell")


swap_inner(torch.cuda.synchronize, stand_in("cuda_sync"))


def fake_make_graphed_callables(fn, sample_args):
    g = new_graph()
    ctx = make_ctx(g)
    with ctx:
        fn(*sample_args)
    return fn


swap_inner(torch.cuda.make_graphed_callables, fake_make_graphed_callables)


def new_graph():
    """A CUDAGraph built as its __new__ would, minus the C++ base (a dummy on CPU builds)."""
    g = object.__new__(torch.cuda.CUDAGraph)
    g._tracker = None
    return g


def make_ctx(g):
    """A torch.cuda.graph context without __init__ (which would create a CUDA stream)."""
    ctx = object.__new__(torch.cuda.graph)
    ctx.pool = ()
    ctx.capture_stream = None
    ctx.stream_ctx = contextlib.nullcontext()
    ctx.cuda_graph = g
    ctx.capture_error_mode = "global"
    ctx._enable_annotations = False
    ctx.check_input_liveness = False
    return ctx


def main() -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
    t = torch.ones(4)
    dist.all_reduce(t)                          # seq 1, not capturing
    g1 = new_graph()
    with make_ctx(g1):                          # graph 1: capture through torch.cuda.graph
        dist.all_reduce(t)                      # captured: capturing=true, graph_id 1, no seq
    for _ in range(3):
        g1.replay()                             # replay seq 1, 2, 3 of graph 1
    g2 = new_graph()
    g2.capture_begin()                          # graph 2: direct capture_begin / capture_end
    dist.all_reduce(t)
    other = threading.Thread(target=dist.all_reduce, args=(torch.ones(2),), name="comm")
    other.start()                               # another thread's op meanwhile is not captured: seq 2
    other.join()
    g2.capture_end()
    g2.replay()                                 # replay seq 1 of graph 2
    dist.all_reduce(t)                          # seq 3, not capturing
    torch.cuda.synchronize()
    object.__new__(torch.cuda.Stream).synchronize()
    object.__new__(torch.cuda.Event).synchronize()
    torch.cuda.make_graphed_callables(lambda x: dist.all_reduce(x), (t,))  # graph 3 inside
    g4 = new_graph()
    GraphBase.capture_end = stand_in("capture_end", fail=True)
    try:
        with make_ctx(g4):                      # graph 4: capture_end raises -> an error event, same exception
            pass
    except RuntimeError as e:
        calls.append(f"raised: {e}")
    dist.destroy_process_group()
    print(json.dumps({"calls": calls, "cuda_calls_during_capture": cuda_calls_during_capture}), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
