"""Incremental reading of a live ring for the monitor: new meta records and new op slots only.

The monitor asks every second whether each rank progressed, its last sequence number per group and its phase;
decoding whole rings each second would cost as much as the job's own recording. A :class:`RingTail` remembers
where it stopped and reads what was added since (one small read when nothing happened).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.ringreader import slot_dtype

__all__ = ["RingTail"]

_ENTER = rf.KINDS.index("enter")
_ENDS = (rf.KINDS.index("exit"), rf.KINDS.index("error"))
_COLLECTIVE = rf.CATEGORIES.index("collective")
_P2P = rf.CATEGORIES.index("p2p")


@dataclass
class RingTail:
    """Follows one live ring: identity, groups, phase, newest op index and each group's last seq, incrementally.

    Each :meth:`update` reads only the meta records added since the last call and the op slots after the newest
    one seen (one small read when nothing happened). A ring that wrapped past what was seen is rescanned once.
    """

    path: Path
    pid: int = 0
    rank: int | None = None
    world: int | None = None
    newest: int = 0                 # highest committed op index + 1 seen so far
    meta_used: int = 0              # bytes of the meta region in use
    group_seq: dict[str, int] = field(default_factory=dict)    # group name -> last collective seq entered
    group_desc: dict[str, str] = field(default_factory=dict)
    phase: str | None = None        # last phase mark
    in_init: bool = False           # inside init_process_group / new_group
    open_steps: dict = field(default_factory=dict)  # span id -> name of open set-up steps (init / registration)
    exited: bool = False
    last_op: str | None = None
    #: collective / p2p calls entered and not yet left (op slots: torch.distributed ops and a profile's framework
    #: collectives alike): span id -> (op name, monotonic time this tail first saw it open, native thread id)
    open_ops: dict = field(default_factory=dict)
    _hdr: tuple[int, int, int] | None = None   # meta_size, slot_size, slots
    _strings: dict[int, str] = field(default_factory=lambda: {0: ""})
    _meta_off: int = 0
    _scanned: bool = False

    CHUNK = 256

    def progress(self) -> tuple[int, int]:
        return (self.newest, self.meta_used)

    def update(self) -> bool:
        """Read what is new; True when anything changed since the last call."""
        before = (self.newest, self.meta_used)
        try:
            with open(self.path, "rb") as f:
                if self._hdr is None:
                    head = f.read(rf.HEADER.size)
                    if len(head) < rf.HEADER.size:
                        return False
                    fields = rf.HEADER.unpack(head)
                    if fields[0] != rf.MAGIC:
                        return False
                    self.pid = fields[2]
                    self._hdr = (fields[5], fields[6], fields[7])
                    self._meta_off = rf.META_OFFSET
                self._read_meta(f)
                self._read_slots(f)
        except Exception:  # a ring cut or scribbled on: no progress from it this time, never an error upstream
            return False
        return (self.newest, self.meta_used) != before

    def _read_meta(self, f: Any) -> None:
        meta_size = self._hdr[0]  # type: ignore[index]
        end = rf.META_OFFSET + meta_size
        while self._meta_off + rf.META_REC.size <= end:
            f.seek(self._meta_off)
            head = f.read(rf.META_REC.size)
            if len(head) < rf.META_REC.size:
                return
            length, commit = rf.META_REC.unpack(head)
            if length == 0 or self._meta_off + rf.META_REC.size + length > end:
                return
            if commit != rf.META_COMMIT:
                # reserved, not yet committed: a writer is inside (retry next time) unless a later record exists
                nxt = self._meta_off + rf.META_REC.size + length
                f.seek(nxt)
                after = f.read(rf.META_REC.size)
                if len(after) < rf.META_REC.size or rf.META_REC.unpack(after)[0] == 0:
                    return
                self._meta_off = nxt
                continue
            body = f.read(length)
            self._meta_off += rf.META_REC.size + length
            self.meta_used = self._meta_off - rf.META_OFFSET
            try:
                self._meta_record(json.loads(body))
            except ValueError:
                continue

    def _meta_record(self, m: dict[str, Any]) -> None:
        t = m.get("type")
        if t == "str":
            self._strings[int(m["id"])] = m.get("v", "")
        elif t == "identity":
            if m.get("rank") is not None or self.rank is None:
                self.rank = m.get("rank")
                self.world = m.get("world", self.world)
        elif t == "group" and m.get("name") is not None:
            self.group_desc[str(m["name"])] = m.get("desc") or ""
        elif t == "event":
            if m.get("category") == "phase":
                if m.get("name") == "process_exit":
                    self.exited = True
                else:
                    self.phase = str(m.get("name"))
            elif m.get("category") == "init" and m.get("name") in ("init_process_group", "new_group"):
                self.in_init = m.get("kind") == "enter"
            if m.get("category") in ("init", "graph") and m.get("span_id"):  # set-up steps: known waits
                if m.get("kind") == "enter":
                    self.open_steps[m["span_id"]] = str(m.get("name"))
                else:
                    self.open_steps.pop(m["span_id"], None)

    def _read_slots(self, f: Any) -> None:
        import numpy as np

        meta_size, slot_size, slots = self._hdr  # type: ignore[misc]
        if slots <= 0 or slot_size < rf.SLOT.size:
            return
        ops = rf.META_OFFSET + meta_size
        words = slot_size // 8

        def raw_range(first: int, count: int) -> bytes:
            pos = first % slots
            n1 = min(count, slots - pos)
            f.seek(ops + pos * slot_size)
            data = f.read(n1 * slot_size)
            if count > n1:
                f.seek(ops)
                data += f.read((count - n1) * slot_size)
            return data

        def read_range(first: int, count: int) -> Any:
            """Slots [first, first+count) by ring position, as bytes (two reads across the wrap). Seqlock: the range
            is read a second time and a slot whose commit word changed in between (the writer was inside it) gets
            commit 0, so it is not applied; the next update reads it whole."""
            data = raw_range(first, count)
            again = raw_range(first, count)
            n = min(len(data), len(again)) // slot_size
            c1 = np.frombuffer(data, dtype="<u8", count=n * words)[::words]
            c2 = np.frombuffer(again, dtype="<u8", count=n * words)[::words]
            torn = np.flatnonzero(c1 != c2)
            if not torn.size:
                return data
            out = np.frombuffer(data, dtype="<u8", count=n * words).copy()
            out[torn * words] = 0
            return out.tobytes()

        if not self._scanned:
            self._full_scan(f, read_range)
            return
        count = min(self.CHUNK, slots)
        for _ in range(16):
            data = read_range(self.newest, count)
            commits = np.frombuffer(data, dtype="<u8", count=len(data) // slot_size * words)[::words]
            fresh = (commits > self.newest) & (commits <= self.newest + count)
            if not fresh.any():
                if len(commits) and int(commits.max()) > self.newest + count:  # lapped by the writer: rescan
                    self._full_scan(f, read_range)
                return
            top = int(commits[fresh].max())
            self._decode(data, self.newest, top)
            self.newest = top
            if not fresh.all():
                return
        self._full_scan(f, read_range)  # more than 16 chunks behind: jump to the newest

    def _full_scan(self, f: Any, read_range: Any) -> None:
        """Newest index (first sight of a ring, or after falling behind a wrap): from the ring's tail index, else from
        every commit word."""
        import numpy as np

        meta_size, slot_size, slots = self._hdr  # type: ignore[misc]
        words = slot_size // 8
        self._scanned = True
        top = _indexed_newest(f, meta_size, slot_size, slots)
        if top is None:  # no tail index that vouches (a version 1 ring): every commit word
            f.seek(rf.META_OFFSET + meta_size)
            data = f.read(slots * slot_size)
            commits = np.frombuffer(data, dtype="<u8", count=len(data) // slot_size * words)[::words]
            top = int(commits.max()) if len(commits) else 0
        if top > self.newest:
            first = max(self.newest, top - min(self.CHUNK, slots))
            self._decode(read_range(first, top - first), first, top)
            self.newest = top

    def _open_ops(self, arr: Any, np: Any) -> None:
        """Collective / p2p spans entered and not left: (open ∪ entered) − left (a call's exit always follows its
        enter). A record lost to the ring's wrap only ever makes a span look closed, or open until its exit comes."""
        import time

        cat = arr["category"]
        ops = arr[((cat == _COLLECTIVE) | (cat == _P2P)) & (arr["kind"] == _ENTER) & (arr["span_id"] != rf.NONE_I64)
                  & (arr["span_id"] != 0)]
        ended = set(arr["span_id"][np.isin(arr["kind"], _ENDS)].tolist())
        now = time.monotonic()
        for sid, name, tid in zip(ops["span_id"].tolist(), ops["name"].tolist(), ops["tid"].tolist()):
            if sid not in ended:
                self.open_ops[sid] = (self._strings.get(int(name), "?"), now, tid)
        for sid in ended:
            self.open_ops.pop(sid, None)

    def open_ops_since(self, before: float) -> dict[int, str]:
        """Native thread id -> op name of the collective / p2p calls open since `before` (monotonic) or earlier."""
        if self.exited:
            return {}
        return {tid: name for name, seen, tid in self.open_ops.values() if seen <= before}

    def _decode(self, data: bytes, first: int, top: int) -> None:
        """Apply committed records with index in [first, top) found in `data` (slots from position first)."""
        import numpy as np

        dt = slot_dtype()
        if self._hdr[1] != dt.itemsize:  # type: ignore[index]
            return
        arr = np.frombuffer(data, dtype=dt, count=len(data) // dt.itemsize)
        arr = arr[(arr["commit"] > first) & (arr["commit"] <= top)]
        if not len(arr):
            return
        arr = arr[np.argsort(arr["commit"], kind="stable")]
        self._open_ops(arr, np)
        enters = arr[arr["kind"] == _ENTER]
        if len(enters):
            self.last_op = self._strings.get(int(enters["name"][-1]), "?")
        coll = enters[(enters["category"] == _COLLECTIVE) & (enters["seq"] != rf.NONE_I64)]
        for gid, seq in zip(coll["group"].tolist(), coll["seq"].tolist()):   # in order: the last one wins
            self.group_seq[self._strings.get(gid, "?")] = seq


def _indexed_newest(f: Any, meta_size: int, slot_size: int, slots: int) -> int | None:
    """The newest record index + 1 the ring's tail index (ringformat, version 2) gives, checked against the slot
    SLACK records past it (a later record there: the index lags); None where there is no index to trust."""
    f.seek(0)
    head = f.read(rf.HEADER_SIZE)
    if len(head) < rf.HEADER_SIZE or rf.HEADER.unpack_from(head)[1] < 2:
        return None
    magic, flags, used, _ = rf.TAIL_HEAD.unpack_from(head, rf.TAIL_OFFSET)
    if magic != rf.TAIL_MAGIC or flags & rf.TAIL_OVERFLOW or used > rf.TAIL_ENTRIES or slots <= _SLACK:
        return None
    values = [v for k in range(used) for v in rf.TAIL_ENTRY.unpack_from(head, rf.TAIL_ENTRIES_OFFSET +
                                                                         k * rf.TAIL_ENTRY.size)[1:]]
    values += [rf.COMMIT_WORD.unpack_from(head, rf.TAIL_RARE_OFFSET + 8 * k)[0] for k in range(rf.TAIL_RARE)]
    newest = max(values, default=0)
    f.seek(rf.META_OFFSET + meta_size + ((newest + _SLACK) % slots) * slot_size)
    probe = f.read(8)
    if len(probe) < 8 or rf.COMMIT_WORD.unpack(probe)[0] > newest:
        return None
    return newest


_SLACK = 64   # as tracer/formats/ringwindow.SLACK: records committed before their index store
