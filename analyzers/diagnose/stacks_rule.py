"""Verdicts from stacks alone (py-spy dumps a user attached to an issue, `trace attach` on a job never traced).

Without op records there is no group or seq, but the stacks still say who sits inside which collective, called
from which line: ranks 0-6 in ``all_reduce`` from ``train_step`` and rank 7 in ``load_batch`` is the same
picture the wait-for graph would give. Used only when no op evidence exists (the graph wins when it has edges).
"""
from __future__ import annotations

import re
from collections import Counter

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence, where
from ranktrace.analyzers.diagnose.context import Context
from ranktrace.analyzers.hoststate import TRACER_FRAME
from ranktrace.analyzers.stacks import normalise_frame
from ranktrace.analyzers.verdict import Finding, Operation, WaitEdge

__all__ = ["stacks_only", "collective_in_stack"]

_C10D_FRAME = re.compile(
    r"^(?:\w+\.)?(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|all_to_all\w*|"
    r"send|recv|isend|irecv|gather\w*|scatter\w*|reduce)\s\(.*distributed_c10d\.py:\d+\)")
_NATIVE = re.compile(r"nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv)\b")
_NATIVE_NAMES = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                 "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv"}


def collective_in_stack(frames: tuple[str, ...]) -> tuple[str, str | None] | None:
    """(op name, the application frame that called it) when a thread sits inside a torch.distributed collective."""
    for i, f in enumerate(frames):
        m = _C10D_FRAME.match(f)
        if m:
            caller = next((normalise_frame(g) for g in frames[i + 1:]
                           if "/torch/" not in g and "c10d_logger" not in g and "ranktrace" not in g
                           and not TRACER_FRAME.search(g)), None)
            return m.group(1), caller
    for f in frames:
        m = _NATIVE.search(f)
        if m:
            return _NATIVE_NAMES[m.group(1)], None
    return None


def stacks_only(ctx: Context) -> list[Candidate]:
    g = ctx.graph
    if g.edges or g.mismatches or g.stuck or not ctx.stacks:
        return []
    inside = {r: c for r, s in ctx.stacks.items() if (c := collective_in_stack(s.frames)) is not None}
    if not inside:
        return []
    (top, _n), = Counter(name for name, _ in inside.values()).most_common(1)
    waiting = tuple(sorted(r for r, (name, _) in inside.items() if name == top))
    universe = set(ctx.stacks) | (set(range(ctx.world)) if ctx.world else set())
    culprits = tuple(sorted(r for r in universe if r not in waiting and r in ctx.stacks))
    if not culprits:
        return []
    callers = Counter(c for r, (name, c) in inside.items() if name == top and c)
    site = callers.most_common(1)[0][0] if callers else None
    elsewhere = []
    for r in culprits:
        other = inside.get(r)
        elsewhere.append(f"{ranks_text([r])} is in {other[0]} instead" if other else
                         f"{ranks_text([r])} is in {where(ctx.stacks[r]) or 'another place'}")
    summary = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} inside {top}"
               + (f" (called from {site})" if site else "") + f" and {ranks_text(culprits)} never joined: "
               + "; ".join(elsewhere))
    ev = tuple(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in sorted(universe)
               if r in ctx.stacks)
    steps = [f"See why {ranks_text(culprits)} did not reach {top}" + (f" at {site}" if site else "")
             + ": its stack shows what it does instead (stacks alone carry no group or seq: add Flight Recorder "
               "dumps or run under `trace run` to pin the exact op)."]
    return [Candidate("missing_ranks", summary, culprits=culprits, waiting=waiting,
                      operation=Operation(name=top, callsite=site),
                      wait_for=tuple(WaitEdge(r, culprits, top, None, None) for r in waiting),
                      findings=[Finding("missing_ranks", summary + " (from stacks only)", culprits, 0.6, ev)],
                      next_steps=steps)]
