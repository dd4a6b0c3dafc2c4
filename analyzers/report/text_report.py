"""Terminal renderer: the verdict sentence first, then the per-rank table, the merged stack tree, evidence, steps.

Rendered with rich into a string. The caller says how wide and whether in colour (``trace run`` and ``trace
analyze`` ask their terminal: its real width and colour on a TTY, plain text that never wraps when piped); this
module never looks at a terminal itself. Host states and other internal names are said in plain words
(analyzers.report.words); the verdict JSON keeps its values.
"""
from __future__ import annotations

import io
from collections import Counter
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ranktrace.analyzers.report.ledger import ledger_text
from ranktrace.analyzers.report.words import plain, shown_findings, state_text
from ranktrace.analyzers.verdict import InputSummary, RankState, Verdict, compact_ranks, operation_text

__all__ = ["render", "render_change", "headline", "EXTENSION", "BINARY", "PIPE_WIDTH"]

EXTENSION = ".txt"
BINARY = False
PIPE_WIDTH = 240   # width=None (piped, a log): lines are never broken; a table is as wide as its content, up to this

_STATUS_STYLE = {"hang": "bold red", "crashed": "bold red", "completed": "bold green", "idle": "bold green",
                 "inconclusive": "bold yellow"}


def headline(v: Verdict) -> str:
    return f"{v.status.upper()} · {v.kind}"


def _console(buf: io.StringIO, width: int | None, color: bool) -> Console:
    return Console(file=buf, width=width or PIPE_WIDTH, color_system="standard" if color else None,
                   force_terminal=color, no_color=not color, highlight=False, emoji=False, soft_wrap=width is None,
                   legacy_windows=False)


def _rank_rows(v: Verdict) -> list[tuple[tuple[int, ...], RankState]]:
    """Ranks that read the same (state, inside, last op, where) share one row; a culprit never shares with a
    rank that is not one."""
    culprits = set(v.culprit_ranks)
    groups: dict[tuple, list[int]] = {}
    for r, s in sorted(v.ranks.items()):
        where = s.where or (s.stack[0] if s.stack else "")
        groups.setdefault((r in culprits, s.state, s.innermost_open or "", s.last_op or "", where), []).append(r)
    rows = [(tuple(rs), v.ranks[rs[0]]) for rs in groups.values()]
    return sorted(rows, key=lambda x: x[0][0])


def _inputs(con: Console, reads: Sequence[InputSummary], own_dirs: Sequence[str]) -> None:
    """Files of a ranktrace run's own directory (its dumps, samples) in one line; any other input one line each."""
    own = [i for i in reads if any(i.file.startswith(d.rstrip("/") + "/") for d in own_dirs)]
    other = [i for i in reads if i not in own]
    if own:
        fams = Counter(f for i in own for f in (i.recognised or ("not recognised",)))
        con.print(f"inputs: the run's own trace and {len(own)} dump/sample file(s) ("
                  + ", ".join(f"{n} {f}" for f, n in fams.most_common()) + ")", markup=False)
    if other:
        shown = other[:12]
        con.print(Text("inputs:", style="bold"))
        for i in shown:
            con.print("  " + i.text(), markup=False)
        if len(other) > len(shown):
            rest = other[len(shown):]
            used = sum(1 for i in rest if i.recognised)
            con.print(f"  ... and {len(rest)} more ({used} recognised)", markup=False)


def render(verdict: Verdict, width: int | None = 120, color: bool = False) -> str:
    """The verdict for a terminal `width` columns wide (None: never wrap, as for a pipe or a log), in colour or
    not."""
    v = verdict
    buf = io.StringIO()
    con = _console(buf, width, color)
    con.print(Text(headline(v), style=_STATUS_STYLE.get(v.status, "bold")))
    con.print(plain(v.summary), markup=False)  # trace text is data: a "[/x]" in it is not rich markup
    if v.operation is not None:
        con.print("operation: " + operation_text(v.operation), markup=False)
    if v.culprit_ranks:
        con.print(Text(f"culprit ranks: {compact_ranks(v.culprit_ranks)}", style="red" if color else ""))
    if v.waiting_ranks:
        con.print(f"waiting ranks: {compact_ranks(v.waiting_ranks)}")
    if v.unobserved_ranks:
        con.print(f"unobserved ranks (no evidence): {compact_ranks(v.unobserved_ranks)}")
    if v.input_reads:
        _inputs(con, v.input_reads, [i for i in v.inputs if "/" in i])
    if v.ranks:
        t = Table(title=None, show_edge=False, pad_edge=False)
        for col in ("rank", "state", "inside", "last op", "where"):
            t.add_column(col, overflow="fold")
        for ranks, s in _rank_rows(v):
            culprit = ranks[0] in v.culprit_ranks
            style = "red" if culprit and color else ""
            t.add_row(*(Text(c, style=style) for c in (
                f"{compact_ranks(ranks)}{' *' if culprit else ''}", state_text(s.state), s.innermost_open or "",
                s.last_op or "", s.where or (s.stack[0] if s.stack else ""))))
        con.print(t)
    ledger = ledger_text(v)
    if ledger:
        con.print(Text("start-up phases (time each took; '<- now': ranks still in it):", style="bold"))
        for line in ledger:
            con.print(Text(line))
    if v.stack_tree:
        con.print(Text("merged stacks (outermost first):", style="bold"))
        con.print(Text(v.stack_tree))
    findings = shown_findings(v)
    if findings:
        con.print(Text("evidence:", style="bold"))
        for f in findings:
            con.print(f"- [{f.kind}] {plain(f.summary)} (confidence {f.confidence:.1f})", markup=False)
            for e in f.evidence[:6]:
                where = e.file or e.source
                if e.line is not None:
                    where += f":{e.line}"
                rank = f"rank {e.rank}: " if e.rank is not None else ""
                con.print(f"    {rank}{plain(e.detail)} [{e.source} {where}]", markup=False)
    if v.next_steps:
        con.print(Text("next steps:", style="bold"))
        for s in v.next_steps:
            con.print(f"- {plain(s)}", markup=False)
    return buf.getvalue()


def _picture(v: Verdict) -> tuple:
    op = v.operation
    return (v.kind, tuple(v.culprit_ranks), None if op is None else (op.name, op.group, op.seq, op.peer))


def _same_picture(a: Verdict, b: Verdict) -> bool:
    """The same hang: kind, culprits and the operation they are waited for (its name, group, seq)."""
    return _picture(a) == _picture(b)


def render_change(before: Verdict, after: Verdict, width: int | None = 120, color: bool = False) -> str:
    """What changed since `before` was printed (the verdict at the hang), for the end of the run: the whole verdict
    again only when its picture changed (another kind, culprit or operation); else the new headline and the lines
    that differ. "" when nothing a person reads changed."""
    if not _same_picture(before, after):
        return render(after, width, color)
    buf = io.StringIO()
    con = _console(buf, width, color)
    lines = 0
    if headline(before) != headline(after):
        head = Text(headline(after), style=_STATUS_STYLE.get(after.status, "bold"))
        head.append(f" (was {headline(before)}; same culprit and operation)", style="")
        con.print(head)
        lines += 1
    if plain(before.summary) != plain(after.summary):
        con.print(plain(after.summary), markup=False)
        lines += 1
    for label, a, b in (("waiting ranks", before.waiting_ranks, after.waiting_ranks),
                        ("unobserved ranks (no evidence)", before.unobserved_ranks, after.unobserved_ranks)):
        if a != b:
            con.print(f"{label}: {compact_ranks(b) or 'none'} (was {compact_ranks(a) or 'none'})", markup=False)
            lines += 1
    changed: dict[tuple[str, str], list[int]] = {}
    for r, s in sorted(after.ranks.items()):
        old = before.ranks.get(r)
        now = state_text(s.state)
        was = state_text(old.state) if old else "not seen"
        if now != was:
            changed.setdefault((was, now), []).append(r)
    for (was, now), rs in changed.items():
        con.print(f"{'rank' if len(rs) == 1 else 'ranks'} {compact_ranks(rs)}: {now} (was {was})", markup=False)
        lines += 1
    old_f = {(f.kind, f.summary) for f in shown_findings(before)}
    for f in shown_findings(after):
        if (f.kind, f.summary) not in old_f:
            con.print(f"- [{f.kind}] {plain(f.summary)} (confidence {f.confidence:.1f})", markup=False)
            lines += 1
    return buf.getvalue() if lines else ""
