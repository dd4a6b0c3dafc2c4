"""``<run>/report.html``: the verdict and each rank's timeline in one self-contained page (no scripts, nothing
fetched) that opens wherever a hang gets pasted; everything that came from the trace is HTML-escaped. Takes an
``Analysis``, returns the page as a string."""
from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import pyarrow.compute as pc

from ranktrace.analyzers.model import Analysis
from ranktrace.analyzers.report.spans import Mark, Span, SpanSet, pair_spans
from ranktrace.analyzers.verdict import Verdict, compact_ranks, operation_text

__all__ = ["render", "EXTENSION", "BINARY", "SPANS_PER_RANK"]

EXTENSION = ".html"
BINARY = False

SPANS_PER_RANK = 40   # closed spans kept per rank (its latest); spans that never returned are always drawn
_MAX_DEPTH = 4        # rows drawn per lane (op ⊃ wait ⊃ ..., other threads); further spans share the last row
_MARKS_PER_RANK = 20  # latest marks drawn per rank (phase changes, a ring that wrapped, untraced ops)
_W, _LABEL, _ROW, _TOP = 1100, 90, 9, 28  # picture width, label column, height of one nesting level, axis band
_COLOURS = {"collective": "#4878d0", "p2p": "#956cb4", "sync": "#8c8c8c", "graph": "#ee854a", "init": "#6acc64",
            "phase": "#d5bb67", "user": "#82c6e2"}
_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d1d1f;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
.hang,.crashed{color:#b00020} .completed,.idle{color:#1b7f3b} .inconclusive{color:#8a6d00}
table{border-collapse:collapse} td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #ccc} tr.culprit td{color:#b00020;font-weight:600}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px} .ev{color:#555;font-size:12px}
.legend span{display:inline-block;margin-right:12px} .sw{width:10px;height:10px;display:inline-block;margin-right:4px}
svg text{font:11px system-ui,sans-serif}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _clock(result: Analysis) -> tuple[str, int]:
    """The clock of the picture and how many timed rows it leaves out: wall_ns (comparable across hosts) unless
    more rows carry only the monotonic t_ns (one host's clock; Kineto or nsys without a session start)."""
    ev = result.events
    if ev.num_rows == 0:
        return "wall_ns", 0
    ranked = pc.is_valid(ev["rank"])
    n_wall = pc.sum(pc.and_(ranked, pc.is_valid(ev["wall_ns"]))).as_py() or 0
    n_mono = pc.sum(pc.and_(ranked, pc.is_valid(ev["t_ns"]))).as_py() or 0
    n_any = pc.sum(pc.and_(ranked, pc.or_(pc.is_valid(ev["wall_ns"]), pc.is_valid(ev["t_ns"])))).as_py() or 0
    return ("wall_ns", n_any - n_wall) if n_wall >= n_mono else ("t_ns", n_any - n_mono)


def _per_rank(n_ranks: int) -> int:
    """Closed spans drawn per rank: SPANS_PER_RANK for a node, fewer for thousands of ranks (the page stays small)."""
    return max(5, min(SPANS_PER_RANK, 4000 // max(1, n_ranks)))


def _kept(ss: SpanSet, per_rank: int) -> dict[int, list[Span]]:
    """Per rank: its spans that never returned, and its latest `per_rank` closed ones; sorted by start, an
    enclosing span before what it encloses.

    One source per rank: where our own rings recorded the rank, its Flight Recorder / NCCL-log copies of the
    same calls are left out (a gloo FR entry never retires, so it would draw a returned op as open)."""
    by_rank: dict[int, list[Span]] = defaultdict(list)
    for sp in ss.spans:
        by_rank[sp.rank].append(sp)
    out: dict[int, list[Span]] = {}
    for rank, spans in by_rank.items():
        if any(s.source == "events" for s in spans):
            spans = [s for s in spans if s.source == "events"]
        closed = sorted((s for s in spans if not s.open), key=lambda s: s.start)[-per_rank:]
        out[rank] = sorted(closed + [s for s in spans if s.open],
                           key=lambda s: (s.start, -(s.end if s.end is not None else float("inf"))))
    return out


def _levels(spans: list[Span]) -> list[int]:
    """Row of each span within its rank's lane (spans sorted as _kept sorts them): the first row whose last span
    has ended, below the row of the call it is inside (same thread), so a call and the wait inside it, or two
    threads' overlapping calls, never cover each other and a child is never drawn above its parent."""
    row_end: list[float] = []
    open_in: dict[tuple, list[tuple[float, int]]] = defaultdict(list)  # per thread: (end, row) of enclosing calls
    out = []
    for sp in spans:
        end = sp.end if sp.end is not None else float("inf")
        parents = open_in[(sp.pid, sp.tid)]
        while parents and parents[-1][0] <= sp.start:
            parents.pop()
        lowest = parents[-1][1] + 1 if parents else 0
        row = next((i for i in range(lowest, len(row_end)) if row_end[i] <= sp.start), max(lowest, len(row_end)))
        while len(row_end) <= row:
            row_end.append(float("-inf"))
        row_end[row] = end
        parents.append((end, row))
        out.append(min(row, _MAX_DEPTH - 1))
    return out


def _is_hung_op(sp: Span, v: Verdict) -> bool:
    """A span of the verdict's operation: same name, group and seq; for an operation without a seq (an init, a
    graph capture) the spans of that name that never returned."""
    op = v.operation
    if op is None or sp.name != op.name or (op.group is not None and sp.group != op.group):
        return False
    return sp.seq == op.seq if op.seq is not None else sp.open


def _last_seen(result: Analysis, clock: str) -> int | None:
    """The latest moment the inputs saw the job: stack samples and dumps are taken while it hangs, after its
    last op record, so open calls are drawn as long as they were seen open."""
    st = result.stacks
    if st.num_rows == 0 or clock not in st.schema.names:
        return None
    return pc.max(st[clock]).as_py()


def _window(kept: dict[int, list[Span]], marks: tuple[Mark, ...], seen: int | None) -> tuple[int, int]:
    """(start, end) of the picture from what is drawn: from the earliest kept *returned* call (a phase or init
    span open since the job began would squeeze everything else into a pixel: it is clipped at the left edge) to
    the latest drawn record — spans and marks of our sources, not a foreign log whose clock may be hours off —
    or stack sample."""
    spans = [s for ss in kept.values() for s in ss]
    closed = [s for s in spans if not s.open]
    if spans:
        start = min(s.start for s in (closed or spans))
    else:
        start = min(m.t for m in marks)
    times = [s.end for s in closed if s.end is not None] + [s.start for s in spans] + [m.t for m in marks]
    end = max(times + ([seen] if seen is not None else []))
    return start, max(end, start + 1)


def _marks_drawn(ss: SpanSet, start: int, end: int) -> dict[int, list[Mark]]:
    """Per rank its latest marks in the picture, and the last one before it (the phase the rank is in), which is
    drawn at the left edge."""
    by_rank: dict[int, list[Mark]] = defaultdict(list)
    for m in ss.marks:
        by_rank[m.rank].append(m)
    out: dict[int, list[Mark]] = {}
    for rank, ms in by_rank.items():
        ms.sort(key=lambda m: m.t)
        inside = [m for m in ms if start <= m.t <= end][-_MARKS_PER_RANK:]
        before = [m for m in ms if m.t < start][-1:]
        out[rank] = before + inside
    return out


def _timeline(ss: SpanSet, v: Verdict, seen: int | None, left_out: int) -> str:
    ranks = sorted(set(ss.ranks) | set(v.ranks))
    per_rank = _per_rank(len(ranks))
    kept = _kept(ss, per_rank)
    if not kept and not ss.marks:
        return "<p>No timed op records (stacks and logs only).</p>"
    start, end = _window(kept, ss.marks, seen)
    span_ns = end - start
    scale = (_W - _LABEL - 10) / span_ns

    def x(t: int) -> float:
        return _LABEL + (max(t, start) - start) * scale

    marks = _marks_drawn(ss, start, end)
    lanes: list[str] = []
    y = _TOP
    culprits, waiting = set(v.culprit_ranks), set(v.waiting_ranks)
    for rank in ranks:
        spans = kept.get(rank, [])
        depths = _levels(spans)
        height = _ROW * (max(depths, default=0) + 1) + 6
        cls = "#b00020" if rank in culprits else ("#8a6d00" if rank in waiting else "#1d1d1f")
        tag = " *" if rank in culprits else ""
        lanes.append(f'<text x="4" y="{y + 12}" fill="{cls}">rank {rank}{tag}</text>'
                     f'<line x1="{_LABEL}" x2="{_W - 10}" y1="{y + height}" y2="{y + height}" stroke="#eee"/>')
        for sp, d in zip(spans, depths):
            x0 = x(sp.start)
            x1 = x(sp.end if sp.end is not None else end)
            colour = "#d62728" if sp.open else "#7f2704" if sp.error else _COLOURS.get(sp.category or "", "#999")
            stroke = ' stroke="#000" stroke-width="1.5"' if _is_hung_op(sp, v) else ""
            dur = "never returned" if sp.end is None else f"{max(sp.end - sp.start, 0) / 1e6:.3f} ms"
            if sp.start < start:
                dur += f", started {(start - sp.start) / 1e9:.1f} s before the picture"
            tip = f"rank {rank}: {sp.name}" + (f" group={sp.group}" if sp.group else "") + (
                f" seq={sp.seq}" if sp.seq is not None else "") + f" · {dur}" + (
                f" · {sp.callsite}" if sp.callsite else "") + (f" · error: {sp.error}" if sp.error else "")
            open_cls = ' class="open"' if sp.open else ""
            lanes.append(f'<rect x="{x0:.1f}" y="{y + 3 + d * _ROW}" width="{max(x1 - x0, 1.0):.1f}" '
                         f'height="{_ROW - 2}" fill="{colour}"{stroke}{open_cls}><title>{_e(tip)}</title></rect>')
        for m in marks.get(rank, []):  # phases, ring wrapped, ...: over the bars, so their titles can be hovered
            when = " (before the picture)" if m.t < start else ""
            lanes.append(f'<path d="M{x(m.t) - 4:.1f} {y}h8l-4 6z" fill="#333">'
                         f'<title>{_e(f"rank {rank}: {m.name}{when}")}</title></path>')
        y += height
    ticks = []
    for i in range(6):
        t = start + span_ns * i / 5
        ticks.append(f'<line x1="{x(int(t)):.1f}" x2="{x(int(t)):.1f}" y1="{_TOP - 6}" y2="{y}" stroke="#f0f0f0"/>'
                     f'<text x="{x(int(t)):.1f}" y="{_TOP - 10}" fill="#666" '
                     f'text-anchor="{"start" if i == 0 else "end" if i == 5 else "middle"}">{(t - end) / 1e9:+.2f} s'
                     "</text>")
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>{_e(k)}</span>' for k, c in _COLOURS.items())
    clock = "wall clock" if ss.clock == "wall_ns" else "monotonic clock of one host"
    if left_out:
        clock += f"; {left_out} record(s) without that clock are not drawn"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{y + 4}" role="img" '
            f'aria-label="op timeline per rank">{"".join(ticks)}{"".join(lanes)}</svg>'
            f'<p class="legend">{legend}<span><i class="sw" style="background:#d62728"></i>never returned</span>'
            f'<span><i class="sw" style="background:#7f2704"></i>raised an error</span>'
            f'<span>outlined: the operation above</span><span>&#9660; a mark (phase, ring wrapped, ...)</span></p>'
            f'<p class="ev">Seconds before the last drawn record or stack sample ({clock}); per rank its calls '
            f"that never returned and its latest {per_rank} others. Hover a bar for the call. A returned NCCL call "
            "was only enqueued (DESIGN §2): a bar that ended is not an op that finished on the GPU.</p>")


def _rank_table(v: Verdict) -> str:
    if not v.ranks:
        return ""
    culprits = set(v.culprit_ranks)
    rows = "".join(
        f'<tr class="{"culprit" if r in culprits else ""}"><td>{r}{" *" if r in culprits else ""}</td>'
        f"<td>{_e(s.state)}</td><td>{_e(s.innermost_open)}</td><td>{_e(s.last_op)}</td>"
        f"<td>{_e(s.where or (s.stack[0] if s.stack else ''))}</td></tr>"
        for r, s in sorted(v.ranks.items()))
    return ("<h2>Ranks</h2><table><tr><th>rank</th><th>state</th><th>inside</th><th>last op</th><th>where</th></tr>"
            f"{rows}</table>")


def _phases(v: Verdict) -> str:
    """The start-up phase ledger (report/ledger.py): one row per phase and instance."""
    from ranktrace.analyzers.report.ledger import ledger_rows

    rows = ledger_rows(v)
    if not rows:
        return ""
    body = "".join(f"<tr><td>{_e(r.phase)}</td><td>{_e(r.ranks)}</td><td>{_e(r.took)}</td><td>{_e(r.open)}</td></tr>"
                   for r in rows)
    return ("<h2>Start-up phases</h2><table><tr><th>phase</th><th>ranks</th><th>took</th><th>still in it</th></tr>"
            f"{body}</table>")


def _findings(v: Verdict) -> str:
    if not v.findings:
        return ""
    items = []
    for f in v.findings:
        ev = []
        for e in f.evidence[:8]:
            where = (e.file or e.source) + (f":{e.line}" if e.line is not None else "")
            rank = f"rank {e.rank}: " if e.rank is not None else ""
            ev.append(f'<li class="ev">{_e(rank + e.detail)} <code>[{_e(e.source)} {_e(where)}]</code></li>')
        items.append(f"<li><b>[{_e(f.kind)}]</b> {_e(f.summary)} (confidence {f.confidence:.1f})"
                     f"<ul>{''.join(ev)}</ul></li>")
    return f"<h2>Evidence</h2><ul>{''.join(items)}</ul>"


def render(result: Analysis) -> str:
    v = result.verdict
    clock, left_out = _clock(result)
    n_ranks = pc.count_distinct(result.events["rank"]).as_py() if result.events.num_rows else 0
    ss = pair_spans(result.events, clock, tail=6 * _per_rank(max(n_ranks, len(v.ranks))), open_rows=result.open_rows)
    facts = []
    if v.operation is not None:
        facts.append(f"<b>operation:</b> {_e(operation_text(v.operation))}")
    for label, ranks in (("culprit ranks", v.culprit_ranks), ("waiting ranks", v.waiting_ranks),
                         ("unobserved ranks (no evidence)", v.unobserved_ranks)):
        if ranks:
            facts.append(f"<b>{label}:</b> {_e(compact_ranks(ranks))}")
    steps = "".join(f"<li>{_e(s)}</li>" for s in v.next_steps)
    waits = "".join(f"<li>rank {e.rank} waits on {_e(compact_ranks(e.waits_on))} in {_e(e.op)}"
                    + (f" (group {_e(e.group)}, seq {e.seq})" if e.group is not None else "") + "</li>"
                    for e in v.wait_for)
    inputs = "".join(f"<li><code>{_e(i)}</code></li>" for i in v.inputs)
    title = f"{v.status.upper()} · {v.kind}"
    return "".join([
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>ranktrace: {_e(title)}</title>',
        f"<style>{_STYLE}</style></head><body>",
        f'<h1 class="{_e(v.status)}">{_e(title)}</h1><p>{_e(v.summary)}</p>',
        "<p>" + "<br>".join(facts) + "</p>" if facts else "",
        _rank_table(v),
        "<h2>Timeline</h2>", _timeline(ss, v, _last_seen(result, clock), left_out),
        f"<h2>Next steps</h2><ul>{steps}</ul>" if steps else "",
        _phases(v),
        _findings(v),
        f"<h2>Merged stacks (outermost first)</h2><pre>{_e(v.stack_tree)}</pre>" if v.stack_tree else "",
        f"<h2>Who waits on whom</h2><ul>{waits}</ul>" if waits else "",
        f"<h2>Inputs</h2><ul>{inputs}</ul>" if inputs else "",
        '<p class="ev">ranktrace · verdict schema ranktrace.verdict/1 · the JSON verdict is verdict.json</p>',
        "</body></html>\n",
    ])
