"""The guardian: a small process beside the job, in the job's process group, for two things `trace run` cannot do
from where it stands.

1. If `trace run` dies without ending the job (SIGKILL, OOM kill), the job must not run on unwatched: a parent-death
   signal reaches only the direct child, and mp.spawn ranks were found under PID 1, still running 29 s later. The
   guardian notices (its control pipe reaches end of file without "done"), says so in meta.json
   (``launcher_lost``), sends SIGTERM to the job's processes (the job's process group and every live process that
   wrote a ring of this run: torchrun starts its workers in sessions of their own) and SIGKILL to what is left 5 s
   later. The process `trace run` started already got SIGTERM as its parent-death signal, and is not sent a second.
2. A signal must reach the process the user started exactly once. When a scheduler signals every process (Slurm,
   systemd, ``pkill``), the job already got it, and `trace run` forwarding it again would be a second SIGTERM (which a
   "second TERM = exit now" handler reads as "abort the graceful shutdown"). The guardian sits where such a signal
   lands too (the job's process group, the job's cgroup, the job's command line for ``pkill -f``), blocks them and
   reports each one it receives to `trace run`, which then forwards only the signals the job did not get.

It runs as ``python -I -S guardian.py ...`` (stdlib only, no site, no sitecustomize: it is not traced), never writes
to the job's terminal, and exits when `trace run` says "done".
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

if __package__:
    from ranktrace.tracer.launch import pidident
else:  # python -I -S guardian.py: no site, no package; the sibling module by its path
    import importlib.util as _ilu

    _spec = _ilu.spec_from_file_location("_ranktrace_pidident",
                                         os.path.join(os.path.dirname(os.path.abspath(__file__)), "pidident.py"))
    pidident = _ilu.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules[_spec.name] = pidident  # dataclasses look their module up there
    _spec.loader.exec_module(pidident)  # type: ignore[union-attr]

__all__ = ["Guardian", "job_processes", "job_targets", "WITNESSED", "GRACE_S"]

# what a scheduler or a person may send to every process of a job (and trace run forwards)
WITNESSED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT,
             signal.SIGALRM, signal.SIGWINCH, signal.SIGCONT)
GRACE_S = 5.0


def _alive(pid: int) -> bool:
    st = pidident.stat(pid)
    return st is not None and not st.zombie


def job_targets(pgid: int, host_dir: Path | None, started_s: float) -> list["pidident.Target"]:
    """The job's live processes, each held by its identity (pidident): the members of its process group started
    since the run, and every process that wrote a ring of this run and is still that writer (the ring's record of
    its start time). A ring's pid now run by an unrelated process (the writer died, its pid was reused) is left
    alone, and so is a pid that changes hands between this check and the signal (pidfds)."""
    me = os.getpid()
    out: dict[int, "pidident.Target"] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            st = pidident.stat(int(entry))
            if st is None or st.pgid != pgid or st.zombie:
                continue
            t = pidident.target(int(entry), lambda s: s.pgid == pgid and s.start_s >= started_s - pidident.SLACK_S)
            if t is not None:
                out[t.pid] = t
    if host_dir is not None:
        try:
            rings = os.listdir(host_dir / "rings")
        except OSError:
            rings = []
        for name in rings:
            pid = pidident.ring_pid(name)
            if pid is None or pid == me or pid in out:
                continue
            writer = pidident.ring_writer(host_dir / "rings" / name)
            if writer is None:
                continue
            t = pidident.target(pid, lambda s: s.start_s >= started_s - pidident.SLACK_S
                                and pidident.writer_matches(pid, writer, s))  # noqa: B023 (called at once)
            if t is not None:
                out[pid] = t
    return [out[p] for p in sorted(out)]


def job_processes(pgid: int, host_dir: Path | None, started_s: float) -> list[int]:
    """The pids of job_targets (for counting and records; signal through job_targets)."""
    targets = job_targets(pgid, host_dir, started_s)
    for t in targets:
        t.close()
    return [t.pid for t in targets]


def _boot_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Guardian:
    """`trace run`'s side of the guardian process (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], ctl: int, reports: int) -> None:
        self.proc, self.ctl, self.reports = proc, ctl, reports
        self._buf = b""
        self.seen: list[tuple[int, int, int]] = []   # (signal, sender pid, CLOCK_MONOTONIC ns) it received

    @classmethod
    def start(cls, job_pid: int, host_dir: Path, command: Sequence[str],
              log: Callable[[str], None] = lambda s: None) -> "Guardian | None":
        """Start it in the job's process group. None (one line said) when it cannot be started: the run goes on
        without it (no cleanup if trace run is killed, signals forwarded without the witness)."""
        ctl_r, ctl_w = os.pipe()
        rep_r, rep_w = os.pipe()

        def in_child() -> None:
            try:
                os.setpgid(0, job_pid)  # where a signal to the job's group lands
            except OSError:
                pass

        argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(ctl_r), str(rep_w), str(job_pid),
                str(host_dir), f"{_boot_s():.3f}", "--", *command]
        try:
            proc = subprocess.Popen(argv, pass_fds=(ctl_r, rep_w), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=in_child)
        except (OSError, subprocess.SubprocessError) as e:
            for fd in (ctl_r, ctl_w, rep_r, rep_w):
                os.close(fd)
            log(f"guardian not started ({e}): if trace run is killed, the job is not ended for it")
            return None
        os.close(ctl_r)
        os.close(rep_w)
        os.set_blocking(rep_r, False)
        return cls(proc, ctl_w, rep_r)

    def poll(self) -> None:
        """Take the reports written so far (never waits)."""
        while True:
            try:
                data = os.read(self.reports, 4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not data:
                return
            self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            for ln in lines:
                try:
                    sig, pid, t = map(int, ln.split())
                except ValueError:
                    continue
                self.seen.append((sig, pid, t))

    def witnessed(self, signum: int, t_ns: int, window_ns: int) -> bool:
        """The guardian (so the job's process group / cgroup) received `signum` within `window_ns` of `t_ns`: the
        sender reached the job itself. That report is used up (one report answers one signal)."""
        self.poll()
        for i, (sig, _pid, t) in enumerate(self.seen):
            if sig == signum and abs(t - t_ns) <= window_ns:
                del self.seen[i]
                return True
        return False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """The job is over: the guardian exits without touching anything."""
        try:
            os.write(self.ctl, b"done\n")
        except OSError:
            pass
        for fd in (self.ctl, self.reports):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the guardian process itself ----------------------------------------------------------------------------------

def _record_loss(host_dir: Path, ended: list[int]) -> None:
    """meta.json says trace run was lost and what the guardian ended (the analysis then calls the trace cut, never a
    hang). Atomic like every meta.json write; skipped when it cannot be written."""
    path = host_dir / "meta.json"
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict) or meta.get("exit"):
            return
        meta["launcher_lost"] = {"wall_ns": time.time_ns(), "ended_pids": ended,
                                 "detail": "trace run ended without recording the job's exit (killed?); its guardian "
                                           "ended the job"}
        tmp = host_dir / f".meta.json.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(meta, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def _end_job(job_pid: int, host_dir: Path, started_s: float) -> None:
    targets = job_targets(job_pid, host_dir, started_s)
    _record_loss(host_dir, [t.pid for t in targets])
    for t in targets:
        if t.pid != job_pid:  # the started process got SIGTERM as its parent-death signal already
            t.signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(t.alive() for t in targets):
        time.sleep(0.1)
    for t in targets:
        if t.alive():
            t.signal(signal.SIGKILL)
        t.close()


def main(argv: list[str]) -> int:
    ctl, rep, job_pid = int(argv[0]), int(argv[1]), int(argv[2])
    host_dir, started_s = Path(argv[3]), float(argv[4])
    leader = pidident.stat(job_pid)  # the job started a moment before us: its processes count from then
    if leader is not None:
        started_s = min(started_s, leader.start_s)
    signal.pthread_sigmask(signal.SIG_BLOCK, WITNESSED)
    for s in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    os.set_blocking(rep, False)
    while True:
        info = signal.sigtimedwait(WITNESSED, 0.05)
        if info is not None:
            try:
                os.write(rep, f"{info.si_signo} {info.si_pid} {time.monotonic_ns()}\n".encode())
            except OSError:
                pass
        if select.select([ctl], [], [], 0)[0]:
            try:
                data = os.read(ctl, 64)
            except OSError:
                data = b""
            if data.startswith(b"done"):
                return 0
            if not data:  # trace run is gone without saying "done"
                _end_job(job_pid, host_dir, started_s)
                return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:sys.argv.index("--") if "--" in sys.argv else len(sys.argv)]))
