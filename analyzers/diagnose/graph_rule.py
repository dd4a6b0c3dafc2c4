"""graph_capture: a hang while a CUDA graph capture is open, or ranks that disagree about finishing a capture.

Two kinds of evidence: our own events (an open ``graph`` span, ops recorded with ``capturing=true``) and server
logs (SGLang/vLLM "Capture cuda graph begin" without an end, "Registering N cuda graph addresses" on some TP ranks
but not others). Collectives issued during capture are only *recorded* into the graph; a rank that never finishes
capturing leaves its peers waiting in their next real collective.
"""
from __future__ import annotations

import re

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.model.vocabulary import CAPTURE_ERROR, CAPTURE_FAILED
from ranktrace.analyzers.verdict import Evidence, Finding, Operation

__all__ = ["graph_capture"]

BEGIN = "cuda_graph_capture_begin"
END = "cuda_graph_capture_end"
ERROR = "cuda_graph_capture_error"
_CAPTURE_ERROR = re.compile(CAPTURE_ERROR)
_CAPTURE_RAISED = re.compile(f"{CAPTURE_ERROR}|{CAPTURE_FAILED}")  # a framework's "capture failed", any cause


def graph_capture(ctx: Model) -> list[Candidate]:
    # only capture spans: a rank blocked launching CUDAGraph.replay() (also category graph) is not capturing
    from ranktrace.analyzers.diagnose.waiting_rule import exit_marks

    gone = set(exit_marks(ctx))  # a rank that exited inside a capture left its span open: it exited, it is not capturing
    open_caps = {r: s for r, s in ctx.open_by_rank().items()
                 if s.category == "graph" and s.name in ("cuda_graph_capture", "make_graphed_callables")
                 and r not in gone}
    capturing_ops = {s.rank for s in ctx.open_spans if s.capturing and s.rank is not None and s.rank not in gone}
    marks = _capture_marks(ctx)
    failed = _capture_errors(ctx)
    if failed and not open_caps and not capturing_ops:
        return _failed_capture(ctx, failed)
    regs = {o["rank"]: o for o in ctx.observations("graph_registration") if o["rank"] is not None}
    in_capture = set(open_caps) | capturing_ops | {r for r, (b, e) in marks.items() if b and not e}
    if not in_capture and not (regs and marks):
        return []
    if not open_caps and not capturing_ops and ctx.graph.edges:
        return []  # only log lines say "capturing": the ops say who waits for whom (the waiting rule names the phase)
    ranks_all = set(range(ctx.world)) if ctx.world else (set(marks) | set(regs) | in_capture)
    evidence: list[Evidence] = []
    culprits: set[int]
    if regs and marks:
        # server logs: ranks that began capture but never registered / finished
        began = {r for r, (b, _e) in marks.items() if b}
        culprits = (began | ranks_all) - set(regs) if began else set()
        culprits &= (began or ranks_all)
        evidence += [Evidence(o["source"] or "server_log", o["file"], o["line"],
                              f"registered {o['value']} cuda graph addresses", r) for r, o in sorted(regs.items())]
        for r in sorted(culprits):
            b = marks.get(r, (None, None))[0]
            if b is not None:
                evidence.append(Evidence(b["source"] or "server_log", b["file"], b["line"],
                                         "began cuda graph capture, never registered its graph addresses", r))
        values = {o["value"] for o in regs.values()}
        if len(values) > 1:
            evidence.append(Evidence("server_log", None, None, "ranks registered different address counts: "
                                     + ", ".join(f"rank {r}: {o['value']}" for r, o in sorted(regs.items())), None))
    else:
        culprits = set()
    if not culprits:
        culprits = in_capture if in_capture and in_capture != ranks_all else culprits
    if not culprits and not in_capture:
        return []
    for r, s in sorted(open_caps.items()):
        evidence.append(Evidence("events", s.file, s.line, f"graph capture {s.name} (graph {s.graph_id}) opened at "
                                 f"{s.callsite}, never closed", r))
    for r in sorted(culprits):
        if r in ctx.stacks:
            evidence.append(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")))
    waiting = tuple(sorted(ranks_all - culprits)) if culprits else ()
    who = culprits or in_capture
    summary = (f"{ranks_text(who)} never finished CUDA graph capture"
               + (f" while {ranks_text(waiting)} did and wait for {'it' if len(who) == 1 else 'them'}" if waiting else ""))
    steps = ["Relaunch with CUDA graphs off to confirm (SGLang --disable-cuda-graph, vLLM --enforce-eager); if that "
             "runs, the hang is in capture: check collectives issued during capture (custom all-reduce, pynccl) and "
             "that every TP rank captures the same batch sizes.",
             f"Look at {ranks_text(who)}'s stack during capture: a collective or a host sync inside capture never "
             f"returns."]
    return [Candidate("graph_capture", summary, culprits=tuple(sorted(who)), waiting=waiting,
                      operation=Operation(name="cuda_graph_capture", phase="cuda_graph_capture"),
                      findings=[Finding("graph_capture", summary, tuple(sorted(who)), 0.8, tuple(evidence))],
                      next_steps=steps)]


def _capture_marks(ctx: Model) -> dict[int, tuple[dict | None, dict | None]]:
    import pyarrow.compute as pc

    ev = ctx.events
    marks = ev.filter(pc.and_(pc.equal(ev["kind"], "mark"), pc.is_in(ev["name"], value_set=__import__(
        "pyarrow").array([BEGIN, END]))))
    out: dict[int, tuple[dict | None, dict | None]] = {}
    for r in marks.to_pylist():
        if r["rank"] is None:
            continue
        b, e = out.get(r["rank"], (None, None))
        if r["name"] == BEGIN:
            b = r
            e = None if (e is None or (e.get("line") or 0) < (r.get("line") or 0)) else e
        else:
            e = r
        out[r["rank"]] = (b, e)
    return out


def _capture_errors(ctx: Model) -> list[dict]:
    """The CUDA runtime's stream-capture errors (cudaErrorStreamCaptureUnsupported, ...), one row per rank (or one
    with no rank)."""
    import pyarrow.compute as pc

    ev = ctx.events
    rows = ev.filter(pc.and_(pc.equal(ev["kind"], "mark"), pc.equal(ev["name"], ERROR))).to_pylist() \
        if ev.num_rows else []
    # the same error raised in a traceback of any program (torch.cuda.graph capture in a training script)
    rows += [o for o in ctx.observations("exception") if _CAPTURE_RAISED.search(o["detail"] or "")]
    out: dict[object, dict] = {}
    for r in rows:
        out.setdefault(r["rank"], r)
    return list(out.values())


def _failed_capture(ctx: Model, rows: list[dict]) -> list[Candidate]:
    """A CUDA call that capture forbids was made while a stream was capturing: the process raises, inside capture."""
    ranks = tuple(sorted({r["rank"] for r in rows if r["rank"] is not None}))
    who = ranks_text(ranks) if ranks else "a process"
    forbidden = next((r for r in rows if _CAPTURE_ERROR.search(r["detail"] or "")), None)
    summary = (f"{who} failed inside CUDA graph capture: a CUDA call that capture does not allow (a host sync, a "
               f"copy or a collective outside the captured stream) — {(forbidden['detail'] or '')[:160]}"
               if forbidden else f"{who} failed inside CUDA graph capture — {(rows[0]['detail'] or '')[:160]}")
    evidence = tuple(Evidence(r["source"] or "server_log", r["file"], r["line"], (r["detail"] or "")[:200], r["rank"])
                     for r in rows[:8])
    steps = ["Relaunch with CUDA graphs off to confirm (vLLM --enforce-eager, SGLang --disable-cuda-graph); then find "
             "the call inside the captured region that syncs or runs outside the capture stream (the traceback's "
             "innermost frame of the capture), or use a release that fixed it."]
    return [Candidate("graph_capture", summary, culprits=ranks, waiting=(),
                      operation=Operation(name="cuda_graph_capture", phase="cuda_graph_capture"),
                      findings=[Finding("graph_capture", summary, ranks, 0.8, evidence)],
                      next_steps=steps)]
