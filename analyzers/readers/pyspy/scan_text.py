"""The text walk of py-spy output: ``Process`` / ``Thread`` headers, frame lines, ``--locals``, SGLang's wrapper and
py-spy's own error messages, wherever a log or a paste holds them."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.common.ranks import rank_from_name, split_rank_prefix
from ranktrace.analyzers.readers.common.stacks import StackRecord

__all__ = ["ANSI", "Process", "scan_text", "classify_error"]

SOURCE = "pyspy"

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PYTHON = re.compile(r"^Python v(\S+)")
_PARENT = re.compile(r"^Parent Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \((idle|active\+gil|active|gil|unknown)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^(\S.*) \(([^()]+)\)$")
_SEPARATOR = re.compile(r"^-{10,}$")
#: the command a person ran, pasted above its dump: ``$ py-spy dump --pid 123``, ``% sudo py-spy dump -p 6473``
_BANNER = re.compile(r"^(?:\S{0,80}[$%#>] )?(?:sudo )?(?:\S{0,200}/)?py-spy dump\b.{0,200}?(?:--pid[ =]|-p ?)(\d{1,9})")
#: a Python frame written at the margin (a trimmed stack pasted without its thread header and indentation)
_BARE_PY_FRAME = re.compile(r"^\S.{0,300}? \([^()\s][^()]{0,300}\.py:\d{1,7}\)$")
_SGLANG_DUMP = re.compile(r"Pyspy dump for PID (\d+)(?: \((.*?)\))?:\s*$")
_SGLANG_FAIL = re.compile(r"Pyspy failed(?: to dump PID (\d+))?(?: \((.*?)\))?\. Error: ?(.*)$")
_SGLANG_ALLFAIL = re.compile(r"All pyspy dump attempts failed for PID (\d+)")
_PYSPY_ERROR = re.compile(
    r"^(Permission Denied\b.*|Error: Failed to .*|Error: No such .*|This program requires root.*)$"
)
_GENERIC_ERROR = re.compile(r"^Error: .+$")  # only as the first line of a file (py-spy's stderr saved alone)
_ERROR_CONT = re.compile(r"^(Caused by:|Stack backtrace:|\s+\S.*|)$")
_NATIVE_LOC = re.compile(r":\d+$")

_ERROR_CLASSES = (
    (re.compile(r"Permission Denied|Operation not permitted|requires root", re.I), "permission_denied"),
    (re.compile(r"Failed to get process executable name|No such process|os error 3\b"), "no_such_process"),
    (re.compile(r"Failed to find python version|not a python process|Failed to find a python interpreter", re.I),
     "not_python"),
)


def classify_error(message: str) -> str:
    """Class of a py-spy failure message: permission_denied | no_such_process | not_python | other."""
    for rx, kind in _ERROR_CLASSES:
        if rx.search(message):
            return kind
    return "other"


@dataclass
class Process:
    """One dumped process: its header and the threads under it."""

    line: int
    pid: int | None
    cmdline: str | None = None
    rank: int | None = None
    native: bool = False
    threads: list[StackRecord] = field(default_factory=list)


@dataclass
class _TextState:
    f: str
    procs: list[Process] = field(default_factory=list)
    proc: Process | None = None
    thread: StackRecord | None = None
    in_locals: bool = False
    base_indent: int = 0
    pending_pid: int | None = None
    pending_native: bool = False
    error: list[str] = field(default_factory=list)
    error_line: int = 0
    error_pid: int | None = None
    skipped: list[Skipped] = field(default_factory=list)
    torn: list[tuple[int, str]] = field(default_factory=list)
    outside: int = 0
    first_outside: int | None = None
    first_line: bool = True

    def close_thread(self) -> None:
        self.thread, self.in_locals = None, False

    def close_process(self) -> None:
        self.close_thread()
        self.proc = None

    def flush_torn(self) -> None:
        if self.torn:
            no, text = self.torn[0]
            self.skipped.append(Skipped(self.f, no, f"{len(self.torn)} torn/unrecognized line(s) inside a py-spy "
                                                    f"dump, first: {text[:120]!r}"))
            self.torn.clear()

    def flush_error(self) -> None:
        if self.error:
            msg = " | ".join(x for x in (e.strip() for e in self.error) if x)
            who = f" for pid {self.error_pid}" if self.error_pid is not None else ""
            self.skipped.append(Skipped(self.f, self.error_line,
                                        f"py-spy failed{who} ({classify_error(msg)}): {msg[:400]}"))
            self.error.clear()
            self.error_pid = None

    def start_process(self, line: int, pid: int | None) -> Process:
        self.close_process()
        p = Process(line=line, pid=pid)
        if pid is not None and pid == self.pending_pid:
            p.native = self.pending_native
        self.pending_pid, self.pending_native = None, False
        self.procs.append(p)
        self.proc = p
        return p


def scan_text(path: Path, text: str) -> tuple[list[Process], list[Skipped], int]:
    """The dumps of a text: processes with their threads (pid, rank and snapshot filled in later), what was
    skipped, and how many lines lay outside any dump."""
    st = _TextState(f=str(path))
    for no, raw in enumerate(text.splitlines(), start=1):
        prefix_rank, body = split_rank_prefix(ANSI.sub("", raw.rstrip("\r\n")))
        stripped = body.strip()
        indent = len(body) - len(body.lstrip(" "))
        is_first = st.first_line and bool(stripped)
        if stripped:
            st.first_line = False

        # 1. continuation of a py-spy error message
        if st.error:
            if _ERROR_CONT.match(body) and not _THREAD.match(stripped) and not _PROCESS.match(stripped):
                st.error.append(stripped)
                continue
            st.flush_error()

        # 2. SGLang wrapper lines
        m = _SGLANG_DUMP.search(stripped)
        if m:
            st.flush_torn()
            st.close_process()
            st.pending_pid = int(m.group(1))
            st.pending_native = "--native" in (m.group(2) or "") or "-n " in (m.group(2) or "")
            continue
        m = _SGLANG_FAIL.search(stripped)
        if m:
            st.close_process()
            st.error, st.error_line = [m.group(3)], no
            st.error_pid = int(m.group(1)) if m.group(1) else _pid_in(m.group(2))
            continue
        m = _SGLANG_ALLFAIL.search(stripped)
        if m:
            st.skipped.append(Skipped(st.f, no, f"all py-spy attempts failed for pid {m.group(1)}"))
            continue

        # 3. py-spy headers (and the command that made them)
        m = _BANNER.match(stripped) if "py-spy" in stripped else None
        if m:
            st.flush_torn()
            st.close_process()
            st.pending_pid = int(m.group(1))
            continue
        m = _PROCESS.match(stripped)
        if m:
            st.flush_torn()
            st.base_indent = indent
            p = st.start_process(no, int(m.group(1)))
            p.cmdline = m.group(2).strip() or None
            p.rank = prefix_rank if prefix_rank is not None else (rank_from_name(p.cmdline) if p.cmdline else None)
            continue
        if st.proc is not None and st.thread is None and (_PYTHON.match(stripped) or _PARENT.match(stripped)):
            continue
        m = _THREAD.match(stripped)
        if m:
            if st.proc is None:  # trimmed dump without a Process header
                st.base_indent = indent
                st.start_process(no, st.pending_pid)
            assert st.proc is not None
            st.close_thread()
            state = "active+gil" if m.group(2) == "gil" else m.group(2)
            st.thread = StackRecord(SOURCE, st.f, no, ident=m.group(1), tid=int(m.group(1)) if m.group(1).isdigit()
                                    else None, thread_name=m.group(3), state=state, rank=prefix_rank)
            st.proc.threads.append(st.thread)
            continue
        if _SEPARATOR.match(stripped):
            st.flush_torn()
            st.close_process()
            continue

        # 4. py-spy's own error output
        m = _PYSPY_ERROR.match(stripped) or (_GENERIC_ERROR.match(stripped) if is_first else None)
        if m and indent == 0:
            st.flush_torn()
            st.close_process()
            st.error, st.error_line, st.error_pid = [stripped], no, None
            continue

        if not stripped:
            continue
        if st.thread is not None and indent - st.base_indent <= 0 and _BARE_PY_FRAME.match(stripped):
            st.base_indent = indent - 4      # the paste lost the frames' indentation under a thread header
        elif st.thread is None and _BARE_PY_FRAME.match(stripped):
            # a trimmed stack pasted at the margin: frames with no thread header, no indentation
            st.flush_torn()
            p = st.proc if st.proc is not None else st.start_process(no, st.pending_pid)
            st.thread = StackRecord(SOURCE, st.f, no, rank=prefix_rank)
            p.threads.append(st.thread)
            st.base_indent = indent - 4
        rel = indent - st.base_indent
        # 5. frames and --locals lines of the current thread
        if st.thread is not None and rel >= 4:
            if rel >= 8 or (st.in_locals and rel > 4):
                st.in_locals = True  # Arguments: / Locals: / name: repr
                continue
            if rel == 4 and re.search(r"\S {4,}\S", stripped):
                # two writes glued on one line: keep the parts that are whole frames, report the rest
                parts = re.split(r" {4,}", stripped)
                good = [x for x in parts if _FRAME.match(x)]
                st.thread.frames.extend(good)
                st.torn.extend((no, x) for x in parts if not _FRAME.match(x))
                continue
            fm = _FRAME.match(stripped)
            if rel == 4 and fm:
                st.in_locals = False
                st.thread.frames.append(stripped)
                if not _NATIVE_LOC.search(fm.group(2)):
                    assert st.proc is not None
                    st.proc.native = True
                if prefix_rank is not None and st.thread.rank is None:
                    st.thread.rank = prefix_rank
                continue
            if stripped in ("...", "<truncated>") or re.match(r"^\(?\d+ more frames?\)?$", stripped):
                continue
            st.torn.append((no, stripped))
            continue
        if st.proc is not None and rel > 0:
            st.torn.append((no, stripped))
            continue
        # 6. anything else ends the dump (a log line after an SGLang dump) and is not ours
        st.flush_torn()
        st.close_process()
        st.outside += 1
        if st.first_outside is None:
            st.first_outside = no
    st.flush_error()
    st.flush_torn()
    return st.procs, st.skipped, st.outside if st.first_outside is not None else 0


def _pid_in(cmd: str | None) -> int | None:
    m = re.search(r"--pid[ =](\d+)", cmd or "")
    return int(m.group(1)) if m else None
