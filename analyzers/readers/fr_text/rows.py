"""A claim block to OBSERVATIONS rows: one ``fr_missing_ranks`` per missing rank, one ``fr_mismatch`` per error
block, one ``fr_culprit`` per culprit rank, each with the block's context in ``detail``."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.fr_text.scan import Block

__all__ = ["block_rows"]


def block_rows(b: Block, f: str) -> list[dict[str, Any]]:
    name = canonical_op(b.op) if b.op else None
    ctx = [f"group={b.group}:{b.group_desc}" if b.group_desc else f"group={b.group}", f"op={b.op}",
           f"record_id={b.record_id}", f"state={b.state}", f"expected_ranks={b.expected or None}"]
    if b.frames:
        ctx.append(f"stack_top={b.frames[0]!r}")
    context = " ".join(ctx)
    base = {"name": name, "group": b.group, "value": b.seq, "source": "fr", "file": f}
    rows: list[dict[str, Any]] = []
    for r in b.missing:
        rows.append({**base, "rank": r, "kind": "fr_missing_ranks", "line": b.missing_line or b.line,
                     "detail": f"missing ranks {sorted(b.missing)}; {context}"})
    if b.kind in ("errors", "size"):
        kinds = sorted({c[1].split(":", 1)[0] for c in b.culprits}) or (
            ["SIZE_OR_SYNTAX_MISMATCH"] if b.kind == "size" else ["UNKNOWN"])
        rows.append({**base, "rank": None, "kind": "fr_mismatch", "line": b.line, "detail": ",".join(kinds)})
    for rank, msg, line in b.culprits:
        rows.append({**base, "rank": rank, "kind": "fr_culprit", "line": line, "detail": f"{msg}; {context}"})
    return rows
