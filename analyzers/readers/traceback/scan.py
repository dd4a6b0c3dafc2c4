"""Lines -> Traceback / CppBacktrace records, per writer (two ranks printing at once interleave their lines)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.text import Line, TextDoc
from ranktrace.analyzers.readers.common.torch_text import Speaker, speaker, strip_leaders
from ranktrace.analyzers.readers.traceback.signatures import (CHAIN, CPP_FRAME, CPP_HEADER, EXC, FRAME, HEADER,
                                                              CPP_FRAME_TORN, IGNORED, RICH_BOX, RICH_CURRENT,
                                                              RICH_HEADER, RICH_IN, RICH_LOC, SEGV, SPAWN, THREAD)

__all__ = ["Frame", "Traceback", "CppBacktrace", "Scan", "scan"]

_EXC_NAME = re.compile(r"(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout|Iteration)$")
_CARETS = frozenset("^~ ")
_BOX = ("│", "└", "├", "┬", "┌")
_RICH_LEAD = ("│", "╭", "╰")


@dataclass(frozen=True)
class Frame:
    file: str
    lineno: int
    func: str
    code: str | None
    line: int                 # the line of the input that shows this frame


@dataclass(frozen=True)
class Traceback:
    line: int                     # header line, or first frame line when the top was cut
    who: Speaker
    frames: tuple[Frame, ...]     # outermost first, as printed
    exc_type: str | None          # None: cut before its exception line
    exc_msg: str                  # first line of the message (or the next line when the message starts empty)
    exc_line: int | None
    cut_top: bool
    spawn_index: int | None       # "-- Process N terminated with the following error:" just before it
    thread: str | None            # "Exception in thread NAME:" just before it
    chained: bool                 # an exception raised while handling (or caused by) an earlier one
    segfault: int | None = None   # the line of "Segfault encountered": native frames, innermost first, no exception


@dataclass(frozen=True)
class CppBacktrace:
    line: int
    who: Speaker
    raised_from: str | None       # "Exception raised from checkTimeout at ..." function
    symbols: tuple[str, ...]      # innermost first: "c10d::ProcessGroupNCCL::checkTimeout(...)"
    libs: tuple[str, ...]         # the library of each frame (file name)
    cut_top: bool


@dataclass
class Scan:
    records: list[Traceback | CppBacktrace] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def scan(doc: TextDoc) -> Scan:
    """
    Tracebacks are read per writer: lines carry the launcher prefix of the rank that printed them (``[rank3]:``, a Ray
    worker's pid), and two ranks printing at once interleave their lines, so each writer has its own open traceback.
    A traceback starts at its header, or, when the paste cut the top off, at the first frame line; it ends at its
    exception line, or — cut at the bottom — at the first line of the same writer that is neither a frame nor code.

    Code line or exception line? After a frame, an indented line deeper than the frame is code. When the indentation is
    gone (pytest's ``E`` column strips it), a line is code unless it looks like an exception (a dotted name ending in
    Error / Exception / Interrupt / Exit / Warning or with a capitalised last part, then ``:`` or the end of the line).
    """
    return _Scanner(doc).run()


def _looks_like_exception(text: str) -> re.Match[str] | None:
    m = EXC.match(text)
    if m is None:
        return None
    typ = m.group("type")
    if ".." in typ or typ.endswith(".") or typ in ("None", "True", "False"):
        return None
    last = typ.rsplit(".", 1)[-1]
    if not last or not (last[0].isupper() or _EXC_NAME.search(last)):
        return None
    if m.group("msg") is None and not _EXC_NAME.search(last) and last not in ("KeyboardInterrupt", "StopIteration"):
        return None   # a bare capitalised word is an exception only with a typical name
    return m


def _ignored(text: str) -> bool:
    s = text.strip()
    return (not s) or set(s) <= _CARETS or s.startswith(_BOX) or IGNORED.match(text) is not None


@dataclass
class _Open:
    line: int
    who: Speaker
    frames: list[Frame]
    cut_top: bool
    spawn_index: int | None
    thread: str | None
    chained: bool
    segfault: int | None = None
    indent: int = -1
    exc: tuple[str, str, int] | None = None
    wants_detail: bool = False
    continued: int = 0       # indented lines already taken into the message (pydantic's "  Value error, ...")


class _Scanner:
    def __init__(self, doc: TextDoc) -> None:
        self.doc = doc
        self.out = Scan()
        self.open: dict[tuple[object, ...], _Open] = {}
        # key -> (line, what, number, name): what a line said about the writer's next traceback
        self.pending: dict[tuple[object, ...], tuple[int, str, int | None, str | None]] = {}
        self.cpp: dict[tuple[object, ...], tuple[int, Speaker, str | None, list[str], list[str], bool]] = {}
        # key -> (file, lineno): a rich frame location whose "in func" wrapped onto the next box line
        self.rich_loc: dict[tuple[object, ...], tuple[str, str]] = {}

    def run(self) -> Scan:
        for ln in self.doc.lines:
            try:
                self.line(ln)
            except (ValueError, IndexError) as e:
                self.out.skipped.append(Skipped(self.doc.path, ln.no, f"traceback line not understood "
                                                                     f"({type(e).__name__}): {ln.text[:160]!r}"))
        for key, (file, lineno) in list(self.rich_loc.items()):   # a location the paste cut after
            if key in self.open:
                self.open[key].frames.append(Frame(file, int(lineno), "?", None, self.open[key].line))
        for key in list(self.open):
            self.close(key)
        for key in list(self.cpp):
            self.close_cpp(key)
        self.out.records.sort(key=lambda r: r.line)   # writers close at different times: keep the input's order
        return self.out

    @staticmethod
    def key(ln: Line) -> tuple[object, ...]:
        p = ln.prefix
        return (p.rank, p.local_rank, p.pid, p.host, p.tag)

    # --- one line -------------------------------------------------------------------------------------------------
    def line(self, ln: Line) -> None:
        text, _ = strip_leaders(ln.text)
        key = self.key(ln)
        if text.lstrip()[:1] in _RICH_LEAD:
            for plain in self.rich(key, text):
                self.plain_line(ln, key, plain)
            return
        self.plain_line(ln, key, text)

    def rich(self, key: tuple[object, ...], text: str) -> list[str]:
        """rich's box-drawn traceback line -> the plain traceback lines it stands for (none for its context lines,
        borders and locals): the header, ``File "f", line N, in func`` for a location (which may wrap onto the next
        box line), the code of the ``❱`` current line indented under it."""
        out: list[str] = []
        if RICH_HEADER.match(text):
            self.rich_loc.pop(key, None)
            return ["Traceback (most recent call last):"]
        m = RICH_BOX.match(text) if text.lstrip()[:1] == "│" else None
        inner = m.group("inner").strip() if m else ""
        loc = self.rich_loc.pop(key, None)
        fm = RICH_IN.match(inner) if loc else None
        if loc:
            out.append(f'  File "{loc[0]}", line {loc[1]}, in {fm.group("func") if fm else "?"}')
            if fm:
                return out
        lm = RICH_LOC.match(inner)
        if lm and lm.group("func"):
            out.append(f'  File "{lm.group("file")}", line {lm.group("line")}, in {lm.group("func")}')
        elif lm:
            self.rich_loc[key] = (lm.group("file"), lm.group("line"))
        else:
            cm = RICH_CURRENT.match(inner)
            if cm and cm.group("code").strip(" │"):
                out.append("      " + cm.group("code").strip(" │"))
        return out

    def plain_line(self, ln: Line, key: tuple[object, ...], text: str) -> None:
        if self.cpp_line(ln, key, text):
            return
        if HEADER.search(text):
            self.close(key)
            self.start(ln, key, text, cut_top=False)
            return
        if CHAIN.match(text):
            self.close(key)
            self.pending[key] = (ln.no, "chain", None, None)
            return
        m = FRAME.match(text)
        if m:
            tb = self.open.get(key)
            if tb is None or tb.exc is not None:
                self.close(key)
                tb = self.start(ln, key, text, cut_top=True)
            if tb.indent < 0:
                tb.indent = len(m.group("ind"))
            tb.frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func"), None, ln.no))
            return
        tb = self.open.get(key)
        if tb is not None and tb.exc is None:
            if _ignored(text):
                return
            if self.is_code(tb, text):
                last = tb.frames[-1]
                code = text.strip() if last.code is None else f"{last.code} {text.strip()}"
                tb.frames[-1] = Frame(last.file, last.lineno, last.func, code, last.line)
                return
            m = _looks_like_exception(text.strip()) if tb.frames else None
            if m is not None:
                msg = (m.group("msg") or "").strip()
                tb.exc = (m.group("type"), msg, ln.no)
                tb.wants_detail = not msg and m.group("msg") is not None
                return
            self.close(key)          # something else: the traceback was cut before its exception line
        elif tb is not None:         # after the exception line: an empty message takes the next line as its detail
            s = text.strip()
            if tb.wants_detail and s and tb.exc is not None and not set(s) <= set("=-"):
                typ, _msg, no = tb.exc
                tb.exc = (typ, s, no)
                tb.wants_detail = False
            elif tb.wants_detail and s:
                return
            elif (tb.exc is not None and s and text[:1] in " \t" and tb.continued < 2 and len(tb.exc[1]) < 300
                  and not s.startswith(("File ", "During handling", "The above exception"))):
                # a message that goes on, indented, on the next lines (pydantic's ValidationError says what failed
                # there): part of the message, which is what a person reads first
                typ, msg, no = tb.exc
                tb.exc = (typ, f"{msg}: {s}"[:400] if msg else s[:400], no)
                tb.continued += 1
                return
            self.close(key)
        self.remember(ln, key, text)

    def is_code(self, tb: _Open, text: str) -> bool:
        if not tb.frames:
            return False
        ind = len(text) - len(text.lstrip())
        if tb.indent > 0:
            return ind > tb.indent
        return _looks_like_exception(text.strip()) is None and not CHAIN.match(text)

    def remember(self, ln: Line, key: tuple[object, ...], text: str) -> None:
        """Lines that say something about the next traceback of this writer."""
        m = SPAWN.search(text)
        if m:
            self.pending[key] = (ln.no, "spawn", int(m.group("i")), None)
            return
        m = THREAD.search(text)
        if m:
            self.pending[key] = (ln.no, "thread", None, m.group("name"))
            return
        if SEGV.search(text):
            self.pending[key] = (ln.no, "segfault", ln.no, None)

    def start(self, ln: Line, key: tuple[object, ...], text: str, cut_top: bool) -> _Open:
        who, _ = speaker(ln, text, self.doc.name_rank)
        spawn: int | None = None
        segfault: int | None = None
        thread: str | None = None
        chained = False
        pend = self.pending.pop(key, None)
        if pend is not None and ln.no - pend[0] <= 4:
            if pend[1] == "spawn":
                spawn = pend[2]
            elif pend[1] == "thread":
                thread = pend[3]
            elif pend[1] == "chain":
                chained = True
            elif pend[1] == "segfault":
                segfault = pend[2]
        if spawn is None and not cut_top:
            m = SPAWN.search(text)   # "-- Process 3 terminated with the following error: Traceback ..." on one line
            if m:
                spawn = int(m.group("i"))
        tb = _Open(ln.no if segfault is None else segfault, who, [], cut_top and segfault is None, spawn, thread,
                   chained, segfault)
        self.open[key] = tb
        return tb

    def close(self, key: tuple[object, ...]) -> None:
        tb = self.open.pop(key, None)
        if tb is None:
            return
        if not tb.frames:
            if tb.exc is None:
                self.out.skipped.append(Skipped(self.doc.path, tb.line, "traceback header without frames (cut)"))
            return
        typ, msg, exc_line = tb.exc if tb.exc is not None else (None, "", None)
        if typ is None and tb.segfault is None:
            self.out.skipped.append(Skipped(self.doc.path, tb.frames[-1].line,
                                            "traceback cut before its exception line: the exception is unknown"))
        self.out.records.append(Traceback(tb.line, tb.who, tuple(tb.frames), typ, msg, exc_line, tb.cut_top,
                                          tb.spawn_index, tb.thread, tb.chained, tb.segfault))

    # --- C++ backtraces -------------------------------------------------------------------------------------------
    def cpp_line(self, ln: Line, key: tuple[object, ...], text: str) -> bool:
        m = CPP_HEADER.search(text)
        if m:
            self.close_cpp(key)
            who, _ = speaker(ln, text, self.doc.name_rank)
            self.cpp[key] = (ln.no, who, m.group("func"), [], [], False)
            return False   # the header may end a Python exception message: let the line be seen as text too
        m = CPP_FRAME.match(text)
        torn = None
        if m is None:
            torn = CPP_FRAME_TORN.match(text)
        if m is not None or torn is not None:
            cur = self.cpp.get(key)
            if cur is None:
                who, _ = speaker(ln, text, self.doc.name_rank)
                cur = (ln.no, who, None, [], [], True)
                self.cpp[key] = cur
            if m is not None:
                cur[3].append(m.group("sym").strip())
                cur[4].append(m.group("lib").rsplit("/", 1)[-1])
            elif torn is not None:
                cur[3].append(torn.group("sym").strip())
                cur[4].append("?")
                self.out.skipped.append(Skipped(self.doc.path, ln.no, "C++ frame line cut before its library"))
            return True
        if key in self.cpp and self.cpp[key][3]:
            self.close_cpp(key)
        return False

    def close_cpp(self, key: tuple[object, ...]) -> None:
        cur = self.cpp.pop(key, None)
        if cur is None or not cur[3]:
            return
        no, who, raised, syms, libs, cut = cur
        self.out.records.append(CppBacktrace(no, who, raised, tuple(syms), tuple(libs), cut))
