"""Verdicts the inputs state outright: ranks named as missing from an op, and ranks whose fingerprints disagree.

Horovod's stall inspector ("Missing ranks: 3: [...]"), ``monitored_barrier`` ("Rank 2 failed to pass
monitoredBarrier"), torch's Flight Recorder analyzer ("missing ranks: {3, 4}"), desync reports and
TORCH_DISTRIBUTED_DEBUG=DETAIL ("Rank 0 is running collective: CollectiveFingerPrint(...), but Rank 1 is running
collective: ...") have already done the matching; their statement is taken at high confidence, with its op and
ranks, and cited.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding, Operation, WaitEdge

__all__ = ["stated_missing", "stated_mismatch", "MISSING_KINDS"]

MISSING_KINDS = ("missing_rank", "fr_missing_ranks")
_EXPECTED = re.compile(r"expected_ranks=\[([\d, ]*)\]")
_BY = re.compile(r"\bby=(\S+)")


def _evidence(rows: list[dict[str, Any]], what: str) -> tuple[Evidence, ...]:
    seen: set[tuple[Any, Any]] = set()
    out = []
    for r in rows:
        k = (r["file"], r["line"])
        if k in seen:
            continue
        seen.add(k)
        out.append(Evidence(r["source"] or "log", r["file"], r["line"], f"{what}: {(r['detail'] or '')[:200]}",
                            r["rank"]))
    return tuple(out[:12])


def stated_missing(ctx: Model) -> list[Candidate]:
    rows = [r for k in MISSING_KINDS for r in ctx.observations(k) if r["rank"] is not None]
    crossed = _crossed(rows)
    if crossed:
        return crossed
    if not rows:
        rows = _implied_by_joined(ctx)
    if not rows:
        return _joined_alone(ctx)
    by_key = _by_statement(rows)
    # the statement about the earliest op (a later one may only follow from it), then the one naming most ranks
    key = min(by_key, key=lambda k: (k[2] if k[2] is not None else 1 << 62, -len(by_key[k])))
    stated = by_key[key]
    op, group, seq = key
    missing = tuple(sorted({r["rank"] for r in stated}))
    joined = {r["rank"] for r in ctx.observations("joined_rank")
              if r["rank"] is not None and (r["name"] in (op, None)) and r["rank"] not in missing}
    expected: set[int] = set()
    for r in stated:
        m = _EXPECTED.search(r["detail"] or "")
        if m and m.group(1).strip():
            expected.update(int(x) for x in m.group(1).split(","))
    waiting = tuple(sorted(joined or (expected - set(missing)) or
                           (set(range(ctx.world)) - set(missing) if ctx.world else set())))
    by = sorted({m.group(1) for r in stated if (m := _BY.search(r["detail"] or ""))} | {r["source"] for r in stated
                                                                                        if r["source"]})
    name = op or "a collective"
    summary = (f"{ranks_text(missing)} never joined {name}" + (f" (group {group}, seq {seq})" if seq is not None else
                                                                   (f" (group {group})" if group else ""))
               + (f"; {ranks_text(waiting)} wait in it" if waiting else "")
               + f" — stated by {', '.join(by)}")
    exited = {r["rank"] for r in ctx.observations("rank_exit") if r["rank"] in missing}
    kind = "rank_exited" if exited and exited >= set(missing) else "missing_ranks"
    steps = [f"See what {ranks_text(missing)} was doing instead of {name}: its own log lines, a stack dump "
             f"(py-spy dump --pid <pid>) or its exit status."]
    return [Candidate(kind, summary, culprits=missing, waiting=waiting, stated=tuple(missing),
                      operation=Operation(name=op, group=group, seq=seq) if op else None,
                      wait_for=tuple(WaitEdge(w, missing, op or "?", group, seq) for w in waiting),
                      findings=[Finding("missing_ranks", summary, missing, 0.9, _evidence(stated, "stated missing"))],
                      next_steps=steps)]


def _crossed(rows: list[dict[str, Any]]) -> list[Candidate]:
    """Stall reports of one input (Horovod's "Missing ranks:" lists; the reader states each (rank, op) once) where
    rank A is missing from one op and rank B from another: each submitted what the other did not, so the ranks are
    in different collectives and wait for each other — a mismatch, not a straggler. The op named is the one stated
    missing first (the longest stalled)."""
    by_file: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "missing_rank" and r["name"] and r["line"] is not None:
            by_file.setdefault(r["file"], []).append(r)
    for block in by_file.values():
        ops: dict[int, set[str]] = {}
        for r in block:
            ops.setdefault(r["rank"], set()).add(r["name"])
        names = {n for s in ops.values() for n in s}
        if len(ops) < 2 or len(names) < 2 or any(len(s) != 1 for s in ops.values()):
            continue
        first = min(block, key=lambda r: r["line"])
        op = first["name"]
        ranks = tuple(sorted(ops))
        theirs = "; ".join(f"{ranks_text([rk])} is missing from {next(iter(s))}" for rk, s in sorted(ops.items()))
        summary = (f"the ranks are in different collectives and wait for each other: {theirs} (each submitted what "
                   f"the other did not)")
        return [Candidate("collective_mismatch", summary, culprits=(), waiting=ranks,
                          operation=Operation(name=op),
                          findings=[Finding("collective_mismatch", summary, ranks, 0.8,
                                            _evidence(block, "stated missing"))],
                          next_steps=["Find the rank-dependent branch that makes ranks submit different collectives "
                                      f"({', '.join(sorted(names))}): every rank must issue the same ops in the same "
                                      "order (a check or a broadcast done on some ranks only)."])]
    return []


def _implied_by_joined(ctx: Model) -> list[dict[str, Any]]:
    """Only the ranks that did join are listed ("ready ranks: 1, 2, 3"): ranks are numbered from 0, so the gaps
    below the highest one listed (or below the world size, when known) are the ones that did not."""
    joined = [r for r in ctx.observations("joined_rank") if r["rank"] is not None]
    if not joined:
        return []
    out = []
    for (op, group, seq), rows in _by_statement(joined).items():
        have = {r["rank"] for r in rows}
        if all(_speaks_for_itself(r) for r in rows):
            # each rank says it arrived ("Rank 3 successfully reached monitoredBarrier"): a paste of some of those
            # lines is no list of everyone who did (a coordinator's "ready ranks: 1, 2" is), so nothing is implied
            continue
        top = (ctx.world or 0) - 1 if ctx.world else max(have)
        for m in sorted(set(range(top + 1)) - have):
            out.append({**rows[0], "rank": m, "kind": "missing_rank",
                        "detail": f"not among the ranks listed as ready; {rows[0]['detail'] or ''}"})
    return out


def _speaks_for_itself(row: dict[str, Any]) -> bool:
    m = _BY.search(row["detail"] or "")
    return bool(m) and m.group(1) == str(row["rank"])


def _joined_alone(ctx: Model) -> list[Candidate]:
    """Ranks that each say they reached an op ("Rank 3 successfully reached monitoredBarrier, but received errors
    ... from rank 0"), and nothing about who did not: some rank is missing, and the input does not say which."""
    joined = [r for r in ctx.observations("joined_rank") if r["rank"] is not None]
    if not joined:
        return []
    (op, group, seq), rows = max(_by_statement(joined).items(), key=lambda kv: len(kv[1]))
    waiting = tuple(sorted({r["rank"] for r in rows}))
    name = op or "a collective"
    summary = (f"{ranks_text(waiting)} reached {name} and {'waits' if len(waiting) == 1 else 'wait'} for a rank that "
               "did not; the input does not say which one")
    steps = [f"Read the log of the rank that checks {name} (rank 0 for monitored_barrier): it names the rank that "
             "failed to reach it."]
    return [Candidate("missing_ranks", summary, waiting=waiting,
                      operation=Operation(name=op, group=group, seq=seq) if op else None,
                      findings=[Finding("missing_ranks", summary, waiting, 0.6, _evidence(rows, "reached"))],
                      next_steps=steps)]


def _by_statement(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["name"], r["group"], r["value"]), []).append(r)
    return out


def stated_mismatch(ctx: Model) -> list[Candidate]:
    fps = [r for r in ctx.observations("fingerprint") if r["rank"] is not None]
    culprit_rows = [r for r in ctx.observations("fr_culprit") if r["rank"] is not None]
    fr_mismatch = ctx.observations("fr_mismatch")
    if fps:
        return _from_fingerprints(ctx, fps)
    if culprit_rows or fr_mismatch:
        rows = culprit_rows or fr_mismatch
        culprits = tuple(sorted({r["rank"] for r in culprit_rows}))
        op = next((r["name"] for r in rows if r["name"]), None)
        seq = next((r["value"] for r in rows if r["value"] is not None), None)
        group = next((r["group"] for r in rows if r["group"]), None)
        summary = (f"the Flight Recorder analyzer found a mismatch at {op or 'a collective'}"
                   + (f" (group {group}, seq {seq})" if seq is not None else "")
                   + (f": culprit {ranks_text(culprits)}" if culprits else ""))
        return [Candidate("collective_mismatch", summary, culprits=culprits,
                          operation=Operation(name=op, group=group, seq=seq) if op else None,
                          findings=[Finding("collective_mismatch", summary, culprits, 0.85,
                                            _evidence(rows, "Flight Recorder"))],
                          next_steps=["Make every rank issue the same collective (op, dtype, size) at that position: "
                                      "the culprit's call site is in its Flight Recorder entry."])]
    nccl = ctx.observations("nccl_mismatch")
    if nccl:  # NCCL's own check (<= 2.7): ranks of one communicator called different collectives
        near = sorted({r["value"] for r in nccl if r["value"] is not None})
        summary = ("NCCL found mismatched collectives: the ranks of a communicator did not call the same collectives "
                   "in the same order" + (f" (it points at and around {ranks_text(near)})" if near else ""))
        return [Candidate("collective_mismatch", summary, culprits=(),
                          findings=[Finding("collective_mismatch", summary, (), 0.7, _evidence(nccl, "NCCL"))],
                          next_steps=["Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL and compare each rank's "
                                      "sequence of collectives (op, count, datatype) around the rank NCCL names."])]
    return []


def _from_fingerprints(ctx: Model, fps: list[dict[str, Any]]) -> list[Candidate]:
    # fingerprints at one sequence number from several reports; else the ranks one report compares (its other
    # rank's sequence number is often not the same: "Sequence number: 32vs 0")
    groups: dict[Any, dict[int, dict[str, Any]]] = {}
    for r in fps:
        groups.setdefault(("seq", r["value"]), {})[r["rank"]] = r
    for r in fps:
        groups.setdefault(("stmt", r["file"], r["line"]), {})[r["rank"]] = r
    key = next((k for k in sorted(groups, key=lambda k: (k[0] != "seq", str(k[1:])))
                if len({_sig(r) for r in groups[k].values()}) > 1), None)
    if key is None:
        return _one_side(fps)
    ranks = groups[key]
    seq = key[1] if key[0] == "seq" else max((r["value"] for r in ranks.values() if r["value"]), default=None)
    sigs = Counter(_sig(r) for r in ranks.values())
    (top, n_top), *rest = sigs.most_common()
    if rest and n_top > rest[0][1]:
        culprits = tuple(sorted(r for r, row in ranks.items() if _sig(row) != top))
        majority = tuple(sorted(r for r, row in ranks.items() if _sig(row) == top))
        conf = 0.9
    else:  # two ranks (or a tie): who is "wrong" is not stated; the ranks other than the reporter are named
        reporters = {int(m.group(1)) for row in ranks.values() if (m := re.search(r"\bby=rank(\d+)", row["detail"] or ""))}
        culprits = tuple(sorted(set(ranks) - reporters)) or tuple(sorted(ranks))
        majority = tuple(sorted(set(ranks) - set(culprits)))
        top = _sig(ranks[majority[0]]) if majority else top
        conf = 0.5
    ref = next(row for row in ranks.values() if _sig(row) == top)
    theirs = "; ".join(f"{ranks_text([r])} ran {_sig(ranks[r])}" for r in culprits)
    summary = (f"ranks ran different collectives at seq {seq}: {theirs}"
               + (f", while {ranks_text(majority)} ran {top}" if majority else ""))
    return [Candidate("collective_mismatch", summary, culprits=culprits, waiting=majority,
                      operation=Operation(name=ref["name"], group=ref["group"], seq=seq,
                                          shape=_field(ref, "shape"), dtype=_field(ref, "dtype")),
                      wait_for=tuple(WaitEdge(r, culprits, ref["name"] or "?", ref["group"], seq) for r in majority),
                      findings=[Finding("collective_mismatch", summary, culprits, conf,
                                        _evidence(list(ranks.values()), "fingerprint"))],
                      next_steps=[f"Make {ranks_text(culprits)} issue the same collective as the others at seq {seq}: "
                                  "a rank-dependent branch or a data-dependent shape reaches a different call."])]


def _one_side(fps: list[dict[str, Any]]) -> list[Candidate]:
    """A mismatch report cut before its second fingerprint: torch said the ranks disagree, one side is legible."""
    ref = fps[0]
    summary = (f"torch reports that ranks ran different collectives at seq {ref['value']}: {ranks_text([ref['rank']])} "
               f"ran {_sig(ref)}; what the other rank ran is cut from the input")
    return [Candidate("collective_mismatch", summary, waiting=(),
                      operation=Operation(name=ref["name"], group=ref["group"], seq=ref["value"],
                                          shape=_field(ref, "shape"), dtype=_field(ref, "dtype")),
                      findings=[Finding("collective_mismatch", summary, (ref["rank"],), 0.6,
                                        _evidence(fps, "fingerprint"))],
                      next_steps=["Read the whole error line (it names the other rank and its collective), or rerun "
                                  "with TORCH_DISTRIBUTED_DEBUG=DETAIL: make every rank issue the same collective."])]


def _field(row: dict[str, Any], name: str) -> str | None:
    m = re.search(rf"\b{name}=(\S+)", row["detail"] or "")
    return m.group(1) if m else None


def _sig(row: dict[str, Any]) -> str:
    parts = [row["name"] or "?"]
    for f in ("shape", "dtype"):
        v = _field(row, f)
        if v:
            parts.append(v)
    return " ".join(parts)
