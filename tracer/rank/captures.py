"""CUDA-graph captures as this process sees them: which graph the capturing thread is filling, and the gate that
keeps the agent's Flight Recorder dump (which may read CUDA events) and a capture start apart.

Part of TraceState (tracestate.py); the capture and replay wrappers are in wrap_graphs.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Any, Iterator

__all__ = ["CaptureState"]


class CaptureState:
    """Capture bookkeeping of TraceState. No CUDA call is ever made here."""

    def init_captures(self) -> None:
        self.capturing: int | None = None  # graph id while a capture is open: process-wide, for the no-CUDA rule
        self.capture_tid = 0  # the thread that opened it: only its ops are captured (capturing_for)
        self.capture_pending = 0  # capture starts under way (torch.cuda.graph.__enter__ / capture_begin running)
        self.fr_lock = threading.Lock()  # see no_capture_starts
        self.capture_span = 0
        self.open_captures: dict[tuple[str, int], tuple[int, int, int, Any]] = {}
        self.graph_ids: dict[int, tuple[Any, int]] = {}
        self._next_graph = itertools.count(1)
        self.replays: dict[int, int] = {}

    def forget_capture_gate(self) -> None:
        """In a forked child: the fork may have landed during the parent agent's dump, so the lock is new."""
        self.fr_lock = threading.Lock()
        self.capture_pending = 0

    def capturing_for(self, tid: int) -> int | None:
        """The graph an op issued now by thread `tid` is captured into: the open capture's, when `tid` opened it.
        Another thread's op meanwhile (a background comm thread) runs for real: it keeps its seq."""
        gid = self.capturing
        return gid if gid is not None and tid == self.capture_tid else None

    @contextlib.contextmanager
    def no_capture_starts(self) -> Iterator[bool]:
        """Held by the agent while it asks torch for the Flight Recorder, which may read CUDA events: no capture
        can begin meanwhile (the capture-start wrappers wait for it, a few ms at most), and it tells whether one is
        open or starting — then the agent does not ask at all (no CUDA call while a capture is open)."""
        with self.fr_lock:
            yield self.capturing is not None or self.capture_pending > 0

    def capture_starting(self) -> None:
        """A capture-start wrapper is about to call torch: waits out an agent's Flight Recorder dump."""
        with self.fr_lock:
            self.capture_pending += 1

    def capture_started(self) -> None:
        """The capture-start call returned or raised (capturing is set by then when it opened). Under the lock:
        two threads starting captures at once must not lose a count (never waits on a dump: one cannot start
        while a capture start is pending)."""
        with self.fr_lock:
            self.capture_pending = max(0, self.capture_pending - 1)

    def graph_id(self, graph: Any) -> int:
        """Our 1-based id of a CUDAGraph object, stable for its lifetime (no CUDA call involved)."""
        hit = self.graph_ids.get(id(graph))
        if hit is not None and (hit[0] is None or hit[0]() is graph):
            return hit[1]
        gid = next(self._next_graph)
        try:
            ref: Any = weakref.ref(graph)
        except TypeError:
            ref = None
        self.graph_ids[id(graph)] = (ref, gid)
        return gid
