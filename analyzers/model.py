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

__all__ = ["Liveness", "HostRun", "JobStatus", "OpenSpan", "Analysis", "Divergence", "Comparison"]


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

    @property
    def interrupted(self) -> bool:
        return self.interrupted_ns is not None

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
class Divergence:
    rank: int
    position: int              # index in the rank's op sequence
    a: str | None              # what A issued there (None: A had stopped)
    b: str | None
    a_callsite: str | None = None
    b_callsite: str | None = None


@dataclass
class Comparison:
    """`trace compare A B`: how two runs differ (see analyzers.compare for how each part is found)."""

    a: str
    b: str
    context: list[tuple[str, Any, Any]] = field(default_factory=list)   # (key, value in A, value in B)
    outcome: tuple[str, str] = ("", "")
    divergences: list[Divergence] = field(default_factory=list)
    op_counts: list[tuple[str, int, int]] = field(default_factory=list)  # (op, count in A, count in B)
    timings: list[tuple[str, float | None, float | None]] = field(default_factory=list)  # seconds

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"schema": "ranktrace.compare/1", **asdict(self)}

    def summary(self) -> str:
        if not self.divergences:
            return "the runs issued the same collectives in the same order on every rank both observed"
        d = min(self.divergences, key=lambda x: (x.position, x.rank))
        if d.b is None:
            return f"rank {d.rank}: A went on to {d.a} where B stopped (op #{d.position})"
        if d.a is None:
            return f"rank {d.rank}: B went on to {d.b} where A stopped (op #{d.position})"
        return f"rank {d.rank}: op #{d.position} is {d.a} in A but {d.b} in B"
