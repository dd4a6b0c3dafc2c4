"""The Python wrappers' writer of op records, and the integer codes those records carry.

``Recorder.op`` takes keyword arguments and converts ``None`` to sentinels on every call (~520 ns); a wrapper
writes two records per traced call, so it uses this positional closure instead: same slot counter, same
seqlock order, already-interned ids and the ring's sentinels (N32, N64), and the same tail-index update
(recorder.TailIndex: one dict lookup and one store a record).
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Iterator

from ..formats import ringformat as rf
from .recorder import Recorder

__all__ = [
    "slot_writer", "ring_parts", "tail_store", "SlotWriter", "N32", "N64", "KIND", "CAT", "PACK", "COMMIT", "SLOT_SIZE",
    "ENTER", "EXIT", "ERROR", "COMPLETE", "MARK", "C_COLL", "C_P2P", "C_GRAPH", "C_SYNC", "F_CAPTURING", "F_ASYNC",
]

N32 = rf.NONE_I32
N64 = rf.NONE_I64
KIND = {k: i for i, k in enumerate(rf.KINDS)}
CAT = {c: i for i, c in enumerate(rf.CATEGORIES)}
PACK = rf.SLOT.pack_into
COMMIT = struct.Struct("<Q").pack_into
SLOT_SIZE = rf.SLOT_SIZE

ENTER, EXIT, ERROR, COMPLETE, MARK = (KIND[k] for k in ("enter", "exit", "error", "complete", "mark"))
C_COLL, C_P2P, C_GRAPH, C_SYNC = CAT["collective"], CAT["p2p"], CAT["graph"], CAT["sync"]
F_CAPTURING, F_ASYNC = rf.FLAG_CAPTURING, rf.FLAG_ASYNC
assert SLOT_SIZE == 128 and (ENTER, EXIT) == (0, 1)  # wrap_ops inlines both in its op path

# kind, cat, flags, name, group, callsite, dtype, shape, error, peer, graph, seq, backend_seq, nbytes, span, parent, tid
SlotWriter = Callable[[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int], None]


def ring_parts(rec: Recorder) -> tuple[Any, Iterator[int], int, int, Callable[[], int], dict[int, int],
                                       Callable[[int], int]]:
    """(mapping, slot counter, offset of slot 0, number of slots, clock, tail-index offsets by key, the function that
    takes a key's entry on its first record) of `rec`, for writers that inline the stores (wrap_ops' op path and
    _fastspan.c do, to save a call per record). The commit word goes through COMMIT
    (``struct.pack_into``), not a u64 memoryview of the mapping: a view is ~20 ns cheaper per store but is an
    exported buffer, and ``Recorder.close`` would then fail with BufferError."""
    return rec._buf, rec._next, rec._ops_offset, rec.slots, rec.clock, rec.tail.offsets, rec.tail.entry


def tail_store(buf: Any, offsets: dict[int, int], entry: Callable[[int], int], cat: int, group: int, peer: int,
               name: int, tid: int, field: int, idx: int) -> None:
    """The tail-index store of an inlined enter or exit record (`field`: ringformat.TAIL_FIELD of its kind)."""
    off = offsets.get(rf.tail_key(cat, group, peer, name, tid))
    if off is None:
        off = entry(rf.tail_key(cat, group, peer, name, tid))
    if off is None:
        off = entry(key)
    if off >= 0:
        COMMIT(buf, off + field, idx + 1)


def slot_writer(rec: Recorder) -> SlotWriter:
    """A positional writer of op records into `rec`'s wrapping region: commit word zeroed, record packed, commit
    word = index + 1 written last (what ``Recorder.op`` does, so both may write one ring from any thread)."""
    buf, nxt, base, slots, clock, offsets, entry = ring_parts(rec)
    size = SLOT_SIZE
    pack = PACK
    commit = COMMIT
    fields = rf.TAIL_FIELD
    rare = rec.tail.rare

    def put(kind: int, cat: int, flags: int, name: int, group: int, callsite: int, dtype: int, shape: int,
            error: int, peer: int, graph: int, seq: int, bseq: int, nbytes: int, span: int, parent: int,
            tid: int) -> None:
        idx = next(nxt)
        off = base + (idx % slots) * size
        commit(buf, off, 0)
        pack(buf, off, 0, clock(), tid, kind, cat, flags, 0, name, group, callsite, dtype, shape, error, peer, graph,
             seq, bseq, nbytes, span, parent)
        commit(buf, off, idx + 1)
        key = ((tid << 32) | group) * 8 if cat == 0 else (  # ringformat.tail_key, inlined
            (((((tid << 32) | name) << 32) | (peer & 0xFFFFFFFF)) << 32 | group) * 8 + 1 if cat == 1
            else -(tid * 8 + cat) - 1)
        toff = offsets.get(key)
        if toff is None:
            toff = entry(key)
        if toff >= 0:
            commit(buf, toff + fields[kind], idx + 1)
        if kind == 2 or kind == 4:  # error, mark
            rare(toff, idx)

    return put
