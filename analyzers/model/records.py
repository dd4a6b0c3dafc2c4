"""What the inputs stage hands the model: the readers' records merged into the common tables, and a way to ask for
records the window left out. The model is built from these alone (``model.build``); it never finds or reads a
file itself, so this module names the hand-off and nothing on the inputs side."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from ranktrace.analyzers.model.values import HostRun

if TYPE_CHECKING:  # a type name only: nothing of the readers is loaded by the model
    from ranktrace.analyzers.readers.base import Skipped

__all__ = ["Inputs", "InputRead", "RecordWindow", "MoreRecords", "MAX_WORLD", "Prefixes"]

# More ranks than any job has (the largest runs have ~10^5): a world size above this is a damaged or hand-edited
# field, and believing it costs the analysis time and memory linear in it (a RAS dump saying 2^70 never ended).
MAX_WORLD = 1 << 18

# rank -> (codes of the ops it ran before its window, into the label table beside them, how many kept ops are among
# them): what each rank ran before the records an analysis kept (inputs.own_records.Window.prefixes).
Prefixes = dict[int, tuple[np.ndarray, list[str | None], int]]


class RecordWindow(Protocol):
    """What the model needs to know of the window our own records were read through (inputs.own_records.Window)."""

    @property
    def cut(self) -> bool:
        """Whether any record was left out."""
        ...


class MoreRecords(Protocol):
    """How the build stage asks for records the window left out, without reading anything itself (the inputs
    stage's ``inputs.collect.Rereader`` answers; None where there is no window to widen)."""

    def wanted(self, ops: pa.Table) -> frozenset[tuple[str, int]]:
        """(channel, seq) of ops the window may have cut short and the wait-for graph compares."""
        ...

    def with_ops(self, keys: frozenset[tuple[str, int]]) -> Inputs:
        """The inputs read again with those ops kept."""
        ...

    def earlier_ops(self) -> Prefixes:
        """What each rank ran before its window (for departures from the majority, asked only on a wait cycle)."""
        ...


@dataclass(frozen=True)
class InputRead:
    """How one input file was read: which families recognised it, the ranks it named, the lines used."""

    file: str
    recognised: tuple[str, ...]
    ranks: tuple[int, ...] = ()
    lines_used: int | None = None
    lines_total: int | None = None
    note: str = ""


@dataclass(frozen=True)
class Inputs:
    """The readers' records, merged: one events, one stacks and one observations table (tracer.formats.schema), the
    host runs of our own traces, and what was read how. The model builds a new value where it aligns clocks or
    widens the window; it never changes this one."""

    events: pa.Table
    stacks: pa.Table
    observations: pa.Table
    skipped: list[Skipped] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    formats: dict[str, list[str]] = field(default_factory=dict)
    hosts: list[HostRun] = field(default_factory=list)
    world_size: int | None = None
    reads: list[InputRead] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    window: Any = None   # a RecordWindow: what the host dirs' own records were read through (issue #19)

    @property
    def has_ranktrace(self) -> bool:
        return bool(self.hosts)

    @property
    def windowed(self) -> bool:
        """Whether some of our own records were left out of this analysis."""
        return bool(self.window is not None and self.window.cut)
