"""A spinner on stderr for analysis work that takes long enough to look hung itself (issue #27: `trace compare` of
a 64-rank x 200k run was silent for 103 s, `trace analyze` for 15 s).

Only on a terminal (never in a pipe or a log), only after AFTER_S seconds (RANKTRACE_PROGRESS_AFTER; a quick
analysis prints nothing extra), and transient: rich erases it when the work is done, so what follows (the verdict) reads as before. Drawn
by rich's own live display in its refresh thread; what it says is the step and the time it has taken.
"""
from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any, TextIO

__all__ = ["working", "AFTER_S", "AFTER_ENV"]

AFTER_S = 2.0
AFTER_ENV = "RANKTRACE_PROGRESS_AFTER"  # seconds before the spinner shows (tests: 0)


def _after_s() -> float:
    try:
        return max(0.0, float(os.environ.get(AFTER_ENV, AFTER_S)))
    except ValueError:
        return AFTER_S


class working:
    """``with working("analyzing RUN"):`` shows ``⠋ analyzing RUN 0:00:05`` on stderr past AFTER_S, on a TTY."""

    def __init__(self, what: str, stream: TextIO | None = None, after_s: float | None = None) -> None:
        self.what = what
        self.after_s = after_s if after_s is not None else _after_s()
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._live: Any = None
        self._done = False

    def _tty(self) -> bool:
        if os.environ.get("TERM", "") == "dumb":
            return False
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def __enter__(self) -> "working":
        if self._tty():
            self._timer = threading.Timer(self.after_s, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._done:
                return
            try:
                con = Console(file=self.stream, highlight=False, emoji=False)
                live = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                                console=con, transient=True, redirect_stdout=False, redirect_stderr=False)
                live.add_task(f"[ranktrace] {self.what}", total=None)
                live.start()
                self._live = live
            except Exception:  # a spinner of ours must never cost the analysis
                self._live = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._done = True
            live, self._live = self._live, None
        if live is not None:
            try:
                live.stop()
            except Exception:
                pass
