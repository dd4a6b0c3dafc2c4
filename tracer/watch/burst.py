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

__all__ = ["BurstResult", "DumpDir", "UnsafeDir", "capture_burst", "find_pyspy", "proc_threads"]


@dataclass
class BurstResult:
    directory: Path
    files: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    dumps: dict[int, "StackDump"] = field(default_factory=dict)   # the py-spy dumps taken here (not handed in)
    ras: "RasPoll | None" = None


class UnsafeDir(OSError):
    """A dumps folder that is not ours alone (a symlink, another user's): nothing is written there."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DumpDir:
    """A new ``dumps/<stamp>/`` in `host_dir`, made and written through directory fds without following a symlink
    at any step: a planted ``dumps`` symlink, or one swapped in later, never leads a write elsewhere. The host dir
    and ``dumps`` must be owned by us; files are created new (O_EXCL | O_NOFOLLOW, 0600)."""

    def __init__(self, host_dir: Path, stamp: str) -> None:
        hfd = os.open(os.path.realpath(host_dir), _DIR_FLAGS)
        try:
            self._owned(hfd, host_dir)
            try:
                os.mkdir("dumps", 0o700, dir_fd=hfd)
            except FileExistsError:
                pass
            try:
                dfd = os.open("dumps", _DIR_FLAGS, dir_fd=hfd)
            except OSError as e:
                raise UnsafeDir(e.errno, f"{host_dir / 'dumps'} is not a folder (a symlink is never followed)") from None
        finally:
            os.close(hfd)
        try:
            self._owned(dfd, host_dir / "dumps")
            name, n = stamp, 1
            while True:
                try:
                    os.mkdir(name, 0o700, dir_fd=dfd)
                    break
                except FileExistsError:
                    n += 1
                    name = f"{stamp}-{n}"
            self.fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        finally:
            os.close(dfd)
        self.path = host_dir / "dumps" / name

    @staticmethod
    def _owned(fd: int, shown: Path) -> None:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeDir(1, f"{shown} is owned by uid {st.st_uid}, not by us: nothing is written into it")

    def write(self, name: str, text: str) -> Path:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return self.path / name

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def _dump_one(pyspy: str, pid: int, directory: DumpDir, native: bool, timeout: float
              ) -> tuple[Path | None, str | None, "StackDump"]:
    from ranktrace.tracer.watch.stack_sampler import pyspy_dump

    d = pyspy_dump(pyspy, pid, native=native, timeout=timeout)
    if d.text is None:
        return None, d.error, d
    return directory.write(f"pyspy-{pid}.json", d.text), None, d


def _ask_agent(host_dir: Path, pid: int, directory: DumpDir, timeout: float, stacks: bool = True
               ) -> tuple[list[Path], str | None]:
    """The rank's own answer (tracer.agent): its Python stacks without ptrace, and its Flight Recorder. `stacks`
    False: this tick's agent dump of the pid is already in the burst (written once: the burst never overwrites)."""
    from ranktrace.tracer.rank import agent

    sock = agent.socket_path(host_dir, pid)
    if not sock.exists():
        return [], None
    try:
        ans = agent.ask(sock, timeout, expect_pid=pid)
    except (OSError, ValueError) as e:
        return [], f"pid {pid}: in-rank agent did not answer ({type(e).__name__}: {e})"
    files: list[Path] = []
    if not isinstance(ans, dict):
        return [], f"pid {pid}: in-rank agent answered something else than its JSON object"
    if stacks and ans.get("threads"):
        # py-spy's JSON layout: the py-spy reader reads it (source agent)
        files.append(directory.write(f"agent-{pid}.json", json.dumps(ans["threads"])))
    if isinstance(ans.get("fr"), str) and ans["fr"]:
        rank = ans.get("rank")
        files.append(directory.write(f"fr-rank{rank}-pid{pid}.json" if isinstance(rank, int) and
                                     not isinstance(rank, bool) else f"fr-pid{pid}.json", ans["fr"]))
    note = ans.get("fr_note") if "capture" in str(ans.get("fr_note")) else ans.get("error")
    return files, (f"pid {pid}: {note}" if note else None)


def capture_burst(host_dir: Path, pids: list[int], *, native: bool = False, timeout: float = 5.0,
                  reason: str = "", dumps: "dict[int, StackDump] | None" = None,
                  ras_addr: str | None = None) -> BurstResult:
    """Dump every pid into ``host_dir/dumps/<timestamp>/``. Never raises for a process or tool problem."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f".{int(time.time() * 1000) % 1000:03d}"
    try:
        out = DumpDir(host_dir, stamp)
    except OSError as e:  # not ours, a symlink: no burst at all (nothing dumped, nothing written)
        return BurstResult(host_dir / "dumps" / stamp, problems=[f"no capture burst: {e.strerror or e}"])
    try:
        return _burst(out, host_dir, pids, native=native, timeout=timeout, reason=reason, dumps=dumps,
                      ras_addr=ras_addr)
    finally:
        out.close()


def _burst(out: DumpDir, host_dir: Path, pids: list[int], *, native: bool, timeout: float, reason: str,
           dumps: "dict[int, StackDump] | None", ras_addr: str | None) -> BurstResult:
    directory = out.path
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
                ras.save(result.ras, directory, write=out.write)
                ras.summarize(result.ras)
            except Exception as e:  # RAS must never cost the burst
                result.problems.append(f"NCCL RAS query failed: {type(e).__name__}: {e}")

        ras_thread = threading.Thread(target=ask, name="ranktrace-ras", daemon=True)
        ras_thread.start()
    threads = {p: proc_threads(p) for p in live}
    result.files.append(out.write("proc.json", json.dumps({"reason": reason, "wall_ns": time.time_ns(),
                                                           "threads": threads}, indent=1)))
    given = {p: d for p, d in (dumps or {}).items() if p in live and d.text is not None}
    for p, d in given.items():
        # pyspy-<pid>.json, or agent-<pid>.json (same layout)
        result.files.append(out.write(f"{d.source}-{p}.json", d.text or ""))
    agents = ThreadPoolExecutor(max_workers=min(8, max(1, len(live))), thread_name_prefix="ranktrace-agent-ask")
    asked = [agents.submit(_ask_agent, host_dir, p, out, timeout, given.get(p) is None or given[p].source != "agent")
             for p in live]
    todo = [p for p in live if p not in given]
    pyspy = find_pyspy() if todo else None
    if todo and pyspy is None:
        result.problems.append("py-spy not found or turned off: Python stacks only from the in-rank agents")
    elif todo:
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            for path, problem, d in pool.map(lambda p: _dump_one(pyspy, p, out, native, timeout), todo):
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
        out.write("problems.txt", "\n".join(result.problems) + "\n")
    return result
