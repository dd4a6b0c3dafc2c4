"""The hot-path form of :meth:`tracer.recorder.Recorder.op`: one positional closure bound to a recorder's mapping.

Why: ``Recorder.op`` takes twenty keyword arguments and converts ``None`` to sentinels on every call (~520 ns);
the wrappers in tracer.hooks write two records per traced call and must stay under a microsecond in total. This
closure takes the already-interned ids and the ring's sentinels (:data:`N32`, :data:`N64`) positionally and does
exactly what ``Recorder.op`` does — same slot counter (so both can be used on one recorder, from any thread), same
seqlock order: commit word zeroed, record packed, commit word = index + 1 written last.

It binds the recorder's mapping, slot counter and offsets once, which are private to tracer.recorder; the layout
itself is tracer.ringformat's.
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Iterator

from .. import ringformat as rf
from .recorder import Recorder

__all__ = ["slot_writer", "ring_parts", "SlotWriter", "N32", "N64", "KIND", "CAT", "PACK", "COMMIT", "SLOT_SIZE"]

N32 = rf.NONE_I32
N64 = rf.NONE_I64
KIND = {k: i for i, k in enumerate(rf.KINDS)}
PACK = rf.SLOT.pack_into
COMMIT = struct.Struct("<Q").pack_into
SLOT_SIZE = rf.SLOT_SIZE
CAT = {c: i for i, c in enumerate(rf.CATEGORIES)}

# kind, cat, flags, name, group, callsite, dtype, shape, error, peer, graph, seq, backend_seq, nbytes, span, parent, tid
SlotWriter = Callable[[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int], None]


def ring_parts(rec: Recorder) -> tuple[Any, Iterator[int], int, int, Callable[[], int]]:
    """(mapping, slot counter, offset of slot 0, number of slots, clock) of `rec`, for writers that inline the three
    stores (tracer.hooks' op path does, to save a call per record). The commit word goes through COMMIT
    (``struct.pack_into``), not a u64 memoryview of the mapping: a view is ~20 ns cheaper per store but is an
    exported buffer, and ``Recorder.close`` would then fail with BufferError."""
    return rec._buf, rec._next, rec._ops_offset, rec.slots, rec.clock


def slot_writer(rec: Recorder) -> SlotWriter:
    """A positional writer of op records into `rec`'s wrapping region (see the module docstring)."""
    buf, nxt, base, slots, clock = ring_parts(rec)
    size = SLOT_SIZE
    pack = PACK
    commit = COMMIT

    def put(kind: int, cat: int, flags: int, name: int, group: int, callsite: int, dtype: int, shape: int,
            error: int, peer: int, graph: int, seq: int, bseq: int, nbytes: int, span: int, parent: int,
            tid: int) -> None:
        idx = next(nxt)
        off = base + (idx % slots) * size
        commit(buf, off, 0)
        pack(buf, off, 0, clock(), tid, kind, cat, flags, 0, name, group, callsite, dtype, shape, error, peer, graph,
             seq, bseq, nbytes, span, parent)
        commit(buf, off, idx + 1)

    return put
