"""What `trace run` prints of its own on stderr: the verdict (once), what changed at the end, and one line of notes.

* The terminal is asked, not assumed: on a TTY its real width and colour (``NO_COLOR`` turns colour off,
  ``FORCE_COLOR`` on), when piped plain text that is never wrapped (:func:`terminal_style`).
* The verdict is printed once, at the hang; at the end of the run only what changed since (another status, ranks
  that left the collective), or nothing (:meth:`Presenter.verdict`, :meth:`Presenter.final`).
* What this machine cannot give (no NVML, no NCCL RAS, no py-spy, no compiled fast path) is collected and said in
  one line under the verdict, not as lines of their own while the job starts (:meth:`Presenter.note`).

The status line (tracer.watch.statusline) is erased before anything here is written.
"""
from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Callable, TextIO

if TYPE_CHECKING:
    from ranktrace.analyzers.verdict import Verdict

__all__ = ["terminal_style", "Presenter"]


def terminal_style(stream: TextIO) -> tuple[int | None, bool]:
    """(width, colour) for text written to `stream`: a TTY's columns (None when piped: never wrap) and whether to
    colour it (a TTY, not ``TERM=dumb``, no ``NO_COLOR``; ``FORCE_COLOR`` forces it)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    width: int | None = None
    if tty:
        try:
            width = os.get_terminal_size(stream.fileno()).columns or None
        except (OSError, ValueError, AttributeError):
            width = None
        if width is None:
            try:
                width = int(os.environ.get("COLUMNS", "")) or None
            except ValueError:
                width = None
        width = max(40, width or 80)
    color = tty and os.environ.get("TERM") != "dumb" and not os.environ.get("NO_COLOR")
    if os.environ.get("FORCE_COLOR"):
        color = True
    return width, color


# the long form each part of ranktrace says, and the few words the notes line needs
_SHORT = [
    (re.compile(r"^no NVIDIA driver reachable through NVML \((.*?)\): no GPU samples.*$"), r"no GPU samples (NVML: \1)"),
    (re.compile(r"^no NCCL RAS on (\S+)$"), r"no NCCL RAS (nothing on \1)"),
    (re.compile(r"^py-spy not found or turned off: .*$"), "py-spy not found or turned off (stacks from the in-rank agents)"),
    (re.compile(r"^compiled fast path unavailable \((.*)\): .*$"), r"compiled fast path unavailable (~2 us per traced call: \1)"),
]


def _short(text: str) -> str:
    for pat, repl in _SHORT:
        if pat.match(text):
            return pat.sub(repl, text)
    return text


class Presenter:
    """Prints verdicts and notes on `stream` (stderr), through `write` (the status line's eraser)."""

    def __init__(self, stream: TextIO | None = None, write: Callable[[str], None] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.write = write or self._raw
        self.shown: "Verdict | None" = None     # the verdict last printed in full or as a change
        self._notes: list[str] = []
        self._said = 0                           # notes already printed

    def _raw(self, s: str) -> None:
        self.stream.write(s)
        self.stream.flush()

    def style(self) -> tuple[int | None, bool]:
        return terminal_style(self.stream)

    # --- notes --------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """A capability this run lacks here (said once, in the notes line)."""
        text = _short(text.strip())
        if text and text not in self._notes:
            self._notes.append(text)

    def notes_line(self) -> str | None:
        """The notes not said yet, as one line (None when there are none); marks them said."""
        new = self._notes[self._said:]
        self._said = len(self._notes)
        return ("[ranktrace] on this machine: " + "; ".join(new) + "\n") if new else None

    def flush_notes(self) -> None:
        line = self.notes_line()
        if line:
            self.write(line)

    # --- verdicts ----------------------------------------------------------------------------------------
    def verdict(self, v: "Verdict") -> None:
        """The verdict in full (the watchdog's, at the hang), then the notes."""
        from ranktrace.analyzers.report import text_report

        width, color = self.style()
        self.write(text_report.render(v, width, color))
        self.shown = v
        self.flush_notes()

    def final(self, v: "Verdict") -> None:
        """The verdict at the end of the run: in full when none was printed, else only what changed."""
        from ranktrace.analyzers.report import text_report

        width, color = self.style()
        text = text_report.render(v, width, color) if self.shown is None else \
            text_report.render_change(self.shown, v, width, color)
        if text:
            self.write(text)
        self.shown = v
        self.flush_notes()
