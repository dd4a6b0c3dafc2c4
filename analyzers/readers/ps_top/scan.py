"""Walk a text input's lines into processes (``Proc``), whichever listing they come from."""
from __future__ import annotations

from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.ps_top import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["Proc", "scan"]


@dataclass
class Proc:
    line: int
    pid: int
    cmd: str | None
    listing: str                  # ps | top | forest | pstree | nvidia-smi
    state: str | None = None      # STAT / S column as printed
    cpu: float | None = None
    ppid: int | None = None
    extra: str = ""               # gpu=.. mem=.. for nvidia-smi rows


@dataclass
class _Header:
    columns: list[str]
    listing: str


@dataclass
class _State:
    path: str
    procs: list[Proc] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    header: _Header | None = None
    smi_plain: bool = False
    forest: list[tuple[int, int]] = field(default_factory=list)   # (depth, pid) stack of the current forest
    misses: int = 0               # lines under the current header that were not rows


def scan(doc: TextDoc) -> tuple[list[Proc], list[Skipped]]:
    r"""
    Header-driven listings (ps, top, htop) are split by the header's column count: every column but the last is one
    whitespace-free field, the last (the command) is the rest of the line. Listings without a header are taken by the
    shape of their rows (``signatures``). A forest's ``\_`` depth gives the parent pid when no PPID column does.
    """
    st = _State(doc.path)
    forest_doc = sum(1 for ln in doc.lines[:20000] if "\\_ " in ln.text) >= 2
    for ln in doc.lines:
        text = ln.text.rstrip()
        if not text.strip():
            continue
        if text.lstrip().startswith("|"):
            _smi(st, ln.no, text)
            continue
        h = _header(text)
        if h is not None:
            st.header, st.smi_plain, st.forest, st.misses = h, False, [], 0
            continue
        if sig.SMI_PLAIN_HEADER.match(text):
            st.header, st.smi_plain = None, True
            continue
        if st.smi_plain:
            m = sig.SMI_PLAIN_ROW.match(text)
            if m:
                st.procs.append(Proc(ln.no, int(m.group("pid")), m.group("name"), "nvidia-smi",
                                     extra=f"gpu={m.group('gpu')} mem={m.group('mem')}MiB"))
                continue
            st.smi_plain = False
        if st.header is not None:
            p = _header_row(st, ln.no, text)
            if p is not None:
                st.procs.append(p)
                st.misses = 0
                continue
            st.misses += 1
            if text.strip() in ("...", "\u2026"):
                continue                          # rows left out by the person who pasted
            if st.misses <= 2 and not text.lstrip().startswith("```"):
                st.skipped.append(Skipped(st.path, ln.no, f"process row cut or not in the header's columns: "
                                                          f"{text.strip()[:100]!r}"))
                continue
            st.header = None
        m = sig.AUX_ROW.match(text)
        if m:
            st.procs.append(_treed(st, Proc(ln.no, int(m.group("pid")), None, "ps", m.group("stat"),
                                            float(m.group("cpu"))), text, m.group("cmd")))
            continue
        m = sig.EF_ROW.match(text)
        if m:
            st.procs.append(_treed(st, Proc(ln.no, int(m.group("pid")), None, "ps", None, float(m.group("cpu")),
                                            int(m.group("ppid"))), text, m.group("cmd")))
            continue
        m = sig.TOP_ROW.match(text)
        if m:
            st.procs.append(Proc(ln.no, int(m.group("pid")), m.group("cmd"), "top", m.group("stat"),
                                 float(m.group("cpu"))))
            continue
        if forest_doc:
            m = sig.FOREST_ROW.match(text)
            if m:
                st.procs.append(_forest_row(st, ln.no, m))
                continue
        if "(" in text and ")" in text:
            _pstree(st, ln.no, text)
    return st.procs, st.skipped


def _header(text: str) -> _Header | None:
    if "PID" not in text or not sig.PS_HEADER.match(text):
        return None
    cols = text.split()
    if not any(c in sig.PID_COLUMNS for c in cols) or cols[-1] not in sig.COMMAND_COLUMNS:
        return None
    listing = "top" if ("PR" in cols or "PRI" in cols) else "ps"
    return _Header(cols, listing)


def _header_row(st: _State, no: int, text: str) -> Proc | None:
    assert st.header is not None
    cols = st.header.columns
    parts = text.split(None, len(cols) - 1)
    values = dict(zip(cols, parts))    # a row cut short keeps the columns it has
    pid_text = next((values[c] for c in cols if c in sig.PID_COLUMNS and c in values), "")
    if not pid_text.isdigit():
        return None
    cmd = values.get(cols[-1]) if len(parts) == len(cols) else None
    state = next((values[c] for c in cols if c in sig.STATE_COLUMNS and c in values), None)
    cpu_text = next((values[c] for c in cols if c in sig.CPU_COLUMNS and c in values), None)
    ppid_text = next((values[c] for c in cols if c in sig.PPID_COLUMNS and c in values), None)
    p = Proc(no, int(pid_text), None, st.header.listing, state if state and state[:1].isalpha() else None,
             _float(cpu_text), int(ppid_text) if ppid_text and ppid_text.isdigit() else None)
    return _treed(st, p, text, cmd) if cmd else p


def _treed(st: _State, p: Proc, text: str, cmd: str) -> Proc:
    """Set `p`'s command from the last column, without its ``\\_`` forest marks; their depth gives the parent
    when no PPID column does."""
    m = sig.TREE_MARKS.match(cmd)
    depth = len(text) - len(cmd) + (m.end() if m else 0)
    p.cmd = (cmd[m.end():] if m else cmd) or None
    if m or st.forest:
        while st.forest and st.forest[-1][0] >= depth:
            st.forest.pop()
        if p.ppid is None and m and st.forest:
            p.ppid = st.forest[-1][1]
        st.forest.append((depth, p.pid))
    return p


def _forest_row(st: _State, no: int, m) -> Proc:
    pid = int(m.group("pid"))
    depth = m.start("cmd")            # the column the command starts at: deeper in the tree, further right
    while st.forest and st.forest[-1][0] >= depth:
        st.forest.pop()
    ppid = st.forest[-1][1] if st.forest else None
    st.forest.append((depth, pid))
    return Proc(no, pid, m.group("cmd"), "forest", ppid=ppid)


def _pstree(st: _State, no: int, text: str) -> None:
    nodes = list(sig.PSTREE_NODE.finditer(text[:8000]))
    if len(nodes) < 2 and not any(c in text for c in "─┬├└"):
        return
    for n in nodes:
        name = n.group("name").strip("{}")
        st.procs.append(Proc(no, int(n.group("pid")), name, "pstree"))


def _smi(st: _State, no: int, text: str) -> None:
    m = sig.SMI_ROW.match(text.strip())
    if m:
        mem = m.group("mem")
        st.procs.append(Proc(no, int(m.group("pid")), m.group("name").strip(), "nvidia-smi",
                             extra=f"gpu={m.group('gpu')} type={m.group('type')} mem={mem}"))


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
