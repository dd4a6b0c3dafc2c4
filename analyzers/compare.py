"""`trace compare A B`: two runs side by side (good vs hung, H100 vs Blackwell) and where they first diverge —
context, outcome, communication, timings. Both runs go through the same facade as `trace analyze`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers import facade
from ranktrace.analyzers.model import Comparison, Divergence, Liveness

__all__ = ["Divergence", "Comparison", "compare_paths", "context_diff", "first_divergence"]

_ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_", "GLOO_", "OMP_", "SGLANG_", "VLLM_")


def context_diff(ma: dict[str, Any], mb: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Keys whose values differ between two meta.json documents (versions, GPUs, env subset, command)."""
    out: list[tuple[str, Any, Any]] = []
    for key in ("command", "hostname"):
        if ma.get(key) != mb.get(key):
            out.append((key, ma.get(key), mb.get(key)))
    va, vb = ma.get("versions", {}), mb.get("versions", {})
    for k in sorted(set(va) | set(vb)):
        if va.get(k) != vb.get(k):
            out.append((f"versions.{k}", va.get(k), vb.get(k)))
    ga = [g.get("name") for g in ma.get("gpus", [])]
    gb = [g.get("name") for g in mb.get("gpus", [])]
    if ga != gb:
        out.append(("gpus", ga, gb))
    ea, eb = ma.get("env", {}), mb.get("env", {})
    for k in sorted(set(ea) | set(eb)):
        if k.startswith(_ENV_PREFIXES) and ea.get(k) != eb.get(k):
            out.append((f"env.{k}", ea.get(k), eb.get(k)))
    return out


def _sequences(ops: pa.Table) -> dict[int, list[tuple[str, str | None]]]:
    issued = ops.filter(ops["issued"]).sort_by([("rank", "ascending"), ("t_enter", "ascending"), ("seq", "ascending")])
    out: dict[int, list[tuple[str, str | None]]] = {}
    cols = [issued[c].to_pylist() for c in ("rank", "name", "group_desc", "group", "seq", "dtype", "shape",
                                            "callsite")]
    for r, n, gd, g, s, dt, sh, cs in zip(*cols):
        label = f"{n} {gd or g} seq {s}" + (f" {dt}{sh or ''}" if dt else "")
        out.setdefault(r, []).append((label, cs))
    return out


def first_divergence(a: dict[int, list[tuple[str, str | None]]],
                     b: dict[int, list[tuple[str, str | None]]]) -> list[Divergence]:
    """Per rank present in both runs, the first position where the op sequences differ."""
    out = []
    for r in sorted(set(a) & set(b)):
        sa, sb = a[r], b[r]
        for i in range(max(len(sa), len(sb))):
            xa = sa[i] if i < len(sa) else (None, None)
            xb = sb[i] if i < len(sb) else (None, None)
            if xa[0] != xb[0]:
                out.append(Divergence(r, i, xa[0], xb[0], xa[1], xb[1]))
                break
    return out


def _timings(events: pa.Table) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    if events.num_rows == 0 or events["t_ns"].null_count == events.num_rows:
        return out
    t0 = pc.min(events["t_ns"]).as_py()
    init = events.filter(pc.equal(events["name"], "init_process_group"))
    ex = init.filter(pc.equal(init["kind"], "exit"))["t_ns"]
    if len(ex):
        out["init_process_group done (max over ranks)"] = (pc.max(ex).as_py() - t0) / 1e9
    coll = events.filter(pc.and_(pc.equal(events["category"], "collective"), pc.equal(events["kind"], "enter")))
    if coll.num_rows:
        out["first collective"] = (pc.min(coll["t_ns"]).as_py() - t0) / 1e9
        out["last collective issued"] = (pc.max(coll["t_ns"]).as_py() - t0) / 1e9
    return out


def compare_paths(a: Path, b: Path, *, liveness: Liveness | None) -> Comparison:
    """Analyze both (`liveness` as for ``facade.analyze``: one value may cover both runs) and answer four
    questions, in the order a person asks them:
    1. context — what differs in how they ran (command, versions, GPUs, NCCL/TORCH environment, world size);
    2. outcome — each run's verdict;
    3. communication — per rank, the first op where B's sequence of (group, seq, op, dtype, shape) departs from
       A's (the op one run issued and the other did not, or issued differently);
    4. timings — init and time-to-first-collective per run.
    """
    ra, rb = facade.analyze([a], liveness=liveness), facade.analyze([b], liveness=liveness)
    cmp = Comparison(str(a), str(b))
    cmp.context = context_diff(ra.meta(), rb.meta())
    cmp.outcome = (f"{ra.verdict.status}/{ra.verdict.kind}: {ra.verdict.summary}",
                   f"{rb.verdict.status}/{rb.verdict.kind}: {rb.verdict.summary}")
    cmp.divergences = first_divergence(_sequences(ra.ops), _sequences(rb.ops))
    ca: dict[str, int] = {}
    cb: dict[str, int] = {}
    for ops, counts in ((ra.ops, ca), (rb.ops, cb)):
        if ops.num_rows:
            for row in ops.filter(ops["issued"]).group_by(["name"]).aggregate([("seq", "count")]).to_pylist():
                counts[row["name"]] = row["seq_count"]
    cmp.op_counts = [(n, ca.get(n, 0), cb.get(n, 0)) for n in sorted(set(ca) | set(cb))]
    ta, tb = _timings(ra.events), _timings(rb.events)
    cmp.timings = [(k, ta.get(k), tb.get(k)) for k in sorted(set(ta) | set(tb))]
    return cmp
