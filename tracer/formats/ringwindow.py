"""A ring's window read through its tail index (ringformat, version 2; issue #28): the header page, the meta region
it uses, its latest records and the few older ones the index names — each byte read once, with pread (so what an
analysis costs shows in /proc/self/io as ``rchar``), never the whole ring.

What an analysis needs whatever its age is each channel's last op (all its records) and last issued op, each
thread's open span, and every error and mark; the writers keep the latest record of each kind per key, so those
are the records at the index's values. Where the index cannot vouch for them, the read goes further back (an op
whose end may be another than the one indexed: from its enter on) or :func:`open_window` answers None and the
caller reads the whole ring (ringreader.RingView): a version 1 ring, an index that overflowed or lags behind the
slots (a writer without it), more errors or marks than the index remembers, a span enclosing the window that the
window does not show closing.
"""
from __future__ import annotations

import mmap
import os
import stat
from typing import Any

import numpy as np

from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.ringreader import RingContents, RingError, header_text, read_meta_region, slot_dtype

__all__ = ["RingWindow", "open_window", "MARGIN", "SLACK"]

MARGIN = 256   # records read before the window: the enters of ops the window starts in the middle of
SLACK = 64     # slots read past the index's newest record: records committed, their index store not yet made
_META_CHUNK = 4096   # the first read of the meta region; each next one twice the last


class RingWindow:
    """The slots read of one ring, in commit order, with ringreader.RingView's interface (``contents``, ``len``,
    ``commit``, ``duplicates``, ``words``, ``field``, ``fields``, ``unchanged``), and what the whole ring holds:
    ``total`` records, ``lost`` to the wrap, ``oldest_t_ns`` (the oldest surviving one's time), ``partial`` (some
    were not read)."""

    def __init__(self, path: str, contents: RingContents, arr: Any, pos: Any, ops_offset: int, total: int, lost: int,
                 oldest_t_ns: int | None, partial: bool, bytes_read: int) -> None:
        self.path = path
        self.contents = contents
        self._arr = arr
        self._pos = pos
        self._ops_offset = ops_offset
        self.total = total
        self.lost = lost
        self.oldest_t_ns = oldest_t_ns
        self.partial = partial
        self.bytes_read = bytes_read
        self.commit = np.ascontiguousarray(arr["commit"])
        self.duplicates = bool(self.commit.size > 1 and np.any(self.commit[1:] == self.commit[:-1]))

    def __len__(self) -> int:
        return int(self._arr.size)

    def __enter__(self) -> "RingWindow":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def words(self, which: tuple[int, ...]) -> Any:
        w = self._arr.view(np.uint64).reshape(len(self._arr), rf.SLOT_SIZE // 8)
        return np.take(w, which, axis=1)

    def field(self, name: str, positions: Any = None) -> Any:
        col = self._arr[name]
        return np.ascontiguousarray(col if positions is None else col[positions])

    def fields(self, names: tuple[str, ...], positions: Any) -> dict[str, Any]:
        rows = self._arr[positions]
        return {name: np.ascontiguousarray(rows[name]) for name in names}

    def unchanged(self, positions: Any = None) -> Any:
        """Seqlock: which slots still hold the record read (their commit words read again through a mapping: the
        pages are the ones just read, so this costs no read of its own)."""
        pos = self._pos if positions is None else self._pos[positions]
        first = self.commit if positions is None else self.commit[positions]
        if pos.size == 0:
            return np.ones(0, dtype=bool)
        try:
            with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                size = len(m)
                offs = self._ops_offset + pos.astype(np.int64) * rf.SLOT_SIZE
                ok = offs + 8 <= size
                words = np.frombuffer(m, dtype=np.uint8)
                now = np.zeros(pos.size, dtype=np.uint64)
                for k in range(8):  # gather the 8 bytes of each commit word
                    now |= words[np.where(ok, offs + k, 0)].astype(np.uint64) << np.uint64(8 * k)
                del words
                return ok & (now == first)
        except (OSError, ValueError):
            return np.zeros(pos.size, dtype=bool)

    def close(self) -> None:
        pass


def _pread(fd: int, size: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        got = os.pread(fd, size - len(out), offset + len(out))
        if not got:
            break
        out += got
    return bytes(out)


def open_window(path: str, rows: int) -> RingWindow | None:
    """The window of `rows` latest records of the ring at `path` and every older record its tail index names, or
    None when the ring must be read whole (see the module's doc). Raises RingError for a file that is no ring."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RingError(f"{path}: not a regular file (a FIFO, socket or device), not a ranktrace ring")
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # single slots: no read-ahead of pages nobody asked
        except (OSError, AttributeError):
            pass
        return _open(fd, path, rows, st.st_size)
    finally:
        os.close(fd)


def _open(fd: int, path: str, rows: int, file_size: int) -> RingWindow | None:
    first = _pread(fd, rf.HEADER_SIZE + _META_CHUNK, 0)   # the header page and the meta region's start: one read
    head = first[:rf.HEADER_SIZE]
    if len(head) < rf.HEADER.size:
        raise RingError(f"{path}: {len(head)} bytes, shorter than a ring header")
    magic, version, pid, mono0, wall0, meta_size, slot_size, slots, flags, host, title = rf.HEADER.unpack_from(head)
    if magic != rf.MAGIC:
        raise RingError(f"{path}: not a ranktrace ring (magic {magic!r})")
    if version not in rf.VERSIONS:
        raise RingError(f"{path}: ring version {version}, this reader knows {', '.join(map(str, rf.VERSIONS))}")
    if version < 2 or len(head) < rf.HEADER_SIZE or slot_size != rf.SLOT_SIZE or slots <= rows + MARGIN + 2 * SLACK:
        return None   # (a ring hardly larger than the window is read whole)
    tmagic, tflags, used, rare_count = rf.TAIL_HEAD.unpack_from(head, rf.TAIL_OFFSET)
    if tmagic != rf.TAIL_MAGIC or tflags & rf.TAIL_OVERFLOW or used > rf.TAIL_ENTRIES:
        return None
    ops_offset = rf.META_OFFSET + meta_size
    if file_size < ops_offset + slots * slot_size:
        return None  # cut short: the whole-ring reader copes with what is there
    entries = np.frombuffer(head, dtype="<u8", count=used * 5, offset=rf.TAIL_ENTRIES_OFFSET).reshape(used, 5)[:, 1:]
    rare = np.frombuffer(head, dtype="<u8", count=rf.TAIL_RARE, offset=rf.TAIL_RARE_OFFSET)
    newest = int(max(int(entries.max(initial=0)), int(rare.max(initial=0))))   # index + 1 of the newest record
    low = max(0, newest - slots)     # the oldest record the ring still holds
    start = max(low, newest - rows - MARGIN)
    need: set[int] = set()           # older records the index names (record indexes)
    known_rare = sorted(int(v) - 1 for v in rare if v)
    if rare_count > rf.TAIL_RARE and known_rare and known_rare[0] >= low:
        return None  # older errors or marks than the index remembers may still be in the ring
    need.update(i for i in known_rare if low <= i < start)
    for v in entries[entries > 0].tolist():
        if low <= v - 1 < start:
            need.add(int(v) - 1)
    contents = RingContents(path, pid, header_text(host), header_text(title), mono0, wall0, bool(flags & rf.FLAG_META_FULL))
    meta = _pread_meta(fd, meta_size, first[rf.HEADER_SIZE:rf.HEADER_SIZE + meta_size])
    read_meta_region(head[:rf.META_OFFSET].ljust(rf.META_OFFSET, b"\0") + meta, meta_size, contents)
    for m in contents.meta:
        if m.get("type") == "str":
            contents.strings[int(m["id"])] = m["v"]
    read_bytes = len(first) + max(0, len(meta) - (len(first) - rf.HEADER_SIZE))
    dt = slot_dtype()
    runs: list[tuple[int, Any]] = []   # (record index of the first slot, the slots read from there)

    def read_run(first: int, end: int) -> int:
        """Slots of records [first, end) (two preads across the wrap); returns bytes read."""
        done = 0
        while first < end:
            p = first % slots
            n = min(end - first, slots - p)
            data = _pread(fd, n * slot_size, ops_offset + p * slot_size)
            done += len(data)
            runs.append((first, np.frombuffer(data, dtype=dt, count=len(data) // slot_size)))
            first += n
        return done

    def slot(i: int) -> Any:
        """The slot read for record index i (None if not read, or it holds another record)."""
        for first, part in runs:
            if first <= i < first + part.size and int(part["commit"][i - first]) == i + 1:
                return part[i - first]
        return None

    # the window and the slack past the newest indexed record, then the probe: a record committed beyond the
    # slack means the index lags (a writer that does not keep it): read the whole ring instead
    read_bytes += read_run(start, newest + SLACK + 1)
    last = runs[-1][1] if runs else None
    probe = int(last["commit"][-1]) if last is not None and last.size else 0
    if probe > newest:   # only record newest + SLACK (or a later lap's) can sit there: the index lags
        return None
    for i in sorted(need):
        read_bytes += read_run(i, i + 1)
    oldest: int | None = None   # the oldest record's time: where "no record of op k" stops meaning "never issued"
    if low and start > low:     # (read only where the wrap lost records: what the ring_wrapped mark is placed by)
        data = _pread(fd, slot_size, ops_offset + (low % slots) * slot_size)
        read_bytes += len(data)
        if len(data) == slot_size:
            first_rec = np.frombuffer(data, dtype=dt, count=1)
            if int(first_rec["commit"][0]) == low + 1:
                oldest = int(first_rec["t_ns"][0])
    # an old failed op's enter: before its error, on the same thread (which was inside the call): read backwards,
    # in growing steps, until it shows (or the ring's oldest record)
    for i in sorted(need):
        rec = slot(i)
        if rec is None or int(rec["kind"]) != rf.KINDS.index("error") or not int(rec["span_id"]):
            continue
        lo, step = i, 16
        while lo > low and not _has_enter(runs, int(rec["span_id"]), lo, i):
            top, lo = lo, max(low, lo - step)
            step *= 4
            read_bytes += read_run(lo, top)
    # an indexed old enter whose op may have ended in a record the index does not name (another op of the key
    # ended later): read from that enter on, once
    back = start
    for e, x, c in entries[:, :3].astype(np.int64).tolist():
        enter = slot(e - 1) if e and low <= e - 1 < start else None
        if enter is None:
            continue
        for end in (x - 1, c - 1):
            if end > e - 1:
                other = slot(end)
                if other is None or int(other["span_id"]) != int(enter["span_id"]):
                    back = min(back, e - 1)
    if back < start:
        read_bytes += read_run(back, start)   # records in `need` among them are read again: a few slots
        start = back
    if runs:
        idx = np.concatenate([first + np.arange(part.size, dtype=np.int64) for first, part in runs])
        raw = np.concatenate([part.view(np.uint8).reshape(part.size, slot_size) for _, part in runs])
        allslots = raw.reshape(-1).view(dt)   # (concatenating structured arrays would drop their padding)
        good = (allslots["commit"] == (idx + 1).astype(np.uint64)) & (idx >= low)
        idx, first_of = np.unique(idx[good], return_index=True)
        arr = np.ascontiguousarray(raw[good][first_of]).reshape(-1).view(dt)
    else:
        idx, arr = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=dt)
    pos = idx % slots
    # a span the window's records lie in that it shows neither opening nor closing may be open since before it
    if start > low and arr.size:
        spans = set(arr["span_id"][arr["span_id"] != 0].tolist())
        parents = set(arr["parent_span_id"][(arr["parent_span_id"] != 0)
                                            & (arr["parent_span_id"] != rf.NONE_I64)].tolist())
        if parents - spans:
            return None
    total = newest - low
    if oldest is None and arr.size:
        oldest = int(arr["t_ns"].min())
    return RingWindow(path, contents, arr, pos, ops_offset, total, low, oldest, start > low, read_bytes)


def _has_enter(runs: list[tuple[int, Any]], span: int, lo: int, hi: int) -> bool:
    """Whether the slots read hold the enter of `span` among records [lo, hi)."""
    for first, part in runs:
        a, b = max(lo, first), min(hi, first + part.size)
        if a < b:
            p = part[a - first:b - first]
            if bool(np.any((p["span_id"] == span) & (p["kind"] == 0) & (p["commit"] == np.arange(a, b) + 1))):
                return True
    return False


def _pread_meta(fd: int, meta_size: int, start: bytes) -> bytes:
    """The meta region up to its first unused record (length 0): `start` (its first bytes, already read), then
    growing chunks — a 1 MiB region a rank fills with a few kilobytes costs those kilobytes."""
    out = bytearray(start)
    size = max(_META_CHUNK, len(out))
    while True:
        pos = 0   # walk the records read so far; done once a zero length is inside what we have
        while pos + rf.META_REC.size <= len(out):
            length = rf.META_REC.unpack_from(out, pos)[0]
            if length == 0:
                return bytes(out)
            pos += rf.META_REC.size + length
        if len(out) >= meta_size:
            return bytes(out)
        chunk = _pread(fd, min(size, meta_size - len(out)), rf.META_OFFSET + len(out))
        if not chunk:
            return bytes(out)
        out += chunk
        size *= 2
