"""Terminal renderer: the verdict sentence first, then the per-rank table, the merged stack tree, evidence, steps.

Rendered with rich into a string. The caller says how wide and whether in colour (``trace run`` and ``trace
analyze`` ask their terminal: its real width and colour on a TTY, plain text that never wraps when piped); this
module never looks at a terminal itself. Host states and other internal names are said in plain words
(analyzers.report.words); the verdict JSON keeps its values.
"""
from __future__ import annotations

import io
from collections import Counter
from typing import Sequence, cast

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ranktrace.analyzers.report.evidence import evidence_lines
from ranktrace.analyzers.report.ledger import ledger_text
from ranktrace.analyzers.report.words import plain, shown_findings, state_text
from ranktrace.analyzers.verdict import InputSummary, RankState, Verdict, compact_ranks, operation_text

__all__ = ["render", "render_change", "headline", "EXTENSION", "BINARY", "PIPE_WIDTH"]

EXTENSION = ".txt"
BINARY = False
PIPE_WIDTH = 240   # width=None (piped, a log): lines are never broken; a table is as wide as its content, up to this

_STATUS_STYLE = {"hang": "bold red", "crashed": "bold red", "completed": "bold green", "idle": "bold green", "stopped": "bold yellow",
                 "inconclusive": "bold yellow"}


def headline(v: Verdict) -> str:
    return f"{v.status.upper()} · {v.kind}"


def _console(buf: io.StringIO, width: int | None, color: bool) -> Console:
    return Console(file=buf, width=width or PIPE_WIDTH, color_system="standard" if color else None,
                   force_terminal=color, no_color=not color, highlight=False, emoji=False, soft_wrap=width is None,
                   legacy_windows=False)


MAX_ROWS = 16        # rank table rows; past them, ranks in the same state inside the same call share a row
_LABEL_CHARS = 32    # a rank set longer than this is said as "1,016 ranks like rank 0"


def _rank_rows(v: Verdict) -> list[tuple[tuple[int, ...], RankState, bool]]:
    """Ranks that read the same (state, inside, last op, where) share one row; a culprit never shares with a
    rank that is not one. Past MAX_ROWS rows (a thousand ranks at different seqs), ranks in the same state inside
    the same call share one, shown by its first rank ("like rank 0"). Rows: (ranks, shown state, alike)."""
    culprits = set(v.culprit_ranks)
    groups: dict[tuple, list[int]] = {}
    for r, s in sorted(v.ranks.items()):
        where = s.where or (s.stack[0] if s.stack else "")
        groups.setdefault((r in culprits, s.state, s.innermost_open or "", s.last_op or "", where), []).append(r)
    if len(groups) > MAX_ROWS:
        coarse: dict[tuple, list[int]] = {}
        for (culprit, state, inside, _last, _where), rs in groups.items():
            coarse.setdefault((culprit, state, inside.split(" ")[0]), []).extend(rs)
        rows = [(tuple(sorted(rs)), v.ranks[min(rs)], True) for rs in coarse.values()]
        rows = [(rs, s, alike and any(_differs(v.ranks[r], s) for r in rs)) for rs, s, alike in rows]
    else:
        rows = [(tuple(rs), v.ranks[rs[0]], False) for rs in groups.values()]
    return sorted(rows, key=lambda x: x[0][0])


def _differs(a: RankState, b: RankState) -> bool:
    return (a.innermost_open, a.last_op, a.where) != (b.innermost_open, b.last_op, b.where)


def _rank_label(ranks: Sequence[int], alike: bool = False) -> str:
    """'0-6,8', or '1,016 ranks like rank 0' when the set is long or its ranks only alike."""
    text = compact_ranks(ranks)
    if alike or len(text) > _LABEL_CHARS:
        return f"{len(ranks):,} ranks like rank {ranks[0]}" if alike else f"{len(ranks):,} ranks from {ranks[0]}"
    return text


def _rank_set(ranks: Sequence[int], limit: int = 160) -> str:
    """A rank set for one line: compact, cut with its size when it would not fit."""
    text = compact_ranks(ranks)
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(",", 1)[0] + f",... ({len(ranks):,} ranks)"


def _hosts_of(v: Verdict, ranks: Sequence[int]) -> str:
    hosts = sorted({v.ranks[r].host for r in ranks if r in v.ranks and v.ranks[r].host}, key=str)
    if len(hosts) <= 3:
        return ", ".join(cast("list[str]", hosts))  # the empty and None hosts are left out above
    return f"{len(hosts)} hosts"


def _hosts_line(v: Verdict) -> str:
    """'hosts: node-0 ranks 0-1, node-1 ranks 2-3; clocks aligned to node-0 within +-2.1 ms (4 collectives)'."""
    shown = v.hosts[:4]
    parts = [f"{h.host} ranks {_rank_set(h.ranks, 40)}" for h in shown]
    text = f"hosts: {len(v.hosts)} (" + ", ".join(parts) + (", ..." if len(v.hosts) > 4 else "") + ")"
    ref = next((h.host for h in v.hosts if h.clock_basis == "reference"), None)
    aligned = [h for h in v.hosts if h.clock_basis in ("collectives", "approximate")]
    loose = [h.host for h in v.hosts if h.clock_basis == "none"]
    if ref and aligned:
        worst = max(aligned, key=lambda h: h.clock_error_ns or 0)
        ops = sum(h.clock_ops for h in aligned)
        text += (f"; clocks aligned to {ref} within +-{_ms(worst.clock_error_ns)}"
                 f"{' (approximate)' if any(h.clock_basis == 'approximate' for h in aligned) else ''}"
                 f" from {ops} collective(s); largest offset {_ms(max(abs(h.clock_offset_ns or 0) for h in aligned))}")
    if loose:
        text += f"; not aligned (no collective in common): {', '.join(loose[:4])}" + (" ..." if len(loose) > 4 else "")
    return text


def _ms(ns: int | None) -> str:
    """A duration in the unit that reads best (ns, us, ms, s)."""
    if ns is None:
        return "?"
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= size:
            return f"{ns / size:.3g} {unit}"
    return f"{ns} ns"


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
        on = _hosts_of(v, v.culprit_ranks)
        con.print(Text(f"culprit ranks: {_rank_set(v.culprit_ranks)}" + (f" (on {on})" if on else ""),
                       style="red" if color else ""))
    if v.waiting_ranks:
        con.print(f"waiting ranks: {_rank_set(v.waiting_ranks)}")
    if v.unobserved_ranks:
        con.print(f"unobserved ranks (no evidence): {_rank_set(v.unobserved_ranks)}")
    if v.hosts:
        con.print(_hosts_line(v), markup=False)
    if v.input_reads:
        _inputs(con, v.input_reads, [i for i in v.inputs if "/" in i])
    if v.ranks:
        t = Table(title=None, show_edge=False, pad_edge=False)
        cols = ("rank", "host", "state", "inside", "last op", "where") if v.hosts else (
            "rank", "state", "inside", "last op", "where")
        for col in cols:
            t.add_column(col, overflow="fold")
        for ranks, s, alike in _rank_rows(v):
            culprit = ranks[0] in v.culprit_ranks
            style = "red" if culprit and color else ""
            cells = [f"{_rank_label(ranks, alike)}{' *' if culprit else ''}", state_text(s.state),
                     s.innermost_open or "", s.last_op or "", s.where or (s.stack[0] if s.stack else "")]
            if v.hosts:
                cells.insert(1, _hosts_of(v, ranks))
            t.add_row(*(Text(c, style=style) for c in cells))
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
            shown, left = evidence_lines(f, v.culprit_ranks)
            for ln in shown:
                con.print("    " + plain(ln.text()), markup=False)
            if left:
                con.print(f"    ... and {left} more evidence line{'s' if left != 1 else ''} "
                          f"(verdict.json has every one)", markup=False)
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
