"""Text dumps to rows: each thread gets its process's pid, rank and snapshot, and each ``Process N: cmdline``
header becomes a ``process`` observation (so a dump cut right after its header still says who was alive)."""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.readers.common.stacks import StackRecord
from ranktrace.analyzers.readers.ps_top.rows import redact_command
from ranktrace.analyzers.readers.pyspy.scan_text import Process

__all__ = ["thread_records", "process_rows"]


def thread_records(name: str, procs: list[Process], file_rank: int | None) -> list[StackRecord]:
    """The threads of the processes that have any, completed: rank = the line's launcher prefix, else the
    process's own (command line), else the file name's when the file holds one process; snapshot =
    ``<file name>[pid N]`` (``#k`` when the same pid is dumped again)."""
    out: list[StackRecord] = []
    seen: dict[int | None, int] = {}
    with_threads = [p for p in procs if p.threads]
    one_process = len(with_threads) == 1
    for p in with_threads:
        k = seen[p.pid] = seen.get(p.pid, 0) + 1
        snap = f"{name}[pid {p.pid}]" if p.pid is not None else f"{name}[dump at line {p.line}]"
        if k > 1:
            snap += f"#{k}"
        for t in p.threads:
            if t.rank is None:
                t.rank = p.rank
            if t.rank is None and one_process:
                t.rank = file_rank
            t.pid, t.native, t.snapshot = p.pid, p.native, snap
            out.append(t)
    return out


def process_rows(f: str, procs: list[Process], file_rank: int | None) -> list[dict[str, Any]]:
    """One ``process`` row per ``Process N: cmdline`` header (docs/EVIDENCE.md): the process py-spy found alive,
    its command (redacted) and the rank it names; also for a dump cut right after its header."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for p in procs:
        if p.pid is None or p.cmdline is None or p.pid in seen:
            continue
        seen.add(p.pid)
        rank = p.rank if p.rank is not None else (file_rank if len(procs) == 1 else None)
        out.append({"pid": p.pid, "rank": rank, "kind": "process", "name": None, "source": "pyspy", "file": f,
                    "line": p.line, "detail": f"pid={p.pid} by=pyspy cmd={redact_command(p.cmdline)}"})
    return out
