"""The job's fds 0-2 as trace run was given them, closed ones included.

A stream closed when trace run starts (``trace run ... >&-``, a daemon manager that closes stdin) must be closed in
the job too. Left as it is, the lowest free number is taken by the next file or pipe trace run opens (meta.json,
the monitor's pipes), and the job would inherit that as its stdin or stdout. So each closed one is filled at once
with /dev/null marked close-on-exec: trace run may read and write it harmlessly, and the job, which does not get it
through Popen, finds it closed after exec — as it would have without ranktrace.
"""
from __future__ import annotations

import fcntl
import os

__all__ = ["hold_closed_std_fds"]


def hold_closed_std_fds() -> frozenset[int]:
    """Fill every closed fd among 0, 1, 2 with /dev/null (close-on-exec); the numbers that were closed."""
    closed: set[int] = set()
    for fd in (0, 1, 2):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            continue
        except OSError:
            closed.add(fd)
    held: list[int] = []
    for _ in sorted(closed):  # the lowest free number comes first: these opens land on the closed ones, in order
        held.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
    for fd in held:
        if fd not in closed:  # something of ours sat below (never expected): give the extra one back
            os.close(fd)
    return frozenset(closed)
