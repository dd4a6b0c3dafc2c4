"""The start-up phase ledger of a verdict (``Verdict.phases``), grouped for a person: one row per phase and
instance (``cuda-graph capture bs=64``) with the ranks that went through it, how long it took them, and which
ranks are in it now. Shared by the text and HTML renderers; takes the Verdict only."""
from __future__ import annotations

from dataclasses import dataclass

from ranktrace.analyzers.verdict import PhaseEntry, Verdict, compact_ranks

__all__ = ["LedgerRow", "ledger_rows", "ledger_text", "seconds_text"]

_NAMES = {
    "torch_distributed_init": "torch distributed init", "weight_loading": "weight loading",
    "memory_profiling": "memory profiling", "kv_cache_alloc": "KV cache allocation", "kernel_warmup": "kernel warm-up",
    "cuda_graph_init": "CUDA-graph set-up", "cuda_graph_capture": "cuda-graph capture",
    "draft_graph_init": "draft (EAGLE) CUDA-graph set-up", "draft_graph_capture": "draft (EAGLE) cuda-graph capture",
}


@dataclass(frozen=True)
class LedgerRow:
    phase: str          # what a person reads: "cuda-graph capture bs=64"
    ranks: str          # "0-7"
    took: str           # "0.4-0.6 s"
    open: str           # ranks still in it ("" when none)


def seconds_text(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def ledger_rows(verdict: Verdict) -> list[LedgerRow]:
    groups: dict[tuple[str, str | None], list[PhaseEntry]] = {}
    for p in verdict.phases:  # start order: a phase's first appearance fixes its row
        groups.setdefault((p.name, p.detail), []).append(p)
    rows = []
    for (name, detail), ps in groups.items():
        ranks = sorted({p.rank for p in ps if p.rank is not None})
        secs = [p.seconds for p in ps if p.seconds is not None]
        took = ""
        if secs:
            lo, hi = min(secs), max(secs)
            took = seconds_text(hi) if seconds_text(lo) == seconds_text(hi) else f"{seconds_text(lo)}-{seconds_text(hi)}"
        still = sorted({p.rank for p in ps if p.open and p.rank is not None})
        label = _NAMES.get(name, name.replace("_", " ")) + (f" {detail}" if detail else "")
        rows.append(LedgerRow(label, compact_ranks(ranks) if ranks else "main process", took,
                              compact_ranks(still) if still else ("yes" if any(p.open for p in ps) else "")))
    return rows


def ledger_text(verdict: Verdict, limit: int = 40) -> list[str]:
    """Lines for a terminal: 'cuda-graph capture bs=4   ranks 0-3   6.0 s   <- still in it: 0-3'."""
    rows = ledger_rows(verdict)
    if not rows:
        return []
    shown = rows if len(rows) <= limit else rows[:limit // 2] + rows[-limit // 2:]
    width = max(len(r.phase) for r in shown)
    out = []
    for r in shown:
        line = f"  {r.phase:<{width}}  ranks {r.ranks:<8} {r.took:>12}"
        if r.open:
            line += f"  <- now: {r.open}"
        out.append(line)
    if len(shown) < len(rows):
        out.insert(limit // 2, f"  ... {len(rows) - len(shown)} more phases ...")
    return out
