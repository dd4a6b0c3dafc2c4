"""What a bisect found, as the `ranktrace.bisect/1` document (bisect.json) and as text (the terminal, bisect.txt).
Built from the runs the session made and what the search concluded; the HTML section reads the same document
(analyzers/report/bisect_html.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ranktrace.tracer.formats import redact
from ranktrace.tracer.launch.bisect.knobs import Candidate, Framework, Hint
from ranktrace.tracer.launch.bisect.runner import RunRecord
from ranktrace.tracer.launch.bisect.search import Config, Search, Tally

__all__ = ["SCHEMA", "Attempt", "build", "render_text", "verdict_line"]

SCHEMA = "ranktrace.bisect/1"


@dataclass
class Attempt:
    """One configuration as run: its runs (complete or not) and what it did to the command."""

    config: Config
    tally: Tally
    changes: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    runs: list[tuple[int, RunRecord]] = field(default_factory=list)   # (run index, record)


def verdict_line(v: dict[str, Any] | None) -> str:
    """'missing_ranks · recv (peer 1) · culprit 1'."""
    if not v:
        return "no verdict"
    parts = [str(v.get("kind"))]
    if v.get("op"):
        op = str(v["op"])
        extra = [f"group {v['group']}" if v.get("group") else "", f"seq {v['seq']}" if v.get("seq") is not None else "",
                 f"peer {v['peer']}" if v.get("peer") is not None else "", f"phase {v['phase']}" if v.get("phase") else ""]
        extra = [e for e in extra if e]
        parts.append(op + (f" ({', '.join(extra)})" if extra else ""))
    elif v.get("phase"):
        parts.append(f"phase {v['phase']}")
    if v.get("culprit_ranks"):
        parts.append("culprit " + ",".join(str(r) for r in v["culprit_ranks"]))
    return " · ".join(parts)


def _effect(a: Attempt, base: Tally | None) -> str:
    t = a.tally
    if a.config.role == "baseline":
        return "baseline"
    if t.rejected:
        return "rejected"
    if not t.complete:
        return "incomplete"
    if t.fixes:
        return "fixes"
    if base is not None and base.n and t.n:
        if base.count("crash") == 0 and t.count("crash") == t.n:
            return "breaks"   # turns the hang into a different failure
        if (t.fail_rate or 0) < (base.fail_rate or 0):
            return "helps"
    return "no effect"


def _run_doc(index: int, r: RunRecord, root: Path) -> dict[str, Any]:
    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(root))
        except ValueError:
            return str(p)

    return {"index": index, "dir": rel(r.run_dir), "log": rel(r.log), "outcome": r.outcome, "how": r.how,
            "seconds": r.seconds, "wall_seconds": round(r.wall_seconds, 2), "exit_code": r.exit_code,
            "verdict": r.verdict, "leftovers": r.leftovers}


def build(*, root: Path, command: Sequence[str], framework: Framework, options: dict[str, Any],
          attempts: Sequence[Attempt], search: Search, hints: Sequence[Hint], skipped: Sequence[tuple[str, str]],
          stopped: str | None, seconds: float, runs_used: int, compare: dict[str, Any] | None = None,
          started: str = "", next_config: Config | None = None) -> dict[str, Any]:
    base = search.baseline
    configs = []
    for a in attempts:
        configs.append({"name": a.config.name, "role": a.config.role, "knobs": a.config.knob_names,
                        "changes": list(a.changes), "env": dict(a.env), "rates": a.tally.rates(),
                        "counts": {o: a.tally.count(o) for o in sorted(set(a.tally.outcomes))},
                        "complete": a.tally.complete, "effect": _effect(a, base),
                        "runs": [_run_doc(i, r, root) for i, r in a.runs]})
    by_key = {a.config.key: a for a in attempts}
    fix = None
    if search.fix is not None:
        a = by_key.get(frozenset(c.key for c in search.fix))
        fix = {"knobs": [c.name for c in search.fix], "changes": list(a.changes) if a else [c.label for c in search.fix],
               "configuration": a.config.name if a else " + ".join(c.label for c in search.fix),
               "minimal": search.fix_minimal, "rates": a.tally.rates() if a else "",
               "chance_by_luck": search.chance_by_luck(),
               "suggests": [c.knob.suggests for c in search.fix if c.knob.suggests]}
    singles = [a for a in attempts if a.config.role in ("single", "alternative", "narrower")
               and len(a.config.candidates) == 1]
    ran = {a.config.candidates[0].name for a in singles}
    status = search.status if search.status != "running" else "incomplete"
    asked = list(next_config.candidates) if next_config is not None and len(next_config.candidates) == 1 else []
    not_tried: list[dict[str, Any]] = []
    for c in asked + list(search.pending) + list(search.singles):
        if c.name in ran or any(x["knob"] == c.name for x in not_tried):
            continue
        waiting = c in asked or c in search.pending
        why = (f"the search stopped first ({stopped})" if stopped and (waiting or status != "fixed")
               else "not needed: a fix was found before it" if status == "fixed" else "not reached")
        not_tried.append({"knob": c.name, "changes": c.label, "why": why})
    doc: dict[str, Any] = {
        "schema": SCHEMA, "status": status, "stopped": stopped, "note": search.note,
        "command": redact.redact_argv(list(command)),
        "framework": {"name": framework.name, "version": framework.version, "why": framework.why},
        "options": options, "started": started, "seconds": round(seconds, 1), "runs_used": runs_used,
        "order": [{"area": h.area, "reason": h.reason} for h in hints],
        "configurations": configs, "fix": fix,
        "do_not_matter": [_knob_doc(a) for a in singles if _effect(a, base) == "no effect"],
        "helps": [_knob_doc(a) for a in singles if _effect(a, base) == "helps"],
        "breaks": [_knob_doc(a) for a in singles if _effect(a, base) == "breaks"],
        "rejected": [_knob_doc(a) for a in singles if _effect(a, base) == "rejected"],
        "not_tried": not_tried,
        "skipped": [{"knob": n, "why": w} for n, w in skipped],
        "compare": compare,
    }
    doc["answer"] = _answer(doc, base)
    return doc


def _knob_doc(a: Attempt) -> dict[str, Any]:
    c = a.config.candidates[0]
    return {"knob": c.name, "changes": a.config.name, "rates": a.tally.rates(), "area": c.knob.area}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _answer(doc: dict[str, Any], base: Tally | None) -> str:
    if base is None:
        return "nothing ran to completion" + (f" ({doc['stopped']})" if doc["stopped"] else "")
    as_given = f"as given it {_fails(base)} ({base.rates()})"
    if doc["status"] == "not_reproduced":
        return f"as given it did not fail ({base.rates()}): nothing to bisect; raise --repeat if it hangs rarely"
    fix = doc["fix"]
    if fix is None:
        tail = {"no_fix": "no knob tried turns it into success", "incomplete": "no fix found before the search stopped"}
        return f"{as_given}; {tail.get(doc['status'], 'no fix found')}" + _dnm(doc)
    luck = fix["chance_by_luck"]
    weak = f" (weak: {luck:.0%} chance of that by luck at the baseline's rate; raise --repeat)" if luck and luck > 0.05 \
        else ""
    return f"{as_given}; succeeds with {'; '.join(_said(c) for c in fix['changes'])} ({fix['rates']}){weak}" + _dnm(doc)


def _said(change: str) -> str:
    """A change as a sentence says it: '+ --flag' -> '--flag', '- --flag v' -> 'without --flag v'."""
    if change.startswith("+ "):
        return change[2:]
    if change.startswith("- "):
        return "without " + change[2:]
    return change


def _fails(t: Tally) -> str:
    kinds = [o for o in ("hang", "crash", "timeout") if t.count(o)]
    return {"hang": "hangs", "crash": "crashes", "timeout": "never finishes"}[kinds[0]] if kinds else "fails"


def _dnm(doc: dict[str, Any]) -> str:
    d = ["; ".join(_said(c) for c in x["changes"].split("; ")) for x in doc["do_not_matter"]]
    if not d:
        return ""
    return f"; {', '.join(d)} {'does' if len(d) == 1 else 'do'} not matter"


# ---- text --------------------------------------------------------------------------------------------------------

def _times(runs: list[dict[str, Any]]) -> str:
    return " ".join(f"{r['seconds']:.1f}" for r in runs if r["outcome"] not in ("interrupted",)) or "-"


def _hang_verdicts(runs: list[dict[str, Any]]) -> str:
    lines = [verdict_line(r["verdict"]) for r in runs if r["outcome"] in ("hang", "crash", "timeout")]
    counts: dict[str, int] = {}
    for ln in lines:
        counts[ln] = counts.get(ln, 0) + 1
    return "; ".join(f"{ln}" + (f" ×{n}" if n > 1 else "") for ln, n in counts.items()) or "-"


def render_text(doc: dict[str, Any], root: Path) -> str:
    o = doc["options"]
    fw = doc["framework"]
    head = (f"trace bisect · {' '.join(doc['command'])}\n"
            f"framework {fw['name']}{' ' + fw['version'] if fw['version'] else ''} · {o['repeat']} run(s) per "
            f"configuration · {doc['runs_used']} run(s) in {doc['seconds']:.0f} s")
    rows = [("configuration", "runs", "outcomes", "time to outcome (s)", "verdict of each failed run")]
    for c in doc["configurations"]:
        rows.append((c["name"] if c["effect"] in ("baseline",) else f"{c['name']}  [{c['effect']}]",
                     str(len(c["runs"])), c["rates"], _times(c["runs"]), _hang_verdicts(c["runs"])))
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((60, 4, 28, 22, 200))]
    table = []
    for r in rows:
        cells = [r[i].ljust(widths[i]) if i < 4 else r[i] for i in range(5)]
        table.append("  ".join(cells).rstrip())
    out = [head, ""] + table + [""]
    if doc["order"]:
        out.append("order: " + "; ".join(f"{h['area']} first: {h['reason']}" for h in doc["order"][:3]))
    out.append(f"answer: {doc['answer']}")
    fix = doc["fix"]
    if fix:
        out.append(f"smallest change that fixes it: {'; '.join(fix['changes'])}"
                   + ("" if fix["minimal"] else " (not reduced further: the search stopped)"))
        for s in fix["suggests"]:
            out.append(f"suggests: {s}")
    for key, label in (("helps", "helps without fixing"), ("breaks", "turns it into another failure"),
                       ("rejected", "rejected by the command")):
        if doc[key]:
            out.append(f"{label}: " + ", ".join(f"{x['changes']} ({x['rates']})" for x in doc[key]))
    whys: dict[str, list[str]] = {}
    for x in doc["not_tried"]:
        whys.setdefault(x["why"], []).append(x["changes"])
    for why, names in whys.items():
        out.append("not tried: " + ", ".join(names[:12]) + (f" (+{len(names) - 12})" if len(names) > 12 else "")
                   + f" — {why}")
    if doc["stopped"]:
        out.append(f"stopped: {doc['stopped']}")
    cmp = doc.get("compare")
    if cmp:
        if cmp.get("summary"):
            out.append(f"compare (A = hung {cmp['hung']}, B = good {cmp['good']}): {cmp['summary']}")
            for k, a, b in cmp.get("context", [])[:6]:
                out.append(f"  {k}: A={a!r} B={b!r}")
            out.append(f"  full comparison: {cmp.get('file', 'compare.txt')}")
        elif cmp.get("problem"):
            out.append(f"compare: {cmp['problem']}")
    out.append(f"bisect folder: {root} (bisect.json, bisect.txt, report.html, runs/)")
    return "\n".join(out) + "\n"
