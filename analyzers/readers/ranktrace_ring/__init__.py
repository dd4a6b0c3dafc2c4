"""ranktrace_ring: ranktrace's own ring files (``<run>/<host>/rings/*.ring``) of live, hung, killed or finished
ranks, read into EVENTS. Two files: the ring format itself is tracer/formats/ringformat.py (shared with the writer), so
the one stage here is :mod:`.events` (ring contents -> EVENTS)."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.ranktrace_ring.events import (ENCODED, identity_of, ring_result,
                                                               ring_to_events)
from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.ringreader import RingError, read_ring

__all__ = ["FORMAT", "FIELD_MAP", "ENCODED", "sniff", "read", "ring_to_events", "identity_of"]

FORMAT = "ranktrace_ring"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("slot t_ns", "EVENTS.t_ns, EVENTS.wall_ns", "CLOCK_MONOTONIC ns; wall = t - mono0 + wall0", "-", "1"),
    ColumnMap("slot kind, category", "EVENTS.kind, EVENTS.category", "ringformat.KINDS / CATEGORIES index", "-",
              "1"),
    ColumnMap("slot name, group, dtype, shape, callsite, error", "EVENTS.name group dtype shape callsite error",
              "string id into the meta region's strings", "null (id 0)", "1"),
    ColumnMap("slot seq, backend_seq, peer, graph_id, nbytes", "EVENTS.seq backend_seq peer graph_id nbytes",
              "int; ringformat NONE = null", "null", "1"),
    ColumnMap("slot flags", "EVENTS.capturing, EVENTS.async_op", "bit FLAG_CAPTURING / FLAG_ASYNC", "False", "1"),
    ColumnMap("slot span_id, parent_span_id", "EVENTS.span_id, EVENTS.parent_span_id", "int; parent 0 = null", "-",
              "1"),
    ColumnMap("slot commit", "EVENTS.line", "commit - 1 (meta events: -(index + 1))", "-", "1"),
    ColumnMap("meta identity record", "EVENTS.rank, EVENTS.world", "int", "null", "1"),
    ColumnMap("meta group record (desc, backend, ranks)", "EVENTS.group_desc backend group_ranks", "joined by name",
              "null", "1"),
    ColumnMap("meta event records (init, phases, graph captures)", "EVENTS.* (one row each)", "JSON", "-", "1"),
    ColumnMap("lost_ops (ring wrapped)", "EVENTS.kind=mark name=ring_wrapped detail", "count", "-", "1"),
)


def sniff(path: Path, head: bytes) -> bool:
    return head.startswith(rf.MAGIC)


def read(path: Path, host: str | None = None) -> ReadResult:
    """Read one ring file into EVENTS (plus a Skipped note for torn records or ops lost to the wrap)."""
    try:
        rc = read_ring(str(path))
    except (RingError, OSError) as e:
        raise ReaderError(path, str(e)) from e
    return ring_result(str(path), rc, host or rc.host)
