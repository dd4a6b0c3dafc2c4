"""NUL holes in a text input: a sparse hole after a node crash, or the run of NULs a copytruncate'd log starts with
once its writer goes on at its old offset. The bytes on both sides are text; the hole is none. A sparse hole is
stepped over (``SEEK_DATA``), never read; NULs stored on disk are read and dropped a chunk at a time, so a hole of
any size costs no memory and one note per hole, never the log."""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from ranktrace.analyzers.readers.base import Skipped

__all__ = ["Holes", "read_past_holes", "strip_nuls", "MAX_SCAN_BYTES"]

MAX_SCAN_BYTES = 1 << 30   # bytes read from disk for one text input, stored NULs included (sparse holes: none read)
_CHUNK = 1 << 20
_SAID = 3                  # holes said one by one; the rest in one line


@dataclass
class Holes:
    """The NUL runs met in one input, merged where they touch: (file offset, bytes, offset in the text kept)."""

    runs: list[list[int]] = field(default_factory=list)
    count: int = 0
    total: int = 0
    _end: int = -1             # file offset just past the last run: a run starting there continues it
    _said_last: bool = False   # the last run is among `runs`

    def add(self, offset: int, n: int, at: int) -> None:
        if n <= 0:
            return
        self.total += n
        if offset == self._end:
            if self._said_last:
                self.runs[-1][1] += n
        else:
            self.count += 1
            self._said_last = len(self.runs) < _SAID
            if self._said_last:
                self.runs.append([offset, n, at])
        self._end = offset + n

    def notes(self, name: str, text: bytes | bytearray) -> list[Skipped]:
        """One note per hole (the first few), the line it sits before; one more for the rest."""
        out = [Skipped(name, text.count(b"\n", 0, at) + 1, f"{n:,} bytes of NUL (a hole) at offset {off:,} skipped")
               for off, n, at in self.runs]
        if self.count > len(self.runs):
            rest = self.total - sum(n for _o, n, _a in self.runs)
            out.append(Skipped(name, None, f"and {self.count - len(self.runs):,} more NUL runs ({rest:,} bytes) "
                                           "skipped"))
        return out


def strip_nuls(chunk: bytes | memoryview, offset: int, at: int, holes: Holes) -> bytes:
    """`chunk` (read at file `offset`; its text goes to position `at` of what is kept) without its NUL runs, each
    recorded in `holes`. Vectorised: a chunk of scattered NULs costs no Python loop per run."""
    if b"\0" not in chunk:
        return bytes(chunk)
    arr = np.frombuffer(chunk, dtype=np.uint8)
    z = arr == 0
    edges = np.diff(np.concatenate(([0], z.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    before = np.concatenate(([0], np.cumsum(ends - starts)[:-1]))   # NULs before each run, within the chunk
    for s, e, b in zip(starts[:_SAID + 1].tolist(), ends[:_SAID + 1].tolist(), before[:_SAID + 1].tolist()):
        holes.add(offset + s, e - s, at + s - b)
    if len(starts) > _SAID + 1:   # the rest only counted (merging needs nothing but the last run's end)
        lengths = ends[_SAID + 1:] - starts[_SAID + 1:]
        holes.count += len(lengths)   # data lies between them and the runs before: none continues another
        holes.total += int(lengths.sum())
        holes._end = offset + int(ends[-1])
        holes._said_last = False
    return arr[~z].tobytes()


def _seek(fd: int, pos: int, whence: int, size: int) -> int:
    """os.lseek with SEEK_DATA / SEEK_HOLE; past the last data (ENXIO) is the end; a file system without them
    (EINVAL) has no holes to step over: `pos` for data, the end for a hole."""
    try:
        return os.lseek(fd, pos, whence)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return size
        return pos if whence == getattr(os, "SEEK_DATA", -1) else size


def read_past_holes(f: BinaryIO, limit: int, holes: Holes, scan: int = MAX_SCAN_BYTES) -> tuple[bytes, bool, bool]:
    """Up to `limit` + 1 bytes of text from `f` (a regular file, at its start), NUL runs dropped and recorded in
    `holes`. Returns (text, whether `limit` was passed, whether `scan` bytes were read before the end)."""
    fd = f.fileno()
    size = os.fstat(fd).st_size
    data_whence, hole_whence = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    out = bytearray()
    pos = scanned = 0
    while pos < size and len(out) <= limit:
        if data_whence is not None and hole_whence is not None:
            data = _seek(fd, pos, data_whence, size)
            if data > pos:                 # a sparse hole: stepped over, not read
                holes.add(pos, min(data, size) - pos, len(out))
                pos = data
                continue
            stop = _seek(fd, pos, hole_whence, size)
        else:
            stop = size
        if scanned >= scan:
            return bytes(out), False, True
        chunk = os.pread(fd, min(_CHUNK, max(stop, pos + 1) - pos, scan - scanned), pos)
        if not chunk:
            break
        out += strip_nuls(chunk, pos, len(out), holes)
        pos += len(chunk)
        scanned += len(chunk)
    passed = len(out) > limit
    return bytes(out[:limit + 1]) if passed else bytes(out), passed, False
