"""A capture burst: everything worth having about a hung job, taken in a few seconds into ``dumps/<timestamp>/``.

Non-blocking py-spy dumps (a blocking dump pauses the rank, and its TP peers stall with it — DESIGN §2), and each
process's threads from /proc (state, wchan, CPU time), run concurrently so eight ranks cost about as much as one.
Every capability that is missing (py-spy not installed, ptrace denied, a process gone between discovery and
sampling) becomes one line in ``problems`` and the burst goes on with what it can get.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BurstResult", "capture_burst", "find_pyspy", "proc_threads"]


@dataclass
class BurstResult:
    directory: Path
    files: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find_pyspy() -> str | None:
    """py-spy on PATH, or installed beside this Python (a venv's bin/ that is not on PATH)."""
    here = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(here) if here.exists() else None)


def proc_threads(pid: int) -> list[dict[str, object]]:
    """Per-thread state, wchan and CPU ticks from /proc (no ptrace needed)."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
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


def _dump_one(pyspy: str, pid: int, directory: Path, native: bool, timeout: float) -> tuple[Path | None, str | None]:
    cmd = [pyspy, "dump", "--nonblocking", "--json", "--pid", str(pid)]
    if native:
        cmd.insert(2, "--native")
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        return None, f"py-spy dump of pid {pid} did not answer within {timeout:.0f} s"
    if res.returncode != 0 or not res.stdout.strip().startswith("["):
        msg = (res.stderr or res.stdout).strip().splitlines()
        text = msg[-1] if msg else f"exit {res.returncode}"
        if "Permission" in text or "ptrace" in text.lower():
            text += " (ptrace denied: set kernel.yama.ptrace_scope=0 or run as the job's user with CAP_SYS_PTRACE)"
        return None, f"py-spy dump of pid {pid} failed: {text}"
    path = directory / f"pyspy-{pid}.json"
    path.write_text(res.stdout)
    return path, None


def capture_burst(host_dir: Path, pids: list[int], *, native: bool = False, timeout: float = 5.0,
                  reason: str = "") -> BurstResult:
    """Dump every pid into ``host_dir/dumps/<timestamp>/``. Never raises for a process or tool problem."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f".{int(time.time() * 1000) % 1000:03d}"
    directory = host_dir / "dumps" / stamp
    directory.mkdir(parents=True, exist_ok=True)
    result = BurstResult(directory)
    live = [p for p in pids if os.path.exists(f"/proc/{p}")]
    for p in sorted(set(pids) - set(live)):
        result.problems.append(f"pid {p} exited before it could be sampled")
    threads = {p: proc_threads(p) for p in live}
    (directory / "proc.json").write_text(json.dumps({"reason": reason, "wall_ns": time.time_ns(),
                                                      "threads": threads}, indent=1))
    result.files.append(directory / "proc.json")
    pyspy = find_pyspy()
    if pyspy is None:
        result.problems.append("py-spy not found: no Python stacks in this burst (pip install py-spy)")
    elif live:
        with ThreadPoolExecutor(max_workers=min(8, len(live))) as pool:
            for path, problem in pool.map(lambda p: _dump_one(pyspy, p, directory, native, timeout), live):
                if path is not None:
                    result.files.append(path)
                if problem:
                    result.problems.append(problem)
    if result.problems:
        (directory / "problems.txt").write_text("\n".join(result.problems) + "\n")
    return result
