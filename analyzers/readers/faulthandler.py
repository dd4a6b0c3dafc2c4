"""Read Python ``faulthandler`` dumps into STACKS rows (one per thread per dump).

Why: ``faulthandler.register(signal, all_threads=True)`` is the no-ptrace fallback for stacks of a rank blocked in
``Work.wait`` (the GIL is released there), and ``dump_traceback_later`` / fatal signals leave the same text in a
rank's stderr. It shows where every Python thread is, like py-spy without thread states.

Accepted text::

    Fatal Python error: Segmentation fault                  (optional; also "Timeout (0:00:10)!")
    Thread 0x00007f... (most recent call first):
      File "x.py", line 12 in func
    Current thread 0x00007f... (most recent call first):
      File "<string>", line 1 in <module>
    Stack (most recent call first):                          (single-thread dumps)

Also: ``[rankN]:`` launcher prefixes, thread names between the id and the parenthesis (newer Pythons), two frame
lines glued together by interleaved writes (``... in f  File "y.py", line 3 in g``), ``<no Python frame>``,
several dumps appended to one file (each becomes its own ``snapshot``: a new dump starts at a ``Fatal Python error``
/ ``Timeout`` line, or when a thread id repeats).

Columns: ``frames`` innermost first (faulthandler's order already) as ``"func (file:line)"``; ``thread_state``
``unknown``; ``thread_name`` ``"<current>"`` for the current thread unless a name is printed; ``tid`` null
(faulthandler prints the pthread id, not the OS thread id); ``native`` False; ``snapshot`` ``<file name>#k``.
A ``Fatal Python error: X`` line also yields an OBSERVATIONS row ``py_fatal_error`` (detail = X).

Known limits: faulthandler prints bare function names and full paths while py-spy prints qualified names and short
paths, so the same frame is spelled differently by the two readers; no pid is printed (null unless the lead knows
it); rank comes from a launcher prefix, else from the file name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.base import ReadResult, ReaderError, Skipped, decode_text, empty_file, read_file_bytes
from ranktrace.analyzers.readers.common.ranks import rank_from_name, split_rank_prefix

__all__ = ["FORMAT", "COLUMN_MAP", "sniff", "read", "read_doc"]

FORMAT = "faulthandler"

#: Declared raw → column mapping: (raw, STACKS column, type, default, first Python version).
COLUMN_MAP: tuple[tuple[str, str, str, str, str], ...] = (
    ('File "F", line N in FUNC', "frames", '"FUNC (F:N)", innermost first', "[]", "3.3"),
    ("Current thread / Thread 0x.. [name]", "thread_name", "str; <current> for the current thread", "null", "3.3"),
    ("[rankN]: prefix | file name", "rank", "int", "null", "-"),
    ("(dump index in file)", "snapshot", "<file name>#k", "-", "-"),
    ("(line of the thread header)", "line", "int", "-", "-"),
)

_HEADER = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9A-Fa-f]+)(?: \[(?P<name>[^\]]*)\]| \"(?P<qname>[^\"]*)\")?"
    r" \(most recent call first\):\s*$"
)
_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME = re.compile(r'File "(?P<file>.*?)", line (?P<line>\d+|\?\?\?) in (?P<func>.*?)(?=\s+File "|\s*$)')
_FATAL = re.compile(r"^Fatal Python error: (.*)$")
_TIMEOUT = re.compile(r"^Timeout \((\d+:\d\d:\d\d(?:\.\d+)?)\)!\s*$")
_IGNORED = re.compile(r"^(<no Python frame>|<truncated rest of calls>|Extension modules: .*|Python runtime state: .*|"
                      r"\.\.\.|  \.\.\.)\s*$")
_SNIFF = re.compile(
    r"(?m)(?:Current thread|Thread) 0x[0-9A-Fa-f]+ (?:\[[^\]]*\] )?\(most recent call first\):"
    r"|^\S*Stack \(most recent call first\):"
)


def _looks_binary_or_json(head: bytes) -> bool:
    """Pickles, NUL bytes and JSON documents are never this text format (a ``[rank0]:`` prefix is fine)."""
    h = head.lstrip()
    return h[:1] in (b"{", b"\x80") or b"\x00" in head or re.match(rb"\[\s*[{\]]", h) is not None


def sniff(path: Path, head: bytes) -> bool:
    """A faulthandler thread header (``... (most recent call first):``) in the first bytes."""
    if _looks_binary_or_json(head):
        return False
    return bool(_SNIFF.search(head.decode("utf-8", errors="replace")))


@dataclass
class _Thread:
    line: int
    name: str | None
    ident: str | None
    rank: int | None
    snapshot: int
    frames: list[str] = field(default_factory=list)


def read(path: Path) -> ReadResult:
    """Read every faulthandler dump in one file into STACKS (and fatal errors into OBSERVATIONS)."""
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT)
    text = decode_text(path, data, "binary data, not a faulthandler dump")
    return _from_text(path, text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (launcher prefixes spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)

    threads: list[_Thread] = []
    obs: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    torn: list[tuple[int, str]] = []
    cur: _Thread | None = None
    snapshot = 0
    ids_in_snapshot: set[str] = set()
    outside = 0
    fatal_pending = False

    def new_snapshot() -> None:
        nonlocal snapshot
        snapshot += 1
        ids_in_snapshot.clear()

    def flush_torn() -> None:
        if torn:
            skipped.append(Skipped(f, torn[0][0], f"{len(torn)} torn/unrecognized line(s) inside a faulthandler "
                                                  f"dump, first: {torn[0][1][:120]!r}"))
            torn.clear()

    for no, raw in enumerate(text.splitlines(), start=1):
        prefix_rank, body = split_rank_prefix(raw.rstrip("\r\n"))
        stripped = body.strip()
        m = _FATAL.match(stripped)
        if m or _TIMEOUT.match(stripped):
            flush_torn()
            new_snapshot()
            fatal_pending = True
            cur = None
            if m:
                obs.append({"rank": prefix_rank, "kind": "py_fatal_error", "name": "faulthandler",
                            "detail": m.group(1).strip(), "source": "faulthandler", "file": f, "line": no})
            continue
        m = _HEADER.match(stripped)
        stack_only = _STACK.match(stripped)
        if m or stack_only:
            flush_torn()
            ident = m.group("id") if m else None
            if snapshot == 0 or (ident is not None and ident in ids_in_snapshot) or (stack_only and not fatal_pending
                                                                                      and threads):
                new_snapshot()
            fatal_pending = False
            if ident is not None:
                ids_in_snapshot.add(ident)
            name = None
            if m:
                name = m.group("name") or m.group("qname")
                if name is None and m.group("current") == "Current thread":
                    name = "<current>"
            else:
                name = "<current>"
            cur = _Thread(line=no, name=name, ident=ident, rank=prefix_rank, snapshot=snapshot)
            threads.append(cur)
            continue
        frames = list(_FRAME.finditer(stripped))
        if frames and stripped.startswith("File "):
            if cur is None:  # frames without a header: a dump whose header was cut off
                if snapshot == 0:
                    new_snapshot()
                cur = _Thread(line=no, name=None, ident=None, rank=prefix_rank, snapshot=snapshot)
                threads.append(cur)
                skipped.append(Skipped(f, no, "frames without a thread header (cut dump?) kept as an unnamed thread"))
            for fm in frames:
                cur.frames.append(f"{fm.group('func').strip()} ({fm.group('file')}:{fm.group('line')})")
            if cur.rank is None and prefix_rank is not None:
                cur.rank = prefix_rank
            continue
        if not stripped or _IGNORED.match(stripped):
            continue
        if cur is not None and body.startswith(" ") and stripped.startswith("File"):
            torn.append((no, stripped))  # a frame line cut in the middle
            continue
        flush_torn()
        cur = None
        outside += 1

    flush_torn()
    if not threads:
        raise ReaderError(path, "no faulthandler thread dump found")
    if outside:
        skipped.append(Skipped(f, None, f"{outside} line(s) outside faulthandler dumps ignored"))

    file_rank = rank_from_name(path.name)
    rows = [{
        "rank": t.rank if t.rank is not None else file_rank, "thread_name": t.name, "thread_state": "unknown",
        "frames": t.frames, "native": False, "snapshot": f"{path.name}#{t.snapshot}", "source": "faulthandler",
        "file": f, "line": t.line,
    } for t in threads]
    for o in obs:
        if o["rank"] is None:
            o["rank"] = file_rank
    return ReadResult(file=f, format=FORMAT, stacks=schema.table_from_rows(schema.STACKS, rows),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped))
