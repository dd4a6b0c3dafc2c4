"""A stand-in GPU for the SGLang replica (examples/replica/sglang): CPU only, obviously not CUDA.

What it keeps of a GPU is what matters to a hang: work is *enqueued* on a stream (a worker thread) and a host sync
(``torch.cuda.synchronize``, the real torch function, down to ``torch._C._cuda_synchronize``) waits until the stream
has drained; while a graph capture is open, launches are recorded into the graph instead of run. torch.cuda's graph
classes are the real Python ones over stand-in C++ bases (a CPU build has only dummies), so ``torch.cuda.graph``
runs its own __enter__/__exit__ — and whatever wraps them.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

import torch

__all__ = ["install", "launch", "new_graph", "graph", "STREAM"]


class Stream:
    """One in-order stream: a thread running launched kernels one after another."""

    def __init__(self) -> None:
        self.q: "queue.Queue[Callable[[], Any]]" = queue.Queue()
        self.pending = 0
        self.cv = threading.Condition()
        self.capturing = 0
        self.thread = threading.Thread(target=self._run, name="cuda_stream", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            kernel = self.q.get()
            try:
                kernel()
            finally:
                with self.cv:
                    self.pending -= 1
                    self.cv.notify_all()

    def launch(self, kernel: Callable[[], Any]) -> None:
        if self.capturing:
            return  # recorded into the graph being captured: it runs at replay, not now
        with self.cv:
            self.pending += 1
        self.q.put(kernel)

    def synchronize(self, *_: Any) -> None:
        """cudaDeviceSynchronize: wait until every launched kernel finished."""
        with self.cv:
            while self.pending:
                self.cv.wait(0.5)


STREAM: Stream | None = None


def launch(kernel: Callable[[], Any]) -> None:
    assert STREAM is not None, "replica_device.install() first"
    STREAM.launch(kernel)


def install() -> None:
    """Point torch.cuda's bottom layer at the stand-in (once per process)."""
    global STREAM
    if STREAM is not None:
        return
    STREAM = Stream()
    torch.cuda._lazy_init = lambda: None           # torch.cuda.synchronize() runs its real code down to:
    torch.cuda._exchange_device = lambda device: -1
    torch.cuda._maybe_exchange_device = lambda device: -1
    torch._C._cuda_synchronize = STREAM.synchronize
    torch._C._host_emptyCache = lambda: None
    base = torch.cuda.CUDAGraph.__bases__[0]       # the dummy C++ base of a CPU build

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        STREAM.capturing += 1

    def capture_end(self: Any) -> None:
        STREAM.capturing -= 1

    base.capture_begin = capture_begin
    base.capture_end = capture_end
    base.replay = lambda self: None


def new_graph() -> Any:
    """A torch.cuda.CUDAGraph built as its __new__ would, minus the C++ base."""
    g = object.__new__(torch.cuda.CUDAGraph)
    g._tracker = None
    return g


def graph(g: Any) -> Any:
    """``torch.cuda.graph(g)`` without the CUDA stream its __init__ would create."""
    ctx = object.__new__(torch.cuda.graph)
    ctx.pool, ctx.capture_stream, ctx.stream_ctx = (), None, contextlib.nullcontext()
    ctx.cuda_graph, ctx.capture_error_mode = g, "global"
    ctx._enable_annotations, ctx.check_input_liveness = False, False
    return ctx
