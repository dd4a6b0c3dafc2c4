"""Reads a ring file, live or after its process died, into numpy columns: the host side of the ring (the
monitor, finalize, the analyzers' ring reader), kept apart from the layout so a rank never loads it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ranktrace.tracer.ringformat import (FLAG_META_FULL, HEADER, MAGIC, META_COMMIT, META_OFFSET, META_REC,
                                         SLOT_SIZE, SLOT_WORDS, VERSION)

__all__ = ["RingContents", "RingError", "read_ring", "slot_dtype"]


class RingError(Exception):
    """A ring file that is not a ranktrace ring, or is cut before its header ends."""


@dataclass
class RingContents:
    """Everything decoded from one ring file."""

    path: str
    pid: int
    host: str
    proctitle: str
    mono0_ns: int
    wall0_ns: int
    meta_full: bool
    meta: list[dict[str, Any]] = field(default_factory=list)   # identity / group / event records in order
    strings: dict[int, str] = field(default_factory=lambda: {0: ""})
    words: Any = None      # committed slots oldest first, as 8-byte words: numpy uint64 (SLOT_WORDS, n)
    torn_meta: int = 0     # meta records cut mid-write (ignored)
    dropped_slots: int = 0  # slots that changed while being read
    lost_ops: int = 0      # ops overwritten by the wrap before they were read

    @property
    def num_slots(self) -> int:
        return 0 if self.words is None else int(self.words.shape[1])

    @property
    def slots(self) -> Any:
        """The committed slots as a numpy structured array (slot_dtype()), oldest first."""
        import numpy as np

        arr = np.zeros(self.num_slots, dtype=slot_dtype())
        if self.num_slots:
            arr.view(np.dtype("<u8")).reshape(self.num_slots, SLOT_SIZE // 8)[:, :SLOT_WORDS] = self.words.T
        return arr

    def columns(self) -> dict[str, Any]:
        """Each slot field as its own contiguous numpy array (what the analyzer reads)."""
        import numpy as np

        dt = slot_dtype()
        if not self.num_slots:
            return {name: np.zeros(0, dtype=dt.fields[name][0]) for name in dt.names}
        out: dict[str, Any] = {}
        for name in dt.names:
            ftype, off = dt.fields[name][0], dt.fields[name][1]
            row = self.words[off // 8]
            size = ftype.itemsize
            out[name] = row.view(ftype) if size == 8 else np.ascontiguousarray(
                row.view(ftype)[(off % 8) // size::8 // size])
        return out


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


MAX_RING_BYTES = 1 << 30  # far above any ring trace run makes (9 MiB by default)


def read_ring(path: str) -> RingContents:
    """Decode a ring file written by the in-rank Recorder (tracer/rank/recorder.py), live or after its process died.

    Raises RingError when the file is not a ring or is shorter than its header.
    """
    # read(), never a mapping: a mapped hole of a sparse file on a full tmpfs faults with SIGBUS in the reader.
    # Only what the header says the ring holds is read (a huge file named .ring costs no more than a ring).
    with open(path, "rb") as f:
        buf = f.read(HEADER.size)
        if len(buf) == HEADER.size:
            _m, _v, _p, _a, _b, meta_size, slot_size, slots = HEADER.unpack_from(buf, 0)[:8]
            buf += f.read(min(MAX_RING_BYTES, META_OFFSET + meta_size + slots * slot_size) - len(buf))
    if not buf:
        raise RingError(f"{path}: empty file, not a ranktrace ring")
    if len(buf) < HEADER.size:
        raise RingError(f"{path}: {len(buf)} bytes, shorter than a ring header")
    magic, version, pid, mono0, wall0, meta_size, slot_size, slots, flags, host, title = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise RingError(f"{path}: not a ranktrace ring (magic {magic!r})")
    if version != VERSION:
        raise RingError(f"{path}: ring version {version}, this reader knows {VERSION}")
    rc = RingContents(path, pid, _cstr(host), _cstr(title), mono0, wall0, bool(flags & FLAG_META_FULL))
    _read_meta(buf, meta_size, rc)
    _read_slots(buf, META_OFFSET + meta_size, slot_size, slots, rc)
    return rc


def _read_meta(buf: bytes, meta_size: int, rc: RingContents) -> None:
    off, end = META_OFFSET, min(META_OFFSET + meta_size, len(buf))
    while off + META_REC.size <= end:
        length, commit = META_REC.unpack_from(buf, off)
        if length == 0:
            break
        body_end = off + META_REC.size + length
        if body_end > end:
            rc.torn_meta += 1
            break
        if commit != META_COMMIT:
            # reserved but not (yet) committed: a writer died mid-record or is writing now. Later records may
            # still be complete (another thread), so skip over it.
            rc.torn_meta += 1
        else:
            try:
                rc.meta.append(json.loads(buf[off + META_REC.size:body_end]))
            except ValueError:
                rc.torn_meta += 1
        off = body_end


def slot_dtype() -> "Any":
    """numpy structured dtype equal to SLOT (so a whole ring decodes in one vectorised step)."""
    import numpy as np

    names = ["commit", "t_ns", "tid", "kind", "category", "flags", "pad", "name", "group", "callsite", "dtype",
             "shape", "error", "peer", "graph_id", "seq", "backend_seq", "nbytes", "span_id", "parent_span_id"]
    formats = ["<u8", "<i8", "<u4", "u1", "u1", "u1", "u1", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4", "<i4", "<i4",
               "<i8", "<i8", "<i8", "<i8", "<i8"]
    offsets, off = [], 0
    for f in formats:
        size = int(f[-1])
        offsets.append(off)
        off += size
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": SLOT_SIZE})


def _read_slots(buf: bytes, ops_offset: int, slot_size: int, slots: int, rc: RingContents) -> None:
    import numpy as np

    for m in rc.meta:
        if m.get("type") == "str":
            rc.strings[int(m["id"])] = m["v"]
    avail = min(slots, max(0, (len(buf) - ops_offset) // slot_size))
    if avail == 0:  # a file cut inside its meta region: no op slot survived
        rc.words = np.zeros((SLOT_WORDS, 0), dtype=np.dtype("<u8"))
        return
    view = np.frombuffer(buf, dtype=np.dtype("<u8"), count=avail * (SLOT_SIZE // 8), offset=ops_offset).reshape(
        avail, SLOT_SIZE // 8)
    # One pass copies the records into word rows (commit words first, then each field's); the analyzer reads
    # fields, and walking 128-byte records once per field would read the whole ring again for each of them.
    words = view[:, :SLOT_WORDS].T.copy()
    # seqlock: re-read the commit words after copying; a slot whose word changed was being rewritten
    commit = words[0]
    live = commit != 0
    keep = live & (commit == view[:, 0])
    rc.dropped_slots = int(np.count_nonzero(live)) - int(np.count_nonzero(keep))
    if not keep.all():
        kept = np.flatnonzero(keep)
        if kept.size and kept[-1] - kept[0] + 1 == kept.size:  # one run (a ring not yet full): a view, no copy
            words = words[:, kept[0]:kept[-1] + 1]
        else:
            words = np.compress(keep, words, axis=1)
    # Order by commit word. Slots are written in index order, so this is one sorted run (two after a wrap).
    commit = words[0]
    if commit.size > 1 and not bool(np.all(commit[1:] > commit[:-1])):
        order = np.argsort(commit, kind="stable")
        c = commit[order]
        if bool(np.any(c[1:] == c[:-1])):  # duplicate commit words (damaged ring): ties ordered by the other fields
            rc.words = words
            arr = rc.slots
            arr.sort(order="commit")
            words = arr.view(np.dtype("<u8")).reshape(len(arr), SLOT_SIZE // 8)[:, :SLOT_WORDS].T.copy()
        else:
            words = np.take(words, order, axis=1)
    if words.shape[1]:
        rc.lost_ops = max(0, int(words[0][-1]) - words.shape[1] - rc.dropped_slots)
    rc.words = words
