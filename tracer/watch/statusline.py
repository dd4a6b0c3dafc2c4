"""One live status line on the terminal during ``trace run``: ranks alive, each group's last seq, quiet time, phase.

Only when stderr is a TTY (never in logs or pipes). Rewritten in place (``\\r`` + erase line) at most once per
second; ranktrace's own lines erase it first (:meth:`StatusLine.clear`), so a verdict report never starts in the
middle of it. The job's own output is not ours to intercept: the cursor is left at the start of the status line so
a line the job prints overwrites it, and the next rewrite draws it again below.

Text, e.g. ``[ranktrace] 8/8 ranks alive | group 0 at seq 42, rank 3 at 41 | group 5 at seq 17 | quiet 12s |
running``: per group the seq (the count of collectives issued on it) most ranks are at, then the ranks elsewhere
(``ranks 3,5 at 41``; ``+N more`` past three such sets).
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
