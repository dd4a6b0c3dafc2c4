"""Text renderer for `trace compare` (a Comparison in, text out), in the order a person asks: hardware and software,
what NCCL decided, outcome, where B departed from A, timings."""
from __future__ import annotations

from ranktrace.analyzers.model.values import Comparison, DecisionDiff, FactDiff
from ranktrace.analyzers.report.words import plain

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".txt"
BINARY = False
_SAME_SHOWN = 12     # facts that are the same: this many are listed, the rest counted


def _v(x: object) -> str:
    return "-" if x is None else str(x)


def _fact(f: FactDiff) -> str:
    if f.status == "same":
        return f"  {f.section:<11} {f.key}: {f.a}"
    mark = {"differs": "≠", "only_a": "A only", "only_b": "B only"}[f.status]
    return f"  {f.section:<11} {f.key}: A={_v(f.a)}  B={_v(f.b)}   [{mark}]"


def _decision(d: DecisionDiff) -> str:
    who = f" {d.who}" if d.who else ""
    if d.scope == "runs":
        text = f"  {d.comm} · {d.what}{who}: A={_v(d.a)}  B={_v(d.b)}"
    else:
        text = f"  {d.comm} · {d.what}:{who} chose {_v(d.b)} where the others chose {_v(d.a)}"
    if d.evidence:
        text += f"   ({', '.join(d.evidence)})"
    return text


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(c: Comparison) -> str:
    lines = [f"A: {c.a}  ({c.a_inputs})", f"B: {c.b}  ({c.b_inputs})", "", f"=> {c.summary()}", ""]

    lines.append("1. hardware and software")
    differs = [f for f in c.context_diff if f.status != "same"]
    same = [f for f in c.context_diff if f.status == "same"]
    if not c.context_diff:
        lines.append("  neither input says what it ran on")
    lines += [_fact(f) for f in differs]
    if same:
        lines.append(f"  the same in both ({len(same)}):" if differs else f"  no difference ({len(same)} facts):")
        lines += [_fact(f) for f in same[:_SAME_SHOWN]]
        if len(same) > _SAME_SHOWN:
            lines.append(f"  ... {len(same) - _SAME_SHOWN} more the same")
    lines.append("")

    lines.append("2. what NCCL decided")
    runs = [d for d in c.nccl_diff if d.scope == "runs"]
    within = [d for d in c.nccl_diff if d.scope != "runs"]
    if not c.nccl_diff:
        lines.append("  no NCCL INFO lines in either input (run with NCCL_DEBUG=INFO; `trace run` sets it)")
    changed = [d for d in runs if d.differs]
    if changed:
        lines.append("  across the runs:")
        lines += [_decision(d) for d in changed]
    elif runs:
        lines.append(f"  across the runs: no difference in what both logs say ({len(runs)} decisions compared)")
    one_side = [d for d in runs if not d.differs and (d.a is None) != (d.b is None)]
    if one_side:
        lines.append("  said by one side only: " + "; ".join(
            f"{d.what} ({'A' if d.a is not None else 'B'}: {d.a if d.a is not None else d.b})" for d in one_side[:8])
            + (" ..." if len(one_side) > 8 else ""))
    for scope, name in (("within_a", "A"), ("within_b", "B")):
        rows = [d for d in within if d.scope == scope]
        if rows:
            lines.append(f"  between the ranks of {name} (a rank that chose a different path is a known precursor of "
                         "hangs):")
            lines += [_decision(d) for d in rows]
    lines += [f"  note: {n}" for n in c.notes]
    lines.append("")

    lines.append("3. outcome")
    for name, v in (("A", c.verdict_a), ("B", c.verdict_b)):
        lines.append(f"  {name}  " + (f"{v.status.upper()} · {v.kind}: {plain(v.summary)}" if v else "-"))
    lines.append("")

    lines.append("4. where B departed from A")
    if not c.related:
        lines.append(f"  A and B look like different jobs ({c.relation}): their op sequences are not compared")
    elif not c.first_divergence:
        lines.append("  " + ("no difference: " + c.summary() if not c.sequence_note.startswith("no op sequence")
                             else c.sequence_note))
    else:
        for d in sorted(c.first_divergence, key=lambda d: (d.position, d.rank)):
            text = f"  rank {d.rank} op #{d.position}: A={d.a or '(nothing more)'}  B={d.b or '(nothing more)'}"
            if d.a_callsite:
                text += f"  [A at {d.a_callsite}]"
            if d.b_callsite and d.b_callsite != d.a_callsite:
                text += f"  [B at {d.b_callsite}]"
            lines.append(text)
    if c.sequence_note and not c.sequence_note.startswith("no op sequence"):
        lines.append(f"  ({c.sequence_note})")
    if c.op_counts and c.related:
        lines.append("  ops issued (all ranks): " + ", ".join(
            f"{n} {a}/{b}" + (" ≠" if a != b else "") for n, a, b in c.op_counts))
    lines.append("")

    lines.append("5. timings")
    if c.phases:
        lines.append("  phases (slowest rank):")
        for p in c.phases:
            ratio = f"  x{p.ratio:.2f}" if p.ratio is not None else ""
            lines.append(f"    {p.name}: A={_secs(p.a_s)}  B={_secs(p.b_s)}{ratio}   [{p.source}]")
    if c.latency:
        lines.append("  per-op latency, µs (p50 / p99, ops):")
        for r in c.latency:
            size = f" {r.nbytes} B" if r.nbytes is not None else ""
            ratio = f"  x{r.ratio_p50:.2f} / x{r.ratio_p99:.2f}" if r.ratio_p50 is not None and \
                r.ratio_p99 is not None else ""
            lines.append(f"    {r.op}{size} [{r.basis}]: A={_us(r.a_p50_us)} / {_us(r.a_p99_us)} ({r.a_n})  "
                         f"B={_us(r.b_p50_us)} / {_us(r.b_p99_us)} ({r.b_n}){ratio}")
    if not c.phases and not c.latency:
        lines.append("  nothing timed in either input")
    return "\n".join(lines) + "\n"
