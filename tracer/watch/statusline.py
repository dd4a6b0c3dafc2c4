"""One live status line on the terminal during ``trace run``: ranks alive, each group's last seq, quiet time, phase.

Why a reserved row and not a line redrawn in place: the job writes to the same terminal directly (its output is
not ours to intercept: a pseudo-terminal in between would change how it buffers, colours and sizes its output), so
ranktrace never knows when the job is about to write. A line drawn in the job's own flow of text, however it is
erased, is overwritten half-way by the job's next line (``0ranktrace] no rank yet | ...``, issue #27). So the
status line lives on the terminal's bottom row, outside the scrolling region (DECSTBM, as apt's progress bar
does): the job's text scrolls in the rows above, exactly as it would, and the bottom row is ours. Each draw is one
``write()`` (a tty write is not interleaved with another process's write), saves and restores the job's cursor
(DECSC / DECRC: position and colours), and draws in plain attributes.

When it is drawn at all: stderr is a terminal that is not ``TERM=dumb``, at least ``MIN_ROWS`` rows, ``trace run``
is its foreground process group (never from the background, where the rows belong to the shell), and
``RANKTRACE_STATUS_LINE`` is not ``0``. :meth:`StatusLine.close` (the end of the run, the job taking the terminal,
any failure of ours: setting ``enabled`` to False) gives the whole screen back. What it cannot undo: a SIGKILL of
`trace run` leaves the scrolling region set (``reset`` or ``tput csr`` gives it back); a job that saves the cursor
itself (DECSC) and restores it more than a second later gets our saved position.

Text, e.g. ``[ranktrace] 8/8 ranks alive | group 0 at seq 42, rank 3 at 41 | group 5 at seq 17 | quiet 12s |
running``: per group the seq (the count of collectives issued on it) most ranks are at, then the ranks elsewhere
(``ranks 3,5 at 41``; ``+N more`` past three such sets). Always shorter than the terminal is wide (a character in
the last column would wrap).
"""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import Callable, TextIO

__all__ = ["StatusLine", "format_status", "compact_group", "MIN_ROWS", "ENV_SWITCH", "region_sequences"]

_SEP = " | "  # ASCII: a terminal in a non-UTF-8 locale must not lose the line
MIN_ROWS = 6  # below that, a row taken from the job costs it too much of its screen
ENV_SWITCH = "RANKTRACE_STATUS_LINE"


def compact_group(name: str, seqs: dict[int, int]) -> str:
    """``group 0 at seq 42, rank 3 at 41``: the seq most ranks of the group are at, then the ranks elsewhere."""
    from ranktrace.analyzers.verdict import compact_ranks

    if not seqs:
        return f"group {name}: no op yet"
    top, _n = Counter(seqs.values()).most_common(1)[0]
    odd: dict[int, list[int]] = {}
    for r, s in sorted(seqs.items()):
        if s != top:
            odd.setdefault(s, []).append(r)
    parts = [f"group {name} at seq {top}"]
    for s, rs in sorted(odd.items(), key=lambda kv: kv[1][0])[:3]:
        parts.append(f"{'rank' if len(rs) == 1 else 'ranks'} {compact_ranks(rs)} at {s}")
    if len(odd) > 3:
        parts.append(f"+{sum(len(rs) for _s, rs in sorted(odd.items(), key=lambda kv: kv[1][0])[3:])} more")
    return ", ".join(parts)


def format_status(alive: int, known: int, world: int | None, groups: dict[str, dict[int, int]], quiet_s: float,
                  phase: str, width: int = 100) -> str:
    ranks = f"{alive}/{world or known} ranks alive" if (world or known) else "no rank yet"
    gs = _SEP.join(compact_group(g, s) for g, s in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))[:4])
    more = f"{_SEP}+{len(groups) - 4} groups" if len(groups) > 4 else ""
    text = _SEP.join(p for p in (f"[ranktrace] {ranks}", gs + more if gs else "", f"quiet {quiet_s:.0f}s", phase)
                     if p)
    return text if len(text) <= width else text[:width - 3] + "..."


def region_sequences(rows: int) -> tuple[str, str, str]:
    """(reserve, draw-prefix, release) for a terminal of `rows` rows: the escape sequences this module writes.

    reserve: IND + CUU (a new bottom row when the cursor sits on it, the job's text and cursor moved up together),
    then the scrolling region 1..rows-1 set between DECSC and DECRC (setting it homes the cursor). draw-prefix: go
    to the bottom row, erase it, plain attributes (the text and DECRC follow). release: erase the bottom row and
    give the whole screen back to scrolling."""
    reserve = f"\x1bD\x1b[1A\x1b7\x1b[1;{rows - 1}r\x1b8"
    draw = f"\x1b7\x1b[{rows};1H\x1b[2K\x1b[0m"
    release = f"\x1b7\x1b[{rows};1H\x1b[2K\x1b[r\x1b8"
    return reserve, draw, release


class StatusLine:
    """Draws the line on the reserved bottom row; inert when `stream` is not a terminal we may draw on."""

    def __init__(self, stream: TextIO, *, min_interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 enabled: bool | None = None) -> None:
        self.stream, self.min_interval, self.clock = stream, min_interval, clock
        if enabled is None:
            enabled = _terminal_allows(stream)
        self._enabled = bool(enabled)
        self.reserved_rows = 0  # the terminal height the scrolling region was set for (0: none set)
        self._last = float("-inf")

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        """Turning it off gives the screen back first (the job took the terminal; a failure of ours)."""
        if not on:
            self.close()
        self._enabled = bool(on)

    @property
    def visible(self) -> bool:
        return self.reserved_rows > 0

    def size(self) -> tuple[int, int]:
        """(columns, rows) of the terminal now; (0, 0) when it cannot say (a pty nobody sized)."""
        try:
            sz = os.get_terminal_size(self.stream.fileno())
            return sz.columns, sz.lines
        except (OSError, ValueError, AttributeError):
            return 0, 0

    def update(self, text_fn: Callable[[int], str | None]) -> None:
        """Redraw with ``text_fn(width)`` if a second has passed since the last draw (None: draw nothing)."""
        if not self._enabled:
            return
        now = self.clock()
        if now - self._last < self.min_interval:
            return
        self._last = now
        cols, rows = self.size()
        if cols < 20 or rows < MIN_ROWS or not self._foreground():
            self.close()  # too small, or in the background: the rows are the shell's
            return
        text = text_fn(cols - 1)
        if not text:
            return
        text = "".join(c if " " <= c <= "~" else "?" for c in text)[:cols - 1]
        out = ""
        if self.reserved_rows != rows:  # first draw, or the terminal was resized (which resets the region)
            if self.reserved_rows:
                out += region_sequences(self.reserved_rows)[2]
            out += region_sequences(rows)[0]
        out += region_sequences(rows)[1] + text + "\x1b8"
        if self._write(out):
            self.reserved_rows = rows

    def clear(self) -> None:
        """The run is over (the launcher's last word): the same as :meth:`close`."""
        self.close()

    def close(self) -> None:
        """Erase the line and give the whole screen back to scrolling."""
        if self.reserved_rows:
            rows, self.reserved_rows = self.reserved_rows, 0
            self._write(region_sequences(rows)[2])

    def _foreground(self) -> bool:
        try:
            fd = self.stream.fileno()
            return os.tcgetpgrp(fd) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            return True  # not a real terminal fd (a test's stand-in): nobody else's rows to take

    def _write(self, s: str) -> bool:
        """One write() of the whole sequence (a tty write is never split by another process's write)."""
        try:
            self.stream.flush()
            try:
                fd = self.stream.fileno()
            except (OSError, ValueError, AttributeError):
                self.stream.write(s)
                self.stream.flush()
                return True
            data = s.encode("ascii", "replace")
            while data:
                n = os.write(fd, data)
                data = data[n:]
            return True
        except (OSError, ValueError):
            self._enabled = False
            return False

    def wrap(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        """`fn` unchanged: our own lines scroll in the job's rows like the job's (kept for the launcher)."""
        return fn


def _terminal_allows(stream: TextIO) -> bool:
    if os.environ.get(ENV_SWITCH, "1") == "0" or os.environ.get("TERM", "") in ("dumb", ""):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
