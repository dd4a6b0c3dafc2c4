"""/proc samples of the job's processes and threads: the monitor's progress counters and ``proc.arrow`` rows.

One ``process`` row per traced process per second (state, CPU, RSS/VMS, faults, I/O counters); ``thread`` rows per
thread (state, wchan, CPU, faults, name) written when the thread changed since its last row and at least every
``THREAD_KEYFRAME_S`` seconds (a hung job's threads cost nothing after the first rows; vanished threads are
forgotten). The same read serves the monitor's "is it progressing" decision: nothing is read twice.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterable

from ranktrace.tracer.watch.sample_log import ArrowStreamLog

__all__ = ["ProcSampler", "ProcCounters", "THREAD_KEYFRAME_S", "group_usage"]

THREAD_KEYFRAME_S = 30.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK_NS = 1_000_000_000 // _CLK_TCK


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ProcCounters:
    """What the progress model reads per process (DESIGN §2): storage I/O, major faults, RSS pages."""

    io: int          # read_bytes + write_bytes (not rchar/wchar: socket polling moves those forever)
    majflt: int
    rss_pages: int


def _stat_fields(stat: bytes) -> tuple[str, list[bytes]]:
    comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
    return comm, stat[stat.rindex(b")") + 2:].split()


class ProcSampler:
    """One /proc read per process (and its threads) per call; rows go to ``proc.arrow`` when a log is given."""

    def __init__(self, log: ArrowStreamLog | None, *, keyframe_s: float = THREAD_KEYFRAME_S) -> None:
        self.log, self.keyframe_s = log, keyframe_s
        self._threads: dict[tuple[int, int], tuple[tuple[Any, ...], float]] = {}  # last written key, when

    def sample(self, pids: Iterable[int], ranks: dict[int, int | None] | None = None,
               threads: bool | set[int] = True) -> dict[int, ProcCounters]:
        """Counters per live pid (zombies and vanished processes are left out). `threads`: read the threads of every
        pid, of none, or of these pids only (a host of many ranks reads its ranks' threads a few at a time)."""
        wall, mono = time.time_ns(), time.monotonic_ns()
        now = mono / 1e9
        out: dict[int, ProcCounters] = {}
        seen: set[tuple[int, int]] = set()
        ranks = ranks or {}
        for pid in pids:
            stat = _read(f"/proc/{pid}/stat")
            if stat is None:
                continue
            try:
                comm, f = _stat_fields(stat)
                state = f[0].decode()
                if state in ("Z", "X"):
                    continue
                minflt, majflt = int(f[7]), int(f[9])
                utime, stime = int(f[11]), int(f[12])
                nthreads, vsize, rss = int(f[17]), int(f[20]), int(f[21])
            except (ValueError, IndexError):
                continue
            io: dict[bytes, int] = {}
            raw = _read(f"/proc/{pid}/io")
            if raw:
                for line in raw.splitlines():
                    k, _, v = line.partition(b":")
                    try:
                        io[k] = int(v)
                    except ValueError:
                        pass
            out[pid] = ProcCounters(io.get(b"read_bytes", 0) + io.get(b"write_bytes", 0), majflt, rss)
            if self.log is None:
                continue
            rank = ranks.get(pid)
            self.log.add({
                "wall_ns": wall, "t_ns": mono, "kind": "process", "pid": pid, "rank": rank, "comm": comm,
                "state": state, "utime_ns": utime * _TICK_NS, "stime_ns": stime * _TICK_NS, "majflt": majflt,
                "minflt": minflt, "num_threads": nthreads, "rss_bytes": rss * _PAGE, "vms_bytes": vsize,
                "rchar": io.get(b"rchar"), "wchar": io.get(b"wchar"), "read_bytes": io.get(b"read_bytes"),
                "write_bytes": io.get(b"write_bytes"),
            })
            if threads is True or (threads and pid in threads):
                self._sample_threads(pid, rank, wall, mono, now, seen)
        looked = {p for p, _t in seen}
        for key in [k for k in self._threads if k not in seen and (k[0] in looked or k[0] not in out)]:
            del self._threads[key]  # a thread gone from a process read now, or of a process gone
        return out

    def _sample_threads(self, pid: int, rank: int | None, wall: int, mono: int, now: float,
                        seen: set[tuple[int, int]]) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for t in tids:
            base = f"/proc/{pid}/task/{t}"
            stat = _read(base + "/stat")
            if stat is None:
                continue
            try:
                comm, f = _stat_fields(stat)
                state = f[0].decode()
                minflt, majflt, utime, stime = int(f[7]), int(f[9]), int(f[11]), int(f[12])
            except (ValueError, IndexError):
                continue
            w = _read(base + "/wchan") if state != "R" else b""
            wchan = (w or b"").decode("ascii", "replace").strip()
            tid = int(t)
            key = (pid, tid)
            seen.add(key)
            sig = (comm, state, wchan, utime, stime, majflt)
            last = self._threads.get(key)
            if last is not None and last[0] == sig and now - last[1] < self.keyframe_s:
                continue
            self._threads[key] = (sig, now)
            self.log.add({  # type: ignore[union-attr]
                "wall_ns": wall, "t_ns": mono, "kind": "thread", "pid": pid, "tid": tid, "rank": rank, "comm": comm,
                "state": state, "wchan": wchan, "utime_ns": utime * _TICK_NS, "stime_ns": stime * _TICK_NS,
                "majflt": majflt, "minflt": minflt,
            })


def group_usage(pgid: int, exclude: set[int]) -> dict[int, tuple[int, int]]:
    """pid -> (CPU ticks, storage read+write bytes) of every process in process group `pgid` except `exclude` (the
    ranks: their progress is read otherwise). One pass over /proc; a process that vanished mid-read is skipped."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat:
            continue
        try:
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[2]) != pgid:  # pgrp
                continue
            cpu = int(fields[11]) + int(fields[12])  # utime + stime
        except (ValueError, IndexError):
            continue
        io = 0
        raw = _read(f"/proc/{entry}/io")
        if raw:
            for line in raw.split(b"\n"):
                if line.startswith((b"read_bytes:", b"write_bytes:")):
                    io += int(line.split()[1])
        out[int(entry)] = (cpu, io)
    return out
