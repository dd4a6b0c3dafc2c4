"""Is a trace directory's job still running here? If so, take a capture burst before analyzing it.

`trace analyze RUN` on a job that is hung *now* should see where each rank is, not only what the rings say: the
rings tell which op is open, the stacks tell what the rank that never issued it is doing instead.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tracer import burst

__all__ = ["live_pids", "host_dirs", "snapshot_live"]


def host_dirs(path: Path) -> list[Path]:
    if (path / "meta.json").exists() or (path / "rings").is_dir():
        return [path]
    if path.is_dir():
        return sorted(d for d in path.iterdir() if (d / "meta.json").exists() or (d / "rings").is_dir())
    return []


def live_pids(host_dir: Path) -> list[int]:
    """Pids of the job's traced processes that are alive on this machine (none once the job has ended)."""
    try:
        meta = json.loads((host_dir / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    if meta.get("exit") or meta.get("hostname") not in (None, os.uname().nodename):
        return []
    pids = []
    for ring in (host_dir / "rings").glob("*.ring"):
        head = ring.stem.split("-")[0]
        if head.isdigit() and os.path.exists(f"/proc/{head}"):
            pids.append(int(head))
    return sorted(set(pids))


def snapshot_live(paths: list[Path], reason: str = "trace analyze") -> list[str]:
    """Burst every live job under `paths`; returns one line per problem (py-spy missing, denied, ...)."""
    problems: list[str] = []
    for p in paths:
        for hd in host_dirs(p):
            pids = live_pids(hd)
            if pids:
                problems.extend(burst.capture_burst(hd, pids, reason=reason).problems)
    return problems
