"""Stacks of the job's processes: non-blocking py-spy dumps, the ranks' own agents, and ``stacks.arrow`` rows.

``stack`` rows define a distinct stack once (``stack_id``, ``frames``); ``sample`` rows reference it per thread and
sample, with the thread name, py-spy's idle/active state, and ``changed`` (the thread's stack differs from its
previous sample; null on its first); ``error`` rows keep py-spy failures. The stack table forgets old stacks past a
cap (re-emitted if seen again). One dump serves both the monitor's "did the stack change" decision and the file.
"""
from __future__ import annotations

import json
import re
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.tracer.watch.sample_log import ArrowStreamLog

__all__ = ["StackSampler", "StackDump", "pyspy_dump", "dump_all", "agent_dumps", "frame_text"]


@dataclass
class StackDump:
    """One non-blocking py-spy dump of one process: its JSON text, or why there is none."""

    pid: int
    wall_ns: int
    t_ns: int
    text: str | None = None
    error: str | None = None
    threads: list[dict[str, Any]] = field(default_factory=list)
    source: str = "pyspy"  # or "agent": the rank's own answer (tracer.agent), same JSON layout


def pyspy_error_text(out: str, returncode: int) -> str:
    """py-spy's own words for why it failed: its ``Error:`` line and the first cause, never its Rust backtrace
    (whose last line, ``10: main``, is what the status line used to show)."""
    lines = [ln.strip() for ln in (out or "").splitlines()]
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("Stack backtrace")), len(lines))
    lines = [ln for ln in lines[:cut] if ln]
    first = next((i for i, ln in enumerate(lines) if ln.startswith("Error:")), None)
    if first is None:
        return lines[0] if lines else f"exit {returncode}"
    text = lines[first][len("Error:"):].strip()
    causes = [re.sub(r"^\d+:\s*", "", ln) for ln in lines[first + 1:] if ln != "Caused by:"]
    if causes and causes[0] and causes[0] not in text:
        text += f" ({causes[0]})"
    return text


def pyspy_dump(pyspy: str, pid: int, *, native: bool = False, timeout: float = 5.0) -> StackDump:
    """``py-spy dump --nonblocking --json`` of one process (never pauses it). Never raises.

    With `native`, py-spy refuses --nonblocking, so that one dump pauses the rank for its duration (0.1-0.75 s
    here): only hang-time bursts ask for it (--native-stacks), never periodic samples."""
    wall, mono = time.time_ns(), time.monotonic_ns()
    cmd = [pyspy, "dump", "--native", "--json", "--pid", str(pid)] if native else \
        [pyspy, "dump", "--nonblocking", "--json", "--pid", str(pid)]
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} did not answer within {timeout:.0f} s")
    except OSError as e:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} could not start: {e}")
    if res.returncode != 0 or not res.stdout.strip().startswith("["):
        text = pyspy_error_text(res.stderr or res.stdout, res.returncode)
        if "Permission" in text or "ptrace" in text.lower():
            text += " (ptrace denied: set kernel.yama.ptrace_scope=0 or run as the job's user with CAP_SYS_PTRACE)"
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} failed: {text}")
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid}: unreadable JSON")
    return StackDump(pid, wall, mono, text=res.stdout, threads=threads if isinstance(threads, list) else [])


def dump_all(pyspy: str, pids: list[int], *, native: bool = False, timeout: float = 5.0) -> dict[int, StackDump]:
    """Dump every pid concurrently (eight ranks cost about one dump of wall time)."""
    if not pids:
        return {}
    if len(pids) == 1:
        return {pids[0]: pyspy_dump(pyspy, pids[0], native=native, timeout=timeout)}
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        dumps = list(pool.map(lambda p: pyspy_dump(pyspy, p, native=native, timeout=timeout), pids))
    return {d.pid: d for d in dumps}


def agent_dumps(host_dir: Path, pids: list[int], *, timeout: float = 1.0) -> dict[int, StackDump]:
    """Stacks of every pid that has an in-rank agent (tracer.agent), asked concurrently; no FR (cheap, periodic).
    For processes py-spy cannot read (ptrace denied, py-spy missing)."""
    from ranktrace.tracer.rank import agent

    def one(pid: int) -> StackDump | None:
        sock = agent.socket_path(host_dir, pid)
        if not sock.exists():
            return None
        wall, mono = time.time_ns(), time.monotonic_ns()
        try:
            ans = agent.ask(sock, timeout, request=agent.STACKS_REQUEST)
        except (OSError, ValueError) as e:
            return StackDump(pid, wall, mono, error=f"in-rank agent of pid {pid} did not answer: {e}", source="agent")
        threads = ans.get("threads") if isinstance(ans.get("threads"), list) else []
        return StackDump(pid, wall, mono, text=json.dumps(threads), threads=threads, source="agent")

    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return {d.pid: d for d in pool.map(one, pids) if d is not None}


def frame_text(fr: dict[str, Any]) -> str | None:
    """One py-spy JSON frame as ``func (file:line)``, the way analyzers.readers.pyspy spells it."""
    if not isinstance(fr, dict) or not fr.get("name"):
        return None
    loc = fr.get("short_filename") or fr.get("filename") or fr.get("module") or "?"
    line = fr.get("line")
    return f"{fr['name']} ({loc}:{line})" if isinstance(line, int) and line > 0 else f"{fr['name']} ({loc})"


class StackSampler:
    """Records dumps into ``stacks.arrow``: each distinct stack once, then (thread, sample) references."""

    def __init__(self, log: ArrowStreamLog | None, *, max_stacks: int = 20000) -> None:
        self.log, self.max_stacks = log, max_stacks
        self._ids: dict[tuple[str, ...], int] = {}
        self._next_id = 0
        self._last: dict[tuple[int, int], int] = {}   # (pid, tid) -> stack_id of its previous sample
        self._sample = 0
        self.samples_taken = 0

    def _stack_id(self, frames: tuple[str, ...]) -> int:
        sid = self._ids.get(frames)
        if sid is not None:
            return sid
        if len(self._ids) >= self.max_stacks:
            self._ids.clear()  # bounded memory: forgotten stacks are written again when seen again
        self._next_id += 1
        sid = self._ids[frames] = self._next_id
        if self.log is not None:
            self.log.add({"kind": "stack", "stack_id": sid, "frames": list(frames)})
        return sid

    def record(self, dumps: dict[int, StackDump], ranks: dict[int, int | None], trigger: str) -> None:
        """One round of dumps into samples/stacks.arrows. A thread /proc shows stopped (T: SIGSTOP, Ctrl-Z) or in
        uninterruptible sleep (D) as it is recorded gets that as its thread state (analyzers.hoststate.PROC_STATES):
        py-spy reads a stopped process's stack as if it merely slept."""
        self._sample += 1
        self.samples_taken += 1
        seen_pids = set(dumps)
        for pid, d in sorted(dumps.items()):
            rank = ranks.get(pid)
            if d.error is not None:
                if self.log is not None and os.path.exists(f"/proc/{pid}"):  # not: a process that just ended
                    self.log.add({"kind": "error", "sample_id": self._sample, "wall_ns": d.wall_ns, "t_ns": d.t_ns,
                                  "pid": pid, "rank": rank, "trigger": trigger, "detail": d.error})
                continue
            for t in d.threads:
                if not isinstance(t, dict):
                    continue
                frames = tuple(s for s in (frame_text(fr) for fr in t.get("frames") or []) if s is not None)
                tid = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else t.get("thread_id")
                sid = self._stack_id(frames)
                key = (pid, int(tid) if isinstance(tid, int) else -1)
                prev = self._last.get(key)
                self._last[key] = sid
                state = "active+gil" if t.get("owns_gil") else ("active" if t.get("active") else "idle")
                state = proc_state(pid, t.get("os_thread_id")) or state
                if self.log is not None:
                    self.log.add({"kind": "sample", "stack_id": sid, "sample_id": self._sample, "wall_ns": d.wall_ns,
                                  "t_ns": d.t_ns, "pid": pid, "tid": key[1] if key[1] >= 0 else None, "rank": rank,
                                  "thread_name": t.get("thread_name"), "thread_state": state,
                                  "changed": None if prev is None else prev != sid, "trigger": trigger})
        for key in [k for k in self._last if k[0] not in seen_pids and not os.path.exists(f"/proc/{k[0]}")]:
            del self._last[key]


_PROC_STATES = {"T": "stopped", "t": "stopped", "D": "uninterruptible"}  # = analyzers.hoststate.PROC_STATES


def proc_state(pid: int, tid: object) -> str | None:
    """"stopped" / "uninterruptible" when /proc says the thread (its process, without a thread id) is T / D now."""
    path = f"/proc/{pid}/task/{tid}/stat" if isinstance(tid, int) else f"/proc/{pid}/stat"
    try:
        with open(path, "rb") as f:
            stat = f.read()
        return _PROC_STATES.get(stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
