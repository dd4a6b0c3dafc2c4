"""Read gdb / cuda-gdb ``thread apply all bt`` output into STACKS rows (native stacks, one per thread).

Why: only a native debugger sees threads that hold no Python state — gloo's ``pt_gloo_runloop`` worker blocked in
``UnboundBuffer::waitRecv``, NCCL's watchdog, a main thread inside ``c10d::Work::wait`` or ``cudaStreamSynchronize``.
Users attach gdb to a hung rank and keep the text; this turns it into the same table py-spy feeds.

Accepted text::

    Thread 4 (Thread 0x7f6b1767e6c0 (LWP 5969) "pt_gloo_runloop"):
    #0  __futex_abstimed_wait_common64 (private=0, ...) at ./nptl/futex-internal.c:57
    #5  0x00007f6b2479c856 in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, ...) () from /.../libtorch_cpu.so
    Thread 2 (LWP 777):                                   (no pthread id)

Several processes in one file (a loop of ``gdb -p``) are split at ``Attaching to process N`` / ``gdb -p N`` /
``[Inferior 1 (process N) detached]``; gdb's start-up chatter, cuda-gdb's focus lines and ``Backtrace stopped``
lines are ignored; ``[rankN]:`` prefixes are honoured.

Pasted shapes also read: frames with no ``Thread`` header (a single-thread ``bt``, or a dump cut above its first
header: one thread per ``#0`` run, ``tid`` null); the ``from lib`` / ``at file:line`` tail gdb wraps onto the next
line; ``info threads`` tables (one row per thread holding only its current frame); a frame cut before its function
name (``#4  0x00007fd0``) or inside its library path (``from /usr/lib/python3.9/s``: the frame without a library)
is skipped / kept without the location; a paste that stops after gdb attached (``Attaching to process N``, no
backtrace) gives one ``process`` OBSERVATIONS row (pid, the executable gdb read symbols from) instead of nothing.

Columns: ``frames`` innermost first as ``"func (file:line)"`` for frames with source, ``"func (lib.so)"`` for
``from lib`` frames (library base name, like py-spy ``--native``), else ``"func"``; C++ parameter lists and call
arguments are dropped (``c10d::Work::wait (libtorch_cpu.so)``). ``tid`` = LWP (OS thread id), ``thread_name`` =
the quoted name, ``native`` True, ``thread_state`` ``unknown``, ``pid`` from the attach/detach lines, else the LWP
of gdb's thread 1 (the main thread), ``snapshot`` ``<file name>[pid N]``.

Known limits: device (CUDA kernel) backtraces from cuda-gdb are read like host ones (their frame names keep the
``<<<grid,block>>>`` launch text); Python frames are only visible as ``_PyEval_EvalFrameDefault`` unless the user
ran ``py-bt`` (not parsed); a frame line cut in the middle is skipped (reported), so that stack has a gap.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.base import ReadResult, ReaderError, Skipped, decode_text, empty_file, read_file_bytes
from ranktrace.analyzers.readers.common.ranks import rank_from_name, split_rank_prefix

__all__ = ["FORMAT", "COLUMN_MAP", "sniff", "read", "read_doc", "frame_text"]

FORMAT = "gdb"

#: Declared raw → column mapping: (raw, STACKS column, type, default, first seen).
COLUMN_MAP: tuple[tuple[str, str, str, str, str], ...] = (
    ("Thread N (... (LWP L) ...)", "tid", "int LWP", "null", "gdb 7"),
    ('Thread N (... "name")', "thread_name", "str", "null", "gdb 8"),
    ("#k [0xADDR in ]FUNC (ARGS) [at FILE:LINE | from LIB]", "frames", "func (file:line) | func (lib)", "[]", "gdb 7"),
    ("Attaching to process N / [Inferior 1 (process N) detached]", "pid", "int", "LWP of thread 1", "gdb 7"),
    ("[rankN]: prefix | file name", "rank", "int", "null", "-"),
    ("(line of the Thread header)", "line", "int", "-", "-"),
)

_THREAD = re.compile(r"^Thread (\d+) \((.*)\):\s*$")
_LWP = re.compile(r"\bLWP (\d+)")
_NAME = re.compile(r'"([^"]*)"\s*$')
_FRAME_START = re.compile(r"^#(\d+)\s+(.*)$")
_ADDR = re.compile(r"^0x[0-9A-Fa-f]+ in ")
_ADDR_ONLY = re.compile(r"^0x[0-9A-Fa-f]*(?: in)?$")
_AT = re.compile(r"^(.*) at (\S+:\d+)\s*$")
_FROM = re.compile(r"^(.*) from (\S+)\s*$")
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
_SNIFF = re.compile(r"(?m)^\S*?Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ )?\(?LWP \d+\)|^\S*?#\d+\s+0x[0-9a-fA-F]+ in \S")


def _looks_binary_or_json(head: bytes) -> bool:
    """Pickles, NUL bytes and JSON documents are never this text format (a ``[rank0]:`` prefix is fine)."""
    h = head.lstrip()
    return h[:1] in (b"{", b"\x80") or b"\x00" in head or re.match(rb"\[\s*[{\]]", h) is not None


def sniff(path: Path, head: bytes) -> bool:
    """gdb thread headers (``Thread N (Thread 0x.. (LWP n)``) or ``#k  0x... in func`` frame lines."""
    if _looks_binary_or_json(head):
        return False
    return bool(_SNIFF.search(head.decode("utf-8", errors="replace")))


def _balanced_tail(text: str) -> int | None:
    """Index of the '(' that opens the parenthesised group ending `text`, or None if unbalanced/absent."""
    if not text.endswith(")"):
        return None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return i
    return None


def _function(spec: str) -> str | None:
    """``func(params) (args)`` → ``func``; None when the parentheses do not balance (a torn line)."""
    spec = spec.strip()
    i = _balanced_tail(spec)
    if i is None:
        return spec if "(" not in spec and ")" not in spec and spec else None
    func = spec[:i].rstrip()
    if not func:
        return None
    j = _balanced_tail(func)  # demangled C++ parameter list: waitRecv(int*, ...) -> waitRecv
    if j is not None and j > 0 and not func.startswith("{"):
        func = func[:j]
    return func or None


def frame_text(rest: str) -> str | None:
    """Format one frame line (after ``#k``) as ``func (file:line)`` / ``func (lib)`` / ``func``; None if torn."""
    rest = _ADDR.sub("", rest.strip())
    if _ADDR_ONLY.match(rest):
        return None          # "0x00007f0" / "0x00007f.. in": cut before the function name
    loc = None
    m = _AT.match(rest)
    if m:
        rest, loc = m.group(1), m.group(2)
    else:
        m = _FROM.match(rest)
        if m:
            rest, loc = m.group(1), _lib(m.group(2))
    func = _function(rest)
    if func is None:
        return None
    return f"{func} ({loc})" if loc else func


@dataclass
class _Thread:
    line: int
    gdb_no: int               # 0: frames with no Thread header (a plain ``bt``, a dump cut before its header)
    lwp: int | None
    name: str | None
    rank: int | None
    section: int
    frames: list[str] = field(default_factory=list)


def _with_location(frame: str, lib: str | None, at: str | None) -> str:
    """A frame whose ``from lib`` / ``at file:line`` gdb wrapped onto the next line; a frame cut before its
    parentheses closed is completed as far as the tail allows."""
    loc = at if at else _lib(lib or "")
    if loc is None:
        return frame
    return f"{frame} ({loc})" if frame else f"?? ({loc})"


def _lib(path: str) -> str | None:
    """The library's base name; None for a path cut before its name ends (``.../lib/python3.9/s``)."""
    name = path.rsplit("/", 1)[-1]
    return name if "." in name else None


def _attached_only(f: str, section_pid: dict[int, int], section_exe: dict[int, str],
                   skipped: list[Skipped]) -> ReadResult:
    """gdb attached (``Attaching to process N``, ``gdb -p N``) but the paste stops before any backtrace: the
    process it attached to is all the file says (a ``process`` row)."""
    obs = []
    for s, pid in sorted(section_pid.items()):
        exe = section_exe.get(s)
        obs.append({"pid": pid, "kind": "process", "name": None, "source": "gdb", "file": f,
                    "detail": f"pid={pid} by=gdb" + (f" cmd={exe}" if exe else "") + " (attached, no backtrace in "
                              "the file)"})
    skipped.append(Skipped(f, None, "gdb attached but the file holds no backtrace (cut after the preamble?)"))
    return ReadResult(file=f, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(skipped))


def read(path: Path) -> ReadResult:
    """Read gdb ``thread apply all bt`` output (one or several processes) into STACKS."""
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT)
    text = decode_text(path, data, "binary data (a core file?), not gdb text output")
    return _from_text(path, text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (launcher prefixes spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)

    threads: list[_Thread] = []
    section_pid: dict[int, int] = {}
    section_exe: dict[int, str] = {}
    section = 0
    cur: _Thread | None = None
    skipped: list[Skipped] = []
    torn: list[tuple[int, str]] = []
    outside = 0

    for no, raw in enumerate(text.splitlines(), start=1):
        prefix_rank, body = split_rank_prefix(raw.rstrip("\r\n"))
        stripped = body.strip()
        m = _ATTACH.match(stripped) or _GDB_COMMAND.match(stripped)
        if m:
            if any(t.section == section for t in threads) or section_pid.get(section, int(m.group(1))) != \
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
            if any(t.section == section and t.gdb_no == gdb_no for t in threads):
                section += 1  # the same gdb thread number again: a second process without attach lines
            cur = _Thread(line=no, gdb_no=gdb_no, lwp=int(lwp.group(1)) if lwp else None,
                          name=name.group(1) if name else None, rank=prefix_rank, section=section)
            threads.append(cur)
            continue
        m = _INFO_THREAD.match(stripped)
        if m:
            fr = frame_text(m.group(4))
            t = _Thread(line=no, gdb_no=int(m.group(1)), lwp=int(m.group(2)), name=m.group(3), rank=prefix_rank,
                        section=section, frames=[fr] if fr else [])
            if fr is None:
                torn.append((no, stripped))
            threads.append(t)
            cur = None
            continue
        m = _FRAME_START.match(stripped)
        if m:
            if cur is None or (cur.gdb_no == 0 and m.group(1) == "0" and cur.frames):
                # frames with no Thread header: a single-thread ``bt``, or a dump cut above its first header
                cur = _Thread(line=no, gdb_no=0, lwp=None, name=None, rank=prefix_rank, section=section)
                threads.append(cur)
            fr = frame_text(m.group(2))
            if fr is None:
                torn.append((no, stripped))
                cur.frames.append("")        # keep the position: the wrapped tail may complete it
            else:
                cur.frames.append(fr)
            continue
        m = _FRAME_TAIL.match(stripped)
        if m and cur is not None and cur.frames:
            cur.frames[-1] = _with_location(cur.frames[-1], m.group(1), m.group(2))
            continue
        if not stripped or _IGNORED.match(stripped):
            continue
        if cur is not None and stripped.startswith("#"):
            torn.append((no, stripped))
            continue
        outside += 1

    for t in threads:
        t.frames = [fr for fr in t.frames if fr]
    threads = [t for t in threads if t.frames or t.gdb_no]
    if not threads:
        if section_pid:
            return _attached_only(f, section_pid, section_exe, skipped)
        raise ReaderError(path, "no gdb thread backtrace found")
    if torn:
        skipped.append(Skipped(f, torn[0][0], f"{len(torn)} torn frame line(s) skipped (stack has a gap), "
                                              f"first: {torn[0][1][:120]!r}"))
    if outside:
        skipped.append(Skipped(f, None, f"{outside} unrecognized line(s) outside thread backtraces ignored"))

    file_rank = rank_from_name(path.name)
    sections = sorted({t.section for t in threads})
    rows = []
    for s in sections:
        members = [t for t in threads if t.section == s]
        pid = section_pid.get(s)
        if pid is None:
            main = [t for t in members if t.gdb_no == 1 and t.lwp is not None]
            pid = main[0].lwp if main else None
        for t in members:
            rank = t.rank if t.rank is not None else (file_rank if len(sections) == 1 else None)
            state = "unknown"
            rows.append({
                "pid": pid, "tid": t.lwp, "rank": rank, "thread_name": t.name, "thread_state": state,
                "frames": t.frames, "native": True,
                "snapshot": f"{path.name}[pid {pid}]" if pid is not None else f"{path.name}[process {s}]",
                "source": "gdb", "file": f, "line": t.line,
            })
    return ReadResult(file=f, format=FORMAT, stacks=schema.table_from_rows(schema.STACKS, rows),
                      skipped=tuple(skipped))
