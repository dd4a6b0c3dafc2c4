"""One ring's EVENTS table as a reader's result (tracer/formats/ringevents.py converts it; this adds what was
skipped: torn records, ops lost to the wrap)."""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.ringevents import ENCODED, identity_of, ring_to_events, roles_text

__all__ = ["ENCODED", "ring_to_events", "identity_of", "roles_text", "ring_result"]


def ring_result(path: str, rc: Any, host: str) -> ReadResult:
    """One ring read: its EVENTS, and a note each for meta records cut mid-write, op records lost to the wrap and
    a full meta region."""
    skipped: list[Skipped] = []
    if rc.torn_meta:
        skipped.append(Skipped(path, None, f"{rc.torn_meta} meta record(s) cut mid-write (process killed?)"))
    if rc.lost_ops:
        skipped.append(Skipped(path, None, f"{rc.lost_ops} older op record(s) overwritten by the ring wrap"))
    if rc.meta_full:
        skipped.append(Skipped(path, None, "meta region full: later strings recorded as '?'"))
    return ReadResult(file=path, format="ranktrace_ring", version=str(rf.VERSION),
                      events=ring_to_events(rc, host, path), skipped=tuple(skipped),
                      world_size=identity_of(rc).get("world"))
