"""The line walk of gdb output: ``Thread N (...)`` headers, ``#k`` frames and their wrapped tails, ``info threads``
tables, and the attach / detach lines that split one file into several processes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ranktrace.analyzers.readers.common.ranks import split_rank_prefix
from ranktrace.analyzers.readers.common.stacks import StackRecord
from ranktrace.analyzers.readers.gdb.frames import frame_text, with_location

__all__ = ["SNIFF", "Scan", "scan"]

SOURCE = "gdb"

_THREAD = re.compile(r"^Thread (\d+) \((.*)\):\s*$")
_LWP = re.compile(r"\bLWP (\d+)")
_NAME = re.compile(r'"([^"]*)"\s*$')
_FRAME_START = re.compile(r"^#(\d+)\s+(.*)$")
_ATTACH = re.compile(r"^Attaching to (?:program: .*, )?process (\d+)")
#: ``info threads``: ``* 1    Thread 0x7f.. (LWP 5923) "python" 0x00007f.. in poll () from /lib64/libc.so.6``
_INFO_THREAD = re.compile(r"^\*?\s{0,4}(\d{1,6})\s{1,8}Thread 0x[0-9a-fA-F]{1,16} \(LWP (\d{1,9})\)"
                          r"(?: \"([^\"]{0,200})\")?\s{1,8}(\S.*)$")
#: the rest of a frame gdb wrapped onto the next line: ``    from /usr/lib/libnccl.so.2`` / ``    at init.cc:840``
_FRAME_TAIL = re.compile(r"^(?:from (\S+)|at (\S+:\d+))\s*$")
_SYMBOLS_OF = re.compile(r"^Reading symbols from (\S+?)(?:\.\.\.|$)")
_GDB_COMMAND = re.compile(r"^(?:\S{0,80}[$#%] )?(?:sudo )?(?:cuda-)?gdb\b.{0,200}?(?:-p|--pid|attach)\s{0,4}(\d+)")
_DETACH = re.compile(r"^\[Inferior \d+ \(process (\d+)\) (?:detached|killed|exited.*)\]")
_IGNORED = re.compile(
    r"^(\[New LWP \d+\]|\[New Thread .*\]|\[Thread debugging using .*\]|Using host libthread_db.*|"
    r"\d+\s.*No such file or directory\.|warning: .*|To enable execution of this file add|add-auto-load.*|"
    r"line to your configuration file.*|To completely disable this security protection add|set auto-load .*|"
    r"For more information about this security protection see the|\"Auto-loading safe path\" section.*|"
    r"info \"\(gdb\)Auto-loading safe path\"|Backtrace stopped: .*|\(More stack frames follow\.\.\.\)|"
    r"\[Current focus set to .*\]|\[Switching focus to .*\]|\[Switching to thread .*\]|Reading symbols from .*|"
    r"Loaded symbols for .*|Download failed: .*|\(gdb\) .*|Quit anyway\? .*|Detaching from program: .*|"
    r"0x[0-9a-f]+ in .*|.* at \S+:\d+|.*\(\) from \S+)\s*$"
)
SNIFF = re.compile(r"(?m)^\S*?Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ )?\(?LWP \d+\)|^\S*?#\d+\s+0x[0-9a-fA-F]+ in \S")




@dataclass
class Scan:
    """What the walk found: threads per section (one process each), the pid and executable of each section."""

    threads: list[tuple[int, StackRecord]]      # (section, thread), in file order
    section_pid: dict[int, int]
    section_exe: dict[int, str]
    torn: list[tuple[int, str]]                 # frame lines cut in the middle: (line, text)
    outside: int                                # lines outside any backtrace


def scan(path: Path, text: str) -> Scan:
    """The backtraces of a text, split into processes (sections), and what was torn or left outside."""
    f = str(path)

    threads: list[tuple[int, StackRecord]] = []   # (section, thread)
    section_pid: dict[int, int] = {}
    section_exe: dict[int, str] = {}
    section = 0
    cur: StackRecord | None = None
    torn: list[tuple[int, str]] = []
    outside = 0
    wrapped: _WrappedFrame | None = None   # a frame whose argument list gdb continued on the next lines

    for no, raw in enumerate(text.splitlines(), start=1):
        prefix_rank, body = split_rank_prefix(raw.rstrip("\r\n"))
        stripped = body.strip()
        if wrapped is not None:
            if wrapped.takes(body, stripped):
                if wrapped.closed():
                    fr = frame_text(wrapped.text)
                    if fr is not None and wrapped.record.frames[wrapped.index] == "":
                        wrapped.record.frames[wrapped.index] = fr
                        torn.remove(wrapped.torn)
                    wrapped = None
                continue
            wrapped = None
        m = _ATTACH.match(stripped) or _GDB_COMMAND.match(stripped)
        if m:
            if any(s == section for s, _ in threads) or section_pid.get(section, int(m.group(1))) != \
                    int(m.group(1)):
                section += 1
            section_pid[section] = int(m.group(1))
            cur = None
            continue
        m = _SYMBOLS_OF.match(stripped)
        if m:
            section_exe.setdefault(section, m.group(1).rsplit("/", 1)[-1])
            continue
        m = _DETACH.match(stripped)
        if m:
            section_pid.setdefault(section, int(m.group(1)))
            section += 1
            cur = None
            continue
        m = _THREAD.match(stripped)
        if m:
            inner = m.group(2)
            lwp = _LWP.search(inner)
            name = _NAME.search(inner)
            gdb_no = int(m.group(1))
            if any(s == section and t.ident == _number(gdb_no) for s, t in threads):
                section += 1  # the same gdb thread number again: a second process without attach lines
            cur = StackRecord(SOURCE, f, no, ident=_number(gdb_no), tid=int(lwp.group(1)) if lwp else None,
                              thread_name=name.group(1) if name else None, native=True, rank=prefix_rank)
            threads.append((section, cur))
            continue
        m = _INFO_THREAD.match(stripped)
        if m:
            fr = frame_text(m.group(4))
            t = StackRecord(SOURCE, f, no, [fr] if fr else [], ident=_number(int(m.group(1))), tid=int(m.group(2)),
                            thread_name=m.group(3), native=True, rank=prefix_rank)
            if fr is None:
                torn.append((no, stripped))
            threads.append((section, t))
            cur = None
            continue
        m = _FRAME_START.match(stripped)
        if m:
            if cur is None or (cur.ident is None and m.group(1) == "0" and cur.frames):
                # frames with no Thread header: a single-thread ``bt``, or a dump cut above its first header
                cur = StackRecord(SOURCE, f, no, native=True, rank=prefix_rank)
                threads.append((section, cur))
            fr = frame_text(m.group(2))
            if fr is None:
                torn.append((no, stripped))
                cur.frames.append("")        # keep the position: the wrapped tail may complete it
                if m.group(2).count("(") > m.group(2).count(")"):
                    wrapped = _WrappedFrame(cur, len(cur.frames) - 1, m.group(2).strip(), torn[-1])
            else:
                cur.frames.append(fr)
            continue
        m = _FRAME_TAIL.match(stripped)
        if m and cur is not None and cur.frames:
            cur.frames[-1] = with_location(cur.frames[-1], m.group(1), m.group(2))
            continue
        if not stripped or _IGNORED.match(stripped):
            continue
        if cur is not None and stripped.startswith("#"):
            torn.append((no, stripped))
            continue
        outside += 1

    for _, t in threads:
        t.frames = [fr for fr in t.frames if fr]
    threads = [(s, t) for s, t in threads if t.frames or t.ident is not None]
    return Scan(threads, section_pid, section_exe, torn, outside)


class _WrappedFrame:
    """A ``#k`` line whose call arguments gdb printed over several lines (``ncclEnqueueCheck (`` then indented
    ``func=..., primName=...`` lines up to ``) at misc/enqueue.cu:205``): its lines joined until the parentheses
    balance, then read as one frame. Bounded: a dozen lines, a few thousand characters."""

    MAX_LINES, MAX_CHARS = 12, 4000

    def __init__(self, record: StackRecord, index: int, text: str, torn: tuple[int, str]) -> None:
        self.record, self.index, self.text, self.torn = record, index, text, torn
        self.lines = 0

    def takes(self, body: str, stripped: str) -> bool:
        """Whether this line continues the frame (indented, not a frame or thread header of its own)."""
        if (not stripped or not body[:1].isspace() or stripped.startswith(("#", "Thread ")) or
                self.lines >= self.MAX_LINES or len(self.text) + len(stripped) > self.MAX_CHARS):
            return False
        self.text += " " + stripped
        self.lines += 1
        return True

    def closed(self) -> bool:
        return self.text.count("(") <= self.text.count(")")


def _number(gdb_no: int) -> str | None:
    """gdb's thread number as the record's ident; 0 (or no ``Thread`` header) is none."""
    return str(gdb_no) if gdb_no else None
