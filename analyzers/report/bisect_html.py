"""The `trace bisect` section of report.html: the table of configurations and runs, the smallest change that fixes
the hang and what it suggests, the comparison of the best hung and the best good run. Takes the `ranktrace.bisect/1`
document (bisect.json) as a dict; everything in it is HTML-escaped. html_report.render calls `section` when it is
given a bisect; `page` is the page of a bisect with no hung run to show."""
from __future__ import annotations

import html
from typing import Any, Mapping

__all__ = ["section", "page"]

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d1d1f;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #ccc} .ev{color:#555;font-size:12px}
"""
_EFFECT_CLASS = {"fixes": "fix", "baseline": "base", "breaks": "worse", "rejected": "worse"}
_SECTION_STYLE = (".bisect tr.fix td{color:#1b7f3b;font-weight:600} .bisect tr.base td{color:#b00020} "
                  ".bisect tr.worse td{color:#8a6d00}")


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _verdict(v: Mapping[str, Any] | None) -> str:
    if not v:
        return ""
    op = v.get("op")
    bits = [str(v.get("kind"))]
    if op:
        where = ", ".join(x for x in (f"seq {v['seq']}" if v.get("seq") is not None else "",
                                      f"peer {v['peer']}" if v.get("peer") is not None else "",
                                      f"phase {v['phase']}" if v.get("phase") else "") if x)
        bits.append(f"{op}" + (f" ({where})" if where else ""))
    if v.get("culprit_ranks"):
        bits.append("culprit " + ",".join(str(r) for r in v["culprit_ranks"]))
    return " · ".join(bits)


def _runs(c: Mapping[str, Any]) -> str:
    cells = []
    for r in c.get("runs", []):
        v = _verdict(r.get("verdict")) if r.get("outcome") in ("hang", "crash", "timeout") else ""
        title = _e(f"{r.get('how')}" + (f" — {r['verdict'].get('summary')}" if r.get("verdict") else ""))
        cells.append(f'<span title="{title}"><a href="{_e(r.get("dir"))}/report.html">{_e(r.get("outcome"))}</a> '
                     f'{_e(r.get("seconds"))} s{(" · " + _e(v)) if v else ""}</span>')
    return "<br>".join(cells)


def section(doc: Mapping[str, Any]) -> str:
    """The bisect as one <section> (its own headings), for the top of a run's report page."""
    rows = "".join(
        f'<tr class="{_EFFECT_CLASS.get(c.get("effect", ""), "")}"><td>{_e(c.get("name"))}</td>'
        f'<td>{_e(c.get("effect"))}</td><td>{_e(c.get("rates"))}</td><td>{_runs(c)}</td></tr>'
        for c in doc.get("configurations", []))
    fix = doc.get("fix")
    parts = [f"<h2>trace bisect: {_e(doc.get('status'))}</h2>", f"<p><b>{_e(doc.get('answer'))}</b></p>"]
    if fix:
        parts.append(f"<p><b>smallest change that fixes it:</b> <code>{_e('; '.join(fix.get('changes', [])))}</code>"
                     + ("" if fix.get("minimal") else " (not reduced further: the search stopped)") + "</p>")
        parts += [f"<p><b>suggests:</b> {_e(s)}</p>" for s in fix.get("suggests", [])]
    if doc.get("order"):
        parts.append("<p class=\"ev\">order: " + "; ".join(f"{_e(h['area'])} first: {_e(h['reason'])}"
                                                          for h in doc["order"][:3]) + "</p>")
    parts.append('<table><tr><th>configuration</th><th>effect</th><th>outcomes</th>'
                 f'<th>each run (outcome, time to outcome, verdict)</th></tr>{rows}</table>')
    for key, label in (("do_not_matter", "do not matter"), ("helps", "help without fixing"),
                       ("breaks", "turn it into another failure"), ("rejected", "rejected by the command"),
                       ("not_tried", "not tried")):
        items = doc.get(key) or []
        if items:
            parts.append(f"<p><b>{label}:</b> " + ", ".join(
                f"<code>{_e(x.get('changes'))}</code>" + (f" ({_e(x['rates'])})" if x.get("rates") else "")
                for x in items) + "</p>")
    if doc.get("stopped"):
        parts.append(f"<p><b>stopped:</b> {_e(doc['stopped'])}</p>")
    cmp = doc.get("compare")
    if cmp and cmp.get("summary"):
        ctx = "".join(f"<li><code>{_e(k)}</code>: A={_e(a)} B={_e(b)}</li>" for k, a, b in cmp.get("context", []))
        parts.append(f"<h2>Best hung run vs best good run</h2><p>A = <code>{_e(cmp.get('hung'))}</code>, "
                     f"B = <code>{_e(cmp.get('good'))}</code>: {_e(cmp['summary'])}</p>"
                     + (f"<ul>{ctx}</ul>" if ctx else "") + f'<p class="ev">full comparison: {_e(cmp.get("file"))}</p>')
    elif cmp and cmp.get("problem"):
        parts.append(f"<p class=\"ev\">{_e(cmp['problem'])}</p>")
    parts.append(f'<p class="ev">{_e(doc.get("runs_used"))} runs in {_e(doc.get("seconds"))} s · '
                 f'schema {_e(doc.get("schema"))} · the JSON is bisect.json</p>')
    return f'<section class="bisect"><style>{_SECTION_STYLE}</style>' + "".join(parts) + "</section>"


def page(doc: Mapping[str, Any]) -> str:
    """A page with the bisect alone (no hung run to draw)."""
    cmd = " ".join(str(a) for a in doc.get("command", []))
    return "".join([
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>ranktrace bisect</title>',
        f"<style>{_STYLE}</style></head><body><h1>trace bisect</h1><p><code>{_e(cmd)}</code></p>",
        section(doc), "</body></html>\n"])
