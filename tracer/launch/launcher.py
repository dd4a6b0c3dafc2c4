"""``trace run``: start the user's command with ranktrace injected, pass its signals and exit status through.

What it guarantees (issue #2, DESIGN §1):
* the command runs in a new process group (not a new session: it keeps the terminal), with PYTHONPATH and
  observability variables from ranktrace.tracer.launch.envplan;
* a signal reaching ``trace`` reaches the process the user started, exactly once (``_route``): keyboard and terminal
  signals (Ctrl-C, Ctrl-\\, hangup, resize) while ``trace`` holds the terminal go to the job's process group, as the
  terminal would have sent them; any other is sent to the started process unless the guardian (launch/guardian.py)
  saw the sender reach the job itself (a scheduler signalling every process);
* its child gets SIGTERM as parent-death signal, and the guardian ends the rest of the job if ``trace`` is killed;
  nothing else is ended for the job: what it leaves behind on purpose (daemons, new sessions, a background writer)
  lives on as without ranktrace; only ``--on-hang kill`` ends the job's processes (``_end_job``);
* the exit status is the command's own (128+N when signal N ended it), with one stderr line saying so;
* a missing command, an unwritable or full output directory are refused *before* anything starts (exit 2) and
  leave no half-made trace directory.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ranktrace.tracer.launch import envplan
from ranktrace.tracer.launch import hostinfo
from ranktrace.tracer.launch import meta
from ranktrace.tracer.launch import nsys
from ranktrace.tracer.launch import output_log, stdfds
from ranktrace.tracer.launch import profiles
from ranktrace.tracer.launch import runid
from ranktrace.tracer.launch import sysfacts
from ranktrace.tracer.launch import pidident
from ranktrace.tracer.launch.guardian import Guardian, job_processes, job_targets
from ranktrace.tracer.watch.monitor import Monitor, MonitorOptions
from ranktrace.tracer.watch.presenter import Presenter
from ranktrace.tracer.watch.statusline import StatusLine
from ranktrace.tracer.launch.terminal import JobTerminal, controlling_tty

__all__ = ["RunOptions", "LaunchError", "RunOutcome", "prepare_run_dir", "launch", "exit_code_of", "describe_exit"]

PR_SET_PDEATHSIG = 1
MIN_FREE_BYTES = 64 << 20
# Signals meant for the job (Slurm sends USR1/USR2 before preemption; QUIT asks for a dump), forwarded by _route.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT,
             signal.SIGALRM, signal.SIGWINCH, signal.SIGCONT)
# What a terminal sends to its whole foreground process group (the keyboard's Ctrl-C / Ctrl-\, a hangup, a resize)
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGWINCH})
WITNESS_WINDOW_S = 0.15   # how long a forwarded signal waits for the guardian to say the job got it already


class LaunchError(Exception):
    """A usage or environment problem found before the job starts (maps to exit 2)."""

# signals that end a job when a person or a scheduler sends them: what ranks record after one is its doing
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

@dataclass(frozen=True)
class RunOptions:
    command: tuple[str, ...]
    out: Path | None = None
    name: str | None = None
    nccl_debug: str | None = None
    nccl_coll: bool = False
    base_dir: Path = Path("traces")
    hooks: tuple[str, ...] = ()   # --hook MODULE:QUALNAME[=category], validated by the CLI
    nsys: bool = False            # --nsys: run the job under Nsight Systems (tracer/launch/nsys.py)
    nsys_args: str = ""           # --nsys-args "...": more `nsys profile` switches
    profiles: tuple = ()          # tracer.launch.profiles.Profile values, chosen by the CLI (profiles.choose)
    profile_source: str = ""      # how they were chosen, for meta.json ("the command", "--profile")
    run_id: str | None = None     # --run-id: one run across hosts (else the launcher's job id, launch/runid.py)
    host_label: str | None = None  # --host-label: this host's directory name (else hostname + boot id)


@dataclass
class RunOutcome:
    exit_code: int
    returncode: int            # as subprocess reports it: negative = killed by that signal
    run_dir: Path
    host_dir: Path
    pids: dict[str, object] = field(default_factory=dict)
    killed_on_hang: bool = False   # --on-hang kill ended the job (trace run then exits 3)
    hang_detected: bool = False
    presenter: Presenter | None = None   # what was printed (the verdict at the hang) and the notes not said yet


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _default_name(command: Sequence[str]) -> str:
    for arg in command:
        if arg.endswith(".py"):
            return Path(arg).stem
    return Path(command[0]).name or "job"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "job"


def check_command(command: Sequence[str]) -> str:
    """Resolve the executable; LaunchError naming it when it is missing or not executable."""
    if not command:
        raise LaunchError("no command given: use `trace run -- CMD ARGS...`")
    exe = shutil.which(command[0])
    if exe is None:
        p = Path(command[0])
        why = "not executable" if p.exists() else "not found"
        raise LaunchError(f"cannot run {command[0]!r}: {why}")
    return exe


def prepare_run_dir(opts: RunOptions) -> tuple[Path, Path]:
    """Create ``<run>/<host>/`` (never reusing a non-empty run dir; a run with a run id joins its run dir, each
    host in its own directory). Raises LaunchError before anything exists."""
    rid = runid.find_run_id(opts.run_id, os.environ, opts.command)
    if rid is not None:
        return _prepare_shared_run_dir(opts, rid)
    if opts.out is not None:
        run_dir = opts.out
        if run_dir.exists() and not run_dir.is_dir():
            raise LaunchError(f"output directory {run_dir} is a file, not a directory: give -o a new or empty "
                              "directory (ranktrace never overwrites anything)")
        if run_dir.exists() and any(run_dir.iterdir()):
            raise LaunchError(f"output directory {run_dir} exists and is not empty; ranktrace never overwrites a trace")
        _check_owner(run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = opts.base_dir / f"{stamp}-{_safe(opts.name or _default_name(opts.command))}"
        run_dir, n = base, 1
        while run_dir.exists():
            n += 1
            run_dir = base.with_name(f"{base.name}-{n}")
    _check_room(run_dir, run_dir.parent)
    created = not run_dir.exists()
    try:
        host_dir = run_dir / (opts.host_label or hostinfo.host_key())
        owner_only_dir(run_dir)  # stacks, command lines, rings: the run folder is its owner's alone
        _fill_host_dir(host_dir)
    except OSError as e:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"output directory {run_dir}: {e.strerror or e}") from e
    return run_dir, host_dir


def _check_room(target: Path, start: Path) -> None:
    """The nearest existing folder at or above `start` is writable and has 64 MiB free, else LaunchError."""
    probe_from = start
    while not probe_from.exists():
        probe_from = probe_from.parent
    if not os.access(probe_from, os.W_OK | os.X_OK):
        raise LaunchError(f"output directory {target}: {probe_from} is not writable")
    free = shutil.disk_usage(probe_from).free
    if free < MIN_FREE_BYTES:
        raise LaunchError(f"output directory {target}: only {free >> 20} MiB free on {probe_from}, need 64 MiB")


def _fill_host_dir(host_dir: Path) -> None:
    """rings/ and nccl/ made, and a 4 KiB write tried, before the job starts (OSError when either fails)."""
    for sub in ("rings", "nccl"):
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    probe = host_dir / ".write-probe"
    probe.write_bytes(b"x" * 4096)
    probe.unlink()


def _check_owner(run_dir: Path) -> None:
    """An existing output folder must be the user's own: another user's (empty) folder is theirs to read, swap or
    fill with links while the job writes stacks and command lines into it. LaunchError otherwise."""
    try:
        st = os.lstat(run_dir)
    except FileNotFoundError:
        return
    except OSError as e:
        raise LaunchError(f"output directory {run_dir}: {e.strerror or e}") from e
    if stat.S_ISLNK(st.st_mode):
        raise LaunchError(f"output directory {run_dir} is a symbolic link: give -o the folder itself")
    if st.st_uid != os.geteuid():
        raise LaunchError(f"output directory {run_dir} belongs to another user (uid {st.st_uid}): give -o a folder "
                          "of your own (ranktrace writes stacks and command lines there)")


def owner_only_dir(path: Path) -> None:
    """Make `path` (and its missing parents) and chmod it 0700: whatever lands inside (rings, dumps, meta.json,
    the verdict) is readable by its owner alone, at any umask. The parents keep their usual mode."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _prepare_shared_run_dir(opts: RunOptions, rid: runid.RunId) -> tuple[Path, Path]:
    """``<run>/<host>/`` of a run that spans hosts: the run dir is joined (made by whichever node comes first), this
    host's directory claimed in it; the same checks as a run of its own, and nothing of another host touched."""
    first = opts.out if opts.out is not None else opts.base_dir / rid.dir_name
    _check_owner(first)
    _check_room(first, first)
    try:
        run_dir, host_dir = runid.claim_run_dir(first, runid.host_dir_name(opts.host_label, os.environ), rid,
                                                exact=opts.out is not None)
    except runid.RunDirError as e:
        raise LaunchError(str(e)) from None
    except OSError as e:
        raise LaunchError(f"output directory {first}: {e.strerror or e}") from e
    _check_owner(run_dir)
    try:
        if os.stat(run_dir).st_uid == os.geteuid():
            os.chmod(run_dir, 0o700)  # the job's nodes run as its user: nobody else needs in (at any umask)
        owner_only_dir(host_dir)  # the run folder is shared by the job's nodes; what each host writes is private
        _fill_host_dir(host_dir)
    except OSError as e:
        shutil.rmtree(host_dir, ignore_errors=True)  # ours alone: the run dir may hold other hosts already
        raise LaunchError(f"output directory {run_dir}: {e.strerror or e}") from e
    return run_dir, host_dir


def exit_code_of(returncode: int) -> int:
    """Shell convention: a command killed by signal N exits 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        return f"job ended by {sig}; exit code {128 - returncode} (128+{-returncode}) is the job's"
    return f"job exited with status {returncode}; exit code {returncode} is the job's"


def _ringguard_problem() -> str | None:
    """Why a ring truncated under a running rank would end that rank with SIGBUS (tracer/rank/_ringguard.c not built
    here), or None."""
    try:
        importlib.import_module("ranktrace.tracer.rank._ringguard")
    except Exception as e:  # the ranks import it the same way
        return f"{type(e).__name__}: {e}"
    return None


def _fastpath_problem() -> str | None:
    """Why the ranks will run the pure-Python wrappers (tracer/rank/_fastspan.c not built here), or None."""
    if os.environ.get("RANKTRACE_FASTPATH", "1") == "0":
        return None  # asked for: nothing to warn about
    try:
        importlib.import_module("ranktrace.tracer.rank._fastspan")
    except Exception as e:  # the ranks import it the same way and fall back alike
        return f"{type(e).__name__}: {e}"
    return None


def launch(
    opts: RunOptions,
    *,
    monitor_opts: "MonitorOptions | None" = None,
    tick_s: float = 0.1,
    log: Callable[[str], None] = lambda s: sys.stderr.write(f"[ranktrace] {s}\n"),
    show: Callable[[str], None] = lambda s: sys.stderr.write(s),
) -> RunOutcome:
    """Run the command to completion under tracing. LaunchError for problems found before it starts.

    The steps: check and prepare (``_prepare``: nothing starts on a usage error) -> start the job (``_start``) ->
    watch it until it exits (``_Job``, ``_supervise``) -> record its exit in meta.json (``_record_exit``)."""
    closed = stdfds.hold_closed_std_fds()  # before anything opens a file: a closed stdout stays closed in the job
    run_dir, host_dir, plan = _prepare(opts)
    machine = sysfacts.start(host_dir)   # topology, P2P, IOMMU/ACS for trace compare, in the background
    # live status line (stderr on a TTY only); our own lines and reports erase it first
    status = StatusLine(sys.stderr, enabled=None if monitor_opts else False)
    log, show = status.wrap(log), status.wrap(show)
    presenter = Presenter(sys.stderr, show)  # the verdict once, and what this machine lacks in one line under it
    fast_error = _fastpath_problem()
    if fast_error:
        presenter.note(f"compiled fast path unavailable ({fast_error}): each traced call costs ~2 us instead of "
                       f"< 1 us")
    guard_error = _ringguard_problem()
    if guard_error:
        presenter.note(f"ring guard unavailable ({guard_error}): a ring file truncated while its rank runs ends that "
                       f"rank with SIGBUS")
    untraced = envplan.untraceable_reason(opts.command)
    if untraced:  # said before the job starts, kept in meta.json for the verdict (which then claims nothing)
        log(untraced)
        meta.update_meta(host_dir, untraced=untraced)
    ns, command = nsys.start(host_dir, opts.command, opts.nsys_args, log) if opts.nsys else (None, opts.command)
    output = output_log.OutputLog(host_dir, log, closed=closed)  # the job's output kept too, where harmless
    proc = _start(command, plan.env, **output.popen_kwargs())
    guardian = Guardian.start(proc.pid, host_dir, command, log)
    output.start(proc)
    job = _Job(proc.pid, _start_monitor(run_dir, host_dir, monitor_opts, log, show, presenter), status, log)
    job.guardian, job.host_dir = guardian, host_dir
    if job.mon is not None:
        job.mon.job_pgid = proc.pid  # its descendants' CPU (a JIT build's compiler) is the job's progress
    if ns is not None and job.mon is not None:   # nsys stops and writes its report before the verdict and the kill
        job.mon.hang_captures.append(ns.capture)
    returncode, gpu = _supervise(job, proc, tick_s)
    output.close()
    fresh_line(sys.stderr)  # the job's last stderr line may lack its newline: ours start on a line of their own
    if ns is not None:
        ns.finish()
    machine.join()
    _record_exit(host_dir, returncode, job, gpu.result(presenter.note), log)
    if ns is not None:
        try:
            meta.update_meta(host_dir, nsys=ns.summary())
        except (OSError, ValueError) as e:
            log(f"could not record the nsys session in meta.json: {e}")
    return RunOutcome(exit_code_of(returncode), returncode, run_dir, host_dir, killed_on_hang=bool(job.killed),
                      hang_detected=job.hang_detected, presenter=presenter)


def _prepare(opts: RunOptions) -> tuple[Path, Path, envplan.EnvPlan]:
    """Check the command, make ``<run>/<host>/``, plan the environment and write the first meta.json."""
    check_command(opts.command)
    run_dir, host_dir = prepare_run_dir(opts)
    profile_plan, profile_meta = profiles.apply(host_dir, opts.profiles, opts.profile_source)
    plan = envplan.plan_environment(os.environ, host_dir, nccl_debug=opts.nccl_debug, nccl_coll=opts.nccl_coll,
                                    hooks=opts.hooks, profile_plan=profile_plan)
    m = meta.initial_meta(opts.command, os.environ, plan.added, host_dir.name, run_dir.name)
    m["profile"] = profile_meta
    m.update(runid.meta_fields(runid.find_run_id(opts.run_id, os.environ, opts.command), opts.host_label))
    meta.write_meta(host_dir, m)
    return run_dir, host_dir, plan


def _start(command: Sequence[str], env: dict[str, str], **popen: object) -> subprocess.Popen[bytes]:
    """Start the job in its own process group, with SIGTERM as its parent-death signal. Not a child subreaper: the
    job's orphans are re-parented as they would be without ranktrace (a daemon's getppid() is not ours)."""
    libc = _libc()

    def in_child() -> None:  # between fork and exec: own process group, die with us
        os.setpgid(0, 0)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    try:
        return subprocess.Popen(list(command), env=env, preexec_fn=in_child, **popen)  # type: ignore[call-overload]
    except OSError as e:
        raise LaunchError(f"cannot run {command[0]!r}: {e.strerror or e}") from e


def _start_monitor(run_dir: Path, host_dir: Path, opts: "MonitorOptions | None", log: Callable[[str], None],
                   show: Callable[[str], None], presenter: Presenter) -> Monitor | None:
    if not opts:
        return None
    try:
        return Monitor(run_dir, host_dir, opts, log=log, show=show, note=presenter.note,
                       show_verdict=presenter.verdict)
    except Exception as e:  # the watchdog must never take the job down
        log(f"monitor could not start (monitoring off): {type(e).__name__}: {e}")
        return None


class _Job:
    """The running job as the wait loop sees it: its process group, the signals forwarded to it, the watchdog
    ticking beside it, and --on-hang kill's SIGTERM-then-SIGKILL."""

    def __init__(self, pgid: int, mon: Monitor | None, status: StatusLine, log: Callable[[str], None]) -> None:
        self.pgid, self.status, self.log = pgid, status, log
        self.mon = mon          # None once closed (a monitor error turns ticking off)
        self.started = mon      # kept after that: its hang flag and GPU facts still count
        self.received: list[int] = []            # signals forwarded (meta.json)
        self.pending_interrupt: list[int] = []   # a first Ctrl-C held back until the capture is done
        self.killed: list[float] = []            # when --on-hang kill sent SIGTERM, then SIGKILL
        self.term: JobTerminal | None = None
        self.guardian: Guardian | None = None
        self.host_dir: Path | None = None
        leader = pidident.stat(pgid)  # when the job started (the identity check of --on-hang kill counts from it)
        self.started_s = min(_boot_s(), leader.start_s) if leader is not None else _boot_s()
        self.pending: list[tuple[int, int]] = []   # (signal, CLOCK_MONOTONIC ns) waiting for the guardian's word
        self.interrupted_ns: int | None = None     # wall clock of the first SIGINT (a person's Ctrl-C, a scheduler)
        self.stopped_ns: int | None = None         # wall clock of the first signal that ends a job (INT/TERM/HUP/QUIT)

    @property
    def hang_detected(self) -> bool:
        return self.started is not None and self.started.hang_detected

    def send(self, signum: int) -> None:
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass

    def forward(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        if signum == signal.SIGINT and self.interrupted_ns is None:
            self.interrupted_ns = time.time_ns()
        if signum in STOP_SIGNALS and self.stopped_ns is None:
            self.stopped_ns = time.time_ns()
        # First Ctrl-C while the job is silent: capture first (<= 3 s), then forward; a second one goes at once.
        if (signum == signal.SIGINT and self.mon is not None and not self.pending_interrupt
                and self.received.count(signal.SIGINT) == 1 and self.mon.silent_for() >= 3.0):
            self.pending_interrupt.append(signum)
            return
        self._route(signum, time.monotonic_ns())

    def _route(self, signum: int, t_ns: int) -> None:
        """Where a signal `trace run` received goes, exactly once (module docstring)."""
        if signum in TERMINAL_SIGNALS and _holds_terminal():
            self.send(signum)  # the keyboard / terminal would have reached every process of the foreground job
        elif signum == signal.SIGCONT and _holds_terminal():
            pass  # job control (fg / bg): JobTerminal continues the job's group itself
        else:
            self.pending.append((signum, t_ns))
            self.deliver_pending()

    def deliver_pending(self, final: bool = False) -> None:
        """Send each pending signal to the started process, unless the guardian saw the same signal reach the job
        (then the sender signalled the job itself). A signal waits at most WITNESS_WINDOW_S for that word."""
        now = time.monotonic_ns()
        window = int(WITNESS_WINDOW_S * 1e9)
        keep = []
        for signum, t in self.pending:
            g = self.guardian
            if g is not None and g.alive and g.witnessed(signum, t, window):
                continue
            if g is None or not g.alive or final or now - t >= window:
                try:
                    os.kill(self.pgid, signum)  # the process the user started (its pid is the group's id)
                except ProcessLookupError:
                    pass
                continue
            keep.append((signum, t))
        self.pending = keep

    def first_handover(self) -> None:
        self.status.enabled = False
        if self.mon is not None:
            self.mon.interactive = "the job has the terminal"  # a person at a prompt is silent, not hung

    def ticked(self) -> None:
        assert self.term is not None
        self.term.on_tick()
        self.on_tick()

    def on_tick(self) -> None:
        if self.pending:
            self.deliver_pending()
        if self.pending_interrupt:
            self._interrupt()
            return
        mon = self.mon
        if mon is None:
            return
        try:
            mon.tick()
        except Exception as e:  # the watchdog must never take the job down
            self.log(f"monitor error (monitoring off): {type(e).__name__}: {e}")
            self.close_monitor()
            return
        try:
            self.status.update(mon.status_text)
        except Exception as e:
            self.status.enabled = False
            self.log(f"status line off: {type(e).__name__}: {e}")
        self._kill_if_asked(mon)

    def _interrupt(self) -> None:
        """The held-back first Ctrl-C: capture (unless a second one came meanwhile), then forward it."""
        if self.received.count(signal.SIGINT) == 1:
            self.log("Ctrl-C while the job is silent: capturing first (press Ctrl-C again to skip)")
            try:
                self.mon.on_silence(self.mon.silent_for(), reason="ctrl-c")  # type: ignore[union-attr]
            except Exception as e:
                self.log(f"capture failed: {type(e).__name__}: {e}")
        self.pending_interrupt.clear()
        self._route(signal.SIGINT, time.monotonic_ns())

    def _kill_if_asked(self, mon: Monitor) -> None:
        if mon.kill_requested and not self.killed:
            self.killed.append(time.monotonic())
            if self.stopped_ns is None:  # what ranks record from here on is the kill's doing
                self.stopped_ns = time.time_ns()
            self.log("--on-hang kill: " + self._said(self.end_job(signal.SIGTERM), "SIGTERM"))
        elif self.killed and len(self.killed) == 1 and time.monotonic() - self.killed[0] > 5.0:
            self.killed.append(time.monotonic())
            self.log("the job ignored SIGTERM for 5 s: " + self._said(self.end_job(signal.SIGKILL), "SIGKILL"))

    @staticmethod
    def _said(sent: int, sig: str) -> str:
        """What the signal reached, as it is: a kill that reached nothing is never said to have ended the job."""
        if sent < 0:
            return f"{sig} sent to the job's process group (/proc shows none of its processes here)"
        if sent > 0:
            return f"{sig} sent to {sent} process{'es' if sent != 1 else ''} of the job"
        return (f"no process of the job could be sent {sig} (/proc unreadable here, or every process already "
                "gone): the job was not ended by ranktrace")

    def job_pids(self) -> list[int]:
        """The job's live processes: its process group and every process of this run that wrote a ring (torchrun
        workers run in sessions of their own). The guardian is ours, not the job's."""
        ours = {self.guardian.proc.pid} if self.guardian is not None else set()
        return [p for p in job_processes(self.pgid, self.host_dir, self.started_s) if p not in ours]

    def end_job(self, sig: int) -> int:
        """--on-hang kill: `sig` to every process of the job (never to what it is not: each one's identity is
        checked and it is signalled through a pidfd, guardian.job_targets); how many it reached. Where /proc shows
        none (hidepid), the job's own process group — our child's, which we have not reaped, so its id is not
        reused — is signalled instead (-1)."""
        ours = {self.guardian.proc.pid} if self.guardian is not None else set()
        sent = 0
        for t in job_targets(self.pgid, self.host_dir, self.started_s):
            if t.pid not in ours and t.signal(sig):
                sent += 1
            t.close()
        if sent == 0:
            try:
                os.killpg(self.pgid, sig)
                return -1
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    def close_monitor(self) -> None:
        m, self.mon = self.mon, None
        if m is not None:
            try:
                m.close()
            except Exception as e:
                self.log(f"monitor close failed: {type(e).__name__}: {e}")


class _GpuFacts:
    """meta.json's GPU facts, gathered while the job runs. With the monitor, its NVML child answers them (NVML is
    opened once per run, and its absence is said once); without it, a probe thread."""

    def __init__(self, mon: Monitor | None) -> None:
        self.from_monitor = mon is not None and mon.gpu is not None
        self.box: dict[str, hostinfo.GpuInfo] = {}
        self.thread = threading.Thread(target=lambda: self.box.setdefault("info", hostinfo.probe_gpus()), daemon=True)
        if not self.from_monitor:
            self.thread.start()

    def take_from(self, mon: Monitor, log: Callable[[str], None]) -> None:
        """Before the monitor closes."""
        if self.from_monitor:
            self.box["info"] = _gpu_info_from(mon, log)

    def result(self, log: Callable[[str], None]) -> hostinfo.GpuInfo | None:
        if not self.from_monitor:
            self.thread.join(timeout=5)
        gpu = self.box.get("info")
        if gpu is None and not self.from_monitor:
            log("NVML did not answer within 5 s (wedged driver?): no GPU details in meta.json")
        elif gpu is not None and gpu.unavailable and not self.from_monitor:
            log(gpu.unavailable)
        return gpu


def _supervise(job: _Job, proc: subprocess.Popen[bytes], tick_s: float) -> tuple[int, _GpuFacts]:
    """Forward signals, tick the watchdog and hand the terminal over until the job exits; then (after --on-hang kill
    only) end the rest of the job, let the guardian go, and put the terminal, the signal handlers and the monitor
    back. What the job left behind on purpose is not touched. Returns its returncode."""
    previous = {s: signal.signal(s, job.forward) for s in FORWARDED}
    gpu = _GpuFacts(job.started)
    job.term = JobTerminal(controlling_tty(), job.pgid, job.send, job.log, job.first_handover)
    try:
        returncode = _wait(proc.pid, job.ticked, tick_s, job.term.on_stop)
        proc.returncode = returncode
        if job.killed:
            _end_leftovers(job)   # --on-hang kill ends the whole job, not only the process that exited
    finally:
        if job.guardian is not None:
            job.guardian.close()
        job.term.restore()  # the terminal and our modes are ours again, for the report and the shell after us
        for s, h in previous.items():
            signal.signal(s, h)
        if job.started is not None:
            gpu.take_from(job.started, job.started.note)
        job.close_monitor()
        job.status.clear()
    return returncode, gpu


def _record_exit(host_dir: Path, returncode: int, job: _Job, gpu: hostinfo.GpuInfo | None,
                 log: Callable[[str], None]) -> None:
    try:
        meta.update_meta(
            host_dir,
            end_wall_ns=time.time_ns(),
            exit={"returncode": returncode, "exit_code": exit_code_of(returncode),
                  "signal": -returncode if returncode < 0 else None, "signals_forwarded": job.received,
                  "killed_on_hang": bool(job.killed), "interrupted": job.interrupted_ns is not None,
                  "interrupted_wall_ns": job.interrupted_ns, "stopped_wall_ns": job.stopped_ns},
            gpus=gpu.gpus if gpu else [],
            driver={"version": gpu.driver, "cuda": gpu.cuda_driver} if gpu else None,
            clock_end=hostinfo.clock_pair(),
        )
    except (OSError, ValueError) as e:  # trace dir deleted or damaged under us: the job's status still counts
        log(f"could not update {host_dir / 'meta.json'}: {e}")


def _gpu_info_from(mon: Monitor, log: Callable[[str], None]) -> hostinfo.GpuInfo | None:
    """meta.json GPU facts from the monitor's NVML child (it already said, once, when NVML is absent)."""
    try:
        hello = mon.gpu_hello(wait_s=5.0)
    except Exception as e:
        return hostinfo.GpuInfo(unavailable=f"GPU details unavailable: {type(e).__name__}: {e}")
    if hello is not None:
        return hostinfo.GpuInfo(driver=hello.get("driver"), cuda_driver=hello.get("cuda_driver"),
                                gpus=list(hello.get("gpus") or []))
    if mon.gpu.off is None:
        mon.gpu.close()
        log("NVML did not answer within 5 s (wedged driver?): no GPU details in meta.json")
    return hostinfo.GpuInfo(unavailable=mon.gpu.off or "NVML did not answer")


def _wait(pid: int, on_tick: Callable[[], None], tick_s: float,
          on_stop: Callable[[int], None] = lambda sig: None) -> int:
    """Wait until `pid` exits; call on_tick between polls, and on_stop(signal) when `pid` was stopped (waitid with
    WSTOPPED only: it never consumes an exit)."""
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            raise RuntimeError("job process vanished without an exit status") from None
        if got == pid:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            stop = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:
            stop = None
        if stop is not None and stop.si_code == os.CLD_STOPPED:
            on_stop(stop.si_status)
        on_tick()
        time.sleep(tick_s)


def _end_leftovers(job: "_Job", grace_s: float = 5.0) -> None:
    """After --on-hang kill: the job's processes still alive get SIGTERM, then SIGKILL after `grace_s`."""
    left = job.job_pids()
    if not left:
        return
    job.end_job(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and job.job_pids():
        time.sleep(0.05)
    job.end_job(signal.SIGKILL)


def fresh_line(stream: "object") -> None:
    """Start our next line at the beginning of a line, whatever the job left on `stream` (its stderr, shared with
    ours): a regular file is read back (its last byte); on a terminal, as many spaces as the terminal is wide and a
    carriage return move to a new line only when the cursor was not at its start (zsh's PROMPT_SP); a pipe cannot
    be read back, so a newline is written (an empty line at worst, never a line glued to the job's)."""
    try:
        stream.flush()  # type: ignore[attr-defined]
        fd = stream.fileno()  # type: ignore[attr-defined]
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if st.st_size:
                rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # `2> file` is write-only: read it anew
                try:
                    last = os.pread(rfd, 1, os.fstat(rfd).st_size - 1)
                finally:
                    os.close(rfd)
                if last != b"\n":
                    os.write(fd, b"\n")
        elif os.isatty(fd):
            cols = os.get_terminal_size(fd).columns
            os.write(fd, b" " * cols + b"\r\x1b[K")
        else:
            os.write(fd, b"\n")
    except (OSError, ValueError, AttributeError):
        pass


def _holds_terminal() -> bool:
    """`trace run`'s process group is its terminal's foreground group: a keyboard signal came to the whole job."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _boot_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)
