"""One run of one configuration, and the safety around all of them.

A run is `trace run -o RUN --hang-after S --on-hang kill -- CMD` as a child process in its own process group (a
Ctrl-C at the terminal reaches `trace bisect` alone, which decides), its output into a log that is watched for the
line the framework prints when it is ready to serve. It is stopped (SIGTERM to `trace run`, which forwards it to the
job and still writes the trace) when ready, when its time is up, or on Ctrl-C; SIGKILL if it has not ended after a
grace. `trace bisect` is a child subreaper, so whatever the job left behind is re-parented to it and is terminated
and reaped before the next run starts. The outcome is read from the exit status, meta.json (killed_on_hang) and
verdict.json. `gpu_lock` keeps two bisects off the same GPUs; `probe_version` asks the job's own interpreter which
release of the framework it has."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping

from ranktrace.tracer.launch import pidident
from ranktrace.tracer.launch.attach import descendants

__all__ = ["READY", "RunSpec", "RunRecord", "Stopper", "GpuBusy", "become_subreaper", "run_once",
           "reap_leftovers", "gpu_lock", "LockDirUnsafe", "probe_version", "verdict_brief"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# What each framework prints once it serves (SGLang: http_server._wait_and_warmup; vLLM: uvicorn's startup line).
READY = {
    "sglang": r"The server is fired up and ready to roll",
    "vllm": r"Application startup complete|Starting vLLM (API )?server on",
}
HANG_MARK = b"--on-hang kill: terminating the job"
REJECTED = re.compile(rb"unrecognized arguments:|error: argument [^\n]*: invalid choice|error: unrecognized option|"
                      rb"error: ambiguous option")
STOP_GRACE_S = 90.0      # trace run, once stopped, still finalizes and analyzes the trace
LEFTOVER_GRACE_S = 5.0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def become_subreaper() -> bool:
    """Orphans of every run are re-parented to us, so none escapes the reaping after it."""
    libc = _libc()
    return bool(libc is not None and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


class Stopper:
    """Ctrl-C / SIGTERM / SIGHUP while the search runs: the first stops the run in progress gracefully (its trace is
    still written) and ends the search; a second one kills the run at once."""

    def __init__(self) -> None:
        self.requests = 0
        self.signal: int | None = None   # the first one (trace bisect then exits 128 + it)

    def __call__(self, signum: int, _frame: object) -> None:
        self.requests += 1
        if self.signal is None:
            self.signal = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator["Stopper"]:
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self) for s in sigs}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


@dataclass(frozen=True)
class RunSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]                  # the whole environment of `trace run`
    run_dir: Path                           # must not exist yet
    log: Path
    hang_after: float
    startup_hang_after: float
    hooks: tuple[str, ...] = ()
    ready: str | None = None                # regex: the job counts as a success once a line matches it
    deadline: float | None = None           # time.monotonic() at which the run is stopped
    deadline_outcome: str = "timeout"       # timeout (the run's own limit) | cut (the bisect's --time ran out)
    edits_flags: bool = False               # the configuration changed the command line (it may be rejected)


@dataclass
class RunRecord:
    outcome: str              # hang | crash | success | timeout | rejected | interrupted | cut | error
    how: str                  # in words: "killed on hang", "ready: <line>", "exit 0", "exit 7", ...
    seconds: float            # from start to the outcome (hang detected, ready, exit)
    wall_seconds: float       # the whole run, trace written
    exit_code: int | None     # trace run's
    run_dir: Path
    log: Path
    verdict: dict[str, Any] | None = None       # verdict_brief of verdict.json (what the table shows)
    leftovers: int = 0        # processes it left behind that we had to end
    problems: list[str] = field(default_factory=list)
    full_verdict: dict[str, Any] | None = None  # verdict.json itself (what the knob order reads)


class _Output(threading.Thread):
    """Copies `trace run`'s output into the log and notes when the ready line and the hang kill appear."""

    def __init__(self, stream: IO[bytes], log: IO[bytes], ready: str | None, t0: float) -> None:
        super().__init__(daemon=True)
        self.stream, self.log, self.t0 = stream, log, t0
        self.ready = re.compile(ready.encode()) if ready else None
        self.ready_at: float | None = None
        self.ready_line = ""
        self.hang_at: float | None = None

    def run(self) -> None:
        for line in iter(self.stream.readline, b""):
            try:
                self.log.write(line)
                self.log.flush()
            except OSError:
                pass
            now = time.monotonic() - self.t0
            if self.hang_at is None and HANG_MARK in line:
                self.hang_at = now
            if self.ready is not None and self.ready_at is None and self.ready.search(line):
                self.ready_at = now
                self.ready_line = line.decode(errors="replace").strip()[:200]


def _in_child() -> None:
    """Between fork and exec: own process group (a terminal Ctrl-C is ours to decide on), die with us."""
    os.setpgid(0, 0)
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def trace_run_argv(spec: RunSpec) -> list[str]:
    argv = [sys.executable, "-m", "ranktrace", "run", "-o", str(spec.run_dir), "--hang-after", f"{spec.hang_after:g}",
            "--startup-hang-after", f"{max(spec.startup_hang_after, spec.hang_after):g}", "--on-hang", "kill"]
    for h in spec.hooks:
        argv += ["--hook", h]
    return argv + ["--", *spec.argv]


def run_once(spec: RunSpec, stop: Stopper, say: Callable[[str], None]) -> RunRecord:
    """Run one configuration once, to its outcome, and leave nothing of it running."""
    t0 = time.monotonic()
    with open(spec.log, "wb") as log:
        proc = subprocess.Popen(trace_run_argv(spec), env=dict(spec.env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_in_child)
        assert proc.stdout is not None
        out = _Output(proc.stdout, log, spec.ready, t0)
        out.start()
        reason, stopped_at, killed = None, 0.0, False
        seen_requests = stop.requests
        while proc.poll() is None:
            now = time.monotonic()
            if stop.requests > seen_requests and reason != "interrupted":
                reason, stopped_at = "interrupted", now
                _signal(proc, signal.SIGTERM)
            elif reason is None and out.ready_at is not None:
                reason, stopped_at = "ready", now
                _signal(proc, signal.SIGTERM)
            elif reason is None and spec.deadline is not None and now >= spec.deadline:
                reason, stopped_at = spec.deadline_outcome, now
                say(f"run stopped: {'its --run-timeout' if reason == 'timeout' else 'the --time budget'} ran out")
                _signal(proc, signal.SIGTERM)
            grace = 5.0 if stop.requests > seen_requests + 1 else STOP_GRACE_S
            if reason is not None and not killed and now - stopped_at > grace:
                killed = True
                _signal(proc, signal.SIGKILL)
            time.sleep(0.1)
        end = time.monotonic()
        leftovers = reap_leftovers()
        out.join(timeout=10)
        proc.stdout.close()
    rc = proc.returncode
    rec = _classify(spec, rc, reason, out, end - t0, leftovers)
    rec.wall_seconds = time.monotonic() - t0
    if leftovers:
        rec.problems.append(f"{leftovers} process(es) it left behind were terminated")
    return rec


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def reap_leftovers(grace_s: float = LEFTOVER_GRACE_S) -> int:
    """Terminate and reap everything still below us (orphans a run left: we are their subreaper). How many."""
    me = os.getpid()

    def alive() -> list[int]:
        _reap()
        return [p for p in descendants([me]) if p != me and not _zombie(p)]

    left = alive()
    if not left:
        return 0
    n = len(left)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        below = set(left) | {me}
        for pid in left:  # held by a pidfd, then checked still below us: a pid reused meanwhile is never signalled
            t = pidident.target(pid, lambda st: st.ppid in below)
            if t is not None:
                t.signal(sig)
                t.close()
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = alive()
        if not left:
            break
    _reap()
    return n


def _reap() -> None:
    while True:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if got == 0:
            return


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] == b"Z"
    except (OSError, ValueError):
        return True  # gone


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _host_meta(run_dir: Path) -> dict[str, Any] | None:
    for m in sorted(run_dir.glob("*/meta.json")):
        doc = _read_json(m)
        if doc is not None:
            return doc
    return None


def _log_tail(path: Path, n: int = 65536) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read()
    except OSError:
        return b""


def _classify(spec: RunSpec, rc: int | None, reason: str | None, out: _Output, seconds: float,
              leftovers: int) -> RunRecord:
    meta = _host_meta(spec.run_dir)
    verdict = _read_json(spec.run_dir / "verdict.json")
    killed_on_hang = bool(((meta or {}).get("exit") or {}).get("killed_on_hang"))

    def rec(outcome: str, how: str, at: float | None = None) -> RunRecord:
        return RunRecord(outcome, how, round(at if at is not None else seconds, 2), 0.0, rc, spec.run_dir, spec.log,
                         verdict_brief(verdict) if verdict else None, leftovers, full_verdict=verdict)

    if reason == "interrupted":
        return rec("interrupted", "stopped by Ctrl-C")
    if out.ready_at is not None:
        return rec("success", f"ready: {out.ready_line}", out.ready_at)
    if reason in ("timeout", "cut"):
        return rec(reason, "stopped: " + ("its --run-timeout" if reason == "timeout" else "the --time budget"))
    if killed_on_hang:
        said = "" if not verdict or verdict.get("status") == "hang" else \
            f"; the verdict is {verdict.get('status')}/{verdict.get('kind')}"
        return rec("hang", f"hang detected, job killed (--on-hang kill){said}", out.hang_at)
    if meta is None:
        line = _log_tail(spec.log, 2000).decode(errors="replace").strip().splitlines()
        return rec("error", "trace run did not start the job: " + (line[-1] if line else f"exit {rc}"))
    if rc == 0:
        return rec("success", "exit 0")
    if spec.edits_flags and REJECTED.search(_log_tail(spec.log)):
        m = REJECTED.search(_log_tail(spec.log))
        return rec("rejected", "the command rejected an argument" + (f" ({m.group(0).decode().strip()})" if m else ""))
    return rec("crash", f"exit {rc}" if rc is not None and rc >= 0 else f"killed by signal {-(rc or 0)}")


def verdict_brief(v: dict[str, Any]) -> dict[str, Any]:
    """What the bisect table shows of a run's verdict."""
    op = v.get("operation") or {}
    phase = op.get("phase") or next((p.get("name") for p in v.get("phases") or [] if p.get("open")), None)
    return {"status": v.get("status"), "kind": v.get("kind"), "summary": v.get("summary"),
            "op": op.get("name"), "group": op.get("group_desc") or op.get("group"), "seq": op.get("seq"),
            "peer": op.get("peer"), "phase": phase, "culprit_ranks": v.get("culprit_ranks") or [],
            "waiting_ranks": v.get("waiting_ranks") or []}


# ---- one bisect per set of GPUs ---------------------------------------------------------------------------------

class GpuBusy(Exception):
    pass


class LockDirUnsafe(GpuBusy):
    """The lock folder is not ours alone (another user's, a symlink, writable by others): nothing is opened in it."""


def _lock_dir(env: Mapping[str, str]) -> tuple[int, Path]:
    """An fd of the lock folder, checked: $RANKTRACE_LOCK_DIR as given (it must be a real folder; lock files in it
    are opened without following links and written only when they are ours), else <tmp>/ranktrace-bisect-<uid>,
    which must be a real folder owned by us and closed to everyone else (another local user may have made it
    first, and planted a symlink in it)."""
    given = env.get("RANKTRACE_LOCK_DIR")
    where = Path(given or Path(tempfile.gettempdir()) / f"ranktrace-bisect-{os.getuid()}")
    try:
        where.mkdir(mode=0o700, parents=bool(given), exist_ok=True)
    except OSError as e:
        raise LockDirUnsafe(f"cannot make the GPU lock folder {where}: {e.strerror or e}") from None
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if given else os.O_NOFOLLOW))
    except OSError as e:
        raise LockDirUnsafe(f"the GPU lock folder {where} is not a folder we can use (a symlink?): "
                            f"{e.strerror or e}; remove it or set RANKTRACE_LOCK_DIR") from None
    st = os.fstat(fd)
    if not given and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
        os.close(fd)
        raise LockDirUnsafe(f"the GPU lock folder {where} is not ours alone (owner uid {st.st_uid}, mode "
                            f"{st.st_mode & 0o7777:04o}; want uid {os.geteuid()}, 0700): not used; remove it or set "
                            f"RANKTRACE_LOCK_DIR")
    return fd, where


def _open_lock(dir_fd: int, name: str, where: Path) -> tuple[IO[str], bool]:
    """The lock file, opened in the checked folder without following a symlink and without truncating it; whether
    it is ours to write (a plain file we own with one link: a hard link to someone's file is only locked)."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600,
                     dir_fd=dir_fd)
    except OSError as e:
        raise LockDirUnsafe(f"cannot open the GPU lock {where / name} (a symlink?): {e.strerror or e}; not "
                            f"followed") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise LockDirUnsafe(f"the GPU lock {where / name} is not a plain file: not used")
    ours = st.st_uid == os.geteuid() and st.st_nlink == 1
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+"), ours


@contextlib.contextmanager
def gpu_lock(env: Mapping[str, str]) -> Iterator[str]:
    """Hold the GPUs the runs will use (CUDA_VISIBLE_DEVICES, else all) for the whole bisect: a second bisect on any
    of them is refused. All GPUs = the 'all' lock exclusive; some = 'all' shared plus each device exclusive. The
    locks live in $RANKTRACE_LOCK_DIR (default <tmp>/ranktrace-bisect-<uid>, which must be ours and 0700: see
    _lock_dir); a lock file is never followed through a symlink, never truncated before it is locked, and our pid
    is written only into a plain file we own."""
    devices = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    key = ",".join(devices) if devices else "all"
    dir_fd, where = _lock_dir(env)
    held: list[IO[str]] = []
    try:
        wanted = [("all", fcntl.LOCK_EX if not devices else fcntl.LOCK_SH)]
        wanted += [(re.sub(r"[^\w.-]", "_", d), fcntl.LOCK_EX) for d in devices]
        for name, mode in wanted:
            f, ours = _open_lock(dir_fd, f"gpu-{name}.lock", where)
            held.append(f)
            try:
                fcntl.flock(f, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                other = f.read(32).strip()
                other = other if other.isdigit() else ""
                raise GpuBusy(f"another trace bisect{' (pid ' + other + ')' if other else ''} runs jobs on GPUs {key} "
                              f"(lock {where / f'gpu-{name}.lock'}): one job at a time on the same GPUs") from None
            if mode == fcntl.LOCK_EX and ours:
                f.seek(0)
                f.truncate()
                f.write(str(os.getpid()))
                f.flush()
        yield key
    finally:
        for f in held:
            f.close()
        os.close(dir_fd)


# ---- which release ----------------------------------------------------------------------------------------------

def _interpreter(command: tuple[str, ...] | list[str], env: Mapping[str, str]) -> str | None:
    exe = shutil.which(command[0], path=env.get("PATH")) if command else None
    if exe is None:
        return None
    if re.fullmatch(r"python[0-9.]*", Path(exe).name):
        return exe
    try:
        with open(exe, "rb") as f:
            first = f.readline(300).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    parts = first[2:].split()
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1], path=env.get("PATH"))
    return parts[0]


def probe_version(command: tuple[str, ...] | list[str], env: Mapping[str, str], package: str) -> str | None:
    """The installed release of `package` as the job's own interpreter sees it, or None."""
    interp = _interpreter(command, env)
    if interp is None:
        return None
    try:
        res = subprocess.run([interp, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                             env=dict(env), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    v = res.stdout.strip()
    return v if res.returncode == 0 and re.fullmatch(r"[\w.+-]+", v or "-") else None
