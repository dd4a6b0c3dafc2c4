"""Is a trace directory's job still running here? The one rule for "alive", and the capture burst it allows.

The analysis never looks at a process table: ``liveness`` looks here, on the job's own machine, and hands the
answer to it as a plain value. `trace analyze RUN` on a job that is hung *now* should also see where each rank is,
not only what the rings say: the rings tell which op is open, the stacks tell what the rank that never issued it
is doing instead (``snapshot_live``).
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

from ranktrace.analyzers.model import Liveness
from ranktrace.tracer.watch import burst
from ranktrace.tracer.launch import hostinfo
from ranktrace.tracer import ringformat as rf

__all__ = ["liveness", "live_pids", "host_dirs", "snapshot_live"]


def host_dirs(path: Path) -> list[Path]:
    """The trace host dirs at `path` (itself, or its children). A folder that cannot be read holds none here: the
    analysis walks it again and says why it was skipped."""
    def is_host(p: Path) -> bool:
        try:
            return (p / "meta.json").exists() or (p / "rings").is_dir()
        except OSError:
            return False

    if is_host(path):
        return [path]
    try:
        return sorted(d for d in path.iterdir() if is_host(d)) if path.is_dir() else []
    except OSError:
        return []


def liveness(paths: list[Path]) -> Liveness:
    """What is alive of the traced jobs under `paths`, for the analysis. Only host dirs of this machine are looked
    at (meta.json names it); another machine's stay out of the answer, so their state reads as unknown."""
    node = os.uname().nodename
    seen: dict[str, frozenset[int]] = {}
    for p in paths:
        for hd in host_dirs(Path(p)) if Path(p).is_dir() else []:
            if _meta(hd).get("hostname") == node:
                seen[Liveness.key(hd)] = frozenset(live_pids(hd))
    return Liveness(host=node, checked_at=time.time(), live_pids=seen)


def _meta(host_dir: Path) -> dict:
    try:
        meta = json.loads((host_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def live_pids(host_dir: Path) -> list[int]:
    """Pids of the job's traced processes that are alive on this machine (none once the job has ended).

    A pid is taken from a ring's name only if the process running under it now is the one that wrote the ring:
    same boot (the host dir names its boot id) and started no later than the ring was created. A `trace run` that
    was SIGKILLed never wrote its exit: days later its pids may belong to unrelated processes, which must not be
    dumped and read as ranks. `trace attach` writes no rings: its meta.json pids count when they started before
    the attach. A zombie (killed, not yet reaped by whoever inherited it) is not alive."""
    meta = _meta(host_dir)
    if meta.get("exit") or meta.get("hostname") not in (None, os.uname().nodename):
        return []
    key = meta.get("host_key") or (host_dir.name if host_dir.name.startswith(f"{socket.gethostname()}-") else None)
    if key is not None and key != hostinfo.host_key():  # the dir may be named by a --host-label: meta.json's key
        return []  # this machine rebooted since: none of those processes exists any more
    pids = []
    with_ring = set()
    for ring in (host_dir / "rings").glob("*.ring"):
        head = ring.stem.split("-")[0]
        if head.isdigit():
            with_ring.add(int(head))
            if ring_owner_alive(int(head), ring):
                pids.append(int(head))
    start_ns = meta.get("start_wall_ns")
    for p in meta.get("pids") or {}:
        if str(p).isdigit() and int(p) not in with_ring:
            by = None if not isinstance(start_ns, int) else start_ns / 1e9 - (time.time() - _boottime())
            if pid_running(int(p), by):
                pids.append(int(p))
    return sorted(set(pids))


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def pid_running(pid: int, started_by_s: float | None = None) -> bool:
    """Process `pid` exists, is not a zombie and (when `started_by_s`, seconds since boot, is given) started no
    later than that, with 1 s of slack for tick rounding. Where /proc hides another user's processes
    (hidepid), existence is all that can be known: a process we may not see counts as running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, PermissionError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc/self") or os.path.exists(f"/proc/{pid}")
    except OSError:
        return False
    try:
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):  # killed, not yet reaped: not alive
            return False
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError):
        return False
    return started_by_s is None or started_s <= started_by_s + 1.0


def ring_owner_alive(pid: int, ring: Path) -> bool:
    """Whether process `pid` is running (not a zombie) and started no later than `ring`'s header says the ring
    was made. The header has CLOCK_MONOTONIC; /proc/<pid>/stat counts from boot including suspended time
    (CLOCK_BOOTTIME): the ring's time is moved onto that clock by today's difference between the two."""
    try:
        with open(ring, "rb") as f:
            head = f.read(rf.HEADER.size)
        fields = rf.HEADER.unpack(head)
        if fields[0] != rf.MAGIC:
            return False
    except (OSError, struct.error):
        return False
    return pid_running(pid, fields[3] / 1e9 + (_boottime() - time.monotonic()))


def snapshot_live(paths: list[Path], reason: str = "trace analyze") -> list[str]:
    """Burst every live job under `paths`; returns one line per problem (py-spy missing, denied, ...)."""
    problems: list[str] = []
    for p in paths:
        for hd in host_dirs(p):
            pids = live_pids(hd)
            if pids:
                problems.extend(burst.capture_burst(hd, pids, reason=reason).problems)
    return problems
