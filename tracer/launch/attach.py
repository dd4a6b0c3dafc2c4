"""`trace attach PID...`: the outside view of a job that is already hung and was not started under ranktrace.

Relaunching a hung 8-GPU server costs an hour, so this needs nothing inside the job: it finds every process of
the job (the given pids and all their descendants), reads each one's rank from its environment (RANK, set by
torchrun/Slurm launchers; else sibling order under one parent, said as an inference), takes a burst (non-blocking
py-spy, /proc thread states) into a new trace directory, and leaves the verdict to the analyzers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ranktrace.tracer.watch import burst
from ranktrace.tracer.launch import hostinfo
from ranktrace.tracer.launch import meta, pidident

__all__ = ["AttachResult", "NothingToRead", "descendants", "rank_of", "attach"]


class NothingToRead(Exception):
    """None of the processes given (or below them) is one `trace attach` can read: said before anything is made."""


@dataclass
class AttachResult:
    run_dir: Path
    host_dir: Path
    pids: dict[int, dict[str, object]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _ppid_map() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                out[int(entry)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(pids: list[int]) -> list[int]:
    """The pids and every process below them."""
    parent = _ppid_map()
    children: dict[int, list[int]] = {}
    for c, p in parent.items():
        children.setdefault(p, []).append(c)
    out: list[int] = []
    todo = list(pids)
    while todo:
        p = todo.pop()
        if p in out or p not in parent:
            continue
        out.append(p)
        todo.extend(children.get(p, ()))
    return sorted(out)


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def rank_of(pid: int) -> tuple[int | None, int | None]:
    """(rank, world) from the process environment (torchrun, Slurm, MPI launchers)."""
    env = _environ(pid)
    for rk, wk in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK",
                                                                               "OMPI_COMM_WORLD_SIZE")):
        if env.get(rk, "").isdigit():
            world = env.get(wk, "")
            return int(env[rk]), int(world) if world.isdigit() else None
    return None, None


# multiprocessing's own service processes: children of the main process like the ranks, never ranks themselves
_MP_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver", b"multiprocessing.semaphore_tracker")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def mp_helper(pid: int) -> bool:
    """A resource tracker / forkserver of multiprocessing (torch.multiprocessing starts one beside mp.spawn's ranks)."""
    cmd = _cmdline(pid)
    return any(h in cmd for h in _MP_HELPERS)


def _is_python(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return "python" in os.path.basename(exe)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def _listed(pids: list[int], limit: int = 4) -> str:
    shown = ", ".join(f"{_comm(p)} {p}" for p in pids[:limit])
    return shown + (f" and {len(pids) - limit} more" if len(pids) > limit else "")


def attach(pids: list[int], out_base: Path = Path("traces")) -> AttachResult:
    """Discover, burst, and write a self-describing trace dir for the analyzers. NothingToRead when no Python
    process is among the pids and their descendants (a shell's own pid: its only Python child is this command)."""
    ours = set(descendants([os.getpid()]))  # this trace attach and what it starts (py-spy): never read as the job
    found = [p for p in descendants(pids) if p not in ours]
    procs = [p for p in found if _is_python(p)]
    others = [p for p in found if p not in procs]
    said = []
    if any(p in ours for p in pids):
        said.append(f"pid {os.getpid()} is this trace attach itself: left out")
    if not procs:
        what = f"{_listed(others)}: not Python" if others else "none of them runs"
        if any(p in ours for p in descendants(pids)):
            what += "; the only Python one is this trace attach"
        raise NothingToRead(
            f"nothing to read: no Python process among pid(s) {', '.join(map(str, pids))} and their descendants "
            f"({what}). trace attach reads Python stacks (py-spy) and /proc of a job's Python processes; nothing "
            f"was captured")
    if others:
        said.append(f"not read: {len(others)} process(es) that are not Python ({_listed(others)}); their stacks "
                    f"and ranks are not in the verdict")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = out_base / f"{stamp}-attach"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = out_base / f"{stamp}-attach-{n}"
    host_dir = run_dir / hostinfo.host_key()
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o700)  # the job's stacks and command lines: its owner's alone
    host_dir.mkdir()
    info: dict[int, dict[str, object]] = {}
    parent = _ppid_map()
    helpers = {p for p in procs if mp_helper(p)}
    for p in procs:
        rank, world = (None, None) if p in helpers else rank_of(p)
        info[p] = {"rank": rank, "world": world, "ppid": parent.get(p), "rank_from": "environ" if rank is not None
                   else None}
        st = pidident.stat(p)
        if st is not None:  # who it is: `trace analyze` later dumps this pid only while the same process has it
            info[p]["start_ticks"] = st.start_ticks
        if p in helpers:
            info[p]["role"] = "multiprocessing helper"
    # Leaves without a RANK in their environment (mp.spawn children): rank = order among siblings, flagged
    leaves = [p for p in procs if p not in helpers and not any(parent.get(q) == p for q in procs)]
    by_parent: dict[int | None, list[int]] = {}
    for p in leaves:
        if info[p]["rank"] is None:
            by_parent.setdefault(parent.get(p), []).append(p)
    notes = []
    for parent_pid, sibs in by_parent.items():
        if len(sibs) > 1:
            for i, p in enumerate(sorted(sibs)):
                info[p].update(rank=i, world=len(sibs), rank_from="sibling order (inferred)")
            notes.append(f"ranks 0-{len(sibs) - 1} inferred from the order of pid {parent_pid}'s children (pids "
                         f"{', '.join(map(str, sorted(sibs)))}): none has RANK in its environment")
    m = meta.initial_meta(["trace", "attach", *map(str, pids)], {}, {}, host_dir.name, run_dir.name)
    m.update(attached=True, pids={str(p): v for p, v in info.items()})
    meta.write_meta(host_dir, m)
    res = burst.capture_burst(host_dir, procs, reason="trace attach")
    return AttachResult(run_dir, host_dir, info, said + notes + list(res.problems))
