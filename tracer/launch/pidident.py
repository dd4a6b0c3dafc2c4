"""Is the process under a pid the one we mean? The one check before ranktrace signals or dumps a process by pid.

A pid read from a ring's file name, meta.json or a process group can belong to another process by now: the writer
died and the kernel handed its pid to something unrelated (a `sleep`, another user's job). Identity here is the
pid plus the process's start time (/proc/<pid>/stat field 22, clock ticks since boot): the ring records its
writer's (ringformat.IDENT); a ring made before that record existed only bounds it (its writer started no later
than the ring was made). A process is signalled through a pidfd opened *before* its identity is checked, so the
signal reaches the process that was checked even if it exits and its pid is reused in between.

Stdlib only: the guardian (``python -I -S guardian.py``) loads this file by its path.
"""
from __future__ import annotations

import os
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

if __package__:
    from ranktrace.tracer.formats import ringformat as rf
else:  # loaded by path (the guardian runs without site and without the package): the sibling file by its path
    import importlib.util as _ilu

    _spec = _ilu.spec_from_file_location(
        "_ranktrace_ringformat", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                              "formats", "ringformat.py"))
    rf = _ilu.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules[_spec.name] = rf  # dataclasses look their module up there
    _spec.loader.exec_module(rf)  # type: ignore[union-attr]

__all__ = ["Stat", "RingWriter", "Target", "Unreadable", "UNREADABLE", "stat", "ring_writer", "ring_pid",
           "writer_matches", "environ_dir", "target", "SLACK_S"]

SLACK_S = 1.0   # clock-tick rounding and the monotonic -> boot-time conversion of a ring's creation time
_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    state: str
    pgid: int
    start_ticks: int
    ppid: int = 0

    @property
    def start_s(self) -> float:
        """Seconds since boot (CLOCK_BOOTTIME) at which the process started."""
        return self.start_ticks / _TCK

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def stat(pid: int) -> Stat | None:
    """State, process group and start time of `pid`; None when there is no such process (or /proc hides it)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()
        return Stat(fields[0].decode(), int(fields[2]), int(fields[19]), int(fields[1]))
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class RingWriter:
    """What a ring says about the process that wrote it."""
    pid: int
    mono0_ns: int                 # CLOCK_MONOTONIC when the ring was made
    start_ticks: int | None       # the writer's start time; None for a ring made before it was recorded

    def made_s(self) -> float:
        """When the ring was made, in seconds since boot (the clock of /proc/<pid>/stat)."""
        return self.mono0_ns / 1e9 + (time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic())


def ring_pid(name: str) -> int | None:
    """The pid in a ring's file name (`<pid>.ring`, `<pid>-<n>.ring`)."""
    head = name.split(".")[0].split("-")[0]
    return int(head) if head.isdigit() else None


def ring_writer(path: str | os.PathLike[str]) -> RingWriter | None:
    """The ring's own record of its writer, or None when `path` is no ring (or a symlink, or not a plain file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000):
            return None
        buf = os.pread(fd, rf.IDENT_OFFSET + rf.IDENT.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        fields = rf.HEADER.unpack_from(buf, 0)
    except struct.error:
        return None
    if fields[0] != rf.MAGIC:
        return None
    ticks = None
    if len(buf) >= rf.IDENT_OFFSET + rf.IDENT.size:
        magic, t = rf.IDENT.unpack_from(buf, rf.IDENT_OFFSET)
        if magic == rf.IDENT_MAGIC and t > 0:
            ticks = t
    return RingWriter(int(fields[2]), int(fields[3]), ticks)


def writer_matches(pid: int, writer: RingWriter, st: Stat | None = None) -> bool:
    """The live process `pid` is the one that wrote the ring: same pid in the header, same start time (or, for an
    old ring without it, started no later than the ring was made). A zombie is nobody's writer any more."""
    st = stat(pid) if st is None else st
    if st is None or st.zombie or writer.pid != pid:
        return False
    if writer.start_ticks is not None:
        return st.start_ticks == writer.start_ticks
    return st.start_s <= writer.made_s() + SLACK_S


class Unreadable:
    """/proc/<pid>/environ could not be read (another user's process, a non-dumpable one)."""

    def __repr__(self) -> str:
        return "Unreadable"


UNREADABLE = Unreadable()


def environ_dir(pid: int) -> str | None | Unreadable:
    """RANKTRACE_DIR in the environment `pid` was started with (None: not set), UNREADABLE when it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            env = f.read(1 << 22)
    except OSError:
        return UNREADABLE
    for item in env.split(b"\0"):
        if item.startswith(b"RANKTRACE_DIR="):
            return os.fsdecode(item[len(b"RANKTRACE_DIR="):])
    return None


@dataclass
class Target:
    """A process whose identity was checked, held by a pidfd where the kernel has them: `signal` reaches that very
    process or nobody (never one that got its pid since)."""
    pid: int
    start_ticks: int
    pidfd: int | None = None
    gone: bool = field(default=False)

    def signal(self, sig: int) -> bool:
        """Send `sig`; False when the process is gone (or no longer the one checked)."""
        if self.gone:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
                return True
            st = stat(self.pid)  # no pidfd (old kernel): check again right before the signal
            if st is None or st.start_ticks != self.start_ticks:
                self.gone = True
                return False
            os.kill(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            self.gone = True
            return False
        except OSError:
            return False

    def alive(self) -> bool:
        """Still running (not a zombie) and still the process that was checked."""
        if self.gone:
            return False
        st = stat(self.pid)
        if st is None or st.zombie or st.start_ticks != self.start_ticks:
            self.gone = True
            return False
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, 0)
            except ProcessLookupError:
                self.gone = True
                return False
            except OSError:
                pass
        return True

    def close(self) -> None:
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None

    def __del__(self) -> None:
        self.close()


def target(pid: int, check: Callable[[Stat], bool]) -> Target | None:
    """Hold `pid` (a pidfd first, then the check on what runs under it now), or None when `check` refuses it or the
    process is gone. With the pidfd opened before the check, the process checked is the one later signalled."""
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds (kernel < 5.3), or gone already: the check decides
        fd = None
    st = stat(pid)
    if st is None or st.zombie or not check(st):
        if fd is not None:
            os.close(fd)
        return None
    return Target(pid, st.start_ticks, fd)
