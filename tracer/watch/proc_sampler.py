"""/proc samples of the job's processes and threads: the monitor's progress counters and ``proc.arrow`` rows.

One ``process`` row per traced process per second (state, CPU, RSS/VMS, faults, I/O counters); ``thread`` rows per
thread (state, wchan, CPU, faults, name) written when the thread changed since its last row and at least every
``THREAD_KEYFRAME_S`` seconds (a hung job's threads cost nothing after the first rows; vanished threads are
forgotten). The same read serves the monitor's "is it progressing" decision: nothing is read twice.

Host-side waits (issue #29, tracer/watch/wait_probe.py), at most every ``PROBE_EVERY_S`` within a ``PROBE_BUDGET_S``
time limit: a ``wait`` row per quiet process (the main thread's syscall, the file behind the descriptor it waits on,
who could end the wait), a ``lock`` row per lock file in the JIT caches of a process that sleeps (age, holders,
openers, compilers alive), a ``child`` row per descendant of a process (comm, state, CPU, redacted command line) —
each written when it changed and at least every ``THREAD_KEYFRAME_S``. The monitor's progress decision reads none
of them.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterable

from ranktrace.tracer.watch import wait_probe
from ranktrace.tracer.watch.sample_log import ArrowStreamLog

__all__ = ["ProcSampler", "ProcCounters", "THREAD_KEYFRAME_S", "PROBE_EVERY_S", "PROBE_BUDGET_S", "group_usage"]

THREAD_KEYFRAME_S = 30.0
PROBE_EVERY_S = 2.0     # host-wait probes (wait / lock / child rows): one round per this many seconds
PROBE_BUDGET_S = 0.25   # a round's time limit: what it did not reach is said in the rows' detail (note=)
FACTS_TTL_S = 10.0      # open-file map, lock-file lists reused this long (ages, /proc/locks, liveness: every round)
_QUIET_SHARE = 0.25     # a process below this share of one core since the last round is probed for its wait
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

    def __init__(self, log: ArrowStreamLog | None, *, keyframe_s: float = THREAD_KEYFRAME_S,
                 probe_every_s: float = PROBE_EVERY_S) -> None:
        self.log, self.keyframe_s, self.probe_every_s = log, keyframe_s, probe_every_s
        self._threads: dict[tuple[int, int], tuple[tuple[Any, ...], float]] = {}  # last written key, when
        self._facts: dict[tuple[str, int, str], tuple[tuple[Any, ...], float]] = {}  # (kind, pid, path): key, when
        self._last_probe = float("-inf")
        # the costly reads of a round, kept for FACTS_TTL_S: every process's open files, the JIT caches' lock files
        self._fd_map: tuple[float, int, dict[str, list[tuple[int, int]]]] | None = None  # monotonic s, wall ns, map
        self._fd_map_cut = False
        self._last_fd_scan = float("-inf")
        self._roots: tuple[float, dict[str, list[str]]] = (float("-inf"), {})
        self._probe_cpu: dict[int, tuple[float, int]] = {}  # pid -> (when probed, CPU ticks then)

    def sample(self, pids: Iterable[int], ranks: dict[int, int | None] | None = None,
               threads: bool | set[int] = True) -> dict[int, ProcCounters]:
        """Counters per live pid (zombies and vanished processes are left out). `threads`: read the threads of every
        pid, of none, or of these pids only (a host of many ranks reads its ranks' threads a few at a time)."""
        wall, mono = time.time_ns(), time.monotonic_ns()
        now = mono / 1e9
        out: dict[int, ProcCounters] = {}
        seen: set[tuple[int, int]] = set()
        ranks = ranks or {}
        probed: dict[int, tuple[str, int]] = {}  # pid -> (state, CPU ticks) for the host-wait probe
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
            probed[pid] = (state, utime + stime)
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
        if self.log is not None and now - self._last_probe >= self.probe_every_s:
            self._last_probe = now
            self._probe(probed, ranks, wall, mono, now)
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


    def _probe(self, procs: dict[int, tuple[str, int]], ranks: dict[int, int | None], wall: int, mono: int,
               now: float) -> None:
        """One round of host-wait facts (wait_probe) under one time limit; rows only where something changed."""
        deadline = wait_probe.Deadline(PROBE_BUDGET_S)
        fresh = self._fd_map is not None and now - self._fd_map[0] < FACTS_TTL_S
        index = wait_probe.ProcIndex(deadline, self._fd_map[1:] if fresh and self._fd_map else None,
                                     partial=fresh and self._fd_map_cut,
                                     may_rescan=now - self._last_fd_scan >= FACTS_TTL_S / 2)
        if now - self._roots[0] >= FACTS_TTL_S:
            self._roots = (now, {})
        roots_cache = self._roots[1]
        live: set[tuple[str, int, str]] = set()
        for pid, (state, cpu) in sorted(procs.items()):
            last = self._probe_cpu.get(pid)
            self._probe_cpu[pid] = (now, cpu)
            if last is None or state in ("R", "Z", "X") or not deadline.left("waits of every process"):
                continue  # first look (no CPU figure yet), running, or the round's time is spent
            if (cpu - last[1]) * _TICK_NS / 1e9 > _QUIET_SHARE * max(now - last[0], 1e-3):
                continue  # busy: its wait (if any) is short
            w = wait_probe.wait_fact(pid, state, index)
            peers = ",".join(h.text() for h in w.peers)
            detail = (f"syscall={w.syscall or '-'} fd={w.fd if w.fd is not None else '-'} peers={peers or '-'}"
                      + (f" remote={w.remote}" if w.remote else "") + (f" note={w.note}" if w.note else ""))
            self._fact(live, now, {"wall_ns": wall, "t_ns": mono, "kind": "wait", "pid": pid, "tid": w.tid,
                                   "rank": ranks.get(pid), "state": state, "path": w.target,
                                   "peer_pid": w.peers[0].pid if w.peers else None, "detail": detail}, "")
            if w.syscall in wait_probe.SLEEP_SYSCALLS and state != "D":
                locks, why = wait_probe.lock_facts(pid, index, roots_cache)
                for lk in locks:
                    d = (f"mtime_ns={lk.mtime_ns} holders={','.join(h.text() for h in lk.holders) or '-'} "
                         f"waiters={','.join(map(str, lk.waiters)) or '-'} "
                         f"openers={','.join(h.text() for h in lk.openers) or '-'} "
                         f"builders={','.join(h.text() for h in lk.builders) or '-'}"
                         + (f" note={lk.note}" if lk.note else ""))
                    self._fact(live, now, {"wall_ns": wall, "t_ns": mono, "kind": "lock", "pid": pid,
                                           "rank": ranks.get(pid), "path": lk.path,
                                           "peer_pid": lk.holders[0].pid if lk.holders else None, "detail": d},
                               lk.path)
        for c in wait_probe.children(set(procs), index):
            self._fact(live, now, {"wall_ns": wall, "t_ns": mono, "kind": "child", "pid": c.pid, "ppid": c.ppid,
                                   "rank": ranks.get(c.root), "comm": c.comm, "state": c.state,
                                   "utime_ns": c.cpu_ticks * _TICK_NS, "peer_pid": c.root,
                                   "detail": f"root={c.root} cmd={c.cmd}"}, "")
        if index.fds_read:  # kept even when cut short (said in the facts' note): a huge host is not read each round
            self._fd_map, self._fd_map_cut, self._last_fd_scan = (now, index.fds_at, index.fd_holders()), index.cut, now
        for key in [k for k in self._facts if k not in live]:
            del self._facts[key]
        for pid in [p for p in self._probe_cpu if p not in procs]:
            del self._probe_cpu[pid]

    def _fact(self, live: set[tuple[str, int, str]], now: float, row: dict[str, Any], path: str) -> None:
        key = (row["kind"], row["pid"], path)
        live.add(key)
        sig = tuple(v for k, v in sorted(row.items()) if k not in ("wall_ns", "t_ns", "utime_ns"))
        if row["kind"] == "child":  # CPU moved: worth a row (a compiler at work), but not every round of it
            sig += (bool(row["utime_ns"]) and row["utime_ns"] // 1_000_000_000,)
        last = self._facts.get(key)
        if last is not None and last[0] == sig and now - last[1] < self.keyframe_s:
            return
        self._facts[key] = (sig, now)
        self.log.add(row)  # type: ignore[union-attr]


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
