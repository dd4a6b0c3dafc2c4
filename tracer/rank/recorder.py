"""Per-process crash-safe recorder: one memory-mapped ring file (layout: ringformat) that survives SIGKILL of the
rank and is readable while it runs.

An op record is one counter step and one ``struct.pack_into`` into a ``MAP_SHARED`` mapping: no lock, no syscall.
Rare, precious records go to the non-wrapping meta region under a lock, so a serving loop never evicts them.
The file's blocks are reserved when it is made (``reserve``): a disk that fills later never faults a ring write.
"""
from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

from ..formats import ringformat as rf

__all__ = ["Recorder", "DEFAULT_SLOTS", "DEFAULT_META_BYTES", "reserve"]

DEFAULT_SLOTS = 65536          # 8 MiB of op records per process
DEFAULT_META_BYTES = 1 << 20   # 1 MiB of identity/groups/strings/phases
_KIND = {k: i for i, k in enumerate(rf.KINDS)}
_CAT = {c: i for i, c in enumerate(rf.CATEGORIES)}
_COMMIT = struct.Struct("<Q")


def reserve(fd: int, size: int) -> None:
    """Allocate the ring's blocks now (OSError, e.g. ENOSPC, when they cannot be): a write into a reserved page never
    faults for want of space, so a disk that fills later can never raise SIGBUS inside the job's collective.
    Where the filesystem has no fallocate, writing the zeros reserves them the same way."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    zeros = bytes(1 << 20)
    off = 0
    while off < size:
        off += os.pwrite(fd, zeros[:min(len(zeros), size - off)], off)


def _start_ticks() -> int:
    """This process's start time (/proc/self/stat field 22, clock ticks since boot), 0 where unreadable: the ring
    says which process wrote it, so a later process with the same pid is never signalled or dumped for it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


class Recorder:
    """Owns one ring file. Not thread-hostile: op records may be written from any thread."""

    def __init__(
        self,
        path: str,
        *,
        slots: int = DEFAULT_SLOTS,
        meta_bytes: int = DEFAULT_META_BYTES,
        clock: Callable[[], int] = time.monotonic_ns,
        wall_clock: Callable[[], int] = time.time_ns,
        proctitle: str = "",
    ) -> None:
        self.path = path
        self.clock = clock
        self.slots = slots
        self.meta_bytes = meta_bytes
        self._ops_offset = rf.META_OFFSET + meta_bytes
        size = self._ops_offset + slots * rf.SLOT_SIZE
        # Written under a temporary name and published with link(): a live reader (the monitor, `trace analyze`)
        # never sees a ring whose header is not written yet, and an existing ring is never replaced.
        tmp = f"{path}.{os.getpid()}.part"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)  # the job's command line and call sites
        try:
            os.ftruncate(fd, size)
            reserve(fd, size)  # a page of a sparse file that faults on a full disk is SIGBUS in the job's own call
            self._buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        rf.HEADER.pack_into(
            self._buf, 0, rf.MAGIC, rf.VERSION, os.getpid(), clock(), wall_clock(), meta_bytes, rf.SLOT_SIZE,
            slots, 0, socket.gethostname().encode()[:63], proctitle.encode("utf-8", "replace")[:127],
        )
        rf.IDENT.pack_into(self._buf, rf.IDENT_OFFSET, rf.IDENT_MAGIC, _start_ticks())
        try:
            os.link(tmp, path)  # FileExistsError when the name is taken: the caller picks another
        except FileExistsError:
            self._buf.close()
            os.unlink(tmp)
            raise
        except OSError:  # a filesystem without hard links
            if os.path.exists(path):
                self._buf.close()
                os.unlink(tmp)
                raise FileExistsError(path) from None
            os.rename(tmp, path)
        else:
            os.unlink(tmp)
        self._next = itertools.count()
        self._meta_off = rf.META_OFFSET
        self._meta_lock = threading.Lock()
        self._strings: dict[str, int] = {"": 0}
        self._next_string = itertools.count(1)
        self._span = itertools.count(1)

    # --- non-wrapping region -------------------------------------------------------------------------
    def meta(self, record: dict[str, Any], blocking: bool = True) -> bool:
        """Append a JSON record to the non-wrapping region. Returns False when the region is full, or when
        `blocking` is False and another write holds the lock (an exit path must never wait: a signal handler
        may have interrupted that very write in this thread)."""
        body = json.dumps(record, separators=(",", ":"), default=str).encode()
        if not self._meta_lock.acquire(blocking):
            return False
        try:
            off = self._meta_off
            end = off + rf.META_REC.size + len(body)
            if end + rf.META_REC.size > rf.META_OFFSET + self.meta_bytes:
                self._mark_meta_full()
                return False
            self._meta_off = end
            rf.META_REC.pack_into(self._buf, off, len(body), 0)
            self._buf[off + rf.META_REC.size:end] = body
            rf.META_REC.pack_into(self._buf, off, len(body), rf.META_COMMIT)
        finally:
            self._meta_lock.release()
        return True

    def _mark_meta_full(self) -> None:
        flags_off = rf.HEADER.size - 64 - 128 - 4
        struct.pack_into("<I", self._buf, flags_off, rf.FLAG_META_FULL)

    def intern(self, s: str | None) -> int:
        """Id of `s` in the string table (0 for None/empty). Strings are recorded once per process."""
        if not s:
            return 0
        sid = self._strings.get(s)
        if sid is not None:
            return sid
        with self._meta_lock:
            sid = self._strings.get(s)
            if sid is not None:
                return sid
            sid = next(self._next_string)
        if not self.meta({"type": "str", "id": sid, "v": s}):
            return self.intern("?") if s != "?" else 0
        self._strings[s] = sid
        return sid

    def adopt_strings(self, strings: dict[str, int]) -> None:
        """Take over another ring's string table with the same ids (a forked child's ring, see
        TraceState.reset_after_fork)."""
        for value, sid in sorted(strings.items(), key=lambda kv: kv[1]):
            if sid and value not in self._strings:
                if self.meta({"type": "str", "id": sid, "v": value}):
                    self._strings[value] = sid
        top = max(strings.values(), default=0)
        self._next_string = itertools.count(top + 1)

    def new_span(self) -> int:
        return next(self._span)

    # --- wrapping region -----------------------------------------------------------------------------
    def op(
        self,
        kind: str,
        category: str,
        name_id: int,
        *,
        tid: int,
        group_id: int = 0,
        callsite_id: int = 0,
        dtype_id: int = 0,
        shape_id: int = 0,
        error_id: int = 0,
        peer: int | None = None,
        graph_id: int | None = None,
        seq: int | None = None,
        backend_seq: int | None = None,
        nbytes: int | None = None,
        span_id: int = 0,
        parent_span_id: int = 0,
        capturing: bool = False,
        async_op: bool = False,
        t_ns: int | None = None,
    ) -> None:
        """Write one op record. Strings are passed as ids from :meth:`intern` (interned once, outside the hot path)."""
        idx = next(self._next)
        off = self._ops_offset + (idx % self.slots) * rf.SLOT_SIZE
        buf = self._buf
        _COMMIT.pack_into(buf, off, 0)
        rf.SLOT.pack_into(
            buf, off, 0, self.clock() if t_ns is None else t_ns, tid, _KIND[kind], _CAT[category],
            (rf.FLAG_CAPTURING if capturing else 0) | (rf.FLAG_ASYNC if async_op else 0), 0,
            name_id, group_id, callsite_id, dtype_id, shape_id, error_id,
            rf.NONE_I32 if peer is None else peer,
            rf.NONE_I32 if graph_id is None else graph_id,
            rf.NONE_I64 if seq is None else seq,
            rf.NONE_I64 if backend_seq is None else backend_seq,
            rf.NONE_I64 if nbytes is None else nbytes,
            span_id, parent_span_id,
        )
        _COMMIT.pack_into(buf, off, idx + 1)

    def close(self) -> None:
        try:
            self._buf.flush()
            self._buf.close()
        except (ValueError, OSError):
            pass
