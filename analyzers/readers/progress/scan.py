"""Walk a text input's lines and keep the last progress statement per (rank, what) — for lines with no rank (bars
of several processes interleaved without prefixes) the one that got furthest. One pass; a line is tried only when
it holds ``%`` or one of the counter words."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ranktrace.analyzers.readers.progress import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["Progress", "Ending", "scan", "endings"]


@dataclass(frozen=True)
class Progress:
    line: int
    rank: int | None
    what: str
    value: int
    total: int | None
    text: str


@dataclass(frozen=True)
class Ending:
    line: int
    rank: int | None
    what: str          # training_done | exit_ok
    text: str


#: an ending counts only among the last lines a rank (or the file) printed: a loop that "finished" and then hung
#: in the next stage says more after it
_LAST_LINES = 6
#: glog-style info / debug lines of C++ libraries ("[I1202 07:13:58.752 TCPStoreLibUvBackend.cpp:130] ...",
#: "I1202 07:13:58.75 123 ProcessGroupNCCL.cpp:...]"): teardown chatter, never the loop's own words
_CHATTER = re.compile(r"\s{0,4}\[?[IDV]\d{4} \d{2}:\d{2}:\d{2}")


def endings(doc: TextDoc) -> list[Ending]:
    """Lines near the end of each rank's output saying the job ended normally."""
    last_of: dict[int | None, list[int]] = {}
    for i, ln in enumerate(doc.lines):
        if _CHATTER.match(ln.text):
            continue  # a library's info/debug lines (store or socket teardown) say nothing about the loop
        last_of.setdefault(ln.prefix.rank, []).append(i)
    tail = {i for idx in last_of.values() for i in idx[-_LAST_LINES:]}
    out = []
    for i in sorted(tail):
        ln = doc.lines[i]
        m = sig.END.search(ln.text[:2000])
        if m:
            rank = ln.prefix.rank if ln.prefix.rank is not None else doc.name_rank
            out.append(Ending(ln.no, rank, "training_done" if m.group("train") else "exit_ok", ln.text.strip()))
    return out


def scan(doc: TextDoc) -> list[Progress]:
    last: dict[tuple[int | None, str], Progress] = {}
    for ln in doc.lines:
        text = ln.text[:8000]
        rank = ln.prefix.rank if ln.prefix.rank is not None else doc.name_rank
        found: list[Progress] = []
        if "%" in text and "/" in text:
            m = sig.TQDM.search(text)
            if m:
                total = sig.count_value(m.group("total"))
                found.append(Progress(ln.no, rank, sig.what_of_label(m.group("label")),
                                      sig.count_value(m.group("done")), total, text.strip()))
        if not found and any(w in text for w in ("tep", "ter", "poch", "TEP")):
            for m in sig.COUNTER.finditer(text):    # "Epoch 3/10, step 120/1000": both
                what = "epoch" if m.group("what").lower() == "epoch" else "step"
                if all(f.what != what for f in found):
                    found.append(Progress(ln.no, rank, what, int(m.group("n")),
                                          int(m.group("total")) if m.group("total") else None, text.strip()))
        for f in found:
            before = last.get((rank, f.what))
            if rank is None and before is not None and before.value > f.value:
                continue   # bars of several unnamed processes: keep the one that got furthest
            last[(rank, f.what)] = f
    return sorted(last.values(), key=lambda p: (p.line, p.what))
