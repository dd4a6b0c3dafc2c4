"""Walk a text input's lines and collect Horovod's statements: who is missing from / ready for which tensor, and
the shutdown errors. One pass, one line at a time; a line that matches nothing is not Horovod's."""
from __future__ import annotations

from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.horovod import signatures as sig
from ranktrace.analyzers.readers.text import Line, TextDoc

__all__ = ["Statement", "Scan", "scan"]


@dataclass(frozen=True)
class Statement:
    """One thing Horovod said on one line."""

    line: int
    what: str                 # missing | ready | shutdown | stall_shutdown | internal_error
    rank: int | None          # the rank the statement is about (missing/ready) or the rank that printed it
    tensor: str | None = None
    shutdown_rank: bool = False   # "1!: [..]": this rank passed the shutdown time
    text: str = ""            # the message (errors), or the error type
    seconds: int | None = None


@dataclass
class Scan:
    statements: list[Statement] = field(default_factory=list)
    warnings: list[tuple[int, int | None]] = field(default_factory=list)   # (line, seconds) of each stall warning
    skipped: list[Skipped] = field(default_factory=list)


def scan(doc: TextDoc) -> Scan:
    """
    Which lines count:

    * per-op lines (``<tensor> [ready ranks: ..]``) anywhere: their wording is Horovod's alone;
    * ``<rank>: [<tensor>, ...`` lines only inside a block opened by ``Missing ranks:`` / ``Stalled ranks:`` (a bare
      ``1: [`` elsewhere is someone else's text); the block ends at the first line that is neither a rank line nor the
      wrapped rest of one (a rank line whose ``[`` list was not closed);
    * the shutdown / stall-shutdown / HorovodInternalError lines anywhere.
    """
    out = Scan()
    in_block = False          # inside a "Missing ranks:" list
    open_list = False         # the last rank line's "[" list is not closed yet (wrapped)
    for ln in doc.lines:
        text = ln.text
        w = sig.WARNING.search(text) if "One or more tensors" in text else None
        if w:
            out.warnings.append((ln.no, int(w.group(1))))
        h = sig.RANK_HEADER.search(text) if " ranks:" in text else None
        if h:
            _per_op(out, ln, text[:h.start()], doc)
            in_block, open_list = True, False
            rest = text[h.end():]
            if rest.strip():   # the list pasted on the same line
                open_list = _rank_line(out, ln, rest, doc)
            continue
        if in_block:
            if sig.RANK_LINE.match(text):
                open_list = _rank_line(out, ln, text, doc)
                continue
            if open_list:
                open_list = "]" not in text
                continue
            in_block = False
        if "ranks" in text or "rank:" in text:
            _per_op(out, ln, text, doc)
        _errors(out, ln, text, doc)
    return out


def _rank_line(out: Scan, ln: Line, text: str, doc: TextDoc) -> bool:
    """``1!: [a, b, c ...]`` → one missing statement per tensor named; True when the list goes on (wrapped)."""
    m = sig.RANK_LINE.match(text)
    if not m:
        out.skipped.append(Skipped(doc.path, ln.no, f"unrecognised line in a Horovod rank list: {text[:120]!r}"))
        return False
    body = text[m.end():]
    closed = "]" in body
    body = body.split("]", 1)[0]
    names = [t.strip() for t in body.split(",")]
    if not closed and names:
        names = names[:-1] or names   # the last name may be cut; keep it when it is the only one
    rank = int(m.group(1))
    names = [n.removesuffix(" ...").strip() for n in names]
    names = [n for n in names if n and n != "..."] or [None]
    for name in names[:64]:
        out.statements.append(Statement(ln.no, "missing", rank, name, bool(m.group(2))))
    return not closed


def _per_op(out: Scan, ln: Line, text: str, doc: TextDoc) -> None:
    for m in sig.PER_OP.finditer(text):
        tensor = sig.tensor_before(text, m.start())
        tokens = [t for t in m.group("ranks").replace(",", " ").split() if t]
        if m.group("close") is None:
            if text[m.end():].strip():
                continue   # not a list that runs to the end of the line: not a rank list
            tokens = tokens[:-1]   # cut at the line end: the last number may be cut too
            out.skipped.append(Skipped(doc.path, ln.no, "Horovod rank list cut at the end of the line: "
                                                        "its last rank is not used"))
        what = "ready" if m.group("kind") == "ready" else "missing"
        for t in tokens:
            out.statements.append(Statement(ln.no, what, int(t), tensor))


def _errors(out: Scan, ln: Line, text: str, doc: TextDoc) -> None:
    rank = ln.prefix.rank if ln.prefix.rank is not None else doc.name_rank
    i = text.find(sig.SHUTDOWN)
    if i >= 0:
        t = sig.SHUTDOWN_TYPE.search(text[max(0, i - 160):i])
        etype = t.group(1).rsplit(".", 1)[-1] if t else "HorovodShutdown"
        out.statements.append(Statement(ln.no, "shutdown", rank, text=etype, seconds=None))
        return
    if "One or more rank (marked" in text:
        s = sig.STALL_SHUTDOWN.search(text)
        out.statements.append(Statement(ln.no, "stall_shutdown", rank, text=text[:300],
                                        seconds=int(s.group(1)) if s else None))
        return
    i = text.find(sig.INTERNAL_ERROR)
    if i >= 0:
        out.statements.append(Statement(ln.no, "internal_error", rank,
                                        text=text[i + len(sig.INTERNAL_ERROR):][:300].strip()))
