"""Runs the real `vllm serve` (the CPU build, TP2, a tiny local Llama) under `trace run`, or without it, and records
what a person on call would see: the live verdict files as the watchdog writes them, the final verdict, the job's
output, a completion's answer.

Used by tests/vllm_real/test_vllm_real.py and bench/bench_vllm.py. Every process started here runs in a session of
its own and is killed by process group when the run is over (never by name).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.vllm_real.setup_env import MODEL, READY, REPO, VENV, check, install_faults, site_packages, venv_python

PROMPT = "the rank that never returned"
MAX_TOKENS = 8


def vllm_env(fault: str | None = None, rank: int = 1, arm: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKTRACE_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0|1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if fault:
        env["RANKTRACE_TEST_VLLM_FAULT"] = fault
        env["RANKTRACE_TEST_VLLM_FAULT_RANK"] = str(rank)
        if arm is not None:
            env["RANKTRACE_TEST_VLLM_FAULT_ARM"] = str(arm)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_argv(port: int, model: Path = MODEL) -> list[str]:
    return [str(VENV / "bin" / "vllm"), "serve", str(model), "--tensor-parallel-size", "2", "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port)]


@dataclass
class Run:
    """One server run and what came of it."""

    name: str
    run_dir: Path | None
    log: Path
    port: int
    proc: subprocess.Popen
    t0: float
    rc: int | None = None
    ready_at: float | None = None                   # seconds after start: /health answered
    fault_at: float | None = None                   # seconds after start: the fault took effect
    healthy_until: float | None = None              # seconds after start: the healthy part of a run ended
    live: list[tuple[float, dict]] = field(default_factory=list)   # (seconds after start, verdict.json)
    answers: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)        # seconds per output token, one per completion
    notes: list[str] = field(default_factory=list)
    _verdict_mtime: float = 0.0

    @property
    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def verdict(self) -> dict | None:
        if self.run_dir is None:
            return None
        try:
            return json.loads((self.run_dir / "verdict.json").read_text())
        except (OSError, ValueError):
            return None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def job_alive(self) -> bool:
        """A process of the job (not trace run, not its guardian) is alive in this run's session."""
        for pid in self.session_pids():
            if pid == self.proc.pid:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if b"guardian.py" in cmd or state == b"Z":
                continue
            return True
        return False

    def session_pids(self) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.getsid(int(d.name)) == self.proc.pid:
                        out.append(int(d.name))
                except OSError:
                    pass
        return out

    def poll(self) -> None:
        """Keep each new verdict.json the watchdog writes while the job runs (the live verdict; the one trace run
        writes after the job ended is `verdict`)."""
        if self.run_dir is None or not self.alive():
            return
        p = self.run_dir / "verdict.json"
        try:
            m = p.stat().st_mtime
        except OSError:
            return
        if m != self._verdict_mtime:
            self._verdict_mtime = m
            if not self.job_alive():
                return  # the job has ended: this is trace run's final verdict, not the watchdog's
            try:
                self.live.append((self.now(), json.loads(p.read_text())))
            except (OSError, ValueError):
                self._verdict_mtime = 0.0  # written as we read: next time

    def wait_for(self, what: Callable[[], bool], seconds: float, step: float = 0.5) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll()
            if what():
                return True
            if not self.alive():
                self.poll()
                return what()
            time.sleep(step)
        return False

    def wait_ready(self, seconds: float = 240) -> bool:
        def ok() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError, ValueError):
                return False

        got = self.wait_for(ok, seconds, 1.0)
        if got and self.ready_at is None:
            self.ready_at = self.now()
        return got

    def wait_line(self, text: str, seconds: float) -> float | None:
        """Seconds after start when `text` appeared in the job's output (None: it did not)."""
        if self.wait_for(lambda: text in self.output, seconds):
            return self.now()
        return None

    def complete(self, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS, timeout: float = 120) -> str:
        body = json.dumps({"model": str(MODEL), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.monotonic()
        with urllib.request.urlopen(req, timeout=timeout) as r:
            got = json.loads(r.read())
        self.token_times.append((time.monotonic() - t) / max_tokens)
        text = got["choices"][0]["text"]
        self.answers.append(text)
        return text

    def complete_async(self, prompt: str = PROMPT, timeout: float = 120) -> None:
        """A completion sent from a thread: a hung server never answers it; the test goes on."""
        import threading

        def go() -> None:
            try:
                self.complete(prompt, timeout=timeout)
            except Exception as e:
                self.notes.append(f"completion failed: {type(e).__name__}: {e}")

        threading.Thread(target=go, daemon=True).start()

    def worker_pid(self, title: str = "VLLM::Worker_TP1") -> int | None:
        """The pid whose process title is `title`, in this run's session."""
        for pid in self.session_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if cmd == title or cmd.startswith(title + " "):
                return pid
        return None

    def signal_worker(self, sig: int, title: str = "VLLM::Worker_TP1") -> int:
        pid = self.worker_pid(title)
        assert pid is not None, f"no {title} in run {self.name}"
        os.kill(pid, sig)
        self.fault_at = self.now()
        self.notes.append(f"{signal.Signals(sig).name} -> {title} pid {pid} at {self.fault_at:.1f} s")
        return pid

    def stop(self, sig: int = signal.SIGINT, grace: float = 60) -> int:
        """Stop as a person would (Ctrl-C to trace run / the server), then wait; SIGKILL the session if it lingers."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig) if self.run_dir is None else self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        return self.wait_exit(grace)

    def wait_exit(self, seconds: float) -> int:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.alive():
            self.poll()
            time.sleep(0.5)
        if self.alive():
            self.notes.append(f"still running after {seconds:.0f} s: killed")
        self.reap()
        self.rc = self.proc.wait()
        return self.rc

    def reap(self) -> None:
        """SIGKILL whatever is left of this run's session (its own processes only; a stopped one is continued so
        that it can die)."""
        for pid in self.session_pids():
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except (OSError, ProcessLookupError):
                    pass


def start(name: str, base: Path, *, traced: bool = True, fault: str | None = None, hang_after: float = 10,
          on_hang: str = "kill", extra: tuple[str, ...] = (), extra_serve: tuple[str, ...] = (),
          arm: Path | None = None, env: dict[str, str] | None = None) -> Run:
    """`[trace run -o base/name --hang-after S --on-hang kill --] vllm serve ...` in a session of its own."""
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    run_dir = base / name if traced else None
    log = base / f"{name}.log"
    argv = serve_argv(port) + list(extra_serve)   # a later --flag wins in vllm's parser
    if traced:
        argv = [str(venv_python(VENV)), "-m", "ranktrace.cli", "run", "-o", str(run_dir), "--hang-after",
                str(hang_after), "--on-hang", on_hang, *extra, "--", *argv]
    out = open(log, "wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(base),
                            env={**vllm_env(fault, arm=arm), **(env or {})}, start_new_session=True)
    out.close()
    return Run(name, run_dir, log, port, proc, time.monotonic())


def usable() -> str | None:
    """None when the vLLM environment answers, else the one line the tests skip with. The environment's copy of
    the fault injection is brought up to date with tests/vllm_real/faults.py."""
    if os.environ.get("RANKTRACE_VLLM") == "0":
        return "RANKTRACE_VLLM=0: the real-vLLM tests are turned off"
    ready = VENV / READY  # written by setup_env.py once the environment answered (importing vllm costs ~10 s)
    got = json.loads(ready.read_text()) if ready.exists() and venv_python(VENV).exists() else check(VENV)
    if isinstance(got, str):
        return f"real vLLM not usable ({got}); run python tests/vllm_real/setup_env.py"
    if not (MODEL / "config.json").exists():
        return f"no tiny model at {MODEL}; run python tests/vllm_real/setup_env.py"
    install_faults(site_packages(VENV))
    return None


__all__ = ["Run", "start", "usable", "vllm_env", "serve_argv", "free_port", "PROMPT", "REPO"]
