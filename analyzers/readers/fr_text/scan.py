"""The line walk of torchfrtrace output: claim headlines of three generations, their ``key: value`` lines and
stack, claims outside blocks, and a crash of the analyzer itself (whose output then holds no analysis)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.analyzers.readers.base import Skipped

__all__ = ["SNIFF", "Block", "scan"]

_START = (
    # (regex, block kind); separators vary across releases and pastes (", sequence number: N", ": sequence
    # number: N", " N at entry R")
    (re.compile(r"^Not all ranks joining collective for group (?P<group>\S+) collective (?P<op>\S+)"
                r"(?:\s+Missing ranks are (?P<missing>\{[^}]*\}|set\(\)))?"), "missing"),
    (re.compile(r"^Not all ranks joining collective[,:]?\s{0,4}(?:(?:collective )?sequence number:?\s{0,4})?"
                r"(?P<seq>\d+)(?: at entry (?P<rec>\d+))?"), "missing"),
    (re.compile(r"^Collective (?P<rec>\d+) errors for group (?P<group>\S+) collective (?P<op>\S+)"), "errors"),
    (re.compile(r"^Collective (?:sequence number:?\s{0,4})?(?P<seq>\d+)(?: at entry (?P<rec>\d+))?:? (?:has )?"
                r"errors"), "errors"),
    (re.compile(r"^Input/output mismatch in the collective (?P<rec>\d+)\s+for group (?P<group>\S+) "
                r"collective (?P<op>\S+)"), "size"),
    (re.compile(r"^Input/output mismatch in the collective[,:]?\s{0,4}(?:sequence number:?\s{0,4})?(?P<seq>\d+)"
                r"(?: at entry (?P<rec>\d+))?"), "size"),
)
_KEY = re.compile(r"^(internal record id|group info|collective|missing ranks|expected ranks|world size|"
                  r"collective state|input sizes|output sizes|total input numel|total output numel|error msg|"
                  r"Found errors|collective stack trace|Collective stack traces):\s*(.*)$")
_CULPRIT = re.compile(r"(?:Culprit|Error) rank (\d+)[;,]\s*(?:Error type: )?(?:MatchState\.)?([A-Z_]+)(?:,\s*)?")
_CANNOT_DECIDE = re.compile(r"missed FR dumps from ranks \((\{[^}]*\})\)")
_MISSING_FILES = re.compile(r"Missing dump files from ranks (\{[^}]*\})")
_TOO_MANY = re.compile(r"^Too many mismatches for process_group (\S+?):? (.*?),? aborting")
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)|AssertionError|KeyError)(?::\s*(.*))?$")
_FRAME = re.compile(r"^\s*\S.* at \S+:\d+\s*$")
_NOISE = re.compile(
    r"^(\s*$|.*UserWarning|\s+cpu = _conversion|tabulate is not installed|real\s|user\s|sys\s|"
    r"built groups|built collectives|appending a non-matching collective|No errors found for this collective|"
    r"Rank \d+ has an empty op list|Rank \d+ does not have a coalesced end|.*FutureWarning|\s+warnings\.warn)"
)
SNIFF = re.compile(
    rb"Not all ranks joining collective|Collective sequence number: \d+ has errors|Collective \d+ (?:at entry \d+ )?errors"
    rb"|Input/output mismatch in the collective|File \"[^\"]*(?:/torchfrtrace|flight_recorder/fr_trace\.py"
    rb"|flight_recorder/components/\w+\.py)\", line"
)


def _set(text: str) -> list[int]:
    """Ranks from '{0, 3}', 'set()', '2' (an int there is a count, not a set: gives [])."""
    text = text.strip()
    if text in ("set()", "{}"):
        return []
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    if isinstance(v, (set, list, tuple, frozenset)):
        return sorted(int(x) for x in v if isinstance(x, int))
    return []


@dataclass
class Block:
    """One claim of torchfrtrace (missing ranks, errors, size mismatch) and the key lines under it."""

    kind: str                     # missing | errors | size
    line: int
    seq: int | None = None
    record_id: int | None = None
    group: str | None = None
    group_desc: str | None = None
    op: str | None = None
    state: str | None = None
    missing: list[int] = field(default_factory=list)
    missing_line: int | None = None
    expected: list[int] = field(default_factory=list)
    culprits: list[tuple[int, str, int]] = field(default_factory=list)  # rank, "KIND: msg", line
    frames: list[str] = field(default_factory=list)


def _group(text: str) -> tuple[str, str | None]:
    name, sep, desc = text.strip().partition(":")
    return name, (desc if sep else None)


def _culprits(text: str, line: int) -> list[tuple[int, str, int]]:
    out = []
    ms = list(_CULPRIT.finditer(text))
    for i, m in enumerate(ms):
        end = ms[i + 1].start() if i + 1 < len(ms) else len(text)
        msg = text[m.end():end].strip().rstrip(",").strip()
        out.append((int(m.group(1)), f"{m.group(2)}: {msg}" if msg else m.group(2), line))
    return out


def scan(path: Path, text: str) -> tuple[list[Block], list[dict[str, Any]], list[Skipped]]:
    """The claim blocks of torchfrtrace's text, the claims made outside blocks (``fr_missing_dump`` rows) and what
    was skipped (an analyzer crash, unrecognised lines)."""
    f = str(path)

    blocks: list[Block] = []
    obs: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    unknown: list[tuple[int, str]] = []
    cur: Block | None = None
    in_stack = False
    in_traceback = False
    tb_line = 0

    def flush_unknown() -> None:
        if unknown:
            first_no, first = unknown[0]
            skipped.append(Skipped(f, first_no, f"{len(unknown)} unrecognized line(s), first: {first[:120]!r}"))
            unknown.clear()

    lines = text.splitlines()
    for no, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        # 1. the analyzer crashed: a traceback runs until its exception line
        if line.startswith("Traceback (most recent call last)"):
            flush_unknown()
            in_traceback, tb_line, cur, in_stack = True, no, None, False
            continue
        if in_traceback:
            if line.startswith(" ") or not line:
                continue
            # the first unindented line after the frames is the exception (class: message)
            in_traceback = False
            exc_text = line.strip()
            m = _EXC.match(exc_text)
            hint = ""
            if m and m.group(1) == "KeyError" and "', " in (m.group(2) or ""):
                hint = " (known: gloo dumps name their pg_config key '' — read the dumps with ranktrace instead)"
            skipped.append(Skipped(f, no, f"torchfrtrace crashed at line {tb_line}: {exc_text}{hint}; "
                                          "its output holds no analysis"))
            mf = _MISSING_FILES.search(line)
            if mf:
                for r in _set(mf.group(1)):
                    obs.append({"rank": r, "kind": "fr_missing_dump", "detail": exc_text, "source": "fr",
                                "file": f, "line": no})
            continue
        # 2. a new claim block
        started = False
        for rx, kind in _START:
            m = rx.match(line.strip())
            if m:
                flush_unknown()
                d = m.groupdict()
                cur = Block(kind=kind, line=no)
                blocks.append(cur)
                cur.seq = int(d["seq"]) if d.get("seq") else None
                cur.record_id = int(d["rec"]) if d.get("rec") else None
                if d.get("group"):
                    cur.group, cur.group_desc = _group(d["group"])
                if d.get("op"):
                    cur.op = d["op"]
                if d.get("missing"):
                    cur.missing, cur.missing_line = _set(d["missing"]), no
                in_stack = False
                started = True
                break
        if started:
            continue
        stripped = line.strip()
        # 3. key: value lines of the current block
        m = _KEY.match(stripped)
        if m and cur is not None:
            key, val = m.group(1), m.group(2)
            in_stack = key in ("collective stack trace", "Collective stack traces")
            if key == "internal record id":
                cur.record_id = int(val) if val.isdigit() else cur.record_id
            elif key == "group info":
                cur.group, cur.group_desc = _group(val)
            elif key == "collective":
                cur.op = val.strip()
            elif key == "missing ranks":
                cur.missing, cur.missing_line = _set(val), no
            elif key == "expected ranks":
                cur.expected = _set(val)
            elif key == "collective state":
                cur.state = val.strip()
            elif key in ("error msg", "Found errors"):
                cur.culprits.extend(_culprits(val, no))
            elif in_stack and val.strip():
                cur.frames.append(val.strip())
            continue
        if in_stack and cur is not None and _FRAME.match(line):
            cur.frames.append(stripped)
            continue
        if in_stack and stripped.startswith("[") and stripped.endswith("]"):
            continue  # oldest generation printed the frame list as a Python repr
        # 4. claims outside blocks
        m2 = _CANNOT_DECIDE.search(stripped)
        if m2:
            for r in _set(m2.group(1)):
                obs.append({"rank": r, "kind": "fr_missing_dump", "group": cur.group if cur else None,
                            "value": cur.seq if cur else None, "detail": stripped, "source": "fr", "file": f,
                            "line": no})
            continue
        m3 = _TOO_MANY.match(stripped)
        if m3:
            skipped.append(Skipped(f, no, f"torchfrtrace stopped checking group {m3.group(1)} after too many "
                                          "mismatches: later collectives of that group were not analysed"))
            cur, in_stack = None, False
            continue
        if _NOISE.match(line):
            in_stack = in_stack and bool(stripped)
            continue
        in_stack = False
        unknown.append((no, stripped))
    flush_unknown()
    if in_traceback:
        skipped.append(Skipped(f, tb_line, "torchfrtrace crashed (traceback cut before its exception line)"))

    return blocks, obs, skipped
