"""The verdict model (DESIGN §5 contract): typed, frozen, and serialised 1:1 to the JSON that outside checks read.

``Verdict.to_dict`` *is* the JSON output (``trace analyze --json``, ``<run>/verdict.json``) and ``Verdict.from_dict``
reads it back, so a saved verdict can be re-rendered and the two never drift apart. Add fields freely; renaming or
removing one needs a schema version bump.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SCHEMA", "STATUSES", "KINDS", "Evidence", "Finding", "Operation", "WaitEdge", "RankState", "Verdict",
           "InputSummary", "PhaseEntry", "HostSummary",
           "compact_ranks", "operation_text", "PHASE_TEXT", "phase_text"]

SCHEMA = "ranktrace.verdict/1"
STATUSES = ("hang", "completed", "crashed", "idle", "inconclusive", "interrupted", "stopped")
KINDS = ("missing_ranks", "collective_mismatch", "stuck_in_collective", "graph_capture", "init_hang", "rank_exited",
         "blocked_outside_collective", "wait_cycle", "no_hang", "unknown")


@dataclass(frozen=True)
class Evidence:
    source: str            # events | pyspy | nccl | fr | watchdog | ras | proc | gpu | meta | server_log | ...
    file: str | None = None
    line: int | None = None  # line in file, or record index for binary sources
    detail: str = ""
    rank: int | None = None


@dataclass(frozen=True)
class Finding:
    kind: str
    summary: str
    ranks: tuple[int, ...] = ()
    confidence: float = 0.5
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class Operation:
    name: str
    group: str | None = None
    group_desc: str | None = None
    group_ranks: tuple[int, ...] | None = None
    seq: int | None = None
    dtype: str | None = None
    shape: str | None = None
    phase: str | None = None
    peer: int | None = None
    callsite: str | None = None
    phase_detail: str | None = None   # the instance of that phase (bs=64)


@dataclass(frozen=True)
class PhaseEntry:
    """One start-up phase of one rank (analyzers/model/phases.py): DESIGN §5's ``phases`` list."""

    rank: int | None          # None: a process without a rank (the server's main process)
    name: str                 # torch_distributed_init | weight_loading | kv_cache_alloc | cuda_graph_capture | ...
    detail: str | None = None  # bs=64
    start_ns: int | None = None  # wall clock, ns since the epoch
    seconds: float | None = None  # how long it took; an open phase: up to the time of the analysis's evidence
    open: bool = False
    source: str = "events"    # events (the rings) | server_log (the job's output)
    file: str | None = None
    line: int | None = None
    failed: bool = False      # it ended by raising

    def to_dict(self) -> dict[str, Any]:
        start = None
        if self.start_ns is not None:
            import datetime as _dt

            start = _dt.datetime.fromtimestamp(self.start_ns / 1e9, tz=_dt.timezone.utc).isoformat(
                timespec="milliseconds")
        return {"rank": self.rank, "name": self.name, "detail": self.detail, "start": start,
                "start_ns": self.start_ns, "seconds": None if self.seconds is None else round(self.seconds, 3),
                "open": self.open, "source": self.source, "file": self.file, "line": self.line,
                "failed": self.failed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PhaseEntry":
        return cls(rank=d.get("rank"), name=d["name"], detail=d.get("detail"), start_ns=d.get("start_ns"),
                   seconds=d.get("seconds"), open=bool(d.get("open")), source=d.get("source", "events"),
                   file=d.get("file"), line=d.get("line"), failed=bool(d.get("failed")))


@dataclass(frozen=True)
class WaitEdge:
    rank: int
    waits_on: tuple[int, ...]
    op: str
    group: str | None
    seq: int | None


@dataclass(frozen=True)
class RankState:
    state: str = "unknown"   # host_sync_wait | in_collective | blocked_other | idle_loop | running | exited | unknown
    phase: str | None = None
    innermost_open: str | None = None
    stack: tuple[str, ...] = ()
    last_op: str | None = None
    pids: tuple[int, ...] = ()
    where: str | None = None  # innermost frame of the program itself (not stdlib, torch or ranktrace)
    phase_detail: str | None = None   # the instance of its phase (bs=64)
    phase_seconds: float | None = None  # how long it has been in that phase (or took, when none is open)
    roles: str | None = None  # what the framework calls this process: "DP1 TP3 EP3" (DP replica, attention TP, ...)
    exit: str | None = None   # how its process ended ("exit code 7"; "no exit record: ..."), once it did
    host: str | None = None   # the host it ran on, when the run spans hosts (left out of the JSON otherwise)
    # what it is blocked on (analyzers/model/blocked.py): in_collective | lock_wait | stopped | in_kernel |
    # waiting_on_process | busy | unknown, and the sentence; left out of the JSON where nothing says it
    blocked: str | None = None
    blocked_detail: str | None = None


@dataclass(frozen=True)
class HostSummary:
    """One host of a run that spans hosts: its ranks, and its clock against the reference host's (analyzers.clocks:
    offset and +- error in ns; basis reference | collectives | approximate | none, from `clock_ops` collectives)."""

    host: str
    ranks: tuple[int, ...] = ()
    clock_offset_ns: int | None = None
    clock_error_ns: int | None = None
    clock_basis: str = "none"
    clock_ops: int = 0


@dataclass(frozen=True)
class InputSummary:
    """How one input file was read: the families that recognised it, the ranks it named, the lines used."""

    file: str
    recognised: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    lines_used: int | None = None
    lines_total: int | None = None
    note: str = ""

    def text(self) -> str:
        what = ", ".join(self.recognised) if self.recognised else "not recognised"
        parts = [f"{self.file}: {what}"]
        if self.ranks:
            parts.append(("rank " if len(self.ranks) == 1 else "ranks ") + compact_ranks(self.ranks))
        if self.lines_total:
            parts.append(f"{self.lines_used or 0} of {self.lines_total} lines used")
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)


@dataclass(frozen=True)
class Verdict:
    status: str
    kind: str
    summary: str
    operation: Operation | None = None
    culprit_ranks: tuple[int, ...] = ()
    waiting_ranks: tuple[int, ...] = ()
    unobserved_ranks: tuple[int, ...] = ()
    rank_space: str = "global"
    wait_for: tuple[WaitEdge, ...] = ()
    findings: tuple[Finding, ...] = ()
    next_steps: tuple[str, ...] = ()
    ranks: dict[int, RankState] = field(default_factory=dict)
    world_size: int | None = None
    stack_tree: str = ""     # merged STAT-style tree, rendered (text)
    inputs: tuple[str, ...] = ()
    input_reads: tuple[InputSummary, ...] = ()
    phases: tuple[PhaseEntry, ...] = ()
    hosts: tuple[HostSummary, ...] = ()   # a run across hosts (in the JSON only then)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not one of {STATUSES}")
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} not one of {KINDS}")

    def to_dict(self) -> dict[str, Any]:
        op = None
        if self.operation is not None:
            op = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.operation).items()}
        return {
            "schema": SCHEMA,
            "status": self.status,
            "kind": self.kind,
            "summary": self.summary,
            "operation": op,
            "culprit_ranks": list(self.culprit_ranks),
            "waiting_ranks": list(self.waiting_ranks),
            "unobserved_ranks": list(self.unobserved_ranks),
            "rank_space": self.rank_space,
            "world_size": self.world_size,
            "wait_for": [{"rank": e.rank, "waits_on": list(e.waits_on), "op": e.op, "group": e.group, "seq": e.seq}
                         for e in self.wait_for],
            "findings": [
                {"kind": f.kind, "summary": f.summary, "ranks": list(f.ranks), "confidence": f.confidence,
                 "evidence": [asdict(e) for e in f.evidence]}
                for f in self.findings
            ],
            "next_steps": list(self.next_steps),
            "ranks": {str(r): _rank_dict(s) for r, s in sorted(self.ranks.items())},
            "stack_tree": self.stack_tree,
            "inputs": list(self.inputs),
            "input_reads": [{**asdict(i), "recognised": list(i.recognised), "ranks": list(i.ranks)}
                            for i in self.input_reads],
            "phases": [p.to_dict() for p in self.phases],
            **({"hosts": [{**asdict(h), "ranks": list(h.ranks)} for h in self.hosts]} if self.hosts else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema {d.get('schema')!r})")
        op = d.get("operation")
        operation = None
        if op:
            op = dict(op)
            if op.get("group_ranks") is not None:
                op["group_ranks"] = tuple(op["group_ranks"])
            operation = Operation(**op)
        return cls(
            status=d["status"], kind=d["kind"], summary=d["summary"], operation=operation,
            culprit_ranks=tuple(d.get("culprit_ranks", ())), waiting_ranks=tuple(d.get("waiting_ranks", ())),
            unobserved_ranks=tuple(d.get("unobserved_ranks", ())), rank_space=d.get("rank_space", "global"),
            wait_for=tuple(WaitEdge(e["rank"], tuple(e["waits_on"]), e["op"], e.get("group"), e.get("seq"))
                           for e in d.get("wait_for", ())),
            findings=tuple(Finding(f["kind"], f["summary"], tuple(f.get("ranks", ())), f.get("confidence", 0.5),
                                   tuple(Evidence(**e) for e in f.get("evidence", ())))
                           for f in d.get("findings", ())),
            next_steps=tuple(d.get("next_steps", ())),
            ranks={int(r): RankState(**{**s, "stack": tuple(s.get("stack", ())), "pids": tuple(s.get("pids", ()))})
                   for r, s in d.get("ranks", {}).items()},
            world_size=d.get("world_size"), stack_tree=d.get("stack_tree", ""), inputs=tuple(d.get("inputs", ())),
            input_reads=tuple(InputSummary(**{**i, "recognised": tuple(i.get("recognised", ())),
                                              "ranks": tuple(i.get("ranks", ()))}) for i in d.get("input_reads", ())),
            phases=tuple(PhaseEntry.from_dict(p) for p in d.get("phases", ())),
            hosts=tuple(HostSummary(**{**h, "ranks": tuple(h.get("ranks", ()))}) for h in d.get("hosts", ())),
        )


def _rank_dict(s: RankState) -> dict[str, Any]:
    d = {**asdict(s), "stack": list(s.stack), "pids": list(s.pids)}
    if d["host"] is None:  # one host: the JSON as it was before runs spanned hosts
        del d["host"]
    for key in ("blocked", "blocked_detail"):
        if d[key] is None:  # no blocked-state facts: the JSON as it was before them
            del d[key]
    return d


def compact_ranks(ranks: Iterable[int]) -> str:
    """'0-6,8' style rank sets, as STAT and people write them.

    >>> compact_ranks([0, 1, 2, 3, 4, 5, 6, 8])
    '0-6,8'
    >>> compact_ranks([])
    ''
    """
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def operation_text(op: Operation) -> str:
    """'all_reduce, group 0 (default_pg), members 0-3, seq 5, float32 [64, 64], at train.py:77 step' — the
    operation line every renderer shows."""
    bits = [op.name or "(collective not named)"]
    if op.group is not None:
        bits.append(f"group {op.group}" + (f" ({op.group_desc})" if op.group_desc else ""))
    if op.group_ranks:
        bits.append(f"members {compact_ranks(op.group_ranks)}")
    if op.seq is not None:
        bits.append(f"seq {op.seq}")
    if op.dtype or op.shape:
        bits.append(" ".join(x for x in (op.dtype, op.shape) if x))
    if op.callsite:
        bits.append(f"at {op.callsite}")
    return ", ".join(bits)


# how a person reads a phase name
PHASE_TEXT = {
    "torch_distributed_init": "torch distributed init", "weight_loading": "weight loading",
    "memory_profiling": "memory profiling", "kv_cache_alloc": "KV cache allocation", "kernel_warmup": "kernel warm-up",
    "attention_backend_init": "attention back-end init", "cuda_graph_init": "CUDA-graph set-up",
    "cuda_graph_capture": "cuda-graph capture", "prefill_graph_capture": "prefill cuda-graph capture",
    "draft_graph_init": "draft (EAGLE) CUDA-graph set-up", "draft_graph_capture": "draft (EAGLE) cuda-graph capture",
    "draft_extend_graph_capture": "draft-extend cuda-graph capture", "draft_weight_loading": "draft weight loading",
    "warmup": "warm-up", "server_warmup": "server warm-up", "serving": "serving",
}


def phase_text(name: str, detail: str | None = None) -> str:
    """'cuda_graph_capture', 'bs=64' -> 'cuda-graph capture bs=64' (verdict text and the watchdog's line)."""
    return PHASE_TEXT.get(name, name.replace("_", " ")) + (f" {detail}" if detail else "")
