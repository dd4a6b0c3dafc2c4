"""``trace run --nsys``: the job under Nsight Systems, with a report even when the job hangs.

nsys writes its report when collection ends; a process killed while collecting leaves none. So the job runs as
``nsys profile --session-new=<name> --kill=none ...`` (a session ranktrace can stop from outside, and stopping it
leaves the job running), and when the watchdog finds the job silent it runs ``nsys stop --session=<name>`` — before
``--on-hang kill`` acts and before the verdict is written — waits for the report, and exports it with ``nsys export
--type=sqlite`` into ``<host>/nsys/``, where the analysis reads it beside the rings (the nsys reader: NVTX ranges of
the ``ranktrace`` domain, kernels that finished; a kernel still spinning is absent from the export, not open). A job
that ends on its own gets its report from nsys at exit, exported the same way.

Command switches used, as documented in the Nsight Systems User Guide's CLI sections (read for 2023.1, 2024.1 and
the current online guide): ``--version``; ``profile`` with ``--session-new``, ``--trace=cuda,nvtx,osrt``, ``--kill``,
``--sample``, ``--cpuctxsw``, ``--output``, ``--force-overwrite`` and, where ``nsys profile --help`` lists them,
``--cuda-graph-trace=node`` and an ``nccl`` trace value; ``stop --session``; ``export --type=sqlite --output
--force-overwrite``. Older than :data:`MIN_VERSION`, or nsys not on PATH: one line, and the run goes on without it.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["MIN_VERSION", "NsysSession", "parse_version", "profile_argv", "start"]

MIN_VERSION = (2023, 1)
REPORT_DIR = "nsys-rep"       # <host>/nsys-rep/report.nsys-rep: nsys' own report (not read by the analysis)
EXPORT_DIR = "nsys"           # <host>/nsys/report.sqlite: read by the analysis with the rings
_VERSION = re.compile(r"(\d{4})\.(\d+)(?:\.(\d+))?")
#: our defaults, each skipped when the user's --nsys-args already set that switch (long name, short alias)
_DEFAULTS: tuple[tuple[str, str | None, str], ...] = (
    ("--trace", "-t", "cuda,nvtx,osrt"),
    ("--sample", "-s", "none"),
    ("--cpuctxsw", None, "none"),
    ("--kill", None, "none"),
)
Runner = Callable[..., subprocess.CompletedProcess[str]]


def parse_version(text: str) -> tuple[int, ...] | None:
    """``NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0`` -> (2024, 5, 1)."""
    m = _VERSION.search(text or "")
    if not m:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def _user_switches(args: Sequence[str]) -> set[str]:
    out = set()
    for a in args:
        if a.startswith("-"):
            out.add(a.split("=", 1)[0])
    return out


_OURS = ("--output", "-o", "--session-new")   # where the report goes and the session name are ranktrace's


def _without_ours(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(user args without the switches ranktrace must own, the ones dropped)."""
    kept, dropped, skip = [], [], False
    for a in args:
        if skip:
            dropped.append(a)
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _OURS:
            dropped.append(a)
            skip = "=" not in a
            continue
        kept.append(a)
    return kept, dropped


def profile_argv(exe: str, session: str, report_base: Path, user_args: Sequence[str], help_text: str,
                 command: Sequence[str]) -> list[str]:
    """The ``nsys profile`` command line that runs `command` in a session named `session` (see the module
    docstring). Switches the user gave in `user_args` win over ours, except the output and the session name."""
    user_args, _ = _without_ours(user_args)
    given = _user_switches(user_args)
    argv = [exe, "profile", f"--session-new={session}"]
    for long, short, value in _DEFAULTS:
        if long in given or (short and short in given):
            continue
        if long == "--trace":
            trace = value.split(",")
            if re.search(r"\bnccl\b", _trace_values(help_text)):
                trace.append("nccl")
            value = ",".join(trace)
        argv.append(f"{long}={value}")
    if "--cuda-graph-trace" in help_text and "--cuda-graph-trace" not in given:
        argv.append("--cuda-graph-trace=node")
    argv.append(f"--output={report_base}")
    if not given & {"--force-overwrite", "-f"}:
        argv.append("--force-overwrite=true")
    return argv + list(user_args) + list(command)


def _trace_values(help_text: str) -> str:
    """The part of ``nsys profile --help`` that lists --trace's values (so 'nccl' elsewhere does not count)."""
    m = re.search(r"--trace=?\S*(.*?)(?:\n\s*-{1,2}[a-z]|\Z)", help_text, re.S)
    return m.group(1) if m else ""


@dataclass
class NsysSession:
    """One nsys session around the job: stop it (once) when the job hangs, export the report (once)."""

    exe: str
    version: str
    session: str
    host_dir: Path
    log: Callable[[str], None]
    run: Runner = subprocess.run
    stop_timeout_s: float = 120.0
    export_timeout_s: float = 300.0
    stopped: bool = False
    exported: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def report_base(self) -> Path:
        return self.host_dir / REPORT_DIR / "report"

    @property
    def report(self) -> Path:
        return self.report_base.with_name("report.nsys-rep")

    @property
    def export_path(self) -> Path:
        return self.host_dir / EXPORT_DIR / "report.sqlite"

    def _say(self, line: str, problem: bool = False) -> None:
        if problem:
            self.problems.append(line)
        self.log(line)

    def _call(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
        try:
            return self.run([self.exe, *args], capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            self._say(f"nsys {args[0]} failed: {type(e).__name__}: {e}", problem=True)
            return None

    def _wait_report(self, deadline: float) -> bool:
        """The report exists and stopped growing (nsys converts its raw stream into it after collection)."""
        last = -1
        while time.monotonic() < deadline:
            try:
                size = self.report.stat().st_size
            except OSError:
                size = -1
            if size > 0 and size == last:
                return True
            last = size
            time.sleep(0.5)
        return False

    def capture(self, reason: str = "the job is silent") -> bool:
        """Stop collection and write + export the report now, while the job is still hung (once per run)."""
        if self.stopped:
            return self.exported is not None
        self.stopped = True
        self.log(f"nsys: stopping collection ({reason}) and writing the report before anything else acts")
        deadline = time.monotonic() + self.stop_timeout_s
        res = self._call(["stop", f"--session={self.session}"], self.stop_timeout_s)
        if res is not None and res.returncode != 0:
            self._say(f"nsys stop --session={self.session} exited {res.returncode}: "
                      f"{(res.stderr or res.stdout or '').strip()[:300]}", problem=True)
        if not self._wait_report(deadline):
            self._say(f"nsys: no report at {self.report} within {self.stop_timeout_s:.0f} s of `nsys stop`",
                      problem=True)
            return False
        return self.export()

    def export(self) -> bool:
        if self.exported is not None:
            return True
        if not self.report.exists():
            return False
        self.export_path.parent.mkdir(parents=True, exist_ok=True)
        res = self._call(["export", "--type=sqlite", f"--output={self.export_path}", "--force-overwrite=true",
                          str(self.report)], self.export_timeout_s)
        if res is None:
            return False
        if res.returncode != 0 or not self.export_path.exists():
            self._say(f"nsys export exited {res.returncode}: {(res.stderr or res.stdout or '').strip()[:300]}",
                      problem=True)
            return False
        self.exported = self.export_path
        self.log(f"nsys: report {self.report} exported to {self.export_path} (read with the rings)")
        return True

    def finish(self) -> None:
        """After the job ended: nsys wrote the report at exit unless collection was stopped before; export it."""
        if self.exported is not None:
            return
        if not self.stopped and not self._wait_report(time.monotonic() + 30.0):
            self._say(f"nsys: no report at {self.report} (nsys itself killed?)", problem=True)
            return
        self.export()

    def summary(self) -> dict[str, object]:
        """meta.json's ``nsys`` entry."""
        return {"version": self.version, "session": self.session, "report": str(self.report),
                "export": str(self.exported) if self.exported else None, "stopped_on_hang": self.stopped,
                "problems": self.problems}


def _probe(exe: str, run: Runner) -> tuple[str | None, str]:
    """(version text, profile --help text); version None when `nsys --version` fails."""
    try:
        v = run([exe, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None, ""
    if v.returncode != 0:
        return None, ""
    try:
        h = run([exe, "profile", "--help"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        help_text = (h.stdout or "") + (h.stderr or "")
    except (OSError, subprocess.SubprocessError):
        help_text = ""
    return (v.stdout or v.stderr or "").strip(), help_text


def start(host_dir: Path, command: Sequence[str], user_args: str, log: Callable[[str], None],
          run: Runner = subprocess.run) -> tuple[NsysSession | None, list[str]]:
    """(session, the command to start): the job wrapped in ``nsys profile``, or (None, the command itself) with one
    line said when nsys is missing or too old."""
    exe = shutil.which(os.environ.get("RANKTRACE_NSYS", "nsys"))
    if exe is None:
        log("--nsys: nsys not found on PATH: running without Nsight Systems")
        return None, list(command)
    text, help_text = _probe(exe, run)
    version = parse_version(text or "")
    if version is None:
        log(f"--nsys: `{exe} --version` gave no version ({(text or 'failed')[:100]}): running without Nsight Systems")
        return None, list(command)
    if version[:2] < MIN_VERSION:
        log(f"--nsys: nsys {'.'.join(map(str, version))} is older than {'.'.join(map(str, MIN_VERSION))}, the "
            "oldest whose session commands ranktrace reads: running without Nsight Systems")
        return None, list(command)
    session = f"ranktrace-{uuid.uuid4().hex[:12]}"
    ns = NsysSession(exe, ".".join(map(str, version)), session, host_dir, log)
    ns.report_base.parent.mkdir(parents=True, exist_ok=True)
    try:
        extra = shlex.split(user_args or "")
    except ValueError as e:
        log(f"--nsys-args not understood ({e}): ignored")
        extra = []
    extra, dropped = _without_ours(extra)
    if dropped:
        log(f"--nsys-args: {' '.join(dropped)} ignored (ranktrace names the session and the report)")
    argv = profile_argv(exe, session, ns.report_base, extra, help_text, command)
    log(f"--nsys: nsys {ns.version}, session {session}; report in {ns.report_base.parent}")
    return ns, argv
