"""The analysis as plain values: what goes in besides the files (``Liveness``) and what comes out (``Analysis``,
``Comparison``). Renderers, the watchdog and the CLI read these and nothing deeper; it imports only the verdict."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from ranktrace.analyzers.verdict import Verdict

if TYPE_CHECKING:  # a type name only: the model must not pull the readers in at run time
    from ranktrace.analyzers.readers.base import Skipped

__all__ = ["Liveness", "HostRun", "JobStatus", "OpenSpan", "Analysis", "FactDiff", "DecisionDiff", "OpRef", "Divergence",
           "PhaseTiming", "LatencyRow", "Comparison"]


@dataclass(frozen=True)
class Liveness:
    """Which of a trace's processes were alive when the capture side looked, on its own machine.

    The analysis never looks at a process table itself: the same files give the same verdict wherever they are
    analyzed. ``None`` instead of a Liveness means nobody looked (an offline analysis): the job state of an
    unfinished run is then unknown, never "gone". A host dir missing from `live_pids` was not looked at either
    (another machine's, or not among the paths checked).
    """

    host: str                                  # the machine that looked (os.uname().nodename)
    checked_at: float                          # when (time.time())
    live_pids: Mapping[str, frozenset[int]] = field(default_factory=dict)  # host dir (real path) -> its live pids

    @staticmethod
    def key(host_dir: Path | str) -> str:
        return os.path.realpath(host_dir)

    def pids_at(self, host_dir: Path | str) -> frozenset[int] | None:
        """The live pids of this host dir's job, or None when it was not looked at."""
        return self.live_pids.get(self.key(host_dir))


@dataclass(frozen=True)
class HostRun:
    """One ranktrace host directory that was read: its meta.json (if readable) and whether its job has ended."""

    host_dir: Path
    meta: dict[str, Any] | None
    ended: bool


@dataclass(frozen=True)
class JobStatus:
    """What the job itself did, from meta.json plus the Liveness it was given (None fields for foreign inputs)."""

    traced: bool
    ended: bool
    exit_code: int | None
    signal: int | None
    live_pids: tuple[int, ...] = ()
    liveness_known: bool = False  # every host dir of the run was looked at: "not alive" then means gone
    killed_on_hang: bool = False  # ranktrace's --on-hang kill ended it: the job was hung, not crashed
    interrupted_ns: int | None = None   # wall clock of the SIGINT trace run forwarded (a Ctrl-C): its own outcome
    lost_ns: int | None = None          # trace run was lost (killed) then and its guardian ended the job
    stopped_ns: int | None = None       # wall clock of the first INT/TERM/HUP/QUIT trace run forwarded to the job,
    #                                     less model.build.STOP_SLACK_NS (the signal may have come earlier)

    @property
    def interrupted(self) -> bool:
        return self.interrupted_ns is not None

    @property
    def ended_from_outside_ns(self) -> int | None:
        """When something outside the job began ending it: a stop trace run forwarded, else the moment trace run was
        lost and its guardian ended the job. Exits and errors after it are that ending's, not the job's own."""
        return self.stopped_ns if self.stopped_ns is not None else self.lost_ns

    @property
    def state(self) -> str:
        """ended | cut (trace run was killed; its guardian ended the job) | running (some process alive) | gone (none
        alive, no exit status) | unknown (nobody looked)."""
        if self.ended:
            return "ended"
        if self.lost_ns is not None:
            return "cut"
        if not self.traced or not self.liveness_known:
            return "unknown"
        return "running" if self.live_pids else "gone"


@dataclass(frozen=True)
class OpenSpan:
    """An ENTER with no EXIT/ERROR yet: what a rank is inside right now (or was when it died)."""

    rank: int | None
    pid: int | None
    tid: int | None
    name: str
    category: str
    group: str | None
    seq: int | None
    t_ns: int | None
    callsite: str | None
    capturing: bool
    graph_id: int | None
    source: str | None
    file: str | None
    line: int | None
    detail: str | None


@dataclass(frozen=True, eq=False)
class Analysis:
    """One analysis of some inputs: the verdict and the tables behind it (the timeline renderers draw these)."""

    verdict: Verdict
    events: pa.Table                       # schema.EVENTS of every input (NCCL RAS counts become op rows too)
    ops: pa.Table                          # timeline.OPS: one row per (rank, channel, seq)
    stacks: pa.Table                       # schema.STACKS: stack samples and dumps
    observations: pa.Table                 # schema.OBSERVATIONS
    open_spans: tuple[OpenSpan, ...]       # calls entered and never left, in time order
    open_rows: tuple[int, ...]             # the rows of `events` those calls entered in, ascending
    job: JobStatus
    liveness: Liveness | None              # as given; None: an offline analysis
    hosts: tuple[HostRun, ...] = ()        # ranktrace host dirs read
    files: tuple[str, ...] = ()            # every file a reader read
    skipped: tuple["Skipped", ...] = ()    # what was not used, and why
    windowed: bool = False                 # records of ours were left out (each rank's latest ones were read)

    def inside(self) -> dict[int, OpenSpan]:
        """Per rank, the innermost (latest) call it entered and never left: who is inside what right now."""
        out: dict[int, OpenSpan] = {}
        for s in self.open_spans:
            if s.rank is not None:
                out[s.rank] = s
        return out

    def meta(self) -> dict[str, Any]:
        """The first readable meta.json of the run ({} for foreign inputs)."""
        return next((h.meta for h in self.hosts if h.meta), {})


@dataclass(frozen=True)
class FactDiff:
    """One fact of `trace compare`'s first answer (hardware, software, topology, environment, job) in A and B."""

    section: str                 # hardware | software | topology | environment | job
    key: str                     # "GPU model", "compute capability", "NCCL", "NCCL_P2P_DISABLE", ...
    a: str | None
    b: str | None
    status: str                  # differs | same | only_a | only_b (the other side does not say)
    source_a: str | None = None  # where A's value was read (meta.json, an NCCL log line, an nsys table, ...)
    source_b: str | None = None


@dataclass(frozen=True)
class DecisionDiff:
    """What NCCL decided for one communicator, compared across the two runs (scope ``runs``: a = A's choice, b = B's)
    or between the ranks of one run (scope ``within_a`` / ``within_b``: a = what most ranks chose, b = what
    ``ranks`` chose instead; a rank that took another path is a known precursor of hangs)."""

    scope: str                   # runs | within_a | within_b
    comm: str                    # "8-rank communicator 1" (matched across runs by size and order of creation)
    what: str                    # transport | transport to peer 3 | channels | nodes | ring | tree | algorithm
                                 # all_reduce | NCCL_P2P_LEVEL | network | ...
    ranks: tuple[int, ...]       # the ranks this row is about (empty: the whole communicator or every process)
    a: str | None
    b: str | None
    differs: bool = True
    evidence: tuple[str, ...] = ()   # file:line of the lines that say it
    who: str = ""                # ranks written out, or processes when the log does not name ranks ("pid 1234")


@dataclass(frozen=True)
class OpRef:
    """One op of a rank's sequence, as trace compare aligns them: (phase, group, op, seq, shape)."""

    op: str
    group: str | None = None
    seq: int | None = None
    phase: str | None = None
    dtype: str | None = None
    shape: str | None = None
    callsite: str | None = None

    def label(self) -> str:
        text = f"{self.op} {self.group or '?'} seq {self.seq if self.seq is not None else '?'}"
        if self.dtype or self.shape:
            text += f" {self.dtype or ''}{self.shape or ''}"
        if self.phase:
            text += f" (in {self.phase})"
        return text


@dataclass(frozen=True)
class Divergence:
    rank: int
    position: int              # index in the rank's op sequence
    a: str | None              # what A issued there (None: A had stopped)
    b: str | None
    a_callsite: str | None = None
    b_callsite: str | None = None
    a_op: OpRef | None = None
    b_op: OpRef | None = None


@dataclass(frozen=True)
class PhaseTiming:
    """A phase's duration in both runs (seconds; the longest rank), e.g. init_process_group, loading weights, the KV
    pool, a CUDA graph capture of one batch size."""

    name: str
    a_s: float | None
    b_s: float | None
    ratio: float | None = None   # b / a
    source: str = ""


@dataclass(frozen=True)
class LatencyRow:
    """Per-op latency of one (op, size) in both runs, from one kind of evidence (`basis`)."""

    op: str
    nbytes: int | None
    basis: str                   # host call (our rings) | GPU kernel (nsys) | kernel (Kineto) | ... | enqueue interval
    a_n: int = 0
    a_p50_us: float | None = None
    a_p99_us: float | None = None
    b_n: int = 0
    b_p50_us: float | None = None
    b_p99_us: float | None = None
    ratio_p50: float | None = None   # b / a
    ratio_p99: float | None = None


@dataclass
class Comparison:
    """`trace compare A B`, in the order a person asks (see analyzers.compare for how each part is found):
    1. hardware and software (``context_diff``, differences first); 2. what NCCL decided (``nccl_diff``);
    3. outcome (``verdict_a``, ``verdict_b``); 4. where B departed from A (``first_divergence``); 5. timings
    (``phases``, ``latency``)."""

    a: str
    b: str
    a_inputs: str = ""                 # what A was made of ("ranktrace run, 4 ranks", "NCCL log", ...)
    b_inputs: str = ""
    related: bool = True               # False: two different jobs; no divergence is reported then
    relation: str = ""                 # why they count as the same job or not
    context_diff: list[FactDiff] = field(default_factory=list)
    nccl_diff: list[DecisionDiff] = field(default_factory=list)
    verdict_a: Verdict | None = None
    verdict_b: Verdict | None = None
    first_divergence: list[Divergence] = field(default_factory=list)
    sequence_note: str = ""            # how the sequences were aligned (source, shapes left out, ranks in one run only)
    phases: list[PhaseTiming] = field(default_factory=list)
    latency: list[LatencyRow] = field(default_factory=list)
    op_counts: list[tuple[str, int, int]] = field(default_factory=list)  # (op, count in A, count in B)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict, fields

        out: dict[str, Any] = {"schema": "ranktrace.compare/1", "summary": self.summary()}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Verdict):
                out[f.name] = v.to_dict()
            elif isinstance(v, list):
                out[f.name] = [asdict(x) if hasattr(x, "__dataclass_fields__") else x for x in v]
            else:
                out[f.name] = v
        return out

    @property
    def differences(self) -> list[FactDiff]:
        return [f for f in self.context_diff if f.status == "differs"]

    def summary(self) -> str:
        if not self.related:
            return f"A and B look like different jobs ({self.relation}): no divergence is reported"
        if not self.first_divergence:
            if self.sequence_note.startswith("no op sequence"):
                return self.sequence_note
            return "the runs issued the same collectives in the same order on every rank both observed"
        d = min(self.first_divergence, key=lambda x: (x.position, x.rank))
        if d.b is None:
            return f"rank {d.rank}: A went on to {d.a} where B stopped (op #{d.position})"
        if d.a is None:
            return f"rank {d.rank}: B went on to {d.b} where A stopped (op #{d.position})"
        return f"rank {d.rank}: op #{d.position} is {d.a} in A but {d.b} in B"
