"""What each rank is blocked on, in one word and one sentence (issue #29): the host-side picture behind a hang that
reads 0% CPU and 0% GPU everywhere.

Joins what the model already holds: the rank's latest stack and its host state (hoststate), the watchdog's /proc
samples (the main thread's state letter, wchan and CPU; the syscall it waits in and the file behind it; lock files in
its JIT caches with their age, holders, openers and the compilers alive; its child processes) and py-spy's GIL mark.
One state per rank, first match wins:

``stopped`` (/proc T) · ``in_kernel`` (D, with wchan and what it usually means) · ``in_collective`` (the stack is in
a collective, its set-up or a host sync; spinning or parked by its CPU) · ``lock_wait`` (path, holder alive or dead,
since when; stale when nobody holds it or builds) · ``waiting_on_process`` (a pipe / socket read and who holds the
other end, a child to exit, a serving loop's next request) · ``busy`` (its CPU, or a child at work: what it runs) ·
``unknown`` (with what evidence was missing).

A pure function of the Model: no I/O. gloo's "returned" is not NCCL's: CPU never decides that a rank progresses, it
only says spinning vs parked, or which child works.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ranktrace.analyzers.model.hoststate import application_frame
from ranktrace.analyzers.model.stacks import normalise_frame
from ranktrace.analyzers.verdict import Evidence

if TYPE_CHECKING:
    from ranktrace.analyzers.model.build import Model

__all__ = ["Blocked", "BLOCKED_STATES", "blocked_states", "in_lock_wait", "lock_frame", "COMPILERS", "age_text",
           "HOST_WAITS"]

BLOCKED_STATES = ("in_collective", "lock_wait", "stopped", "in_kernel", "waiting_on_process", "busy", "unknown")
#: the states that say what a rank waits for on the host: worth a sentence wherever the rank is named
HOST_WAITS = frozenset({"lock_wait", "stopped", "in_kernel", "waiting_on_process"})

# frames of a process waiting for a file lock: torch's cpp_extension build lock (FileBaton polls for the lock file to
# go away), the filelock library (Triton, FlashInfer, Hugging Face, DeepSpeed caches), fcntl / lockf
LOCK_FRAMES = ("FileBaton.wait (", "utils/file_baton.py", "filelock/_api.py", "filelock/_unix.py", "flock (",
               "lockf (")
# compilers and build drivers a JIT build runs (a live one means the build is progressing: not a hang)
COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "ninja", "cc1plus", "c++", "g++", "gcc", "clang", "clang++", "ld",
                       "nvlink", "fatbinary", "cudafe++", "hipcc", "cc1", "as"})
# wchan -> what a D state there usually means
_WCHAN_MEANING = ((re.compile(r"uvm|nvidia|nv_"), "the NVIDIA driver (nvidia / nvidia_uvm): a driver-side wait, "
                   "e.g. the HMM eviction deadlock (NVIDIA/open-gpu-kernel-modules#1223); nvidia-smi may hang too"),
                  (re.compile(r"nfs|rpc_|sunrpc"), "a network filesystem (NFS) call that the server does not answer"),
                  (re.compile(r"io_schedule|folio|wait_on_page|blk_|bio_|jbd2|ext4|xfs"), "storage I/O"),
                  (re.compile(r"fuse"), "a FUSE filesystem's daemon"))
_IN_COLLECTIVE = {"in_collective": "inside a collective", "in_init": "in communicator / rendezvous set-up",
                  "host_sync_wait": "in a host sync waiting for the GPU (on NCCL, where a hung collective shows)"}
_READS = frozenset({"read", "readv", "pread64", "recvfrom", "recvmsg", "poll", "ppoll", "epoll_wait", "epoll_pwait",
                    "select", "pselect6", "accept", "accept4", "connect"})
_SPIN_MS = 5000    # main thread CPU in the last 10 s above which a waiting rank spins rather than parks
_BUSY_MS = 3000    # a rank's or child's CPU in the last 10 s that is work


@dataclass(frozen=True)
class Blocked:
    """One rank's blocked state: the word (BLOCKED_STATES), the sentence, and the facts the rules cite."""

    state: str
    detail: str
    since_ns: int | None = None
    path: str | None = None           # lock_wait: the lock file; waiting_on_process: the pipe / socket
    holder: int | None = None         # the process that could end the wait (lock holder, pipe writer)
    holder_alive: bool | None = None
    stale: bool = False               # lock_wait: no live process holds it, has it open or builds
    age_s: int | None = None          # lock_wait: the lock file's age when last looked at
    building: bool = False            # lock_wait: a compiler runs or the holder's children work: progress
    gil: str | None = None            # a thread that holds the GIL while blocked in native code, said
    evidence: tuple[Evidence, ...] = ()

    def text(self) -> str:
        return f"{self.state}: {self.detail}" + (f"; {self.gil}" if self.gil else "")


def in_lock_wait(frames: tuple[str, ...]) -> bool:
    return any(m in f for f in frames[:6] for m in LOCK_FRAMES)


def lock_frame(frames: tuple[str, ...]) -> str:
    return next((f for f in frames[:6] if any(m in f for m in LOCK_FRAMES)), frames[0] if frames else "?")


def age_text(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s // 86400} days"


def field(detail: str | None, key: str) -> str | None:
    """``key=value`` from a samples detail (values without spaces; ``target=`` and ``cmd=`` run to the end)."""
    text = detail or ""
    if key in ("target", "cmd"):
        i = text.find(f" {key}=")
        return text[i + len(key) + 2:] if i >= 0 else (text[len(key) + 1:] if text.startswith(f"{key}=") else None)
    for part in text.split():
        if part.startswith(key + "="):
            return part[len(key) + 1:]
    return None


def _holders(text: str | None) -> list[tuple[int, str, bool]]:
    """``pid:comm[:dead],...`` -> [(pid, comm, alive)]."""
    out = []
    for item in (text or "-").split(","):
        parts = item.split(":")
        if parts[0].isdigit():
            out.append((int(parts[0]), parts[1] if len(parts) > 1 else "?", not (len(parts) > 2 and parts[2] == "dead")))
    return out


def _int(text: str | None) -> int:
    return int(text) if text and text.lstrip("-").isdigit() else 0


class _Facts:
    """The model's /proc observations by pid, read once for every rank."""

    def __init__(self, ctx: "Model") -> None:
        self.by_kind: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for kind in ("thread_state", "host_wait", "lock_file", "child_process"):
            rows: dict[int, list[dict[str, Any]]] = {}
            for o in ctx.observations(kind):
                key = o["pid"] if kind != "child_process" else _int(field(o["detail"], "root")) or o["pid"]
                if key is not None:
                    rows.setdefault(key, []).append(o)
            self.by_kind[kind] = rows
        self.sampled = any(self.by_kind[k] for k in self.by_kind)
        # NVML (gpu.arrows): each rank's GPU (its process's memory row) and that GPU's latest utilisation / power
        self.gpu_util = {o["name"]: o for o in ctx.observations("gpu_util") if o["name"]}
        self.gpu_of = {o["rank"]: o["name"] for o in ctx.observations("gpu_memory")
                       if o["rank"] is not None and o["detail"] == "process" and o["name"]}
        walls = [o["wall_ns"] for rows in self.by_kind.values() for os_ in rows.values() for o in os_ if o["wall_ns"]]
        self.as_of = max([ctx.as_of_ns or 0, *walls]) or None

    def of(self, kind: str, pids: tuple[int, ...]) -> list[dict[str, Any]]:
        return [o for p in pids for o in self.by_kind[kind].get(p, [])]

    def main_thread(self, pids: tuple[int, ...]) -> dict[str, Any] | None:
        rows = [o for o in self.of("thread_state", pids) if o["tid"] == o["pid"]]
        return max(rows, key=lambda o: o["wall_ns"] or 0) if rows else None


def _ev(o: dict[str, Any], rank: int, what: str) -> Evidence:
    return Evidence(o.get("source") or "proc", o.get("file"), o.get("line"), what, rank)


def blocked_states(ctx: "Model") -> dict[int, Blocked]:
    """rank -> Blocked for every rank with a stack or /proc samples (ranks nothing speaks about are left out)."""
    facts = _Facts(ctx)
    gil = _gil_holders(ctx, facts)
    ranks = set(ctx.stacks) | {r for r, ps in ctx.rank_pids.items()
                               if any(facts.of(k, ps) for k in ("thread_state", "host_wait"))}
    out = {}
    for r in sorted(ranks):
        b = _one(ctx, facts, r)
        if r in gil:
            text, main_holds = gil[r]
            if b.state in ("unknown", "busy", "waiting_on_process") and not main_holds:
                b = Blocked("lock_wait", "its main thread waits for the GIL: " + text, b.since_ns, evidence=b.evidence)
            else:
                b = Blocked(**{**b.__dict__, "gil": text})
        out[r] = b
    return out


def _pids(ctx: "Model", r: int) -> tuple[int, ...]:
    pids = tuple(ctx.rank_pids.get(r, ()))
    st = ctx.stacks.get(r)
    if st is not None and st.pid is not None and st.pid not in pids:
        pids = (st.pid, *pids)
    return pids


def _one(ctx: "Model", facts: _Facts, r: int) -> Blocked:
    pids = _pids(ctx, r)
    st = ctx.stacks.get(r)
    host = ctx.host_states.get(r)
    main = facts.main_thread(pids)
    letter = main["name"] if main else None
    since = _int(field(main["detail"], "since_ns")) or None if main else None
    cpu10 = _int(field(main["detail"], "cpu_ms_last_10s")) if main else None
    wchan = field(main["detail"], "wchan") if main else None
    mev = (_ev(main, r, f"/proc state {letter} wchan={wchan} cpu_ms_last_10s={cpu10}"),) if main else ()
    if host == "stopped" or letter in ("T", "t"):
        return Blocked("stopped", "stopped (/proc state T: SIGSTOP, Ctrl-Z or a debugger): it runs nothing"
                       + _since(since, facts.as_of), since, evidence=mev)
    if host == "uninterruptible" or letter == "D":
        return Blocked("in_kernel", _kernel_text(wchan) + _since(since, facts.as_of), since, evidence=mev)
    if host in _IN_COLLECTIVE:
        how = ("" if cpu10 is None else (", spinning (its main thread burns a core)" if cpu10 >= _SPIN_MS else
                                         ", parked (its main thread sleeps)"))
        where = application_frame(st.frames) if st else None
        gpu, gev = _gpu(facts, r)
        return Blocked("in_collective", _IN_COLLECTIVE[host] + how + (f", from {normalise_frame(where)}" if where
                                                                      else "") + gpu, since, evidence=mev + gev)
    waits = sorted(facts.of("host_wait", pids), key=lambda o: o["wall_ns"] or 0)
    wait = waits[-1] if waits else None
    if (st is not None and in_lock_wait(st.frames)) or (wait and wait["name"] in ("flock", "fcntl")):
        return _lock(ctx, facts, r, pids, st, wait, since, mev)
    if wait and wait["name"] in _READS and (field(wait["detail"], "target") or "-") != "-":
        return _process_wait(facts, r, wait, since)
    if wait and wait["name"] in ("wait4", "waitid"):
        kids = _kids(facts, pids)
        return Blocked("waiting_on_process", "waits for a child process to exit" + (
            f" ({', '.join(k for k, _ms, _o in kids[:3])})" if kids else ""), since, evidence=(_ev(wait, r, "wait4"),))
    kids = [k for k in _kids(facts, pids) if k[1] >= _BUSY_MS]
    if kids:
        return Blocked("busy", "a child at work: " + ", ".join(f"{k} at {ms // 100}% CPU" for k, ms, _o in kids[:3]),
                       evidence=tuple(_ev(o, r, f"child {k}") for k, _ms, o in kids[:3]))
    if cpu10 is not None and cpu10 >= _BUSY_MS and host not in ("blocked_other", "idle_loop"):
        return Blocked("busy", f"running on the CPU ({cpu10 // 100}% of a core in the last 10 s)", evidence=mev)
    if host == "idle_loop":
        return Blocked("waiting_on_process", "waits for its next request (a serving loop's queue)", since, evidence=mev)
    if host == "running":
        return Blocked("busy", "running Python (its stack is active)", evidence=mev)
    return Blocked("unknown", _why_unknown(st, host, main, wait, facts), since, evidence=mev)


def _gpu(facts: _Facts, r: int) -> tuple[str, tuple[Evidence, ...]]:
    """", its GPU gpu3 at 100% (...)" where NVML answered for the rank's device; "" otherwise (no claim)."""
    g = facts.gpu_of.get(r)
    o = facts.gpu_util.get(g) if g else None
    if o is None or o["value"] is None:
        return "", ()
    v = o["value"]
    power = field(o["detail"], "power_mw")
    watts = f", {int(power) // 1000} W" if power and power.isdigit() else ""
    what = ("a kernel spins on it (an NCCL or custom all-reduce kernel polling for a peer)" if v >= 90 else
            "idle: nothing runs on it, the wait is on the host" if v <= 5 else "partly busy")
    return f"; its {g} at {v}%{watts}: {what}", (_ev(o, r, f"{g} at {v}% utilisation{watts}"),)


def _since(since_ns: int | None, as_of: int | None) -> str:
    if not since_ns or not as_of or as_of < since_ns:
        return ""
    return f", for {age_text((as_of - since_ns) / 1e9)} at least"


def _kernel_text(wchan: str | None) -> str:
    w = wchan if wchan and wchan not in ("0", "-") else None
    meaning = next((m for pat, m in _WCHAN_MEANING if w and pat.search(w)), None)
    return ("in uninterruptible sleep inside the kernel (/proc state D" + (f", wchan {w}" if w else ", wchan hidden")
            + ")" + (f": {meaning}" if meaning else ": it cannot run or be killed until that call returns"))


def _lock(ctx: "Model", facts: _Facts, r: int, pids: tuple[int, ...], st: Any, wait: dict[str, Any] | None,
          since: int | None, mev: tuple[Evidence, ...]) -> Blocked:
    if wait and wait["name"] in ("flock", "fcntl"):
        path = field(wait["detail"], "target")
        peers = _holders(field(wait["detail"], "peers"))
        ev = (_ev(wait, r, f"{wait['name']} on {path}: peers={field(wait['detail'], 'peers')}"),)
        if peers:
            pid, comm, alive = peers[0]
            return Blocked("lock_wait", f"blocked in {wait['name']}() on {path}, held by pid {pid} ({comm}, "
                           f"{'alive' if alive else 'no longer alive'})", since, path, pid, alive, evidence=ev)
        return Blocked("lock_wait", f"blocked in {wait['name']}() on {path}; /proc/locks names no holder", since,
                       path, evidence=ev)
    frame = normalise_frame(lock_frame(st.frames)) if st is not None else "a lock wait"
    locks = facts.of("lock_file", pids)
    if not locks:
        why = ("no /proc samples of it" if not facts.sampled else
               "no lock file in the JIT caches its environment names (torch_extensions, Triton, FlashInfer, "
               "TorchInductor)")
        return Blocked("lock_wait", f"waits for a file lock in {frame}; which file is unknown: {why}", since,
                       evidence=mev)
    as_of = facts.as_of or 0
    rows = []
    for o in locks:
        holders = _holders(field(o["detail"], "holders")) + _holders(field(o["detail"], "openers"))
        live = [h for h in holders if h[2] and h[0] not in pids]
        builders = sorted(_holders(field(o["detail"], "builders")), key=lambda h: (h[1] != "ninja", h[0]))  # driver
        age = (o["value"] or 0) + max(0, (as_of - (o["wall_ns"] or as_of)) // 1_000_000_000)
        rows.append((bool(live or builders), -age, o, live, builders, age))
    rows.sort(key=lambda x: (x[0], x[1]))  # a lock nobody holds first, the oldest of those
    held, _neg, o, live, builders, age = rows[0]
    busy_kids = [k for k in _kids(facts, pids) if k[1] > 0]
    path = o["name"]
    ev = (_ev(o, r, f"lock file {path}: age {age_text(age)}, {o['detail']}"),)
    more = f" (and {len(rows) - 1} more lock files there)" if len(rows) > 1 else ""
    if live:
        pid, comm, _alive = live[0]
        building = builders or busy_kids
        who = (", ".join(f"{c} (pid {p})" for p, c, _a in builders[:2]) or ", ".join(k for k, _m, _o in busy_kids[:2]))
        return Blocked("lock_wait", f"waits in {frame} for the lock file {path} (age {age_text(age)}), held open by "
                       f"pid {pid} ({comm}, alive)" + (f" while {who} builds: progress" if building else
                                                       ", and no compiler runs")
                       + more, since, path, pid, True, age_s=age, building=bool(building), evidence=ev)
    if builders or busy_kids:
        who = ", ".join(f"{c} (pid {p})" for p, c, _a in builders[:3]) or ", ".join(k for k, _m, _o in busy_kids[:3])
        return Blocked("lock_wait", f"waits in {frame} for the lock file {path} (age {age_text(age)}); no process "
                       f"has it open, but {who} builds on this machine", since, path, age_s=age, building=True,
                       evidence=ev)
    return Blocked("lock_wait", f"waits in {frame} for the lock file {path} (age {age_text(age)}): no live process "
                   "holds it or builds — a stale lock" + more, since, path, None, None, stale=True, age_s=age,
                   evidence=ev)


def _process_wait(facts: _Facts, r: int, wait: dict[str, Any], since: int | None) -> Blocked:
    target = field(wait["detail"], "target") or "?"
    peers = _holders(field(wait["detail"], "peers"))
    remote = field(wait["detail"], "remote")
    note = field(wait["detail"], "note")
    what = {"pipe": "a pipe", "socket": "a socket"}.get(target.split(":", 1)[0], target)
    ev = (_ev(wait, r, f"{wait['name']} on {target}: peers={field(wait['detail'], 'peers')}"),)
    if peers:
        pid, comm, alive = peers[0]
        end = "write end" if what == "a pipe" else "other end"
        others = f" (and {len(peers) - 1} more)" if len(peers) > 1 else ""
        return Blocked("waiting_on_process", f"blocked in {wait['name']}() on {what} ({target}) whose {end} pid {pid} "
                       f"({comm}{'' if alive else ', dead'}) holds{others}, and it writes nothing", since, target, pid,
                       alive, evidence=ev)
    if remote:
        return Blocked("waiting_on_process", f"blocked in {wait['name']}() on {what} ({target}) to {remote}", since,
                       target, evidence=ev)
    tail = ": no process holds its write end" if what == "a pipe" and not note else ""
    return Blocked("waiting_on_process", f"blocked in {wait['name']}() on {what} ({target}){tail}", since, target,
                   evidence=ev)


def _kids(facts: _Facts, pids: tuple[int, ...]) -> list[tuple[str, int, dict[str, Any]]]:
    """('nvcc (pid 12)', CPU ms in the last 10 s, row) per live descendant, busiest first."""
    out = []
    for o in facts.of("child_process", pids):
        if o["name"] in ("Z", "X"):
            continue
        comm = field(o["detail"], "comm") or "?"
        cmd = (field(o["detail"], "cmd") or "")[:60]
        out.append((f"{comm} (pid {o['pid']}{': ' + cmd if cmd and cmd.split()[0] != comm else ''})",
                    _int(field(o["detail"], "cpu_ms_last_10s")), o))
    return sorted(out, key=lambda k: -k[1])


def _why_unknown(st: Any, host: str | None, main: dict[str, Any] | None, wait: dict[str, Any] | None,
                 facts: _Facts) -> str:
    parts = []
    if st is None:
        parts.append("no stack of it")
    elif host:
        parts.append(f"its stack reads {host} ({normalise_frame(st.frames[0]) if st.frames else '?'})")
    if not facts.sampled:
        parts.append("no /proc samples (an input that is not a ranktrace run, or RANKTRACE_SAMPLES=0)")
    elif main is None:
        parts.append("no /proc sample of its main thread")
    elif wait is None:
        parts.append("the watchdog never saw it quiet enough to ask what it waits in")
    else:
        note = field(wait["detail"], "note")
        parts.append(f"its main thread waits in {wait['name'] or '?'}" + (f" ({note})" if note else "")
                     + ", which names no file or process")
    return "; ".join(parts)


def _gil_holders(ctx: "Model", facts: _Facts) -> dict[int, tuple[str, bool]]:
    """rank -> a sentence, where py-spy marked a thread of the rank's latest snapshot as holding the GIL (active+gil)
    while /proc shows that thread asleep (S or D): blocked in native code with the GIL, it starves every other Python
    thread of the process (and the in-rank agent)."""
    st = ctx.inputs.stacks
    if st.num_rows == 0 or "active+gil" not in set(st["thread_state"].to_pylist()):
        return {}
    thread_letter = {(o["pid"], o["tid"]): o["name"] for rows in facts.by_kind["thread_state"].values() for o in rows}
    rows = sorted(st.select(["rank", "pid", "tid", "thread_name", "thread_state", "frames", "file", "snapshot",
                             "wall_ns"]).to_pylist(), key=lambda x: (x["wall_ns"] or 0, x["file"] or "",
                                                                     x["snapshot"] or ""))
    latest = {row["rank"]: (row["file"], row["snapshot"]) for row in rows if row["rank"] is not None}
    snapshots: dict[int, set[tuple[Any, Any]]] = {}   # rank -> its snapshots
    holding: dict[tuple[int, Any], int] = {}          # (rank, tid) -> snapshots in which it held the GIL
    for row in rows:
        if row["rank"] is None:
            continue
        snapshots.setdefault(row["rank"], set()).add((row["file"], row["snapshot"]))
        if row["thread_state"] == "active+gil":
            holding[(row["rank"], row["tid"])] = holding.get((row["rank"], row["tid"]), 0) + 1
    out = {}
    for row in rows:
        r = row["rank"]
        if r is None or row["thread_state"] != "active+gil" or (row["file"], row["snapshot"]) != latest.get(r):
            continue
        if holding[(r, row["tid"])] < min(2, len(snapshots[r])):
            continue  # one sample caught it with the GIL: a moment, not a thread that keeps it
        letter = thread_letter.get((row["pid"], row["tid"]))
        if letter not in ("S", "D"):
            continue
        top = normalise_frame(row["frames"][0]) if row["frames"] else "?"
        main = row["tid"] == row["pid"] or row["thread_name"] == "MainThread"
        out[r] = (f"{'its main thread' if main else 'thread ' + str(row['thread_name'] or row['tid'])} holds the GIL "
                  f"while blocked in native code (called from {top}; /proc state {letter}): every other Python thread of the rank "
                  "(and ranktrace's in-rank agent) waits for it", main)
    return out
