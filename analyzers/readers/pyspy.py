"""Read ``py-spy dump`` output — text, ``--json``, ``--native``, ``--locals``, ``--subprocesses``, SGLang-wrapped —
into STACKS rows (one per thread per dump).

Why: where each rank's threads sit is what separates "waiting in a collective" from "somewhere else" (DESIGN §2
host state). py-spy is what users already run on a hung job, so we read what they kept, in whatever wrapping.

Accepted shapes (formats.md §4):

* text: ``Process N: cmdline`` / ``Python vX.Y.Z (exe)`` / ``[Parent Process N: cmd]`` headers, then
  ``Thread <tid|0xident> (idle|active|active+gil)[: "name"]`` and 4-space frame lines ``func (file:line)``
  (``func (lib.so)`` for native frames); ``--locals`` lines (8+ spaces) are skipped; several processes in one file
  (``--subprocesses`` with ``----`` separators, or dumps concatenated by a script); trimmed dumps (a thread header and
  only its top frames, with or without a ``Process`` header);
* SGLang's watchdog wrapping: ``[ts] Pyspy dump for PID <pid>[ (<cmd>)]:`` followed by the dump, and its failure
  lines ``Pyspy failed to dump PID <pid>. Error: ...`` / ``Pyspy failed (<cmd>). Error: ...`` /
  ``All pyspy dump attempts failed for PID <pid>.``; other log lines in the file are ignored (counted once);
* what people paste around and instead of a dump: the command above it (``$ py-spy dump --pid 123``: the pid of
  a dump cut before its ``Process`` line), a trimmed stack written at the margin with no thread header or with its
  frames' indentation lost (read as one thread, ``thread_state`` unknown, ``tid`` null);
* any line may carry a launcher prefix (``[rank3]:``, ``[1,3]<stdout>:``); a common indentation (dumps pasted into
  markdown) is removed;
* ``--json``: an array of thread objects (a truncated array keeps every complete thread);
* py-spy's own error output (stderr saved to a file): no rows, one ``Skipped`` naming py-spy's message and its class
  (permission_denied / no_such_process / not_python / other).

Columns: ``frames`` innermost first as ``"func (file:line)"`` exactly as py-spy's text prints them (JSON frames are
formatted the same way from ``short_filename``), ``thread_state`` from the header (JSON: ``owns_gil`` →
``active+gil``, ``active`` → ``active``, else ``idle``), ``tid`` = OS thread id when py-spy printed a decimal id
(a ``0x`` id is a Python thread ident and gives null), ``native`` = the dump holds native frames,
``snapshot`` = ``<file name>[pid N]`` (``#k`` appended when the same pid is dumped again in one file).

OBSERVATIONS: one ``process`` row per ``Process N: cmdline`` header (``pid``, ``detail`` = ``pid=N by=pyspy
cmd=<redacted command>``, ``rank`` as below), so a dump cut right after its header still says which process was
alive.

Rank: launcher prefix on the lines > ``rankN`` / ``TPn`` in the process command line (``sglang::scheduler_TP3``) >
the file name, the latter only when the file holds one process. Otherwise null (the lead maps pid → rank).

Known limits: SGLang's timestamps are local time without a zone, so ``wall_ns`` stays null; ``idle`` is py-spy's OS
level guess, not a statement about progress; a text dump's thread order is not meaningful.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.base import (ReadResult, ReaderError, Skipped, decode_text, empty_file, json_array_items,
                                    read_file_bytes)
from ranktrace.analyzers.readers.ps_top.rows import redact_command
from ranktrace.analyzers.readers.rankinfer import rank_from_name, split_rank_prefix
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "COLUMN_MAP", "sniff", "read", "read_doc", "classify_error"]

FORMAT = "pyspy"

#: Declared raw → column mapping: (raw field, STACKS column, type, default, first py-spy version).
COLUMN_MAP: tuple[tuple[str, str, str, str, str], ...] = (
    ("Process N / JSON pid", "pid", "int", "null", "0.3"),
    ("Thread <decimal> / JSON os_thread_id", "tid", "int (OS tid)", "null", "0.3"),
    ('Thread ...: "name" / JSON thread_name', "thread_name", "str", "null", "0.3"),
    ("(idle|active|active+gil) / JSON active, owns_gil", "thread_state", "str", "unknown", "0.3"),
    ("frame lines / JSON frames[name, short_filename, line]", "frames", "list[str] innermost first", "[]", "0.3"),
    ("native frames present / SGLang --native", "native", "bool", "False", "0.3"),
    ("[rankN]: prefix | cmdline rankN/TPn | file name", "rank", "int", "null", "-"),
    ("file name + pid (+#k)", "snapshot", "str", "-", "-"),
    ("(line of the Thread header; JSON: index of the thread)", "line", "int", "-", "-"),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
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

_SNIFF_TEXT = re.compile(
    r"(?m)(^\S*?\s*Process \d+: .*\r?\n\S*?\s*Python v\d"
    r"|Pyspy dump for PID \d+|Pyspy failed|All pyspy dump attempts failed"
    r"|^\S*?\s*Thread (?:0x[0-9a-fA-F]+|\d+) \((?:idle|active\+gil|active)\)"
    r"|^Permission Denied: Try running again with elevated permissions"
    r"|^Error: Failed to (?:get process executable name|find python version|get stack traces))"
)

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


def sniff(path: Path, head: bytes) -> bool:
    """py-spy text headers / SGLang wrapper / py-spy error text, or a JSON array of py-spy thread objects."""
    h = head.lstrip()
    if h.startswith(b"["):
        if b'"thread_id"' in head and b'"frames"' in head and (b'"owns_gil"' in head or b'"os_thread_id"' in head):
            return True
    if h[:1] in (b"{", b"\x80") or b"\x00" in head:
        return False
    return bool(_SNIFF_TEXT.search(_ANSI.sub("", head.decode("utf-8", errors="replace"))))


# --------------------------------------------------------------------------------------------- text

@dataclass
class _Thread:
    line: int
    tid_raw: str
    state: str
    name: str | None
    rank: int | None
    frames: list[str] = field(default_factory=list)


@dataclass
class _Process:
    line: int
    pid: int | None
    cmdline: str | None = None
    rank: int | None = None
    native: bool = False
    threads: list[_Thread] = field(default_factory=list)


@dataclass
class _TextState:
    f: str
    procs: list[_Process] = field(default_factory=list)
    proc: _Process | None = None
    thread: _Thread | None = None
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

    def start_process(self, line: int, pid: int | None) -> _Process:
        self.close_process()
        p = _Process(line=line, pid=pid)
        if pid is not None and pid == self.pending_pid:
            p.native = self.pending_native
        self.pending_pid, self.pending_native = None, False
        self.procs.append(p)
        self.proc = p
        return p


def _read_text(path: Path, text: str) -> tuple[list[_Process], list[Skipped], int]:
    st = _TextState(f=str(path))
    for no, raw in enumerate(text.splitlines(), start=1):
        prefix_rank, body = split_rank_prefix(_ANSI.sub("", raw.rstrip("\r\n")))
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
            st.thread = _Thread(line=no, tid_raw=m.group(1), state=state, name=m.group(3), rank=prefix_rank)
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
            st.thread = _Thread(line=no, tid_raw="", state="unknown", name=None, rank=prefix_rank)
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


# --------------------------------------------------------------------------------------------- JSON

def _json_frame(fr: Any) -> str | None:
    if not isinstance(fr, dict) or not fr.get("name"):
        return None
    loc = fr.get("short_filename") or fr.get("filename") or fr.get("module") or "?"
    line = fr.get("line")
    return f"{fr['name']} ({loc}:{line})" if isinstance(line, int) and line > 0 else f"{fr['name']} ({loc})"


def _json_threads(text: str) -> tuple[list[Any], bool]:
    """Thread objects of a py-spy JSON array; (objects, truncated)."""
    try:
        obj = json.loads(text)
        return (obj if isinstance(obj, list) else [obj]), False
    except ValueError:
        pass
    return json_array_items(text, text.index("[") + 1), True


def _read_json(path: Path, text: str, file_rank: int | None) -> tuple[list[dict[str, Any]], list[Skipped]]:
    f = str(path)
    items, truncated = _json_threads(text)
    skipped: list[Skipped] = []
    if not items or not all(isinstance(t, dict) and "frames" in t and ("thread_id" in t or "pid" in t)
                            for t in items):
        if truncated and not items:
            raise ReaderError(path, "JSON array holds no complete py-spy thread object")
        raise ReaderError(path, "JSON that is not py-spy --json output (no thread objects with frames)")
    if truncated:
        skipped.append(Skipped(f, None, f"truncated JSON: kept {len(items)} complete thread(s)"))
    rows: list[dict[str, Any]] = []
    pids = {t.get("pid") for t in items}
    # ranktrace's in-rank agent (tracer.agent) writes the same layout into agent-<pid>.json
    source = "agent" if path.name.startswith("agent-") else "pyspy"
    for i, t in enumerate(items):
        frames = [s for s in (_json_frame(fr) for fr in t.get("frames") or []) if s is not None]
        native = any(isinstance(fr, dict) and (fr.get("module") or fr.get("line") == 0) for fr in t.get("frames") or [])
        info = t.get("process_info") if isinstance(t.get("process_info"), dict) else {}
        cmd = info.get("command_line") if isinstance(info.get("command_line"), str) else None
        rank = rank_from_name(cmd) if cmd else None
        if rank is None and len(pids) == 1:
            rank = file_rank
        state = "active+gil" if t.get("owns_gil") else ("active" if t.get("active") else "idle")
        if "active" not in t and "owns_gil" not in t:
            state = "unknown"
        pid = t.get("pid") if isinstance(t.get("pid"), int) else None
        tid = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else None
        rows.append({
            "pid": pid, "tid": tid, "rank": rank, "thread_name": t.get("thread_name"), "thread_state": state,
            "frames": frames, "native": native, "snapshot": f"{path.name}[pid {pid}]", "source": source,
            "file": f, "line": i,
        })
    return rows, skipped


# --------------------------------------------------------------------------------------------- entry point

def read(path: Path) -> ReadResult:
    """Read one file of py-spy output (text or JSON) into STACKS."""
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT)
    text = decode_text(path, data, "binary data, not py-spy output")
    return _from_text(path, text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The py-spy dumps found in a text input opened by the shared opener (prefixes already spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)
    file_rank = rank_from_name(path.name)

    if text.lstrip().startswith("["):
        head = text.lstrip()[:4096]
        if '"frames"' in head or '"thread_id"' in head:
            json_rows, json_skipped = _read_json(path, text.lstrip(), file_rank)
            return ReadResult(file=f, format=FORMAT, stacks=schema.table_from_rows(schema.STACKS, json_rows),
                              skipped=tuple(json_skipped))
    if text.lstrip().startswith("{"):
        raise ReaderError(path, "JSON object, not py-spy output (py-spy --json writes an array)")

    procs, skipped, outside = _read_text(path, text)  # text dump(s)
    with_threads = [p for p in procs if p.threads]
    if not with_threads and not procs and not any(s.reason.startswith(("py-spy failed", "all py-spy"))
                                                  for s in skipped):
        raise ReaderError(path, "no py-spy dump or py-spy error message found")
    for p in procs:
        if not p.threads:
            skipped.append(Skipped(f, p.line, f"py-spy dump of pid {p.pid} has no thread (cut after its header?)"))
    if outside:
        skipped.append(Skipped(f, None, f"{outside} line(s) outside py-spy dumps ignored (log text)"))

    rows: list[dict[str, Any]] = []
    seen: dict[int | None, int] = {}
    one_process = len(with_threads) == 1
    for p in with_threads:
        k = seen[p.pid] = seen.get(p.pid, 0) + 1
        snap = f"{path.name}[pid {p.pid}]" if p.pid is not None else f"{path.name}[dump at line {p.line}]"
        if k > 1:
            snap += f"#{k}"
        for t in p.threads:
            rank = t.rank if t.rank is not None else p.rank
            if rank is None and one_process:
                rank = file_rank
            rows.append({
                "pid": p.pid, "tid": int(t.tid_raw) if t.tid_raw.isdigit() else None, "rank": rank,
                "thread_name": t.name, "thread_state": t.state, "frames": t.frames, "native": p.native,
                "snapshot": snap, "source": "pyspy", "file": f, "line": t.line,
            })
    return ReadResult(file=f, format=FORMAT, stacks=schema.table_from_rows(schema.STACKS, rows),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, _process_rows(f, procs, file_rank)),
                      skipped=tuple(skipped))


def _process_rows(f: str, procs: list[_Process], file_rank: int | None) -> list[dict[str, Any]]:
    """One ``process`` row per ``Process N: cmdline`` header (docs/EVIDENCE.md): the process py-spy found alive,
    its command (redacted) and the rank it names; also for a dump cut right after its header."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for p in procs:
        if p.pid is None or p.cmdline is None or p.pid in seen:
            continue
        seen.add(p.pid)
        rank = p.rank if p.rank is not None else (file_rank if len(procs) == 1 else None)
        out.append({"pid": p.pid, "rank": rank, "kind": "process", "name": None, "source": "pyspy", "file": f,
                    "line": p.line, "detail": f"pid={p.pid} by=pyspy cmd={redact_command(p.cmdline)}"})
    return out
