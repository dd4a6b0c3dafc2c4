"""Helpers for tests that run real jobs under `trace run` (subprocesses, killed by process group on teardown)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TRACE = [PY, "-m", "ranktrace.cli"]
EXAMPLE = REPO / "examples" / "tp_job.py"
SCRIPTS = REPO / "tests" / "scripts"


def trace_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RANKTRACE_DIR", None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_trace(args: list[str], timeout: float = 120, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(TRACE + args, capture_output=True, text=True, timeout=timeout, env=env or trace_env(),
                          cwd=cwd or REPO, stdin=subprocess.DEVNULL)


def host_dir(run_dir: Path) -> Path:
    hosts = [d for d in run_dir.iterdir() if d.is_dir()]
    assert len(hosts) == 1, hosts
    return hosts[0]


def events(run_dir: Path) -> pa.Table:
    with pa.memory_map(str(host_dir(run_dir) / "events.arrow")) as src:
        return ipc.open_file(src).read_all()


def meta(run_dir: Path) -> dict:
    return json.loads((host_dir(run_dir) / "meta.json").read_text())


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_pty(args: list[str], cols: int = 80, rows: int = 50, timeout: float = 120,
               env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str, str]:
    """`trace ARGS` with its stderr on a pseudo-terminal `cols` wide (stdout piped, stdin /dev/null): (returncode,
    everything written to the terminal, stdout). The process group is killed if it outlives `timeout`."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import threading
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(TRACE + args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env or trace_env(), cwd=cwd or REPO, start_new_session=True)
    os.close(slave)
    out_box: list[bytes] = []
    reader = threading.Thread(target=lambda: out_box.append(proc.stdout.read()), daemon=True)  # type: ignore
    reader.start()
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every holder of the slave side has gone
                    break
                if not data:
                    break
                chunks.append(data)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
        os.close(master)
    reader.join(timeout=10)
    return (proc.returncode, b"".join(chunks).decode("utf-8", "replace"),
            (out_box[0] if out_box else b"").decode("utf-8", "replace"))
