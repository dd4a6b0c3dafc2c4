"""Byte layout of a recorder ring file: what the rank writes (tracer/rank/recorder.py) and the host reads
(ringreader.py). Stdlib only: every rank imports it.

Layout (little endian)::

    [0, HEADER_SIZE)              header: magic, version, pid, clock pair, region sizes, host, proctitle; at
                                  IDENT_OFFSET the writer's identity (its start time, /proc/self/stat field 22);
                                  at TAIL_OFFSET (version 2) the tail index
    [META_OFFSET, +meta_size)     non-wrapping region: records  u32 length | u32 commit | JSON bytes
                                  (identity, groups, interned strings, phases, init ops, graph captures)
    [ops_offset, +slots*SLOT)     wrapping region: fixed-size op records, slot = index % slots

Each op slot starts with a u64 commit word = record index + 1, written *last* (a writer first zeroes it). A reader
accepts a slot only if its commit word is non-zero, and orders slots by it; a slot overwritten mid-read shows a
changed commit word on the second read and is dropped (seqlock). A record cut by SIGKILL mid-write keeps commit 0.
The meta region does not wrap: when it is full, later strings are recorded as "?" and a header flag is set.

The tail index (version 2, issue #28) is what lets a reader take a ring's window without reading the whole ring:
the records an analysis needs whatever their age are each one's latest of its kind, so the writers keep, per *key*
(a collective channel: its group; a p2p channel: group, peer and op name; each with the thread; any other
category: the thread), the
index + 1 of its latest enter, end (exit or error), complete, and error-or-mark record (TAIL_ENTRY, one of
TAIL_ENTRIES, taken in first-use order; when they run out TAIL_OVERFLOW is set and readers read the whole ring),
and of every error or mark record a count and the last TAIL_RARE of them. A value is written after the record's
commit word, so the index is never ahead of the slots; a reader takes the newest record from it and reads a little
past it. Version 1 rings (no index) are read whole.
"""
from __future__ import annotations

import struct

__all__ = [
    "MAGIC", "VERSION", "HEADER", "HEADER_SIZE", "META_OFFSET", "META_REC", "META_COMMIT", "SLOT", "SLOT_SIZE",
    "SLOT_WORDS", "IDENT", "IDENT_OFFSET", "IDENT_MAGIC", "VERSIONS", "TAIL_OFFSET", "TAIL_HEAD", "TAIL_MAGIC",
    "TAIL_RARE", "TAIL_RARE_OFFSET", "COMMIT_WORD", "TAIL_ENTRY", "TAIL_ENTRIES_OFFSET", "TAIL_ENTRIES", "TAIL_OVERFLOW", "TAIL_FIELD",
    "tail_key", "KINDS", "CATEGORIES", "FLAG_CAPTURING", "FLAG_ASYNC", "FLAG_META_FULL", "NONE_I32", "NONE_I64",
]

MAGIC = b"RKTRING1"
VERSION = 2
VERSIONS = (1, 2)  # what readers accept: 1 has no tail index (read whole)
# magic, version, pid, mono0_ns, wall0_ns, meta_size, slot_size, slots, flags, host[64], proctitle[128]
HEADER = struct.Struct("<8sIIqqQIII64s128s")
HEADER_SIZE = 4096
# Who wrote the ring: magic, the writer's start time in clock ticks since boot (/proc/<pid>/stat field 22), so a
# process that got the pid later is never taken for it (tracer/launch/pidident.py). Rings made before it was added
# hold zeros here (no magic): their writer is known only to have started before the ring was made.
IDENT = struct.Struct("<8sQ")
IDENT_OFFSET = 512
IDENT_MAGIC = b"RKTIDNT1"
# The tail index: head (magic, flags, keys used, error-or-mark records written), then the index + 1 of the last
# TAIL_RARE error-or-mark records (slot = count % TAIL_RARE), then the entries (key, enter, end, complete, rare).
TAIL_OFFSET = 1024
TAIL_HEAD = struct.Struct("<8sIIQ")
TAIL_MAGIC = b"RKTTAIL1"
TAIL_OVERFLOW = 1
TAIL_RARE = 8
TAIL_RARE_OFFSET = TAIL_OFFSET + TAIL_HEAD.size
TAIL_ENTRY = struct.Struct("<qQQQQ")
TAIL_ENTRIES_OFFSET = TAIL_RARE_OFFSET + 8 * TAIL_RARE
TAIL_ENTRIES = (HEADER_SIZE - TAIL_ENTRIES_OFFSET) // TAIL_ENTRY.size
# byte offset in an entry of the value a record of each kind (KINDS order) updates: enter, exit, error, complete, mark
TAIL_FIELD = (8, 16, 16, 24, 32)
COMMIT_WORD = struct.Struct("<Q")   # a slot's first word, an index value
META_OFFSET = HEADER_SIZE
META_REC = struct.Struct("<II")
META_COMMIT = 0x52544B31  # "RTK1"
# commit, t_ns, tid, kind, category, flags, _pad, name, group, callsite, dtype, shape, error,
# peer, graph_id, seq, backend_seq, nbytes, span_id, parent_span_id
SLOT = struct.Struct("<QqIBBBBIIIIIIiiqqqqq")
SLOT_SIZE = 128
SLOT_WORDS = (SLOT.size + 7) // 8  # the 8-byte words of a slot that hold fields
assert SLOT.size <= SLOT_SIZE

KINDS = ("enter", "exit", "error", "complete", "mark")
CATEGORIES = ("collective", "p2p", "graph", "sync", "init", "phase", "user")
FLAG_CAPTURING = 1
FLAG_ASYNC = 2
FLAG_META_FULL = 1  # header flags
NONE_I32 = -(2**31)
NONE_I64 = -(2**63)


def tail_key(category: int, group: int, peer: int, name: int, tid: int) -> int:
    """The tail-index key of a record (category a CATEGORIES index): a collective's channel (its group) and thread, a
    p2p op's channel (group, peer, name: a send and a recv are two) and thread, any other record's category and
    thread. Per thread, so that every op a thread left open is its key's last enter. Distinct keys never collide
    (Python ints do not wrap); the compiled writer computes the same ints (for tids below 2**28)."""
    if category == 0:
        return ((tid << 32) | group) * 8
    if category == 1:
        return (((((tid << 32) | name) << 32) | (peer & 0xFFFFFFFF)) << 32 | group) * 8 + 1
    return -(tid * 8 + category) - 1
