"""blocked_outside_collective: nothing collective is pending, yet the ranks sit blocked (queue, lock, socket).

Only stacks can say this (DESIGN §2 host states): a job whose every rank waits in ``queue.get`` has no pending op
for the wait-for graph to see.
"""
from __future__ import annotations

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence, where
from ranktrace.analyzers.model.blocked import blocked_states
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Finding, Operation

__all__ = ["blocked_outside"]


def blocked_outside(ctx: Model) -> list[Candidate]:
    building = {r for r, b in blocked_states(ctx).items() if b.state == "lock_wait" and b.building}
    # a rank waiting for a lock that a live build holds waits for progress (host_wait_rule.lock_wait): no culprit
    blocked = sorted(r for r, st in ctx.host_states.items() if st == "blocked_other" and r not in building)
    # a rank waiting for work (idle_loop) beside a blocked one waits for what that one never sends: it is no culprit;
    # only when every rank is idle are the idle ones what the sentence is about
    blocked = blocked or sorted(r for r, st in ctx.host_states.items() if st == "idle_loop")
    if not blocked:
        return []
    pending = bool(ctx.graph.edges or ctx.graph.stuck or ctx.graph.mismatches)
    places = sorted({w for w in (where(ctx.stacks.get(r)) for r in blocked) if w})
    # with a collective pending, the wait-for rules speak; these ranks are then only where the culprits sit
    summary = (("" if pending else "no collective is pending; ")
               + f"{ranks_text(blocked)} {'are' if len(blocked) > 1 else 'is'} blocked outside collectives in "
               f"{', '.join(places[:3]) or 'a wait'}")
    ev = tuple(stack_evidence(ctx.stacks[r], ctx.host_states[r]) for r in blocked)
    steps = [] if pending else [
        f"The hang is in the application, not in communication: see what {ranks_text(blocked)} wait for "
        f"({', '.join(places[:3])}) — a request queue, a data loader, a lock or a subprocess that never answers."]
    return [Candidate("blocked_outside_collective", summary, culprits=tuple(blocked), waiting=(),
                      operation=Operation(name=places[0] if places else "wait"),
                      findings=[Finding("blocked_outside_collective", summary, tuple(blocked), 0.6, ev)],
                      next_steps=steps)]
