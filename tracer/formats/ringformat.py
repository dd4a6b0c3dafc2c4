"""Byte layout of a recorder ring file: what the rank writes (tracer/rank/recorder.py) and the host reads
(ringreader.py). Stdlib only: every rank imports it.

Layout (little endian)::

    [0, HEADER_SIZE)              header: magic, version, pid, clock pair, region sizes, host, proctitle; at
                                  IDENT_OFFSET the writer's identity (its start time, /proc/self/stat field 22)
    [META_OFFSET, +meta_size)     non-wrapping region: records  u32 length | u32 commit | JSON bytes
                                  (identity, groups, interned strings, phases, init ops, graph captures)
    [ops_offset, +slots*SLOT)     wrapping region: fixed-size op records, slot = index % slots

Each op slot starts with a u64 commit word = record index + 1, written *last* (a writer first zeroes it). A reader
accepts a slot only if its commit word is non-zero, and orders slots by it; a slot overwritten mid-read shows a
changed commit word on the second read and is dropped (seqlock). A record cut by SIGKILL mid-write keeps commit 0.
The meta region does not wrap: when it is full, later strings are recorded as "?" and a header flag is set.
"""
from __future__ import annotations

import struct

__all__ = [
    "MAGIC", "VERSION", "HEADER", "HEADER_SIZE", "META_OFFSET", "META_REC", "META_COMMIT", "SLOT", "SLOT_SIZE",
    "SLOT_WORDS", "IDENT", "IDENT_OFFSET", "IDENT_MAGIC", "KINDS", "CATEGORIES", "FLAG_CAPTURING", "FLAG_ASYNC", "FLAG_META_FULL", "NONE_I32", "NONE_I64",
]

MAGIC = b"RKTRING1"
VERSION = 1
# magic, version, pid, mono0_ns, wall0_ns, meta_size, slot_size, slots, flags, host[64], proctitle[128]
HEADER = struct.Struct("<8sIIqqQIII64s128s")
HEADER_SIZE = 4096
# Who wrote the ring: magic, the writer's start time in clock ticks since boot (/proc/<pid>/stat field 22), so a
# process that got the pid later is never taken for it (tracer/launch/pidident.py). Rings made before it was added
# hold zeros here (no magic): their writer is known only to have started before the ring was made.
IDENT = struct.Struct("<8sQ")
IDENT_OFFSET = 512
IDENT_MAGIC = b"RKTIDNT1"
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
