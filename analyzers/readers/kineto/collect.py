"""The one pass over a trace's events: comm events, CUDA launches (flat arrays) and NCCL kernels, nothing else; they
become ops at the end (:mod:`.ops`). :class:`Window` bounds what is kept (#31: 2M collectives took 234 s, 12.7 GB):
per group the first HEAD and last TAIL ops, the rest only counted; a kept op's seq still counts them all."""
from __future__ import annotations

import heapq
import re
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Hashable, cast

import numpy as np

from ranktrace.analyzers.readers.base import Skipped

__all__ = ["BACKEND_PREFIX", "Comm", "Collector", "HEAD", "TAIL", "MAX_GROUPS", "Window", "Kept"]

BACKEND_PREFIX = re.compile(r"^(nccl|gloo|xccl|ucc|mpi|hccl|rccl|cncl|mccl):(.+)$", re.IGNORECASE)

HEAD = 500            # first ops of a group kept
TAIL = 5000           # last ops of a group kept
MAX_GROUPS = 64       # groups (and p2p pairs) given that window; the others keep their last SMALL_TAIL
SMALL_TAIL = 16
MAX_KEYS = 10_000     # past this many, the ops of a new group are only counted


@dataclass
class Kept:
    """What one group (a key of the reader's own, before the trace's process-group table is known) kept."""

    head: list[tuple[float, int, Any]] = field(default_factory=list)   # max-heap by (-ts, -index)
    tail: list[tuple[float, int, Any]] = field(default_factory=list)   # min-heap by (ts, index)
    count: int = 0
    head_cap: int = HEAD
    tail_cap: int = TAIL

    @property
    def middle(self) -> int:
        return self.count - len(self.head) - len(self.tail)


class Window:
    """Ops pushed in any order; every group keeps its HEAD earliest and TAIL latest (by start time) and counts the
    rest, so at any moment head <= middle <= tail in time."""

    def __init__(self) -> None:
        self.groups: dict[Hashable, Kept] = {}
        self.uncounted_keys = 0          # ops of groups past MAX_KEYS: counted here only

    def add(self, key: Hashable, ts: float, index: int, op: Any) -> None:
        k = self.groups.get(key)
        if k is None:
            if len(self.groups) >= MAX_KEYS:
                self.uncounted_keys += 1
                return
            small = len(self.groups) >= MAX_GROUPS
            k = self.groups[key] = Kept(head_cap=0 if small else HEAD, tail_cap=SMALL_TAIL if small else TAIL)
        k.count += 1
        item: tuple[float, int, Any] = (ts, index, op)
        if len(k.tail) < k.tail_cap:
            heapq.heappush(k.tail, item)
            return
        if k.tail_cap and (ts, index) > k.tail[0][:2]:
            item = heapq.heapreplace(k.tail, item)   # the tail's earliest moves on towards the head
        if k.head_cap == 0:
            return
        neg = (-item[0], -item[1], item[2])
        if len(k.head) < k.head_cap:
            heapq.heappush(k.head, neg)
        elif neg[:2] > k.head[0][:2]:                # earlier than the head's latest: that one goes to the middle
            heapq.heapreplace(k.head, neg)

    def kept(self) -> list[tuple[Hashable, list[Any], list[Any], int]]:
        """(key, head ops, tail ops, ops between them) per group, head and tail in time order."""
        out = []
        for key, k in self.groups.items():
            head = [op for _ts, _i, op in sorted((-a, -b, op) for a, b, op in k.head)]
            tail = [op for _ts, _i, op in sorted(k.tail, key=lambda t: t[:2])]
            out.append((key, head, tail, k.middle))
        return out

    @property
    def summarised(self) -> int:
        return sum(k.middle for k in self.groups.values()) + self.uncounted_keys



@dataclass
class Comm:
    """A CPU-side comm event (record_param_comms or a backend annotation) on one thread."""

    index: int
    pid: Any
    tid: Any
    ts: float
    end: float
    name: str                 # raw event name
    is_annotation: bool
    args: dict[str, Any]
    children: list["Comm"] = field(default_factory=list)


class Collector:
    """Consumes stream items; keeps only what ops need; :mod:`.tables` builds the tables from it at the end."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.meta: dict[str, Any] = {}
        self.saw_trace_events = False
        self.events_seen = 0
        self.comms: dict[tuple[Any, Any], list[Comm]] = defaultdict(list)
        # CUDA launches, one per kernel of the trace (millions in a big one): kept as three flat arrays (20 bytes
        # a launch instead of a dict entry and a tuple); only those of NCCL kernels are looked up at the end
        self.launch_corr = array("q")
        self.launch_ts = array("d")
        self.launch_thread = array("i")
        self.threads: dict[tuple[Any, Any], int] = {}
        self.thread_keys: list[tuple[Any, Any]] = []
        self.big_corr: dict[int, tuple[Any, Any, float]] = {}   # correlation ids beyond 64 bits (never in practice)
        # NCCL kernels, flat likewise: correlation, end (µs), name (an index into kernel_names)
        self.kernel_corr = array("q")
        self.kernel_end = array("d")
        self.kernel_name = array("i")
        self.kernel_names: list[str] = []
        self._kernel_name_ids: dict[str, int] = {}
        self.big_kernels: list[tuple[int, float, str]] = []   # correlation beyond 64 bits (never in practice)
        # comm events are folded into ops as they come and only a bounded number per group kept (Window below)
        self.window = Window()
        self.buffered = 0
        self.compact_at = 100_000
        self.folded_end: dict[tuple[Any, Any], float] = {}     # end of the last op folded, per thread
        self.skip_counts: dict[str, int] = defaultdict(int)
        self.skipped: list[Skipped] = []

    def skip(self, line: int | None, reason: str) -> None:
        self.skipped.append(Skipped(self.file, line, reason))

    # -- stream

    def take(self, item: tuple[Any, ...]) -> None:
        if item[0] == "meta":
            if item[1] == "traceEvents":
                self.saw_trace_events = True
            else:
                self.meta[item[1]] = item[2]
            return
        _, index, ev = item
        self.saw_trace_events = True
        self.events_seen += 1
        if not isinstance(ev, dict):
            self.skip_counts["traceEvents element that is not an object"] += 1
            return
        if ev.get("ph") != "X":
            return
        name, cat = ev.get("name"), ev.get("cat")
        if not isinstance(name, str):
            return
        args = cast("dict[str, Any]", ev.get("args")) if isinstance(ev.get("args"), dict) else {}
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            if name == "record_param_comms" or BACKEND_PREFIX.match(name):
                self.skip_counts["collective event without a numeric ts/dur"] += 1
            return
        if cat == "cpu_op" and name == "record_param_comms":
            self._comm(Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, False, _comm_args(args)))
        elif cat in ("user_annotation", "cpu_op") and BACKEND_PREFIX.match(name):
            self._comm(Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, True, _annotation_args(args)))
        elif cat in ("cuda_runtime", "cuda_driver") and "Launch" in name and "correlation" in args:
            try:
                corr = int(args["correlation"])
            except (TypeError, ValueError):
                return
            thread = (ev.get("pid"), ev.get("tid"))
            try:
                hash(thread)
            except TypeError:  # pid/tid that are lists or objects: no thread to tie a kernel to
                return
            if not -(1 << 63) <= corr < 1 << 63:
                self.big_corr[corr] = (thread[0], thread[1], ts)
                return
            ti = self.threads.get(thread)
            if ti is None:
                ti = self.threads[thread] = len(self.thread_keys)
                self.thread_keys.append(thread)
            self.launch_corr.append(corr)
            self.launch_ts.append(ts)
            self.launch_thread.append(ti)
        elif cat == "kernel" and name.startswith("nccl"):
            kcorr = args.get("correlation")
            if isinstance(kcorr, int) and not isinstance(kcorr, bool):
                if not -(1 << 63) <= kcorr < 1 << 63:
                    self.big_kernels.append((kcorr, ts + dur, name))
                    return
                ni = self._kernel_name_ids.get(name)
                if ni is None:
                    if len(self.kernel_names) >= 4096:   # names are few; a trace of made-up ones shares one
                        name = "nccl kernel"
                        ni = self._kernel_name_ids.get(name)
                    if ni is None:
                        ni = self._kernel_name_ids[name] = len(self.kernel_names)
                        self.kernel_names.append(name)
                self.kernel_corr.append(kcorr)
                self.kernel_end.append(ts + dur)
                self.kernel_name.append(ni)

    def _comm(self, c: Comm) -> None:
        thread = (c.pid, c.tid)
        try:
            done = self.folded_end.get(thread)
        except TypeError:   # pid/tid that are lists or objects: one thread of their own
            thread = (repr(c.pid), repr(c.tid))
            done = self.folded_end.get(thread)
        if done is not None and c.ts <= done + 1e-3:
            # nested in (or before) an op already folded: the events of a thread came far out of time order
            self.skip_counts["comm event that came after the ops around it were folded (far out of time order)"] += 1
            return
        self.comms[thread].append(c)
        self.buffered += 1
        if self.buffered >= self.compact_at:
            from ranktrace.analyzers.readers.kineto.ops import compact   # ops builds on this module

            compact(self)

    # -- lookups for the result

    def launches(self, wanted: set[int]) -> dict[int, tuple[Any, Any, float]]:
        """correlation → (pid, tid, ts) of the launches in ``wanted`` (the last one when a correlation repeats)."""
        out: dict[int, tuple[Any, Any, float]] = {}
        if not wanted:
            return out
        corr = self.launch_arrays()[0]
        small = [c for c in wanted if -(1 << 63) <= c < 1 << 63]
        for i in np.flatnonzero(np.isin(corr, np.array(small, dtype=np.int64))).tolist():
            pid, tid = self.thread_keys[self.launch_thread[i]]
            out[int(corr[i])] = (pid, tid, self.launch_ts[i])
        out.update((c, v) for c, v in self.big_corr.items() if c in wanted)
        return out

    def launch_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(correlation, ts µs, thread index) of every launch, as numpy views."""
        return (np.frombuffer(self.launch_corr, dtype=np.int64) if len(self.launch_corr) else np.zeros(0, np.int64),
                np.frombuffer(self.launch_ts, dtype=np.float64) if len(self.launch_ts) else np.zeros(0),
                np.frombuffer(self.launch_thread, dtype=np.int32) if len(self.launch_thread) else np.zeros(0, np.int32))

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(correlation, end µs, name index) of every NCCL kernel, as numpy views."""
        return (np.frombuffer(self.kernel_corr, dtype=np.int64) if len(self.kernel_corr) else np.zeros(0, np.int64),
                np.frombuffer(self.kernel_end, dtype=np.float64) if len(self.kernel_end) else np.zeros(0),
                np.frombuffer(self.kernel_name, dtype=np.int32) if len(self.kernel_name) else np.zeros(0, np.int32))


_COMM_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
              "Process Group Description", "Process Group Ranks", "Process Group ID", "Global rank start",
              "Global rank stride", "Seq", "Src Rank", "Dst Rank", "Rank")


_COMM_ARG_SET = frozenset(_COMM_ARGS)


def _comm_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in _COMM_ARG_SET.intersection(args)}


def _annotation_args(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        out["Input Dims"] = dims[0]
    types = args.get("Input type")
    if isinstance(types, list) and types and isinstance(types[0], str) and types[0]:
        out["Input type"] = types[0]
    return out
