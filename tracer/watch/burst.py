"""A capture burst: everything worth having about a hung job, taken in a few seconds into ``dumps/<timestamp>/``.

Non-blocking py-spy dumps (a blocking one pauses the rank and stalls its peers), /proc thread states and each traced
process's agent answer (stacks, Flight Recorder), run concurrently; whatever cannot be had becomes one line in
``problems`` and the burst goes on.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ranktrace.tracer.watch.ras import RasPoll
    from ranktrace.tracer.watch.stack_sampler import StackDump

__all__ = ["BurstResult", "capture_burst", "find_pyspy", "proc_threads"]


@dataclass
class BurstResult:
    directory: Path
    files: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    dumps: dict[int, "StackDump"] = field(default_factory=dict)   # the py-spy dumps taken here (not handed in)
    ras: "RasPoll | None" = None


PYSPY_ENV = "RANKTRACE_PYSPY"  # a py-spy binary to use, or 0 for none (stacks then come from the in-rank agents)


def find_pyspy() -> str | None:
    """$RANKTRACE_PYSPY, else py-spy on PATH, or installed beside this Python (a venv's bin/ not on PATH)."""
    chosen = os.environ.get(PYSPY_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "0", "off", "no", "none") else shutil.which(chosen)
    here = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(here) if here.exists() else None)


def proc_threads(pid: int) -> list[dict[str, object]]:
    """Per-thread state, wchan and CPU ticks from /proc (no ptrace needed)."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:  # the process exited between discovery and sampling
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read()
            comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
            fields = stat[stat.rindex(b")") + 2:].split()
            try:
                with open(f"{base}/wchan") as f:
                    wchan = f.read().strip()
            except OSError:
                wchan = ""
            out.append({"tid": int(tid), "comm": comm, "state": fields[0].decode(), "wchan": wchan,
                        "utime": int(fields[11]), "stime": int(fields[12])})
        except (OSError, ValueError, IndexError):
            continue
    return out


def _dump_one(pyspy: str, pid: int, directory: Path, native: bool, timeout: float
              ) -> tuple[Path | None, str | None, "StackDump"]:
    from ranktrace.tracer.watch.stack_sampler import pyspy_dump

    d = pyspy_dump(pyspy, pid, native=native, timeout=timeout)
    if d.text is None:
        return None, d.error, d
    path = directory / f"pyspy-{pid}.json"
    path.write_text(d.text)
    return path, None, d


def _ask_agent(host_dir: Path, pid: int, directory: Path, timeout: float) -> tuple[list[Path], str | None]:
    """The rank's own answer (tracer.agent): its Python stacks without ptrace, and its Flight Recorder."""
    from ranktrace.tracer.rank import agent

    sock = agent.socket_path(host_dir, pid)
    if not sock.exists():
        return [], None
    try:
        ans = agent.ask(sock, timeout)
    except (OSError, ValueError) as e:
        return [], f"pid {pid}: in-rank agent did not answer ({type(e).__name__}: {e})"
    files: list[Path] = []
    if ans.get("threads"):
        path = directory / f"agent-{pid}.json"  # py-spy's JSON layout: the py-spy reader reads it (source agent)
        path.write_text(json.dumps(ans["threads"]))
        files.append(path)
    if ans.get("fr"):
        rank = ans.get("rank")
        path = directory / (f"fr-rank{rank}-pid{pid}.json" if isinstance(rank, int) else f"fr-pid{pid}.json")
        path.write_text(ans["fr"])
        files.append(path)
    note = ans.get("fr_note") if "capture" in str(ans.get("fr_note")) else ans.get("error")
    return files, (f"pid {pid}: {note}" if note else None)


def capture_burst(host_dir: Path, pids: list[int], *, native: bool = False, timeout: float = 5.0,
                  reason: str = "", dumps: "dict[int, StackDump] | None" = None,
                  ras_addr: str | None = None) -> BurstResult:
    """Dump every pid into ``host_dir/dumps/<timestamp>/``. Never raises for a process or tool problem."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f".{int(time.time() * 1000) % 1000:03d}"
    directory = host_dir / "dumps" / stamp
    directory.mkdir(parents=True, exist_ok=True)
    result = BurstResult(directory)
    live = [p for p in pids if os.path.exists(f"/proc/{p}")]
    for p in sorted(set(pids) - set(live)):
        result.problems.append(f"pid {p} exited before it could be sampled")
    ras_thread = None
    if ras_addr:
        import threading

        from ranktrace.tracer.watch import ras

        def ask() -> None:
            try:
                result.ras = ras.poll(ras_addr)
                ras.save(result.ras, directory)
                ras.summarize(result.ras)
            except Exception as e:  # RAS must never cost the burst
                result.problems.append(f"NCCL RAS query failed: {type(e).__name__}: {e}")

        ras_thread = threading.Thread(target=ask, name="ranktrace-ras", daemon=True)
        ras_thread.start()
    threads = {p: proc_threads(p) for p in live}
    (directory / "proc.json").write_text(json.dumps({"reason": reason, "wall_ns": time.time_ns(),
                                                      "threads": threads}, indent=1))
    result.files.append(directory / "proc.json")
    given = {p: d for p, d in (dumps or {}).items() if p in live and d.text is not None}
    for p, d in given.items():
        path = directory / f"{d.source}-{p}.json"  # pyspy-<pid>.json, or agent-<pid>.json (same layout)
        path.write_text(d.text or "")
        result.files.append(path)
    agents = ThreadPoolExecutor(max_workers=min(8, max(1, len(live))), thread_name_prefix="ranktrace-agent-ask")
    asked = [agents.submit(_ask_agent, host_dir, p, directory, timeout) for p in live]
    todo = [p for p in live if p not in given]
    pyspy = find_pyspy() if todo else None
    if todo and pyspy is None:
        result.problems.append("py-spy not found or turned off: Python stacks only from the in-rank agents")
    elif todo:
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            for path, problem, d in pool.map(lambda p: _dump_one(pyspy, p, directory, native, timeout), todo):
                result.dumps[d.pid] = d
                if path is not None:
                    result.files.append(path)
                if problem:
                    result.problems.append(problem)
    for fut in asked:
        try:
            files, problem = fut.result(timeout=timeout + 1.0)
        except Exception as e:  # an agent that never answers costs at most the timeout
            files, problem = [], f"in-rank agent: {type(e).__name__}: {e}"
        result.files.extend(files)
        if problem:
            result.problems.append(problem)
    agents.shutdown(wait=False)
    if ras_thread is not None:
        ras_thread.join(timeout=5.0)
        if result.ras is not None:
            result.problems.extend(result.ras.problems)
            if result.ras.file is not None:
                result.files.append(result.ras.file)
    if result.problems:
        (directory / "problems.txt").write_text("\n".join(result.problems) + "\n")
    return result
