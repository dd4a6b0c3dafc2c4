"""meta.json of a trace host directory (schema ``ranktrace.meta/1``, DESIGN §3 contract).

Written once before the job starts (so a trace of a job that never ends still says what ran, where, with what
environment) and updated atomically at the end (exit status, end time, pid -> rank map, versions seen in ranks).
Everything that came from the user's command line or environment passes through tracer.redact first.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ranktrace.tracer.formats import redact
from ranktrace.tracer.launch.envplan import curated_subset

__all__ = ["SCHEMA", "initial_meta", "write_meta", "read_meta", "update_meta"]

SCHEMA = "ranktrace.meta/1"


def initial_meta(command: Sequence[str], env: Mapping[str, str], added: Mapping[str, str], host: str,
                 run_name: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "run": run_name,
        "host": host,
        "hostname": os.uname().nodename,
        "command": redact.redact_argv(list(command)),
        "cwd": os.getcwd(),
        "env": redact.redact_env(curated_subset(env)),
        "env_added": redact.redact_env(dict(added)),
        "versions": {"python_launcher": sys.version.split()[0], "ranktrace": _ranktrace_version()},
        "gpus": [],
        "start_wall_ns": time.time_ns(),
        "end_wall_ns": None,
        "exit": None,
        "pids": {},
        "launcher_pid": os.getpid(),
    }


def _ranktrace_version() -> str:
    try:
        from importlib.metadata import version

        return version("ranktrace")
    except Exception:
        return "0+unknown"


def write_meta(host_dir: Path, meta: Mapping[str, Any]) -> None:
    """Atomic write: a reader never sees half a meta.json, even if we are killed mid-write."""
    tmp = host_dir / f".meta.json.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # command line and environment: the owner's
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, host_dir / "meta.json")


def read_meta(host_dir: Path) -> dict[str, Any]:
    return json.loads((host_dir / "meta.json").read_text())


def update_meta(host_dir: Path, **fields: Any) -> dict[str, Any]:
    meta = read_meta(host_dir)
    meta.update(fields)
    write_meta(host_dir, meta)
    return meta
