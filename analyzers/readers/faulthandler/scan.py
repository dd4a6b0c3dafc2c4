"""The line walk of faulthandler text: thread headers, frame lines (two glued by interleaved writes are split),
fatal-error and timeout lines that start a new dump."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.common.ranks import split_rank_prefix
from ranktrace.analyzers.readers.common.stacks import StackRecord

__all__ = ["SNIFF", "scan"]

SOURCE = "faulthandler"

_HEADER = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9A-Fa-f]+)(?: \[(?P<name>[^\]]*)\]| \"(?P<qname>[^\"]*)\")?"
    r" \(most recent call first\):\s*$"
)
_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME = re.compile(r'File "(?P<file>.{0,1000}?)", line (?P<line>\d+|\?\?\?) in (?P<func>.{0,400}?)(?=\s{1,40}File "|\s*$)')
_FATAL = re.compile(r"^Fatal Python error: (.*)$")
_TIMEOUT = re.compile(r"^Timeout \((\d+:\d\d:\d\d(?:\.\d+)?)\)!\s*$")
_IGNORED = re.compile(r"^(<no Python frame>|<truncated rest of calls>|Extension modules: .*|Python runtime state: .*|"
                      r"\.\.\.|  \.\.\.)\s*$")
SNIFF = re.compile(
    r"(?m)(?:Current thread|Thread) 0x[0-9A-Fa-f]+ (?:\[[^\]]*\] )?\(most recent call first\):"
    r"|^\S*Stack \(most recent call first\):"
)


def scan(path: Path, text: str) -> tuple[list[StackRecord], list[dict[str, Any]], list[Skipped], int]:
    """The thread dumps of a text: stack records (rank from the line prefix, file name not yet applied), the
    ``py_fatal_error`` rows, what was skipped, and how many lines lay outside any dump."""
    f = str(path)

    threads: list[StackRecord] = []
    obs: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    torn: list[tuple[int, str]] = []
    cur: StackRecord | None = None
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
            cur = StackRecord(SOURCE, f, no, ident=ident, thread_name=name, rank=prefix_rank,
                              snapshot=f"{path.name}#{snapshot}")
            threads.append(cur)
            continue
        frames = list(_FRAME.finditer(stripped))
        if frames and stripped.startswith("File "):
            if cur is None:  # frames without a header: a dump whose header was cut off
                if snapshot == 0:
                    new_snapshot()
                cur = StackRecord(SOURCE, f, no, rank=prefix_rank, snapshot=f"{path.name}#{snapshot}")
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
    return threads, obs, skipped, outside
