"""Ranks that cannot run at all: a process stopped (/proc state T: SIGSTOP, Ctrl-Z, a debugger) or in
uninterruptible sleep (/proc state D: inside the kernel, e.g. a driver's memory-eviction path) while the others wait.
Whatever its stack says, such a rank issues nothing, so it is the one the others wait for."""
from __future__ import annotations

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence, where
from ranktrace.analyzers.diagnose.context import Context
from ranktrace.analyzers.verdict import Finding, Operation

__all__ = ["cannot_run"]

_HOW = {"stopped": "is stopped (/proc state T: SIGSTOP, Ctrl-Z or a debugger): it runs nothing",
        "uninterruptible": "is in uninterruptible sleep (/proc state D): it is inside the kernel and cannot run"}
_WAITING = ("blocked_other", "in_collective", "in_init", "idle_loop", "host_sync_wait")


def cannot_run(ctx: Context) -> list[Candidate]:
    frozen = {r: s for r, s in ctx.host_states.items() if s in _HOW}
    if not frozen:
        return []
    waiting = tuple(sorted(r for r, s in ctx.host_states.items() if r not in frozen and s in _WAITING))
    culprits = tuple(sorted(frozen))
    kind_of = {frozen[r] for r in culprits}
    how = _HOW[next(iter(kind_of))] if len(kind_of) == 1 else "cannot run (stopped or in uninterruptible sleep)"
    places = "; ".join(f"rank {r} in {where(ctx.stacks[r])}" for r in waiting if r in ctx.stacks and where(
        ctx.stacks[r]))
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
