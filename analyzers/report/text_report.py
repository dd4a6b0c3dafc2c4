"""Terminal renderer: the verdict sentence first, then the per-rank table, the merged stack tree, evidence, steps.

Rendered with rich into a string (no terminal sniffing here: the caller decides where the text goes; colour is
off so logs and CI stay readable).
"""
from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ranktrace.analyzers.report.ledger import ledger_text
from ranktrace.analyzers.verdict import Verdict, compact_ranks, operation_text

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".txt"
BINARY = False


def render(verdict: Verdict, width: int = 120) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, emoji=False)
    head = f"{verdict.status.upper()} · {verdict.kind}"
    con.print(Text(head, style="bold"))
    con.print(verdict.summary, markup=False)  # trace text is data: a "[/x]" in it is not rich markup
    if verdict.operation is not None:
        con.print("operation: " + operation_text(verdict.operation), markup=False)
    if verdict.culprit_ranks:
        con.print(f"culprit ranks: {compact_ranks(verdict.culprit_ranks)}")
    if verdict.waiting_ranks:
        con.print(f"waiting ranks: {compact_ranks(verdict.waiting_ranks)}")
    if verdict.unobserved_ranks:
        con.print(f"unobserved ranks (no evidence): {compact_ranks(verdict.unobserved_ranks)}")
    if verdict.input_reads:
        shown = verdict.input_reads[:12]
        con.print(Text("inputs:", style="bold"))
        for i in shown:
            con.print("  " + i.text(), markup=False)
        if len(verdict.input_reads) > len(shown):
            rest = verdict.input_reads[len(shown):]
            used = sum(1 for i in rest if i.recognised)
            con.print(f"  ... and {len(rest)} more ({used} recognised)", markup=False)
    if verdict.ranks:
        t = Table(title=None, show_edge=False, pad_edge=False)
        for col in ("rank", "state", "inside", "last op", "where"):
            t.add_column(col, overflow="fold")
        culprits = set(verdict.culprit_ranks)
        for r, s in sorted(verdict.ranks.items()):
            t.add_row(*(Text(c) for c in (f"{r}{' *' if r in culprits else ''}", s.state, s.innermost_open or "",
                                          s.last_op or "", s.where or (s.stack[0] if s.stack else ""))))
        con.print(t)
    ledger = ledger_text(verdict)
    if ledger:
        con.print(Text("start-up phases (time each took; '<- now': ranks still in it):", style="bold"))
        for line in ledger:
            con.print(Text(line))
    if verdict.stack_tree:
        con.print(Text("merged stacks (outermost first):", style="bold"))
        con.print(Text(verdict.stack_tree))
    if verdict.findings:
        con.print(Text("evidence:", style="bold"))
        for f in verdict.findings:
            con.print(f"- [{f.kind}] {f.summary} (confidence {f.confidence:.1f})", markup=False)
            for e in f.evidence[:6]:
                where = e.file or e.source
                if e.line is not None:
                    where += f":{e.line}"
                rank = f"rank {e.rank}: " if e.rank is not None else ""
                con.print(f"    {rank}{e.detail} [{e.source} {where}]", markup=False)
    if verdict.next_steps:
        con.print(Text("next steps:", style="bold"))
        for s in verdict.next_steps:
            con.print(f"- {s}", markup=False)
    return buf.getvalue()
