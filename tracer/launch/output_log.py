"""The job's own output, kept beside its trace: ``<run>/<host>/output.log`` (the server-log reader reads start-up
phases from it: weights loaded, KV cache allocated, capture begin/end, graph addresses registered, server listening).

Only where keeping it cannot change the job: a stream of ``trace run`` that is not a terminal (a file, a pipe, a
CI log) is already not a TTY for the job, so the job gets a pipe instead and every byte is passed on unchanged as it
arrives, and copied into output.log line by line. A stream that is a terminal is left to the job (a pseudo-terminal
in between would change how it buffers, colours and sizes its output) and that is said once.

Known limits: a job writing to a closed stdout of ours no longer gets EPIPE (we keep draining); lines of stdout and
stderr are interleaved in output.log in the order they arrived here.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["OutputLog", "FILE_NAME"]

FILE_NAME = "output.log"
_CHUNK = 65536


class OutputLog:
    """Decides which of our streams are kept, gives Popen its arguments, and copies until the job's pipes close."""

    def __init__(self, host_dir: Path, log: Callable[[str], None],
                 streams: tuple[IO[Any], IO[Any]] | None = None) -> None:
        self.path = host_dir / FILE_NAME
        self.ours = streams or (sys.stdout, sys.stderr)
        self.keep = [not _is_tty(s) for s in self.ours]
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.file: IO[bytes] | None = None
        if any(self.keep):
            try:
                self.file = open(self.path, "ab")
            except OSError as e:
                log(f"the job's output is not kept ({e.strerror or e}); it is passed through as usual")
                self.keep = [False, False]
        if not all(self.keep):
            which = " and ".join(n for n, k in zip(("stdout", "stderr"), self.keep) if not k)
            log(f"{which} {'is a terminal' if which.count('std') == 1 else 'are terminals'}: the job writes there "
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
            try:
                data = os.read(fd, _CHUNK)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            if out_fd is not None:
                try:
                    _write_all(out_fd, data)
                except OSError:
                    out_fd = None  # our stream went away: keep draining, so the job never blocks on a full pipe
            lines, _, partial = (partial + data).rpartition(b"\n")
            if lines:
                self._log(lines + b"\n")
        if partial:
            self._log(partial + b"\n")

    def _log(self, data: bytes) -> None:
        if self.file is None:
            return
        with self.lock:
            try:
                self.file.write(data)
                self.file.flush()
            except (OSError, ValueError):
                self.file = None  # disk full: the job's output still passes through

    def close(self, timeout: float = 2.0) -> None:
        """After the job exited: what is still in the pipes is copied (a leftover process holding them open is not
        waited for past `timeout`), then output.log is closed."""
        for t in self.threads:
            t.join(timeout)
        with self.lock:
            if self.file is not None:
                try:
                    self.file.close()
                except OSError:
                    pass
                self.file = None


def _is_tty(stream: IO[Any]) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
