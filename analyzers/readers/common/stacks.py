"""The one model of a thread's stack that every stack reader builds (py-spy, the in-rank agent, faulthandler, gdb,
tracebacks, the monitor's samples), and the one function that turns records into STACKS rows, so that every
source spells a thread the same way."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import pyarrow as pa

from ranktrace.tracer.formats import schema

__all__ = ["StackRecord", "stacks_table"]


@dataclass(slots=True)
class StackRecord:
    """One thread's stack in one snapshot, as a stack reader read it (mutable while the reader fills it in)."""

    source: str                     # pyspy | agent | faulthandler | gdb | traceback
    file: str                       # the file it was read from
    line: int | None                # where: the thread's header line (JSON, Arrow: the record's index)
    frames: list[str] | None = field(default_factory=list)
    # ^ innermost first: "func (file:line)", "func (lib.so)" for native frames, "func" when the dump gives no place;
    #   None only when a sample names a stack the file no longer holds
    ident: str | None = None        # the thread's id as the dump prints it: py-spy's tid or 0x ident, faulthandler's
    #                                 pthread id, gdb's thread number; None when the dump printed none
    tid: int | None = None          # OS thread id (LWP), when the dump gives one
    thread_name: str | None = None
    state: str = "unknown"          # idle | active | active+gil | unknown (dumps); exception | interrupted (tracebacks)
    native: bool = False            # the dump holds native (C/C++) frames
    pid: int | None = None
    rank: int | None = None
    host: str | None = None
    snapshot: str | None = None     # one capture (a dump, a burst, a sample): its stacks are compared together
    wall_ns: int | None = None
    t_ns: int | None = None


def stacks_table(records: Iterable[StackRecord]) -> pa.Table:
    """The STACKS rows of `records`, in their order."""
    return schema.table_from_rows(schema.STACKS, (
        {"host": r.host, "pid": r.pid, "tid": r.tid, "rank": r.rank, "wall_ns": r.wall_ns, "t_ns": r.t_ns,
         "thread_name": r.thread_name, "thread_state": r.state, "frames": r.frames, "native": r.native,
         "snapshot": r.snapshot, "source": r.source, "file": r.file, "line": r.line}
        for r in records))
