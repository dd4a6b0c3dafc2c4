"""The job's own output, kept beside its trace: ``<run>/<host>/output.log`` (the server-log reader reads start-up
phases from it: weights loaded, KV cache allocated, capture begin/end, graph addresses registered, server listening).

Only where keeping it cannot change the job: a stream of ``trace run`` that is not a terminal (a file, a pipe, a
CI log) is already not a TTY for the job, so the job gets a pipe instead and every byte is passed on unchanged as it
arrives, and copied into output.log line by line. A stream that is a terminal is left to the job (a pseudo-terminal
in between would change how it buffers, colours and sizes its output) and that is said once; so is /dev/null (the
job writes there itself: what its owner discards is not kept).

What the job sees stays what it would see without us:
* our stream closed under it (``trace run ... | head -1``): the copy of that stream stops and the pipe's read end
  is closed, so the job's next write gets EPIPE / SIGPIPE as it would have;
* a process the job leaves behind that still writes when trace run ends (a daemon): the pipe is handed to a ``cat``
  that goes on passing its output to our stream, instead of the daemon dying of SIGPIPE.

output.log is bounded (CAP bytes: the start-up lines that matter come first; past the cap one line says so and the
output is passed through, not kept) and readable by its owner alone. stdout and stderr lines are interleaved in the
order they arrived here.
"""
from __future__ import annotations

import errno
import os
import select
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["OutputLog", "FILE_NAME", "CAP"]

FILE_NAME = "output.log"
CAP = 64 << 20          # bytes of the job's output kept in output.log
_CHUNK = 65536
_POLL_S = 0.2           # how often a copier looks whether it was asked to hand its pipe over


class OutputLog:
    """Decides which of our streams are kept, gives Popen its arguments, and copies until the job's pipes close."""

    def __init__(self, host_dir: Path, log: Callable[[str], None],
                 streams: tuple[IO[Any], IO[Any]] | None = None, cap: int = CAP,
                 closed: frozenset[int] = frozenset()) -> None:
        """`closed`: which of fds 1 and 2 trace run was started without (stdfds): those stay closed in the job."""
        self.path = host_dir / FILE_NAME
        self.ours = streams or (sys.stdout, sys.stderr)
        self.keep = [fd not in closed and not _is_tty(s) and not _is_devnull(s)
                     for fd, s in zip((1, 2), self.ours)]
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.file: IO[bytes] | None = None
        self.cap, self.kept = cap, 0
        self.stop = threading.Event()   # close(): copiers still running hand their pipe to `cat`
        self.left: list[tuple[int, int | None]] = []  # (pipe fd, our fd) a copier gave up on close()
        self.log = log
        if any(self.keep):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                self.file = os.fdopen(fd, "ab")
            except OSError as e:
                log(f"the job's output is not kept ({e.strerror or e}); it is passed through as usual")
                self.keep = [False, False]
        terms = [n for n, s in zip(("stdout", "stderr"), self.ours) if _is_tty(s)]
        if terms:
            which = " and ".join(terms)
            log(f"{which} {'is a terminal' if len(terms) == 1 else 'are terminals'}: the job writes there "
                f"directly and that output is not kept in {FILE_NAME} (start-up phases then come from the rings "
                f"alone; redirect to a file to keep it)")

    def popen_kwargs(self) -> dict[str, Any]:
        return {name: subprocess.PIPE for name, k in zip(("stdout", "stderr"), self.keep) if k}

    def start(self, proc: subprocess.Popen[bytes]) -> None:
        for pipe, ours in ((proc.stdout, self.ours[0]), (proc.stderr, self.ours[1])):
            if pipe is None:
                continue
            t = threading.Thread(target=self._copy, args=(pipe, ours), name="ranktrace-output", daemon=True)
            t.start()
            self.threads.append(t)

    def _copy(self, pipe: IO[bytes], ours: IO[Any]) -> None:
        fd = pipe.fileno()
        try:
            out_fd: int | None = ours.fileno()
        except (OSError, ValueError, AttributeError):
            out_fd = None
        partial = b""
        while True:
            if self.stop.is_set():
                self.left.append((os.dup(fd), out_fd))  # a leftover process still writes: `cat` takes over
                break
            try:
                ready, _, _ = select.select([fd], [], [], _POLL_S)
                if not ready:
                    continue
                data = os.read(fd, _CHUNK)
            except InterruptedError:
                continue
            except (OSError, ValueError):
                break
            if not data:
                break
            if out_fd is not None:
                try:
                    _write_all(out_fd, data)
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        break  # the reader of our stream is gone: so is the job's (its next write gets EPIPE)
                    out_fd = None  # any other failure of ours: keep draining, the job never blocks on a full pipe
            lines, _, partial = (partial + data).rpartition(b"\n")
            if lines:
                self._log(lines + b"\n")
        if partial:
            self._log(partial + b"\n")
        try:
            pipe.close()  # the read end closed: a writer left behind gets EPIPE, never a pipe that silently fills
        except OSError:
            pass

    def _log(self, data: bytes) -> None:
        with self.lock:
            if self.file is None:
                return
            try:
                room = self.cap - self.kept
                if len(data) >= room:
                    self.file.write(data[:max(room, 0)].rpartition(b"\n")[0] + b"\n" if room > 0 else b"")
                    self.file.write(f"[ranktrace] {FILE_NAME} stops here: {self.cap >> 20} MiB kept; the job's "
                                    f"later output was passed through, not kept\n".encode())
                    self.file.close()
                    self.file = None
                    return
                self.file.write(data)
                self.file.flush()
                self.kept += len(data)
            except (OSError, ValueError):
                self.file = None  # disk full: the job's output still passes through

    def close(self, timeout: float = 2.0) -> None:
        """After the job exited: what is still in the pipes is copied; a process left behind that holds them open
        past `timeout` gets its output passed on by ``cat`` from then on (never a SIGPIPE of our making); then
        output.log is closed."""
        for t in self.threads:
            t.join(timeout)
        if any(t.is_alive() for t in self.threads):
            self.stop.set()
            for t in self.threads:
                t.join(_POLL_S * 5)
            handed = [self._hand_over(pipe_fd, out_fd) for pipe_fd, out_fd in self.left]
            if any(handed):
                self.log("a process the job left behind still writes to its output: passed on by `cat` from now on "
                         f"(not kept in {FILE_NAME})")
        with self.lock:
            if self.file is not None:
                try:
                    self.file.close()
                except OSError:
                    pass
                self.file = None

    def _hand_over(self, pipe_fd: int, out_fd: int | None) -> bool:
        """`cat` from the job's pipe to our stream, in a session of its own (it outlives us); False where none."""
        cat = shutil.which("cat")
        try:
            if cat is None or out_fd is None:
                return False
            subprocess.Popen([cat], stdin=pipe_fd, stdout=out_fd, stderr=subprocess.DEVNULL, start_new_session=True,
                             close_fds=True)
            return True
        except OSError as e:
            self.log(f"a process the job left behind still writes to its output, which could not be passed on "
                     f"({e.strerror or e}): its next write gets EPIPE")
            return False
        finally:
            os.close(pipe_fd)


def _is_tty(stream: IO[Any]) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _is_devnull(stream: IO[Any]) -> bool:
    """Our stream is /dev/null: the job may as well write there itself (what is discarded is not kept)."""
    try:
        st = os.fstat(stream.fileno())
        null = os.stat(os.devnull)
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
