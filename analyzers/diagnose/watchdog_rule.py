"""Verdicts from watchdog timeouts alone (the lines ProcessGroupNCCL prints when a collective times out).

Timeouts say which op each reporting rank waited in, never whether another rank reached it. Two readings are
sound without more evidence:

* a *barrier* timed out (``barrier()``, which NCCL runs as a 1-element all_reduce, or a 1-element all_gather):
  barriers do not hang in the transport, they wait for a rank that never arrived — missing_ranks. When rank 0 is
  not among the ranks that timed out it is the one still busy (rank-0-only work: preprocessing, saving, eval);
* anything else every reporting rank timed out in: stuck in that op, culprits not known from these lines.

Old watchdog lines carry no sequence number and status-only lines carry no op; neither aligns in the wait-for
graph, so they are read here directly.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.diagnose.candidate import Candidate, op_evidence, operation_of, ranks_text
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding, Operation, WaitEdge

__all__ = ["barrier_timeout", "reported_timeouts", "gloo_timeout", "is_barrier_like"]

_TIMEOUT_SOURCES = frozenset({"watchdog", "traceback", "torch_errors", "gloo"})
_OWN_SOURCES = frozenset({"events", "ras"})  # ours are aligned by seq always; RAS counts are seqs too
_ONE = re.compile(r"^\[1\](?:->\[\d+\])?$")


def is_barrier_like(name: str | None, shape: str | None) -> bool:
    """barrier(), or the 1-element all_reduce / all_gather NCCL runs for it (NumelIn=1)."""
    if name in ("barrier", "monitored_barrier"):
        return True
    return name in ("all_reduce", "all_gather", "all_gather_into_tensor") and bool(shape and _ONE.match(shape))


#: a rank's own statement that its NCCL work failed or timed out, with no op named (torch_c10d: a watchdog line cut
#: before its WorkNCCL body, "Some NCCL operations have failed or timed out"): that rank waited too
_STATED_FAILURES = frozenset({"watchdog_timeout", "nccl_work_failed"})


def stated_failures(ctx: Model) -> set[int]:
    return {o["rank"] for o in ctx.observations("exception") if o["name"] in _STATED_FAILURES and o["rank"] is not None}


def _culprits_of_barrier(ctx: Model, reporters: set[int], members: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The rank a barrier waits for: a member that reported no timeout. A rank that says its own NCCL work failed or
    timed out (no op named) reported one too: it is never the missing one."""
    reporters = reporters | stated_failures(ctx)
    if members and len(members) > len(reporters) and ctx.world:
        return tuple(sorted(set(members) - reporters)), "they are the members that reported no timeout"
    if reporters and 0 not in reporters:
        why = ("rank 0 reported no timeout while ranks above it did: the usual rank-0-only work (preprocessing, "
               "saving, evaluation) keeps it from the barrier")
        if 0 in ctx.observed_ranks:
            return (0,), why
        # rank 0 is nowhere in the input: a likely suspect, said as such, never a culprit (no witness)
        return (), why + "; but no input shows rank 0 at all, so it is a suspect, not a finding"
    return (), ""


def barrier_timeout(ctx: Model) -> list[Candidate]:
    out: list[Candidate] = []
    for s in ctx.graph.stuck:
        ops = list(s.ops)
        if not ops or not all((o.source or "") in _TIMEOUT_SOURCES for o in ops):
            continue
        ref = ops[0]
        if not is_barrier_like(ref.name, ref.shape):
            continue
        reporters = {o.rank for o in ops}
        members = ctx.graph.members.get(s.chan, ())
        culprits, why = _culprits_of_barrier(ctx, reporters, members)
        what = "barrier" if ref.name == "barrier" else f"1-element {ref.name} (a barrier)"
        suspect = not culprits and "suspect" in why
        summary = (f"{ranks_text(sorted(reporters))} timed out in a {what} (seq {s.seq}): a barrier waits for a rank "
                   f"that never arrived" + (f"; {ranks_text(culprits)} is the one not reporting it" if culprits else
                                              "; rank 0, which the input never shows, is the likely one" if suspect
                                              else "; the lines do not say which rank that is"))
        also = sorted(stated_failures(ctx) - reporters - set(culprits))
        if also:
            summary += (f"; {ranks_text(also)} also report{'s' if len(also) == 1 else ''} failed or timed-out NCCL "
                        "work")
            reporters = reporters | set(also)
        ev = [op_evidence(o) for o in ops[:12]]
        steps = ["Find the rank that did not reach the barrier: the one whose log shows no timeout, or whose last "
                 "lines show other work (a progress bar, saving, evaluation); dump its stack (py-spy dump --pid)."]
        if culprits == (0,) or suspect:
            steps.insert(0, "Rank 0 is likely busy with work only it does (dataset preprocessing, checkpoint saving, "
                            "evaluation) longer than the process-group timeout: raise the timeout "
                            "(init_process_group(timeout=...)) or move that work before init / onto every rank.")
        out.append(Candidate("missing_ranks", summary, culprits=culprits, waiting=tuple(sorted(reporters)),
                             operation=operation_of(ref, members or None),
                             wait_for=tuple(WaitEdge(r, culprits, ref.name, ref.group, s.seq) for r in sorted(reporters)
                                            if culprits),
                             findings=[Finding("missing_ranks", summary, culprits or tuple(sorted(reporters)),
                                               0.6 if culprits else 0.5, tuple(ev)),
                                       Finding("why", why or "a barrier cannot hang in the transport by itself",
                                               culprits or ((0,) if suspect else ()), 0.5)],
                             next_steps=steps))
    return out[:1]


def reported_timeouts(ctx: Model) -> list[Candidate]:
    """Timeouts the wait-for graph could not align (no sequence number, or a status line without the op)."""
    if ctx.graph.edges or ctx.graph.stuck or ctx.graph.mismatches:
        return []
    ev = ctx.events
    rows: list[dict[str, Any]] = []
    if ev.num_rows:
        foreign = ev.filter(pc.invert(pc.is_in(ev["source"], value_set=pa.array(sorted(_OWN_SOURCES)))))
        t = foreign.filter(pc.equal(foreign["kind"], "enter"))
        # a call its own record shows finished (an FR entry that retired or completed, a kernel with its end: the
        # same file and record as the enter) is not in flight, whatever its neighbours
        ends = foreign.filter(pc.is_in(foreign["kind"], value_set=pa.array(["complete", "exit"]))).select(
            ["file", "line"]).to_pylist()
        done = {(e["file"], e["line"]) for e in ends if e["line"] is not None}
        rows = [r for r in t.to_pylist() if r["category"] in ("collective", "p2p")
                and (r["line"] is None or (r["file"], r["line"]) not in done)]
    status = [o for o in ctx.observations("watchdog_pg_status")
              if "failed_seq=" in (o["detail"] or "") or o["name"] in ("failure", "exception", "timeout")]
    if not rows and not status:
        return []
    if rows:
        names = Counter(r["name"] for r in rows)
        (name, _n), = names.most_common(1)
        mine = [r for r in rows if r["name"] == name]
        ranks = sorted({r["rank"] for r in mine if r["rank"] is not None})
        shape = next((r["shape"] for r in mine if r["shape"]), None)
        seq = next((r["seq"] for r in mine if r["seq"] is not None), None)
        group = next((r["group"] for r in mine if r["group"]), None)
        if len(names) > 1 and seq is not None and len({r["seq"] for r in rows}) == 1:
            return []  # different ops at one position: the mismatch rule's case
        timed_out = any("time" in (r["error"] or "").lower() or r["source"] == "watchdog" for r in mine)
        failed = any(r["error"] and not timed_out for r in mine)
        verb = ("timed out waiting in" if timed_out else "failed in" if failed else "issued, and never completed,")
        evid = tuple(Evidence(r["source"], r["file"], r["line"],
                              f"{r['name']}: {r['error'] or r['detail'] or 'in flight'}"[:220], r["rank"]) for r in mine[:8])
        if is_barrier_like(name, shape):
            culprits, why = _culprits_of_barrier(ctx, set(ranks), ())
            what = name if "barrier" in (name or "") else f"barrier-like {name} (one element, as barrier() runs it)"
            summary = (f"{ranks_text(ranks) if ranks else 'a rank'} timed out in a {what}: a barrier "
                       "waits for a rank that never arrived" + (f"; {ranks_text(culprits)} did not report it"
                                                                if culprits else ""))
            return [Candidate("missing_ranks", summary, culprits=culprits, waiting=tuple(ranks),
                              operation=Operation(name=name, group=group, seq=seq, shape=shape),
                              findings=[Finding("missing_ranks", summary, culprits, 0.5, evid)],
                              next_steps=["Find the rank that did not reach the barrier (its log shows other work)."])]
        summary = (f"{ranks_text(ranks) if ranks else 'the reporting rank'} {verb} "
                   f"{name or 'a collective the input does not name'}"
                   + (f" (seq {seq})" if seq is not None else "")
                   + (": every rank shown issued it and none completed it; these lines do not say whether another "
                      "rank never reached it" if not failed else ": " + next(r["error"] for r in mine if r["error"])[:160]))
        return [Candidate("stuck_in_collective", summary, waiting=tuple(ranks),
                          operation=Operation(name=name, group=group, seq=seq, shape=shape) if name else None,
                          findings=[Finding("stuck_in_collective", summary, tuple(ranks), 0.5, evid)],
                          next_steps=_stuck_steps())]
    failed = Counter(_failed_seq(o) for o in status)
    seq = failed.most_common(1)[0][0]
    ranks = sorted({o["rank"] for o in status if o["rank"] is not None and _failed_seq(o) == seq})
    summary = (f"{ranks_text(ranks) if ranks else 'the reporting rank'} timed out at work {seq} (the op is not in "
               "these lines); each had completed everything before it")
    evid = tuple(Evidence(o["source"] or "watchdog", o["file"], o["line"], o["detail"] or "", o["rank"])
                 for o in status[:8])
    return [Candidate("stuck_in_collective", summary, waiting=tuple(ranks),
                      operation=Operation(name="collective", seq=seq),
                      findings=[Finding("stuck_in_collective", summary, tuple(ranks), 0.4, evid)],
                      next_steps=_stuck_steps())]


def _failed_seq(o: dict[str, Any]) -> int | None:
    m = re.search(r"failed_seq=(-?\d+)", o["detail"] or "")
    return int(m.group(1)) if m else None


def _stuck_steps() -> list[str]:
    return ["Get the other ranks' view: their watchdog lines (a rank with a lower 'last enqueued' never issued the op) "
            "or a py-spy dump of each rank while it hangs.",
            "If every rank is in it: a transport or GPU problem — rerun with NCCL_DEBUG=INFO and try "
            "NCCL_P2P_DISABLE=1 / NCCL_IB_DISABLE=1 to isolate the path."]


def gloo_timeout(ctx: Model) -> list[Candidate]:
    """gloo's "Timed out waiting Nms for recv operation to complete": gloo ops are synchronous send/recv between
    peers, so a timeout means a peer never reached the matching op (a broken link says "Connection closed")."""
    rows = [o for o in ctx.observations("transport_error") if o["name"] == "gloo_timeout"]
    if not rows or ctx.graph.edges or ctx.graph.stuck:
        return []
    ranks = tuple(sorted({o["rank"] for o in rows if o["rank"] is not None}))
    summary = (f"{ranks_text(ranks) if ranks else 'a rank'} timed out in a gloo collective waiting for a peer's "
               "data: a peer never reached the same op (which one, these lines do not say)")
    ev = tuple(Evidence(o["source"] or "log", o["file"], o["line"], (o["detail"] or "")[:200], o["rank"])
               for o in rows[:6])
    return [Candidate("missing_ranks", summary, waiting=ranks,
                      findings=[Finding("missing_ranks", summary, ranks, 0.4, ev)],
                      next_steps=["Find the rank that did not reach the collective: its own log or a stack dump "
                                  "(py-spy dump --pid); with TORCH_DISTRIBUTED_DEBUG=DETAIL, torch names it."])]
