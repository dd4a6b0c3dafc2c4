"""What a rule proposes: a possible verdict (kind, culprits, operation, summary) with its findings.

Rules return candidates in priority order; the API takes the first primary one as the verdict and keeps every
rule's findings as evidence. Helpers here turn ops and stacks into ``Evidence`` so every claim cites its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ranktrace.analyzers.model.hoststate import RankStack, application_frame, without_tracer
from ranktrace.analyzers.model.stacks import normalise_frame
from ranktrace.analyzers.verdict import Evidence, Finding, Operation, WaitEdge
from ranktrace.analyzers.model.waitfor import PendingOp

__all__ = ["Candidate", "from_burst", "op_evidence", "stack_evidence", "operation_of", "group_desc", "where", "ranks_text"]


@dataclass
class Candidate:
    kind: str
    summary: str
    culprits: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    operation: Operation | None = None
    wait_for: tuple[WaitEdge, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    primary: bool = True   # False: findings only, never the verdict
    stated: tuple[int, ...] = ()  # ranks an input names outright (a stall inspector's "missing ranks: 1, 5"):
    #                               witnessed even where no line of theirs is in the input (diagnose.arbitrate)


def from_burst(file: str | None) -> bool:
    """A stack read from a burst (``<host>/dumps/<time>/``: taken when the watchdog or `trace snapshot` found the job
    silent), not from the periodic samples."""
    return "/dumps/" in (file or "").replace("\\", "/")


def ranks_text(ranks: "tuple[int, ...] | list[int] | set[int]") -> str:
    from ranktrace.analyzers.verdict import compact_ranks

    rs = sorted(set(ranks))
    return ("rank " if len(rs) == 1 else "ranks ") + compact_ranks(rs)


def op_evidence(op: PendingOp, detail: str = "") -> Evidence:
    what = f"{op.name} group={op.group} seq={op.seq}"
    if op.peer is not None:
        what += f" peer={op.peer}"
    if op.callsite:
        what += f" at {op.callsite}"
    state = "completed" if op.completed else ("failed: " + (op.error or "") if op.errored else "issued, not completed")
    return Evidence(source=op.source or "events", file=op.file, line=op.line,
                    detail=f"{what}: {state}" + (f"; {detail}" if detail else ""), rank=op.rank)


def where(stack: RankStack | None) -> str | None:
    """The innermost frame of the application (not torch/stdlib) — 'next_batch (tp_job.py:50)'."""
    if stack is None or not stack.frames:
        return None
    app = application_frame(stack.frames)
    return normalise_frame(app if app is not None else stack.frames[0])


def stack_evidence(stack: RankStack, state: str) -> Evidence:
    """A stack's line; a process dumped with no rank (rank -1 in the model) is named by its pid, never as a rank."""
    top = " <- ".join(normalise_frame(f) for f in without_tracer(stack.frames)[:4])
    ranked = stack.rank >= 0
    who = f"thread {stack.thread_name}" if stack.thread_name else "its thread"
    if not ranked:
        who = (f"pid {stack.pid}, " if stack.pid else "a process with no rank, ") + who
    return Evidence(source=stack.source or "pyspy", file=stack.file, line=stack.line,
                    detail=f"{state}: {who} in {top}", rank=stack.rank if ranked else None)


def group_desc(desc: str | None) -> str | None:
    """A group's description when it says something: torch names every group created without one "undefined"."""
    return None if desc in (None, "", "undefined") else desc


def operation_of(op: PendingOp, group_ranks: tuple[int, ...] | None, phase: str | None = None) -> Operation:
    return Operation(name=op.name, group=op.group, group_desc=group_desc(op.group_desc), group_ranks=group_ranks,
                     seq=op.seq, dtype=op.dtype, shape=op.shape, phase=phase, peer=op.peer, callsite=op.callsite)
