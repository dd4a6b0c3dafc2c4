"""Collector of one Kineto trace: consumes the stream's items and keeps only what the ops need.

Why separate: this is the memory-bound part (it sees every trace event, millions in a big trace), so it keeps the comm
events, the CUDA launches as flat arrays and the NCCL kernels, and nothing else; interpreting them into ops
(``kineto_comms``) and rows (``kineto_tables``) happens once, at the end.
"""
from __future__ import annotations

from array import array
from collections import defaultdict
from typing import Any

import numpy as np

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.kineto_comms import _BACKEND_PREFIX, _annotation_args, _Comm, _comm_args


class _Collector:
    """Consumes stream items; keeps only what ops need; ``kineto_tables`` builds the tables from it at the end."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.meta: dict[str, Any] = {}
        self.saw_trace_events = False
        self.events_seen = 0
        self.comms: dict[tuple[Any, Any], list[_Comm]] = defaultdict(list)
        # CUDA launches, one per kernel of the trace (millions in a big one): kept as three flat arrays (20 bytes
        # a launch instead of a dict entry and a tuple); only those of NCCL kernels are looked up at the end
        self.launch_corr = array("q")
        self.launch_ts = array("d")
        self.launch_thread = array("i")
        self.threads: dict[tuple[Any, Any], int] = {}
        self.thread_keys: list[tuple[Any, Any]] = []
        self.big_corr: dict[int, tuple[Any, Any, float]] = {}   # correlation ids beyond 64 bits (never in practice)
        self.kernels: list[tuple[int, float, str]] = []  # (correlation, end µs, name) of NCCL kernels
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
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            if name == "record_param_comms" or _BACKEND_PREFIX.match(name):
                self.skip_counts["collective event without a numeric ts/dur"] += 1
            return
        if cat == "cpu_op" and name == "record_param_comms":
            self.comms[(ev.get("pid"), ev.get("tid"))].append(
                _Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, False, _comm_args(args)))
        elif cat in ("user_annotation", "cpu_op") and _BACKEND_PREFIX.match(name):
            self.comms[(ev.get("pid"), ev.get("tid"))].append(
                _Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, True, _annotation_args(args)))
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
            corr = args.get("correlation")
            if isinstance(corr, int):
                self.kernels.append((corr, ts + dur, name))

    # -- lookups for the result

    def _launches(self, wanted: set[int]) -> dict[int, tuple[Any, Any, float]]:
        """correlation → (pid, tid, ts) of the launches in ``wanted`` (the last one when a correlation repeats)."""
        out: dict[int, tuple[Any, Any, float]] = {}
        if not wanted:
            return out
        corr = np.frombuffer(self.launch_corr, dtype=np.int64) if len(self.launch_corr) else np.zeros(0, np.int64)
        small = [c for c in wanted if -(1 << 63) <= c < 1 << 63]
        for i in np.flatnonzero(np.isin(corr, np.array(small, dtype=np.int64))).tolist():
            pid, tid = self.thread_keys[self.launch_thread[i]]
            out[int(corr[i])] = (pid, tid, self.launch_ts[i])
        out.update((c, v) for c, v in self.big_corr.items() if c in wanted)
        return out
