"""HTML renderer for `trace compare --html`: a Comparison in, one self-contained side-by-side page out (no scripts,
no external resources; every string from the inputs escaped). Same order as the text: hardware and software, what
NCCL decided, outcome, where B departed from A, timings."""
from __future__ import annotations

import html
from typing import Any, Iterable

from ranktrace.analyzers.model.values import Comparison, FactDiff
from ranktrace.analyzers.report.words import plain
from ranktrace.analyzers.verdict import Verdict

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".html"
BINARY = False

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%;margin:.4em 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.a{background:#f3f8ff}td.b{background:#fff8f0}
tr.differs td{font-weight:600}tr.differs td.key::before{content:"≠ ";color:#c00}
tr.one td{color:#777}.muted{color:#777}.hang{color:#b00;font-weight:600}.ok{color:#070;font-weight:600}
.summary{font-size:1.05em;padding:.5em;background:#fffbe6;border:1px solid #eed}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:1em}.card{border:1px solid #ddd;padding:.6em}
.bar{display:inline-block;height:.7em;background:#7aa6d8;vertical-align:middle}
.bar.b{background:#e0a060}
"""


def _e(x: Any) -> str:
    return "" if x is None else html.escape(str(x), quote=True)


def _table(head: Iterable[str], rows: Iterable[tuple[str, list[tuple[str, str]]]]) -> str:
    """rows: (tr class, [(td class, escaped html)])."""
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for cls, cells in rows:
        out.append(f'<tr class="{cls}">' + "".join(f'<td class="{c}">{v}</td>' for c, v in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _facts(facts: list[FactDiff]) -> str:
    if not facts:
        return '<p class="muted">Neither input says what it ran on.</p>'
    rows = []
    for f in facts:
        cls = {"differs": "differs", "same": "same"}.get(f.status, "one")
        src = " / ".join(x for x in (f.source_a, f.source_b) if x)
        rows.append((cls, [("", _e(f.section)), ("key", _e(f.key)), ("a", _e(f.a if f.a is not None else "—")),
                           ("b", _e(f.b if f.b is not None else "—")), ("muted", _e(src))]))
    return _table(("section", "fact", "A", "B", "read from"), rows)


def _verdict(name: str, path: str, v: Verdict | None) -> str:
    if v is None:
        return f'<div class="card"><b>{name}</b>: no verdict</div>'
    cls = "hang" if v.status in ("hang", "crashed") else "ok" if v.status in ("completed", "idle") else ""
    extra = []
    if v.operation:
        extra.append(f"operation: {_e(v.operation.name)} group {_e(v.operation.group_desc or v.operation.group)} "
                     f"seq {_e(v.operation.seq)}")
    if v.culprit_ranks:
        extra.append(f"culprit ranks: {_e(', '.join(map(str, v.culprit_ranks)))}")
    if v.waiting_ranks:
        extra.append(f"waiting ranks: {_e(', '.join(map(str, v.waiting_ranks)))}")
    return (f'<div class="card"><b>{name}</b> <span class="muted">{_e(path)}</span><br>'
            f'<span class="{cls}">{_e(v.status.upper())} · {_e(v.kind)}</span><br>{_e(plain(v.summary))}'
            + "".join(f"<br>{x}" for x in extra) + "</div>")


def _bars(a: float | None, b: float | None) -> str:
    top = max(x for x in (a, b, 1e-12) if x is not None)
    out = []
    for x, cls in ((a, ""), (b, " b")):
        w = 0 if x is None else max(1, int(160 * x / top))
        out.append(f'<span class="bar{cls}" style="width:{w}px"></span>')
    return "<br>".join(out)


def render(c: Comparison) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>trace compare: {_e(c.a)} vs {_e(c.b)}"
             f"</title><style>{_CSS}</style></head><body>",
             "<h1>trace compare</h1>",
             f'<div class="cols"><div class="card"><b>A</b> {_e(c.a)}<br><span class="muted">{_e(c.a_inputs)}'
             f'</span></div><div class="card"><b>B</b> {_e(c.b)}<br><span class="muted">{_e(c.b_inputs)}</span>'
             "</div></div>",
             f'<p class="summary">{_e(c.summary())}</p>']

    parts.append("<h2>1. Hardware and software</h2>")
    parts.append(_facts(c.context_diff))

    parts.append("<h2>2. What NCCL decided</h2>")
    if not c.nccl_diff:
        parts.append('<p class="muted">No NCCL INFO lines in either input.</p>')
    runs = [d for d in c.nccl_diff if d.scope == "runs"]
    if runs:
        parts.append("<h3>Across the runs</h3>")
        parts.append(_table(("communicator", "decision", "ranks", "A", "B", "lines"), [
            ("differs" if d.differs else ("one" if (d.a is None) != (d.b is None) else "same"),
             [("", _e(d.comm)), ("key", _e(d.what)), ("", _e(d.who)), ("a", _e(d.a if d.a is not None else "—")),
              ("b", _e(d.b if d.b is not None else "—")), ("muted", _e(", ".join(d.evidence)))]) for d in runs]))
    for scope, name in (("within_a", "A"), ("within_b", "B")):
        rows = [d for d in c.nccl_diff if d.scope == scope]
        if rows:
            parts.append(f"<h3>Between the ranks of {name}</h3><p class='muted'>A rank that chose a different path "
                         "from its peers is a known precursor of hangs.</p>")
            parts.append(_table(("communicator", "decision", "who", "the others", "these", "lines"), [
                ("differs", [("", _e(d.comm)), ("key", _e(d.what)), ("", _e(d.who)), ("a", _e(d.a)),
                             ("b", _e(d.b)), ("muted", _e(", ".join(d.evidence)))]) for d in rows]))
    parts += [f'<p class="muted">{_e(n)}</p>' for n in c.notes]

    parts.append("<h2>3. Outcome</h2>")
    parts.append(f'<div class="cols">{_verdict("A", c.a, c.verdict_a)}{_verdict("B", c.b, c.verdict_b)}</div>')

    parts.append("<h2>4. Where B departed from A</h2>")
    if not c.related:
        parts.append(f"<p>A and B look like different jobs ({_e(c.relation)}): their op sequences are not "
                     "compared.</p>")
    elif not c.first_divergence:
        parts.append(f"<p>{_e(c.summary())}</p>")
    else:
        parts.append(_table(("rank", "op #", "A issued", "B issued", "A at", "B at"), [
            ("differs", [("", _e(d.rank)), ("", _e(d.position)), ("a", _e(d.a or "(nothing more)")),
                         ("b", _e(d.b or "(nothing more)")), ("muted", _e(d.a_callsite)),
                         ("muted", _e(d.b_callsite))])
            for d in sorted(c.first_divergence, key=lambda d: (d.position, d.rank))]))
    if c.sequence_note:
        parts.append(f'<p class="muted">{_e(c.sequence_note)}</p>')
    if c.op_counts and c.related:
        parts.append(_table(("op", "A", "B"), [
            ("differs" if a != b else "same", [("key", _e(n)), ("a", _e(a)), ("b", _e(b))])
            for n, a, b in c.op_counts]))

    parts.append("<h2>5. Timings</h2>")
    if c.phases:
        parts.append(_table(("phase (slowest rank)", "A", "B", "B / A", "", "from"), [
            ("differs" if p.ratio is not None and not 0.5 <= p.ratio <= 2 else "same",
             [("key", _e(p.name)), ("a", _e("—" if p.a_s is None else f"{p.a_s:.3f} s")),
              ("b", _e("—" if p.b_s is None else f"{p.b_s:.3f} s")),
              ("", _e("" if p.ratio is None else f"x{p.ratio:.2f}")), ("", _bars(p.a_s, p.b_s)),
              ("muted", _e(p.source))]) for p in c.phases]))
    if c.latency:
        def us(x: float | None) -> str:
            return "—" if x is None else f"{x:.1f}"

        parts.append(_table(("op", "bytes", "timed as", "A p50 / p99 µs (n)", "B p50 / p99 µs (n)", "B / A p50, p99"),
                            [("differs" if r.ratio_p50 is not None and not 0.5 <= r.ratio_p50 <= 2 else "same",
                              [("key", _e(r.op)), ("", _e(r.nbytes)), ("muted", _e(r.basis)),
                               ("a", _e(f"{us(r.a_p50_us)} / {us(r.a_p99_us)} ({r.a_n})")),
                               ("b", _e(f"{us(r.b_p50_us)} / {us(r.b_p99_us)} ({r.b_n})")),
                               ("", _e(", ".join("-" if x is None else f"x{x:.2f}"
                                               for x in (r.ratio_p50, r.ratio_p99))))])
                             for r in c.latency]))
    if not c.phases and not c.latency:
        parts.append('<p class="muted">Nothing timed in either input.</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
