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
