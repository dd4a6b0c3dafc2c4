"""TraceState: everything the wrappers of one process share, and the one guard every wrapper starts with.

Its parts live beside it: call sites and tensors (callinfo), groups and backend counters (groups), graph captures
(captures). It is one object because _fastspan.c reads its attributes directly on every traced call.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import Any, Callable

from ..formats import redact
from ..formats.ringformat import META_OFFSET
from .callinfo import CallInfo
from .captures import CaptureState
from .groups import GroupBook
from .recorder import Recorder
from .slotwriter import SlotWriter, ring_parts, slot_writer

__all__ = ["TraceState", "ThreadState", "recording_thread", "env_int"]


class ThreadState:
    """Per-thread tracer state, a plain object with slots: attribute access on a threading.local costs ~35 ns
    against ~7 here, and the op path touches it several times (_fastspan.c reads the slots directly)."""

    __slots__ = ("depth", "span", "in_graph_ctx", "tid")

    def __init__(self) -> None:
        self.depth = 0         # >0 while inside a recorded call: inner calls are not recorded again
        self.span = 0          # span id of the innermost open recorded span (parent of the next record)
        self.in_graph_ctx = 0  # >0 inside torch.cuda.graph.__enter__/__exit__ (capture_begin/end belong to it)
        self.tid = threading.get_native_id()  # ~175 ns per call: read once per thread


class _PerThread(threading.local):
    """``.ts``: this thread's ThreadState, made on the thread's first read (threading.local runs __init__ once in
    every thread that touches it), so no wrapper ever tests for a missing one."""

    def __init__(self) -> None:
        self.ts = ThreadState()


def recording_thread(st: TraceState) -> ThreadState | None:
    """The guard every Python wrapper starts with: this thread's state when its call is to be recorded — tracing
    is on and the thread is not inside a recorded call (``dist.all_reduce`` calls ``ProcessGroup.allreduce``; only
    the outer one is recorded) — else None, and the wrapper just calls through. _fastspan.c makes the same test."""
    local = st.tls.ts
    if local.depth or not st.enabled:
        return None
    return local


class TraceState(CallInfo, GroupBook, CaptureState):
    """One process's tracer: recorder, identity, per-thread state, caches; tracing on until ranktrace fails."""

    def __init__(self, recorder_factory: Callable[[], Recorder], rank: int | None, world: int | None) -> None:
        self._factory = recorder_factory
        self._rec: Recorder | None = None
        self.put: SlotWriter = self._put_first
        self.ring: tuple[Any, ...] | None = None  # slotwriter.ring_parts of the recorder, once it exists
        self.rank = rank
        self.world = world
        self.enabled = True
        self._failed = False
        self.tls = _PerThread()
        self._spans = itertools.count(1)
        self.names: dict[str, int] = {}
        self.c10d: Any = None
        self._world_of: Callable[[], Any] = lambda: None
        self.c10d_world: Any = None  # torch's _World, when its default_pg storage can be read directly
        self.non_member: Any = object()
        self.meta_spans = 0
        self.nv: Any = None          # nvtx_ranges.NvtxRanges while an NVTX tool is attached
        self._nv_loaded = False
        self.on_init: list[Callable[[], None]] = []  # run at each init_process_group entry (pending --hook targets)
        self.roles: dict[str, int] = {}  # tp / pp / dp / ep ranks a profile's identity targets learned
        self.init_call_info()
        self.init_groups()
        self.init_captures()

    # --- recorder (created lazily: a process that never records writes no ring) ------------------------
    @property
    def rec(self) -> Recorder:
        if self.ring is None:
            if self._rec is None:
                self._rec = self._factory()  # the factory may set _rec itself first (inject's identity record)
            inherited = getattr(self, "_inherited_strings", None)
            if inherited:  # a forked child: keep the parent's string ids (wrappers cache them) valid in our ring
                self._rec.adopt_strings(inherited)
                self._inherited_strings = None
            self.put = slot_writer(self._rec)
            self.ring = ring_parts(self._rec)
        return self._rec  # type: ignore[return-value]

    def open_ring(self) -> tuple[Any, ...]:
        self.rec  # noqa: B018  (creates the ring, binds self.ring)
        return self.ring  # type: ignore[return-value]

    def _put_first(self, *fields: int) -> None:
        """The writer until the ring exists: create it, then write through the bound writer."""
        self.rec  # noqa: B018  (creates the ring and binds self.put)
        self.put(*fields)

    @property
    def local(self) -> ThreadState:
        """This thread's state (wrappers read ``st.tls.ts`` through recording_thread instead)."""
        return self.tls.ts

    def new_span(self) -> int:
        """Span ids are unique per ring (a forked child starts its own ring and its own count)."""
        return next(self._spans)

    def name_id(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = self.rec.intern(name)
        return nid

    def reset_after_fork(self, recorder_factory: Callable[[], Recorder]) -> None:
        """In a forked child: its own ring, fresh thread state; seq counters stay (the child inherits group state).

        Wrappers cache string ids (op names, group names) from the parent's ring; the child's ring adopts the
        parent's whole string table under the same ids, so those caches stay true."""
        self._factory = recorder_factory
        self._inherited_strings = dict(self._rec._strings) if self._rec is not None else None
        self._rec = None
        self.put = self._put_first
        self.ring = None
        self.tls = _PerThread()
        self._spans = itertools.count(1)
        self.forget_capture_gate()
        self.forget_call_info()
        self.forget_groups()
        self.names.clear()
        self.meta_spans = 0

    def fail(self, err: BaseException) -> None:
        """A failure in ranktrace itself: one line on stderr, tracing off in this process, the job goes on."""
        self.enabled = False
        if not self._failed:
            self._failed = True
            try:
                sys.stderr.write(f"[ranktrace] tracing disabled in pid {os.getpid()}: {type(err).__name__}: {err}\n")
            except Exception:
                pass

    def load_nvtx(self) -> None:
        """Import nvtx once, in-rank, after torch is in (never at interpreter start)."""
        if self._nv_loaded:
            return
        self._nv_loaded = True
        from . import nvtx_ranges

        self.nv = nvtx_ranges.load(lambda detail: self.note("nvtx", detail))

    def note(self, topic: str, detail: str) -> None:
        """One line in the ring meta about how tracing itself is doing (nvtx missing, a hook target, ...)."""
        self.rec.meta({"type": "note", "topic": topic, "detail": detail, "pid": os.getpid()})

    # --- identity and the non-wrapping region ---------------------------------------------------------------
    def identity(self, source: str) -> None:
        self.rec.meta(
            {
                "type": "identity", "rank": self.rank, "world": self.world, "source": source,
                "local_rank": env_int("LOCAL_RANK"), "pid": os.getpid(), "ppid": os.getppid(),
                "argv": redact.redact_argv(sys.argv), **({"roles": self.roles} if self.roles else {}),
            }
        )

    def default_pg(self) -> Any:
        return self._world_of()

    def meta_room(self) -> bool:
        """Whether a rare span may still go to the non-wrapping region: until it is half full. The other half stays
        for what must never be lost (identity, groups, strings, problems); a job that captures thousands of graphs
        (vLLM's piecewise capture makes ~4,000) records the rest in op slots."""
        rec = self.rec
        return rec._meta_off - META_OFFSET < rec.meta_bytes // 2

    def meta_event(self, kind: str, name: str, category: str, span: int, tid: int, **extra: Any) -> None:
        """An enter/exit/error/mark in the meta region (never evicted by the ring wrap)."""
        rec = self.rec
        rec.meta({"type": "event", "kind": kind, "name": name, "category": category, "t_ns": rec.clock(),
                  "tid": tid, "span_id": span, **extra})


def env_int(name: str) -> int | None:
    v = os.environ.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
