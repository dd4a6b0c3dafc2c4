"""Ranks that cannot run at all: a process stopped (/proc state T: SIGSTOP, Ctrl-Z, a debugger) or in
uninterruptible sleep (/proc state D: inside the kernel, e.g. a driver's memory-eviction path) while the others wait.
Whatever its stack says, such a rank issues nothing, so it is the one the others wait for."""
from __future__ import annotations

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence, where
from ranktrace.analyzers.model import blocked
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding, Operation

__all__ = ["cannot_run", "lock_wait", "COMPILERS"]

_HOW = {"stopped": "is stopped (/proc state T: SIGSTOP, Ctrl-Z or a debugger): it runs nothing",
        "uninterruptible": "is in uninterruptible sleep (/proc state D): it is inside the kernel and cannot run"}
_WAITING = ("blocked_other", "in_collective", "in_init", "idle_loop", "host_sync_wait")


def cannot_run(ctx: Model) -> list[Candidate]:
    frozen = {r: s for r, s in ctx.host_states.items() if s in _HOW}
    if not frozen:
        return []
    waiting = tuple(sorted(r for r, s in ctx.host_states.items() if r not in frozen and s in _WAITING))
    culprits = tuple(sorted(frozen))
    kind_of = {frozen[r] for r in culprits}
    how = _HOW[next(iter(kind_of))] if len(kind_of) == 1 else "cannot run (stopped or in uninterruptible sleep)"
    places = "; ".join(f"rank {r} in {where(ctx.stacks[r])}" for r in waiting if r in ctx.stacks and where(
        ctx.stacks[r]))
    on = blocked.blocked_states(ctx)
    since = [b.detail.rsplit(", for ", 1)[1] for r in culprits if (b := on.get(r)) and ", for " in b.detail]
    how += f" (for {since[0]})" if since else ""
    summary = (f"{ranks_text(culprits)} {how}" + (f"; {ranks_text(waiting)} "
                                                 f"{'waits' if len(waiting) == 1 else 'wait'} for it"
                                                 + (f" ({places})" if places else "") if waiting else ""))
    ev = tuple(stack_evidence(ctx.stacks[r], ctx.host_states[r]) for r in (*culprits, *waiting) if r in ctx.stacks)[:8]
    steps = []
    if "stopped" in kind_of:
        steps.append(f"Resume it: `kill -CONT <pid>` of {ranks_text([r for r in culprits if frozen[r] == 'stopped'])} "
                     "(a shell's Ctrl-Z, a debugger left attached, or a SIGSTOP from a tool).")
    if "uninterruptible" in kind_of:
        steps.append("Read its kernel stack (`cat /proc/<pid>/stack`, `wchan`) and `dmesg -T`: a process in D inside "
                     "nvidia/nvidia_uvm is a driver wait (nvidia-smi may hang too); only a driver fix or reboot ends it.")
    first = culprits[0]
    op = where(ctx.stacks[first]) if first in ctx.stacks else None
    return [Candidate("blocked_outside_collective", summary, culprits=culprits, waiting=waiting,
                      operation=Operation(name=op or frozen[first]),
                      findings=[Finding("blocked_outside_collective", summary, culprits, 0.85, ev)],
                      next_steps=steps)]


_LOCK_FRAMES = blocked.LOCK_FRAMES
COMPILERS = blocked.COMPILERS


def lock_wait(ctx: Model) -> list[Candidate]:
    """Ranks waiting for a file lock (a JIT build's lock, a cache's lock) while no collective is pending: named with
    the lock and whether a build is running. A lock nobody is building behind is stale: a start killed while it held
    the lock left the file, and every later start waits for it at 0% CPU, with no error."""
    if ctx.graph.edges or ctx.graph.stuck or ctx.graph.mismatches:
        return []
    waits = [o for o in ctx.observations("lock_wait") if (o["value"] or 0) > 0]
    stacks = {r: s for r, s in ctx.stacks.items() if _in_lock(s.frames)}
    anon = [s for s in ctx.anon_stacks if _in_lock(s.frames)]
    if not waits and not stacks and not anon:
        return []
    building = sorted({c for o in ctx.observations("thread_state") if (c := _comm(o["detail"])) in COMPILERS
                       and _recent_cpu(o["detail"])})
    if building:
        return []  # a compiler is at work behind the lock: a JIT build in progress, said as progress elsewhere
    named = {r: b for r, b in blocked.blocked_states(ctx).items() if b.state == "lock_wait" and b.path}
    if named:
        return _named_lock(ctx, named, stacks)
    paths = sorted({o["name"] for o in waits if o["name"]})
    who = tuple(sorted(set(stacks) | {o["rank"] for o in waits if o["rank"] is not None}))
    what = (f"the file lock {paths[0]}" + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else "") if paths
            else "a file lock (" + (_lock_frame(next(iter(stacks.values())).frames) if stacks else
                                    _lock_frame(anon[0].frames)) + ")")
    n = len(who) or len({s.pid if s.pid is not None else id(s) for s in anon}) or sum(o["value"] or 0 for o in waits)
    subject = (ranks_text(who) if who else f"{n} process{'es' if n != 1 else ''}")
    sampled = bool(ctx.observations("thread_state"))
    why = ("no compiler is running, so no build holds it" if sampled else
           "nothing in the input shows a holder release it")
    summary = (f"{subject} {'waits' if n == 1 else 'wait'} for {what} and nobody takes it; {why}: a stale lock "
               "(left by a start killed while it held it) or a lock on a slow network filesystem. No collective is "
               "involved")
    ev = [Evidence(o["source"] or "lock_wait", o["file"], o["line"], f"{o['name']}: {o['detail']}", o["rank"])
          for o in waits[:4]]
    ev += [stack_evidence(s, ctx.host_states.get(r, "blocked_other")) for r, s in sorted(stacks.items())][:4]
    ev += [stack_evidence(s, "blocked_other") for s in anon[:2]]
    steps = [("Remove the stale lock " + (paths[0] if paths else "file") + " once no process builds behind it (`lsof` "
              "or `fuser` on it shows no holder; torch's cpp_extension lock is "
              "~/.cache/torch_extensions/<py>_<cuda>/<ext>/lock), then restart."),
             "Keep JIT and autotune caches on a local disk (TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR, FLASHINFER's "
             "cache dir), not on an NFS home directory."]
    return [Candidate("blocked_outside_collective", summary, culprits=who, waiting=(),
                      operation=Operation(name="file_lock"),
                      findings=[Finding("blocked_outside_collective", summary, who, 0.7, tuple(ev))],
                      next_steps=steps)]


def _named_lock(ctx: Model, named: dict[int, blocked.Blocked], stacks: dict) -> list[Candidate]:
    """The watchdog's /proc samples named the lock (wait_probe): its path, its age, who holds it and whether anything
    builds. A live holder that builds is progress (a finding, never a verdict); a stale lock or an idle holder is the
    hang."""
    if any(b.building for b in named.values()):
        build = tuple(sorted(r for r, b in named.items() if b.building))
        said = f"{ranks_text(build)}: {named[build[0]].detail}"
        note = f"{said}: a JIT build in progress, however long it takes — not a hang"
        ev = tuple(e for r in build for e in named[r].evidence)[:4]
        return [Candidate("no_hang", note, primary=False, findings=[Finding("lock_held_by_build", note, (), 0.7, ev)])]
    who = tuple(sorted(named))
    first = named[who[0]]
    path = first.path or "?"  # named only holds ranks whose lock has a path
    paths = sorted({b.path for b in named.values() if b.path})
    also = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    inside = ("in " + blocked.lock_frame(ctx.stacks[who[0]].frames).split(" (")[0] + " " if who[0] in stacks else "")
    verb = "waits" if len(who) == 1 else "wait"
    age = f" (age {blocked.age_text(first.age_s)})" if first.age_s is not None else ""
    if first.holder is not None and first.holder_alive:
        summary = (f"{ranks_text(who)} {verb} {inside}for the file lock {path}{also}, held by pid {first.holder},"
                   " which is alive but builds nothing: that process is what they wait for. No collective is involved")
        steps = [f"See what pid {first.holder} does (`py-spy dump --pid {first.holder}`, `cat /proc/{first.holder}/"
                 "wchan`); ending it releases the lock."]
    else:
        dead = f", held by pid {first.holder} which is gone" if first.holder is not None else ""
        summary = (f"{ranks_text(who)} {verb} {inside}for the file lock {path}{age}{also}{dead}: no live process "
                   "holds it or builds, and no compiler is running — a stale lock, left by a start killed while it held "
                   "it. No collective is involved")
        steps = [f"Remove the stale lock: `rm {path}` (check first that `fuser {path}` shows no holder and no "
                 f"nvcc/ninja runs), or clear that build's cache folder ({path.rsplit('/', 1)[0]}), then restart."]
    steps.append("Keep JIT and autotune caches on a local disk (TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR, FLASHINFER's "
                 "cache dir), not on an NFS home directory.")
    ev = [e for r in who for e in named[r].evidence][:4]
    ev += [stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "blocked_other")) for r in who if r in ctx.stacks][:4]
    return [Candidate("blocked_outside_collective", summary, culprits=who, waiting=(),
                      operation=Operation(name="file_lock"),
                      findings=[Finding("blocked_outside_collective", summary, who, 0.8, tuple(ev))],
                      next_steps=steps)]


def _in_lock(frames: tuple[str, ...]) -> bool:
    return any(m in f for f in frames[:6] for m in _LOCK_FRAMES)


def _lock_frame(frames: tuple[str, ...]) -> str:
    return next((f for f in frames[:6] if any(m in f for m in _LOCK_FRAMES)), frames[0] if frames else "?")


def _comm(detail: str | None) -> str | None:
    for part in (detail or "").split():
        if part.startswith("comm="):
            return part[5:]
    return None


def _recent_cpu(detail: str | None) -> bool:
    for part in (detail or "").split():
        if part.startswith("cpu_ms_last_10s="):
            return part[16:].isdigit() and int(part[16:]) > 0
    return True  # no recent-CPU figure: a compiler alive at the last sample counts as working
