"""One live status line on the terminal during ``trace run``: ranks alive, each group's last seq, quiet time, phase.

Only when stderr is a TTY (never in logs or pipes). Rewritten in place (``\\r`` + erase line) at most once per
second; ranktrace's own lines erase it first (:meth:`StatusLine.clear`), so a verdict report never starts in the
middle of it. The job's own output is not ours to intercept: the cursor is left at the start of the status line so
a line the job prints overwrites it, and the next rewrite draws it again below.

Text, e.g. ``[ranktrace] 8/8 ranks alive | 0:42 r3:41 | 5:17 | quiet 12s | running``: per group the seq most ranks
are at, then the ranks elsewhere (``r3:41``; ``+N`` when more than four differ).
"""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import Callable, TextIO

__all__ = ["StatusLine", "format_status", "compact_group"]

_CLEAR = "\r\x1b[K"
_SEP = " | "  # ASCII: a terminal in a non-UTF-8 locale must not lose the line


def compact_group(name: str, seqs: dict[int, int]) -> str:
    """``name:majority`` then the ranks that differ: ``0:42 r3:41``."""
    if not seqs:
        return f"{name}:-"
    top, _n = Counter(seqs.values()).most_common(1)[0]
    odd = sorted((r, s) for r, s in seqs.items() if s != top)
    parts = [f"{name}:{top}"] + [f"r{r}:{s}" for r, s in odd[:4]]
    if len(odd) > 4:
        parts.append(f"+{len(odd) - 4}")
    return " ".join(parts)


def format_status(alive: int, known: int, world: int | None, groups: dict[str, dict[int, int]], quiet_s: float,
                  phase: str, width: int = 100) -> str:
    ranks = f"{alive}/{world or known} ranks alive" if (world or known) else "no rank yet"
    gs = _SEP.join(compact_group(g, s) for g, s in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0]))[:4])
    more = f"{_SEP}+{len(groups) - 4} groups" if len(groups) > 4 else ""
    text = _SEP.join(p for p in (f"[ranktrace] {ranks}", gs + more if gs else "", f"quiet {quiet_s:.0f}s", phase)
                     if p)
    return text if len(text) <= width else text[:width - 3] + "..."


class StatusLine:
    """Draws and clears the line; inert when `stream` is not a TTY."""

    def __init__(self, stream: TextIO, *, min_interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 enabled: bool | None = None) -> None:
        self.stream, self.min_interval, self.clock = stream, min_interval, clock
        if enabled is None:
            try:
                enabled = stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = bool(enabled)
        self.visible = False
        self._last = float("-inf")

    def width(self) -> int:
        try:
            cols = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            cols = 0
        return max(40, cols - 1) if cols else 100  # a pty nobody sized says 0 columns

    def update(self, text_fn: Callable[[int], str | None]) -> None:
        """Redraw with ``text_fn(width)`` if a second has passed since the last draw (None: draw nothing)."""
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last < self.min_interval:
            return
        self._last = now
        text = text_fn(self.width())
        if not text:
            return
        self._write(_CLEAR + text + "\r")
        self.visible = True

    def clear(self) -> None:
        if self.enabled and self.visible:
            self._write(_CLEAR)
            self.visible = False

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def wrap(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        """`fn` with the status line erased first (for ranktrace's own stderr lines and reports)."""
        def out(s: str) -> None:
            self.clear()
            fn(s)
        return out
