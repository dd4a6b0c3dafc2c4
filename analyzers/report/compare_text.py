"""Text renderer for `trace compare` (a Comparison in, text out)."""
from __future__ import annotations

from ranktrace.analyzers.model import Comparison

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".txt"
BINARY = False


def render(c: Comparison) -> str:
    lines = [f"A: {c.a}", f"B: {c.b}", "", f"where they diverge: {c.summary()}", ""]
    lines.append("outcome:")
    lines.append(f"  A  {c.outcome[0]}")
    lines.append(f"  B  {c.outcome[1]}")
    if c.context:
        lines.append("context that differs:")
        for k, a, b in c.context:
            lines.append(f"  {k}: A={a!r}  B={b!r}")
    else:
        lines.append("context: same command, versions, GPUs and NCCL/TORCH environment")
    if c.divergences:
        lines.append("first divergence per rank:")
        for d in c.divergences:
            lines.append(f"  rank {d.rank} op #{d.position}: A={d.a or '(nothing more)'}  B={d.b or '(nothing more)'}"
                         + (f"  [A at {d.a_callsite}]" if d.a_callsite else "")
                         + (f"  [B at {d.b_callsite}]" if d.b_callsite and d.b_callsite != d.a_callsite else ""))
    if c.op_counts:
        lines.append("ops issued (all ranks):")
        for n, a, b in c.op_counts:
            mark = "" if a == b else "   <- differs"
            lines.append(f"  {n}: A={a} B={b}{mark}")
    if c.timings:
        lines.append("timings (s since the first event):")
        for k, a, b in c.timings:
            fa = "-" if a is None else f"{a:.2f}"
            fb = "-" if b is None else f"{b:.2f}"
            lines.append(f"  {k}: A={fa} B={fb}")
    return "\n".join(lines) + "\n"
