"""Reads a ring file, live or after its process died, into numpy columns: the host side of the ring (the
monitor, finalize, the analyzers' ring reader), kept apart from the layout so a rank never loads it.

Two ways in: :func:`read_ring` decodes everything into a :class:`RingContents`; a :class:`RingView` keeps the file
mapped and reads the op slots one field at a time, for the positions asked for — the analyzers read the few fields
that decide which records matter from every slot, and every field only of those (issue #19: a 1M-record ring is
128 MB, and walking each 128-byte record once per field, or copying all of them, costs more than the analysis).
"""
from __future__ import annotations

import json
import mmap
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from ranktrace.tracer.formats.ringformat import (FLAG_META_FULL, HEADER, MAGIC, META_COMMIT, META_OFFSET, META_REC,
                                         SLOT_SIZE, VERSIONS)

__all__ = ["RingContents", "RingError", "RingView", "read_ring", "slot_dtype", "SLOT_FIELDS", "written_slots"]


class RingError(Exception):
    """A ring file that is not a ranktrace ring, or is cut before its header ends."""


SLOT_FIELDS = ("commit", "t_ns", "tid", "kind", "category", "flags", "pad", "name", "group", "callsite", "dtype",
               "shape", "error", "peer", "graph_id", "seq", "backend_seq", "nbytes", "span_id", "parent_span_id")


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
    cols: dict[str, Any] | None = None   # committed slots oldest first: one contiguous numpy array per slot field
    torn_meta: int = 0     # meta records cut mid-write (ignored)
    dropped_slots: int = 0  # slots that changed while being read
    lost_ops: int = 0      # ops overwritten by the wrap before they were read
    oldest_t_ns: int | None = None  # t_ns of the oldest surviving op record (of all of them, when `cols` holds some)

    @property
    def num_slots(self) -> int:
        return 0 if not self.cols else int(len(self.cols["commit"]))

    @property
    def slots(self) -> Any:
        """The committed slots as a numpy structured array (slot_dtype()), oldest first."""
        import numpy as np

        arr = np.zeros(self.num_slots, dtype=slot_dtype())
        for name, values in (self.cols or {}).items():
            arr[name] = values
        return arr

    def columns(self) -> dict[str, Any]:
        """Each slot field as its own contiguous numpy array (what the analyzer reads)."""
        import numpy as np

        if self.cols:
            return self.cols
        dt = slot_dtype()
        return {name: np.zeros(0, dtype=dt.fields[name][0]) for name in dt.names}


def header_text(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


MAX_RING_BYTES = 1 << 30  # far above any ring trace run makes (9 MiB by default)


def _open_ring(path: str) -> Any:
    """The ring's bytes: mapped when every block of the file is allocated (what the recorder makes: it reserves the
    whole ring), else read() — a mapped hole of a sparse file (an older ring) faults with SIGBUS on a full tmpfs.
    Read, only what the header says the ring holds is taken (a huge file named .ring costs no more than a ring)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO named like a ring must not block us
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise RingError(f"{path}: not a regular file (a FIFO, socket or device), not a ranktrace ring")
        os.set_blocking(fd, True)
        if st.st_size == 0:
            # a ring is published (link) only once its header is written: an empty one was cut by someone else
            raise RingError(f"{path}: empty file: a ring cut to 0 bytes after it was made (truncated by another "
                            "process while its rank ran), its records lost" if str(path).endswith(".ring") else
                            f"{path}: empty file, not a ranktrace ring")
        if st.st_blocks * 512 >= st.st_size:
            try:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):
                pass
        buf = f.read(HEADER.size)
        if len(buf) == HEADER.size:
            meta_size, slot_size, slots = HEADER.unpack_from(buf, 0)[5:8]
            buf += f.read(max(0, min(MAX_RING_BYTES, META_OFFSET + meta_size + slots * slot_size) - len(buf)))
        return buf


class RingView:
    """One ring file, mapped: header and meta region decoded at once (``contents``, without slots), the committed op
    slots in commit order (``len(view)`` of them), each field read on demand for all of them or some positions.

    Seqlock: the commit words are read first; a slot whose commit word differs when :meth:`unchanged` reads it again
    (after the fields) was being rewritten meanwhile and must be dropped. Use as a context manager (the mapping is
    released at the end; arrays handed out are copies)."""

    def __init__(self, path: str) -> None:
        self._buf: Any = _open_ring(path)
        self._arr: Any = None
        self._order: tuple[Any, Any, bool] | None = None
        try:
            buf = self._buf
            if len(buf) < HEADER.size:
                raise RingError(f"{path}: {len(buf)} bytes, shorter than a ring header")
            magic, version, pid, mono0, wall0, meta_size, slot_size, slots, flags, host, title = HEADER.unpack_from(buf, 0)
            if magic != MAGIC:
                raise RingError(f"{path}: not a ranktrace ring (magic {magic!r})")
            if version not in VERSIONS:  # 1 and 2 differ only in 2's tail index, in the header page
                raise RingError(f"{path}: ring version {version}, this reader knows "
                                f"{', '.join(map(str, VERSIONS))}")
            rc = RingContents(path, pid, header_text(host), header_text(title), mono0, wall0, bool(flags & FLAG_META_FULL))
            read_meta_region(buf, meta_size, rc)
            for m in rc.meta:
                if m.get("type") == "str":
                    rc.strings[int(m["id"])] = m["v"]
            self.contents = rc
            self._ops_offset = META_OFFSET + meta_size
            self._avail = min(slots, max(0, (len(buf) - self._ops_offset) // slot_size))
        except BaseException:
            self.close()
            raise

    def _slots(self) -> tuple[Any, Any, bool]:
        """(slot index of each committed record oldest first, its commit word, whether a commit word repeats), read
        on first use: a view opened for its identity alone never touches the op slots."""
        import numpy as np

        if self._order is None:
            if self._avail:
                arr = np.frombuffer(self._buf, dtype=slot_dtype(), count=self._avail, offset=self._ops_offset)
                self._arr = arr[:written_slots(arr["commit"])]
                self._order = _commit_order(np.ascontiguousarray(self._arr["commit"]))
            else:
                self._order = (np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.uint64), False)
        return self._order

    @property
    def index(self) -> Any:
        return self._slots()[0]

    @property
    def commit(self) -> Any:
        return self._slots()[1]

    @property
    def duplicates(self) -> bool:
        return self._slots()[2]

    def __len__(self) -> int:
        return int(self.index.size)

    partial = False  # every committed slot is here (ringwindow.RingWindow holds some)

    @property
    def total(self) -> int:
        """Records the ring holds (all of them are read here)."""
        return len(self)

    @property
    def lost(self) -> int:
        """Records overwritten by the wrap before they were read."""
        return max(0, int(self.commit[-1]) - len(self)) if len(self) else 0

    @property
    def oldest_t_ns(self) -> int | None:
        return int(self.field("t_ns").min()) if len(self) else None

    def __enter__(self) -> "RingView":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def words(self, which: tuple[int, ...]) -> Any:
        """The 8-byte words `which` of every committed slot, in commit order: a (len(self), len(which)) uint64
        array read in one pass over the slots (a field is then a shift and a mask of its word)."""
        import numpy as np

        if not len(self) or self._arr is None:
            return np.zeros((0, len(which)), dtype=np.uint64)
        w = self._arr.view(np.uint64).reshape(len(self._arr), SLOT_SIZE // 8)
        idx = self.index
        if int(idx[-1]) - int(idx[0]) + 1 == idx.size:  # one run in slot order
            return np.take(w[int(idx[0]):int(idx[-1]) + 1], which, axis=1)
        return np.take(w, which, axis=1)[idx]

    def fields(self, names: tuple[str, ...], positions: Any) -> dict[str, Any]:
        """Several fields of the slots at `positions`, the records copied once (for a few of many)."""
        import numpy as np

        if not len(self) or self._arr is None:
            return {name: self.field(name) for name in names}
        rows = self._arr[self.index[positions]]
        return {name: np.ascontiguousarray(rows[name]) for name in names}

    def field(self, name: str, positions: Any = None) -> Any:
        """Field `name` of every committed slot (or of those at `positions`, indices into the commit order), as
        one contiguous array."""
        import numpy as np

        if not len(self) or self._arr is None:
            return np.zeros(0, dtype=slot_dtype().fields[name][0])
        col = self._arr[name]
        idx = self.index if positions is None else self.index[positions]
        if idx.size and positions is None and int(idx[-1]) - int(idx[0]) + 1 == idx.size:
            return np.ascontiguousarray(col[int(idx[0]):int(idx[-1]) + 1])  # one run in slot order: a slice
        return col[idx]

    def unchanged(self, positions: Any = None) -> Any:
        """Which slots (all, or those at `positions`) still hold the record whose commit word was read first."""
        first = self.commit if positions is None else self.commit[positions]
        return self.field("commit", positions) == first

    def close(self) -> None:
        self._arr = None
        try:
            self._buf.close()
        except (BufferError, ValueError, AttributeError):
            pass


def written_slots(commit: Any) -> int:
    """How many slots from the start can hold records: all of them, or — for a ring that never wrapped — those up
    to its last committed record (the rest of the file is never-written, sparse slots, not worth reading). Found
    by bisection on the commit words (slot i of a first lap holds record i + 1) and then checked: the count must
    match and the slots after must be empty (a record a dying thread had reserved but not committed stays empty)."""
    n = len(commit)
    if n == 0 or commit[n - 1] != 0:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if commit[mid] != 0:
            lo = mid + 1
        else:
            hi = mid
    if lo and int(commit[lo - 1]) != lo:
        return n
    if commit[lo:min(n, lo + 4096)].any():
        return n
    return lo


def _commit_order(commit: Any) -> tuple[Any, Any, bool]:
    """(slot indices of the committed slots in commit order, their commit words, whether any word repeats).
    Slots are written in index order: one increasing run, two after a wrap; anything else is sorted."""
    import numpy as np

    live = np.flatnonzero(commit)
    c = commit[live]
    if c.size < 2 or bool(np.all(c[1:] > c[:-1])):
        return live, c, False
    down = np.flatnonzero(c[1:] <= c[:-1])
    if down.size == 1 and c[-1] < c[0]:  # wrapped once: the run after the descent is the older one
        k = int(down[0]) + 1
        order = np.concatenate([np.arange(k, c.size), np.arange(0, k)])
        if bool(np.all(c[order][1:] > c[order][:-1])):
            return live[order], c[order], False
    order = np.argsort(c, kind="stable")
    c = c[order]
    return live[order], c, bool(np.any(c[1:] == c[:-1]))


def read_ring(path: str) -> RingContents:
    """Decode a ring file written by the in-rank Recorder (tracer/rank/recorder.py), live or after its process died.

    Raises RingError when the file is not a ring or is shorter than its header.
    """
    import numpy as np

    with RingView(path) as view:
        rc = view.contents
        n_live = len(view)
        cols = {name: view.field(name) for name in SLOT_FIELDS}
        keep = view.unchanged()  # seqlock: re-read the commit words after copying
        duplicates = view.duplicates
    if not keep.all():
        cols = {name: values[keep] for name, values in cols.items()}
    rc.dropped_slots = n_live - int(np.count_nonzero(keep))
    if duplicates:  # duplicate commit words (damaged ring): ties ordered by the other fields
        rc.cols = cols
        arr = rc.slots
        arr.sort(order="commit")
        cols = {name: np.ascontiguousarray(arr[name]) for name in SLOT_FIELDS}
    rc.cols = cols
    n = len(cols["commit"])
    if n:
        rc.lost_ops = max(0, int(cols["commit"][-1]) - n - rc.dropped_slots)
        rc.oldest_t_ns = int(cols["t_ns"].min())
    return rc


def read_meta_region(buf: bytes, meta_size: int, rc: RingContents) -> None:
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

    formats = ["<u8", "<i8", "<u4", "u1", "u1", "u1", "u1", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4", "<i4", "<i4",
               "<i8", "<i8", "<i8", "<i8", "<i8"]
    offsets, off = [], 0
    for f in formats:
        size = int(f[-1])
        offsets.append(off)
        off += size
    return np.dtype({"names": list(SLOT_FIELDS), "formats": formats, "offsets": offsets, "itemsize": SLOT_SIZE})
