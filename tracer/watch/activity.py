"""Is the job busy in a way its rings do not show? CPU of its other processes, files it reads, lines it prints.

Why these, and why not the process group alone: a JIT build (ninja, nvcc, ptxas, or a plain ``sh`` loop standing for
them) runs as a non-Python child of a rank and writes no ring; torchrun starts every worker in a session of its own,
so a worker's compiler is not in the job's process group — it is only in the process tree. A weight load from the
page cache moves no storage counter (``read_bytes`` counts the block layer only): only the file offset of the
checkpoint moves. A job that prints new lines (a progress bar, "loading shard 3/8") is at work; a job that prints
the same line again and again, only its clock time or elapsed seconds changed (a store's "waiting ..."), is not.
Lines are news only until every rank joined: after that the ranks' records speak, and a server's periodic stats line
says nothing about a rank stopped inside a request.

One pass over /proc per call (ppid, process group, CPU, storage I/O of every process), the file offsets of the
ranks' regular files every ``OFFSETS_EVERY_S``, the new bytes of output.log: all bounded, nothing blocks.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ranktrace.tracer.watch.wait_probe import read_proc_file

__all__ = ["JobActivity", "Activity", "BusyChild", "COMPILERS", "child_text"]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: a process (not a ring writer) above this share of one core since the last look is at work: idle helpers, zmq
#: pollers and tokenizer workers stay far below it; a compiler on a loaded machine still gets more
BUSY_SHARE = 0.10
#: a rank below this share of one core counts as still (a hung gloo or store wait sleeps at ~0%)
STILL_SHARE = 0.10
OFFSETS_EVERY_S = 2.0
FD_LIST_TTL_S = 10.0
LOG_READ_MAX = 64 << 10
LOG_SEEN_MAX = 4096
#: what a JIT build's child is called (the status line says "JIT build in a child (ptxas, 40 s)" for these)
COMPILERS = frozenset({"nvcc", "ptxas", "cicc", "ninja", "cc1plus", "cc1", "gcc", "g++", "c++", "cc", "ld", "ld.gold",
                       "ld.lld", "clang", "clang++", "cudafe++", "fatbinary", "nvlink", "hipcc", "make", "cmake", "as",
                       "triton", "nvdisasm", "collect2"})
#: what changes in a line that says the same thing again: clock times and dates, durations, addresses. A progress
#: bar's counts are kept (45/100 then 46/100 is progress); a store's "waiting ... (elapsed 30 s)" repeated is not
_SAME_AGAIN = re.compile(rb"\d{4}-\d\d-\d\d|\d{1,2}:\d\d(?::\d\d)?(?:[.,]\d+)?|\b\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds|"
                         rb"minutes|min)\b|0x[0-9a-fA-F]+|\b\d{9,}(?:\.\d+)?\b")


@dataclass(frozen=True)
class BusyChild:
    """The busiest process of the job that writes no ring, and how long it has been busy without a break."""

    pid: int
    comm: str
    share: float       # of one core, since the last look
    seconds: float     # busy for this long


def child_text(child: BusyChild) -> str:
    """'JIT build in a child (ptxas, 40 s)' / 'a child at work (sh, 12 s)': what the status line says."""
    what = "JIT build in a child" if child.comm in COMPILERS else "a child at work"
    return f"{what} ({child.comm}, {child.seconds:.0f} s)"


@dataclass
class Activity:
    """What moved since the last look (each a few words a person reads), and the busiest non-ring process."""

    moved: list[str] = field(default_factory=list)
    busy_child: BusyChild | None = None
    rank_share: dict[int, float] = field(default_factory=dict)   # ring pid -> share of one core since the last look


def _stat(pid: str) -> tuple[str, int, int, int, str] | None:
    """(comm, ppid, pgid, CPU ticks, state) of one process, or None when it is gone or a zombie."""
    raw = read_proc_file(f"/proc/{pid}/stat")
    if not raw:
        return None
    try:
        comm = raw[raw.index(b"(") + 1:raw.rindex(b")")].decode("utf-8", "replace")
        f = raw[raw.rindex(b")") + 2:].split()
        state = f[0].decode()
        if state in ("Z", "X"):
            return None
        return comm, int(f[1]), int(f[2]), int(f[11]) + int(f[12]), state
    except (ValueError, IndexError):
        return None


def _storage_io(pid: int) -> int:
    raw = read_proc_file(f"/proc/{pid}/io")
    io = 0
    for line in (raw or b"").split(b"\n"):
        if line.startswith((b"read_bytes:", b"write_bytes:")):
            try:
                io += int(line.split()[1])
            except (ValueError, IndexError):
                pass
    return io


class JobActivity:
    """Follows the job's processes between ticks; :meth:`look` says what moved since the previous call."""

    def __init__(self, job_pid: int | None, exclude: set[int] | None = None, log_path: Path | None = None) -> None:
        self.job_pid = job_pid
        self.exclude = exclude or set()            # ours (py-spy, the GPU child, the guardian): never the job's work
        self.log_path = log_path
        self._cpu: dict[int, tuple[float, int]] = {}      # pid -> (when, CPU ticks)
        self._io: dict[int, int] = {}
        self._busy_since: dict[int, float] = {}
        self._fds: dict[int, tuple[float, list[str]]] = {}    # ring pid -> (listed when, fd numbers of regular files)
        self._offsets: dict[int, int] = {}                     # ring pid -> sum of those files' offsets
        self._last_offsets = float("-inf")
        self._log_pos: int | None = None
        self._log_seen: set[bytes] = set()

    def look(self, now: float, ring_pids: set[int], *, quiet_s: float, skip_dirs: tuple[str, ...] = (),
             output_is_news: bool = True) -> Activity:
        """`output_is_news`: False once the ranks' own records speak for the job (every rank joined): new lines are
        still read past, so that they are not news later, but no longer count as progress."""
        out = Activity()
        self._processes(now, ring_pids, out)
        if quiet_s >= 1.0 and now - self._last_offsets >= OFFSETS_EVERY_S:
            self._last_offsets = now
            self._file_offsets(now, ring_pids, skip_dirs, out)
        self._log_lines(out, output_is_news)
        return out

    # --- CPU and storage I/O of the job's other processes ------------------------------------------------------
    def _processes(self, now: float, ring_pids: set[int], out: Activity) -> None:
        try:
            entries = [e for e in os.listdir("/proc") if e.isdigit()]
        except OSError:
            return
        table: dict[int, tuple[str, int, int, int, str]] = {}
        for e in entries:
            st = _stat(e)
            if st is not None:
                table[int(e)] = st
        roots = set(ring_pids) | ({self.job_pid} if self.job_pid else set())
        children: dict[int, list[int]] = {}
        for pid, (_c, ppid, _g, _t, _s) in table.items():
            children.setdefault(ppid, []).append(pid)
        job: set[int] = set()
        todo = [r for r in roots if r in table]
        while todo:  # the process tree under the job and under every ring writer (torchrun workers: own sessions)
            p = todo.pop()
            if p in job:
                continue
            job.add(p)
            todo.extend(children.get(p, ()))
        if self.job_pid:
            job |= {p for p, st in table.items() if st[2] == self.job_pid}  # the job's group: orphans reparented to us
        job -= self.exclude
        best: BusyChild | None = None
        seen: set[int] = set()
        for pid in job:
            comm, _ppid, _pgid, ticks, _state = table[pid]
            seen.add(pid)
            last = self._cpu.get(pid)
            self._cpu[pid] = (now, ticks)
            share = 0.0
            if last is not None and now > last[0]:
                share = (ticks - last[1]) / _CLK_TCK / (now - last[0])
            if pid in ring_pids:
                if last is not None:
                    out.rank_share[pid] = share
                continue  # a rank's own progress is its ring, its counters and its stacks
            io = _storage_io(pid)
            old_io = self._io.get(pid)
            self._io[pid] = io
            if old_io is not None and io != old_io:
                out.moved.append(f"storage I/O of {comm} (pid {pid})")
            if last is not None and share >= BUSY_SHARE:
                since = self._busy_since.setdefault(pid, last[0])
                child = BusyChild(pid, comm, share, now - since)
                if best is None or child.share > best.share:
                    best = child
            else:
                self._busy_since.pop(pid, None)
        for gone in [p for p in self._cpu if p not in seen]:
            self._cpu.pop(gone, None)
            self._io.pop(gone, None)
            self._busy_since.pop(gone, None)
        if best is not None:
            out.busy_child = best
            out.moved.append(child_text(best))

    # --- file offsets: a load from the page cache moves nothing else ---------------------------------------------
    def _file_offsets(self, now: float, ring_pids: set[int], skip_dirs: tuple[str, ...], out: Activity) -> None:
        for pid in ring_pids:
            listed = self._fds.get(pid)
            if listed is None or now - listed[0] >= FD_LIST_TTL_S:
                listed = self._fds[pid] = (now, self._regular_fds(pid, skip_dirs))
            total = 0
            for fd in listed[1]:
                raw = read_proc_file(f"/proc/{pid}/fdinfo/{fd}", 256)
                if raw and raw.startswith(b"pos:"):
                    try:
                        total += int(raw.split(b"\n", 1)[0].split()[1])
                    except (ValueError, IndexError):
                        pass
            old = self._offsets.get(pid)
            self._offsets[pid] = total
            if old is not None and total != old:
                out.moved.append(f"file reads/writes of pid {pid}")
        for gone in [p for p in self._fds if p not in ring_pids]:
            self._fds.pop(gone, None)
            self._offsets.pop(gone, None)

    @staticmethod
    def _regular_fds(pid: int, skip_dirs: tuple[str, ...]) -> list[str]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return []
        out = []
        for fd in fds[:512]:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/") and not target.startswith(("/dev/", "/proc/", "/sys/")) \
                    and not target.startswith(skip_dirs) and not target.endswith(" (deleted)"):
                out.append(fd)
        return out

    # --- new lines in the job's output ------------------------------------------------------------------------
    def _log_lines(self, out: Activity, news: bool = True) -> None:
        if self.log_path is None:
            return
        try:
            size = os.stat(self.log_path).st_size
        except OSError:
            return
        if self._log_pos is None or size < self._log_pos:
            self._log_pos = size  # what was there before we looked is not news
            return
        if size == self._log_pos:
            return
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_pos)
                data = f.read(LOG_READ_MAX)
        except OSError:
            return
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) < LOG_READ_MAX:
                return  # half a line: wait for the rest
            cut = len(data) - 1
        self._log_pos += cut + 1
        fresh = 0
        for line in data[:cut + 1].split(b"\n"):
            key = _SAME_AGAIN.sub(b"#", line.strip())
            if key and key not in self._log_seen:
                fresh += 1
                if len(self._log_seen) < LOG_SEEN_MAX:
                    self._log_seen.add(key)
        if fresh and news:
            out.moved.append(f"{fresh} new line{'s' if fresh > 1 else ''} of output")
