"""Per-process crash-safe recorder: one memory-mapped ring file (layout: ringformat) that survives SIGKILL of the
rank and is readable while it runs.

An op record is one counter step and one ``struct.pack_into`` into a ``MAP_SHARED`` mapping: no lock, no syscall.
Rare, precious records go to the non-wrapping meta region under a lock, so a serving loop never evicts them.
The file's blocks are reserved when it is made (``reserve``): a disk that fills later never faults a ring write.
Every writer of op records also keeps the ring's tail index (ringformat, issue #28: :class:`TailIndex`), so an
analysis reads a ring's window and the few older records it needs, never the whole ring.
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
from . import ringguard

__all__ = ["Recorder", "TailIndex", "DEFAULT_SLOTS", "DEFAULT_META_BYTES", "MIN_SLOTS", "MAX_SLOTS", "RATE_ENV",
           "SECONDS_ENV", "ring_slots", "reserve", "tail_supported"]

DEFAULT_SLOTS = 65536          # 8 MiB of op records per process, where nobody says what rate to expect
MIN_SLOTS, MAX_SLOTS = 8192, 1 << 20   # 1 MiB .. 128 MiB of op records: the bound per process (a rank's ring)
RATE_ENV = "RANKTRACE_RING_RATE"        # op records a second this job is expected to write (per process)
SECONDS_ENV = "RANKTRACE_RING_SECONDS"  # how much history a ring keeps at that rate
DEFAULT_SECONDS = 600
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


def ring_slots(environ: "dict[str, str] | None" = None) -> int:
    """Slots a new ring reserves: the expected rate (RATE_ENV) times the history to keep (SECONDS_ENV, 10 minutes by
    default), within MIN_SLOTS..MAX_SLOTS, so a light rank reserves 1 MiB and a busy one never more than 128 MiB;
    DEFAULT_SLOTS where no rate is given (or it is unreadable). RANKTRACE_RING_SLOTS, an exact count, wins over it
    (tracer/rank/inject.py)."""
    env = os.environ if environ is None else environ
    try:
        rate = float(env.get(RATE_ENV, "") or "nan")
        seconds = float(env.get(SECONDS_ENV, "") or DEFAULT_SECONDS)
    except ValueError:
        return DEFAULT_SLOTS
    if not (rate > 0 and seconds > 0):  # (nan compares false)
        return DEFAULT_SLOTS
    return int(min(MAX_SLOTS, max(MIN_SLOTS, rate * seconds)))


def tail_supported() -> bool:
    """Whether every writer of this process keeps the tail index: the compiled fast path (where built) must be one
    that does (a stale build writes slots without it; its rings then carry no index and are read whole)."""
    try:
        from . import _fastspan  # type: ignore[attr-defined]
    except ImportError:
        return True  # no compiled writer: the Python ones keep it
    return bool(getattr(_fastspan, "TAIL_INDEX", 0))


class TailIndex:
    """The writer's side of the ring's tail index (ringformat): a key's entry is taken on its first record (under a
    lock; then a dict lookup), and each record stores its index + 1 in its entry's field for its kind, after its
    commit word. Errors and marks (rare) are also counted and their last TAIL_RARE indexes kept."""

    def __init__(self, buf: Any, enabled: bool = True) -> None:
        self._buf = buf
        self.offsets: dict[int, int] = {}
        self._lock = threading.Lock()
        self._used = 0
        self.enabled = enabled
        if enabled:
            rf.TAIL_HEAD.pack_into(buf, rf.TAIL_OFFSET, rf.TAIL_MAGIC, 0, 0, 0)

    def entry(self, key: int) -> int:
        """Byte offset of `key`'s entry, -1 when the index is full (flagged: readers then read the whole ring)."""
        with self._lock:
            off = self.offsets.get(key)
            if off is not None:
                return off
            if not self.enabled or self._used >= rf.TAIL_ENTRIES:
                if self.enabled:
                    struct.pack_into("<I", self._buf, rf.TAIL_OFFSET + 8, rf.TAIL_OVERFLOW)
                self.offsets[key] = -1
                return -1
            off = rf.TAIL_ENTRIES_OFFSET + self._used * rf.TAIL_ENTRY.size
            rf.TAIL_ENTRY.pack_into(self._buf, off, ((key + 2**63) % 2**64) - 2**63, 0, 0, 0, 0)
            self._used += 1
            struct.pack_into("<I", self._buf, rf.TAIL_OFFSET + 12, self._used)
            self.offsets[key] = off
            return off

    def note(self, kind: int, category: int, group: int, peer: int, name: int, tid: int, idx: int) -> None:
        """Record `idx` (just committed) under its key."""
        key = rf.tail_key(category, group, peer, name, tid)
        off = self.offsets.get(key)
        if off is None:
            off = self.entry(key)
        if off >= 0:
            _COMMIT.pack_into(self._buf, off + rf.TAIL_FIELD[kind], idx + 1)
        if kind == 2 or kind == 4:
            self.rare(off, idx)

    def rare(self, off: int, idx: int) -> None:
        """An error or mark record: its key's rare field, the count, and the ring of the last TAIL_RARE."""
        if not self.enabled:
            return
        with self._lock:
            if off >= 0:
                _COMMIT.pack_into(self._buf, off + rf.TAIL_FIELD[4], idx + 1)
            count = struct.unpack_from("<Q", self._buf, rf.TAIL_OFFSET + 16)[0]
            _COMMIT.pack_into(self._buf, rf.TAIL_RARE_OFFSET + 8 * (count % rf.TAIL_RARE), idx + 1)
            _COMMIT.pack_into(self._buf, rf.TAIL_OFFSET + 16, count + 1)


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
        self.guarded = ringguard.guard(self._buf)  # a ring cut by someone else: lost, the rank not killed
        rf.HEADER.pack_into(
            self._buf, 0, rf.MAGIC, rf.VERSION, os.getpid(), clock(), wall_clock(), meta_bytes, rf.SLOT_SIZE,
            slots, 0, socket.gethostname().encode()[:63], proctitle.encode("utf-8", "replace")[:127],
        )
        rf.IDENT.pack_into(self._buf, rf.IDENT_OFFSET, rf.IDENT_MAGIC, _start_ticks())
        self.tail = TailIndex(self._buf, tail_supported())
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
        self.tail.note(_KIND[kind], _CAT[category], group_id, rf.NONE_I32 if peer is None else peer, name_id, tid, idx)

    def close(self) -> None:
        if self.guarded:
            ringguard.release(self._buf)
        try:
            self._buf.flush()
            self._buf.close()
        except (ValueError, OSError):
            pass
