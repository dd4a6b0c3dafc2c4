"""Which evidence lines of a finding a person is shown, and how many were left out (issue #27).

Why: a finding at 8 ranks has a line per waiting rank and then the culprit's stack and last op; cutting that list
at its first lines dropped exactly the culprit's, silently. So lines that say the same thing for several ranks are
said once with their rank set ("ranks 0-6: ... [events rings/1999.ring:8 and 6 more]"), the culprit's lines are
always kept, the rest fill up to a limit in the finding's own order, and what is left out is counted. verdict.json
keeps every line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ranktrace.analyzers.verdict import Evidence, Finding, compact_ranks

__all__ = ["EvidenceLine", "evidence_lines", "LIMIT"]

LIMIT = 6  # lines per finding, the culprit's excepted (they are always shown)


@dataclass(frozen=True)
class EvidenceLine:
    """One shown line: the ranks it speaks for (empty: no rank), what it says, its source and where."""

    ranks: tuple[int, ...]
    detail: str
    source: str
    places: tuple[str, ...]   # "file:line" of each rank's record, in the finding's order

    def text(self) -> str:
        who = ""
        if len(self.ranks) == 1:
            who = f"rank {self.ranks[0]}: "
        elif self.ranks:
            who = f"ranks {compact_ranks(self.ranks)}: "
        where = self.places[0] if self.places else ""
        if len(self.places) > 1:
            where += f" and {len(self.places) - 1} more"
        return f"{who}{self.detail} [{self.source}{' ' + where if where else ''}]"


def _place(e: Evidence) -> str:
    where = e.file or ""
    if e.line is not None:
        where += f":{e.line}"
    return where


def _merged(evidence: Iterable[Evidence]) -> list[EvidenceLine]:
    """Lines that differ only in their rank (and the file they came from) become one, in first-seen order."""
    groups: dict[tuple[str, str, bool], tuple[list[int], list[str]]] = {}
    for e in evidence:
        key = (e.source, e.detail, e.rank is None)
        ranks, places = groups.setdefault(key, ([], []))
        if e.rank is not None and e.rank not in ranks:
            ranks.append(e.rank)
        p = _place(e)
        if p:
            places.append(p)
    return [EvidenceLine(tuple(sorted(ranks)), detail, source, tuple(places))
            for (source, detail, _no_rank), (ranks, places) in groups.items()]


def evidence_lines(f: Finding, culprits: Iterable[int], limit: int = LIMIT) -> tuple[list[EvidenceLine], int]:
    """(the lines to show in the finding's order, how many merged lines were left out). Every line about a culprit
    rank is shown; the others fill up to `limit`."""
    lines = _merged(f.evidence)
    bad = set(culprits)
    keep = {i for i, ln in enumerate(lines) if bad.intersection(ln.ranks)}
    for i in range(len(lines)):
        if len(keep) >= limit:
            break
        keep.add(i)
    shown = [ln for i, ln in enumerate(lines) if i in keep]
    return shown, len(lines) - len(shown)
