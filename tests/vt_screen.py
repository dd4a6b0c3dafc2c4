"""A small VT100/xterm screen model for tests: what a person sees after a terminal received some bytes.

It knows what ranktrace's status line and ordinary job output use (printable text with deferred auto-wrap, CR, LF,
BS, TAB, ESC 7 / ESC 8, IND, RI, cursor moves, CUP, EL, ED, DECSTBM, SGR ignored) and keeps the lines that scroll
off the top of a region starting at row 1 as scrollback, the way xterm and tmux do. Anything else in a CSI is
ignored, so a test can tell "the same text" from "different text", not colours.
"""
from __future__ import annotations

import re

__all__ = ["Screen"]

_CSI = re.compile(r"\x1b\[([?>]?)([0-9;]*)([ -/]*)([@-~])")


class Screen:
    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.grid = [[" "] * cols for _ in range(rows)]
        self.history: list[str] = []
        self.wrapped = [False] * rows          # row r continues on row r+1 (auto-wrap, not a newline)
        self.history_wrapped: list[bool] = []
        self.history_full: list[str] = []       # scrolled-off rows as they were, trailing blanks kept
        self.r = self.c = 0
        self.top, self.bottom = 0, rows - 1
        self.saved = (0, 0)
        self.wrap_next = False

    # ---------------------------------------------------------------------------------------------- reading
    def line(self, r: int) -> str:
        return "".join(self.grid[r]).rstrip()

    def transcript(self, join_wrapped: bool = False) -> list[str]:
        """Scrollback then the screen, trailing blank rows dropped: the whole text a person can scroll through.
        `join_wrapped`: a line the terminal wrapped at its edge is given as the one line that was written."""
        lines = self.history + [self.line(r) for r in range(self.rows)]
        cont = self.history_wrapped + self.wrapped
        if join_wrapped:  # a wrapped row is full: its trailing blank is a space that was written
            full = self.history_full + ["".join(row) for row in self.grid]
            lines = [f if c else ln for ln, f, c in zip(lines, full, cont)]
            joined: list[str] = []
            glue = False
            for ln, c in zip(lines, cont):
                if glue:
                    joined[-1] += ln
                else:
                    joined.append(ln)
                glue = c
            lines = joined
        while lines and not lines[-1]:
            lines.pop()
        return lines

    # ---------------------------------------------------------------------------------------------- feeding
    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = _CSI.match(text, i)
                if m:
                    self._csi(m.group(1), m.group(2), m.group(4))
                    i = m.end()
                    continue
                nxt = text[i + 1:i + 2]
                if nxt == "]":  # OSC ... BEL / ST
                    end = min((j for j in (text.find("\x07", i), text.find("\x1b\\", i)) if j >= 0),
                              default=len(text))
                    i = end + (1 if text.startswith("\x07", end) else 2)
                    continue
                self._esc(nxt)
                i += 2
                continue
            self._char(ch)
            i += 1

    def _char(self, ch: str) -> None:
        if ch == "\r":
            self.c, self.wrap_next = 0, False
        elif ch == "\n":
            self._linefeed()
        elif ch == "\b":
            self.c, self.wrap_next = max(0, self.c - 1), False
        elif ch == "\t":
            self.c = min(self.cols - 1, (self.c // 8 + 1) * 8)
        elif ch < " " or ch == "\x7f":
            pass
        else:
            if self.wrap_next:
                self.c, self.wrap_next = 0, False
                self.wrapped[self.r] = True
                self._linefeed()
            self.grid[self.r][self.c] = ch
            if self.c == self.cols - 1:
                self.wrap_next = True
            else:
                self.c += 1

    def _linefeed(self) -> None:
        self.wrap_next = False
        if self.r == self.bottom:
            self._scroll_up()
        elif self.r < self.rows - 1:
            self.r += 1

    def _scroll_up(self) -> None:
        gone = self.grid.pop(self.top)
        was_wrapped = self.wrapped.pop(self.top)
        if self.top == 0:
            self.history.append("".join(gone).rstrip())
            self.history_wrapped.append(was_wrapped)
            self.history_full.append("".join(gone))
        self.grid.insert(self.bottom, [" "] * self.cols)
        self.wrapped.insert(self.bottom, False)

    def _esc(self, ch: str) -> None:
        if ch == "7":
            self.saved = (self.r, self.c)
        elif ch == "8":
            self.r, self.c = self.saved
            self.wrap_next = False
        elif ch == "D":
            self._linefeed()
        elif ch == "E":
            self.c = 0
            self._linefeed()
        elif ch == "M":
            if self.r == self.top:
                self.grid.pop(self.bottom)
                self.grid.insert(self.top, [" "] * self.cols)
                self.wrapped.pop(self.bottom)
                self.wrapped.insert(self.top, False)
            elif self.r > 0:
                self.r -= 1

    def _csi(self, private: str, params: str, final: str) -> None:
        nums = [int(p) if p else 0 for p in params.split(";")] if params else []

        def arg(k: int, default: int) -> int:
            return nums[k] if len(nums) > k and nums[k] else default

        self.wrap_next = False
        if private:
            return  # modes (?25l, ?1049h ...) do not change the text
        if final == "A":
            self.r = max(self.top if self.r >= self.top else 0, self.r - arg(0, 1))
        elif final == "B":
            self.r = min(self.bottom if self.r <= self.bottom else self.rows - 1, self.r + arg(0, 1))
        elif final == "C":
            self.c = min(self.cols - 1, self.c + arg(0, 1))
        elif final == "D":
            self.c = max(0, self.c - arg(0, 1))
        elif final == "G":
            self.c = min(self.cols - 1, arg(0, 1) - 1)
        elif final in "Hf":
            self.r, self.c = min(self.rows, arg(0, 1)) - 1, min(self.cols, arg(1, 1)) - 1
        elif final == "K":
            mode = arg(0, 0)
            row = self.grid[self.r]
            lo, hi = {0: (self.c, self.cols), 1: (0, self.c + 1), 2: (0, self.cols)}.get(mode, (0, 0))
            row[lo:hi] = [" "] * (hi - lo)
            if hi == self.cols:
                self.wrapped[self.r] = False
        elif final == "J":
            mode = arg(0, 0)
            if mode in (2, 3):
                self.grid = [[" "] * self.cols for _ in range(self.rows)]
                self.wrapped = [False] * self.rows
            elif mode == 0:
                self.grid[self.r][self.c:] = [" "] * (self.cols - self.c)
                for r in range(self.r + 1, self.rows):
                    self.grid[r] = [" "] * self.cols
        elif final == "r":
            top, bottom = arg(0, 1) - 1, arg(1, self.rows) - 1
            if top < bottom:
                self.top, self.bottom = top, bottom
                self.r = self.c = 0  # DECSTBM homes the cursor
