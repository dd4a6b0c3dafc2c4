"""Verdicts from stacks alone (py-spy dumps a user attached to an issue, `trace attach` on a job never traced).

Without op records there is no group or seq, but the stacks still say who sits inside which collective, called
from which line: ranks 0-6 in ``all_reduce`` from ``train_step`` and rank 7 in ``load_batch`` is the same
picture the wait-for graph would give. Used only when no op evidence exists (the graph wins when it has edges).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ranktrace.analyzers.diagnose.candidate import Candidate, from_burst, ranks_text, stack_evidence, where
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.model.comm_frames import op_of_frame
from ranktrace.analyzers.model.hoststate import TRACER_FRAME
from ranktrace.analyzers.model.stacks import normalise_frame
from ranktrace.analyzers.verdict import Finding, Operation, WaitEdge

__all__ = ["stacks_only", "collective_in_stack", "anonymous_stacks", "launcher_join"]

_C10D_FRAME = re.compile(
    r"^(?:\w+\.)?(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|all_to_all\w*|"
    r"send|recv|isend|irecv|gather\w*|scatter\w*|reduce)\s\(.*distributed_c10d\.py:\d+\)")
_NATIVE = re.compile(r"nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv)\b")
_NATIVE_NAMES = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
                 "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv"}


def collective_in_stack(frames: tuple[str, ...]) -> tuple[str, str | None] | None:
    """(op name, the application frame that called it) when a thread sits inside a torch.distributed collective."""
    for i, f in enumerate(frames):
        m = _C10D_FRAME.match(f)
        if m:
            caller = next((normalise_frame(g) for g in frames[i + 1:]
                           if "/torch/" not in g and "c10d_logger" not in g and "ranktrace" not in g
                           and not TRACER_FRAME.search(g)), None)
            return m.group(1), caller
    for f in frames:
        m = _NATIVE.search(f)
        if m:
            return _NATIVE_NAMES[m.group(1)], None
    for f in frames:  # a framework's own communication call (DeepSpeed, TensorRT-LLM, vLLM: model/comm_frames.py)
        op = op_of_frame(f)
        if op:
            return op, None
    return None


def stacks_only(ctx: Model) -> list[Candidate]:
    g = ctx.graph
    if g.edges or g.mismatches or g.stuck or not ctx.stacks:
        return []
    inside = {r: c for r, s in ctx.stacks.items() if (c := collective_in_stack(s.frames)) is not None}
    if not inside:
        return _inside_unnamed(ctx)
    (top, _n), = Counter(name for name, _ in inside.values()).most_common(1)
    waiting = tuple(sorted(r for r, (name, _) in inside.items() if name == top))
    universe = set(ctx.stacks) | (set(range(ctx.world)) if ctx.world else set())
    culprits = tuple(sorted(r for r in universe if r not in waiting and r in ctx.stacks))
    if not culprits:
        return _all_inside(ctx, top, waiting, inside)
    callers = Counter(c for r, (name, c) in inside.items() if name == top and c)
    site = callers.most_common(1)[0][0] if callers else None
    elsewhere = []
    for r in culprits:
        other = inside.get(r)
        elsewhere.append(f"{ranks_text([r])} is in {other[0]} instead" if other else
                         f"{ranks_text([r])} is in {where(ctx.stacks[r]) or 'another place'}")
    summary = (f"{ranks_text(waiting)} {'are' if len(waiting) > 1 else 'is'} inside {top}"
               + (f" (called from {site})" if site else "") + f" and {ranks_text(culprits)} never joined: "
               + "; ".join(elsewhere))
    ev = tuple(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in sorted(universe)
               if r in ctx.stacks)
    steps = [f"See why {ranks_text(culprits)} did not reach {top}" + (f" at {site}" if site else "")
             + ": its stack shows what it does instead (stacks alone carry no group or seq: add Flight Recorder "
               "dumps or run under `trace run` to pin the exact op)."]
    return [Candidate("missing_ranks", summary, culprits=culprits, waiting=waiting,
                      operation=Operation(name=top, callsite=site),
                      wait_for=tuple(WaitEdge(r, culprits, top, None, None) for r in waiting),
                      findings=[Finding("missing_ranks", summary + " (from stacks only)", culprits, 0.6, ev)],
                      next_steps=steps)]


def _inside_unnamed(ctx: Model) -> list[Candidate]:
    """Ranks whose native stacks sit inside the communication library (or wait for the GPU) without a frame that
    names the collective: still a finding about where they are."""
    states = {r: ctx.host_states.get(r) for r in ctx.stacks}
    held = sorted(r for r, st in states.items() if st in ("in_collective", "host_sync_wait"))
    if not held or len(held) < len(states):
        return []
    sync = [r for r in held if states[r] == "host_sync_wait"]
    where_ = sorted({w for w in (where(ctx.stacks[r]) for r in held) if w})
    lib = next((f for r in held for f in ctx.stacks[r].frames if "nccl" in f.lower()), None)
    what = ("waits for the GPU on the host" if len(sync) == len(held) else
            f"is inside the communication library ({lib})" if lib else "is inside a collective")
    summary = (f"{ranks_text(held)} {what.replace('waits', 'wait') if len(held) > 1 else what}; the stack does not "
               "name the collective" + (f" ({', '.join(where_[:2])})" if where_ else ""))
    ev = tuple(stack_evidence(ctx.stacks[r], states[r] or "unknown") for r in held)
    return [Candidate("stuck_in_collective", summary, waiting=tuple(held),
                      findings=[Finding("stuck_in_collective", summary + " (from stacks only)", tuple(held), 0.4, ev)],
                      next_steps=["Dump the Python stacks too (py-spy dump --pid <pid> --native) to see which "
                                  "collective it is, and dump the other ranks: one that is elsewhere is the one "
                                  "they wait for."])]


def _all_inside(ctx: Model, top: str, ranks: tuple[int, ...], inside: dict) -> list[Candidate]:
    """Every rank with a stack sits in the same collective and nothing shows another rank elsewhere: the op is
    stuck (or waits for ranks nobody dumped). Partial evidence is still a finding: who, in what, called from where,
    and which ranks to dump next."""
    callers = Counter(c for r, (name, c) in inside.items() if name == top and c)
    site = callers.most_common(1)[0][0] if callers else None
    unobserved = sorted(set(range(ctx.world)) - set(ranks)) if ctx.world else []
    summary = (f"{ranks_text(ranks)} {'are' if len(ranks) > 1 else 'is'} blocked inside {top}"
               + (f" called from {site}" if site else "")
               + (f"; no evidence from {ranks_text(unobserved)}" if unobserved else
                  ("; no evidence from the other ranks" if not ctx.world or len(ranks) < ctx.world else "")))
    ev = tuple(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in ranks if r in ctx.stacks)
    steps = ["Dump the other ranks the same way (py-spy dump --pid <pid> on every rank, or `trace attach PID`): a rank "
             f"that is not inside {top} is the one the others wait for; if all are inside it, the transport or a "
             "GPU is stuck (NCCL_DEBUG=INFO, NCCL_P2P_DISABLE=1 to isolate P2P)."]
    return [Candidate("stuck_in_collective", summary, culprits=(), waiting=ranks,
                      operation=Operation(name=top, callsite=site),
                      findings=[Finding("stuck_in_collective", summary + " (from stacks only)", ranks, 0.5, ev)],
                      next_steps=steps)]


def anonymous_stacks(ctx: Model) -> list[Candidate]:
    """Stacks of processes whose rank nothing states (a single py-spy / gdb paste): the state of the dumped
    process still says where the job is stuck, without naming ranks."""
    if ctx.stacks or not ctx.anon_stacks or ctx.graph.edges or ctx.graph.stuck or ctx.graph.mismatches:
        return []
    from ranktrace.analyzers.model.hoststate import classify

    anon = ctx.anon_stacks
    if ctx.job.traced and ctx.job.ended and not ctx.job.killed_on_hang:
        # a run that ended by itself: the watchdog's periodic samples show where processes were while they still
        # ran, not a hang; only a burst (taken on silence) can say a process was stuck
        anon = [s for s in anon if from_burst(s.file)]
        if not anon:
            return []
    if _moved_between_dumps(anon) or _steps_moved_between_dumps(ctx, anon) or _left_a_collective(anon):
        return []  # the dumped processes are somewhere else in each dump, or past a step or a call: they make progress
    procs = _one_per_process(anon)
    workers = [s for s in procs if not launcher_join(s.frames) and not _helper(s.frames)]
    if workers:  # a launcher waiting for its workers and multiprocessing's helpers are never the ones waited for
        procs = workers
    states = [(s, classify(s.frames, s.thread_state)) for s in procs]
    inside = [(s, c) for s, _st in states if (c := collective_in_stack(s.frames)) is not None]
    if not inside and states and all((st == "running" and _importing(s.frames)) or launcher_join(s.frames)
                                     for s, st in states) and any(_importing(s.frames) for s, _ in states):
        return []  # processes importing their modules (and a launcher waiting for them): a start-up, not a hang
    n = len(states)
    who = "the dumped process" if n == 1 else f"{n} dumped processes"
    ev = tuple(stack_evidence(s, st) for s, st in states[:8])
    if inside:
        (top, _k), = Counter(c[0] for _s, c in inside).most_common(1)
        site = next((c[1] for _s, c in inside if c[0] == top and c[1]), None)
        others = [s for s, _st in states if collective_in_stack(s.frames) is None]
        if others and len(inside) < n:
            places = sorted({w for w in (where(s) for s in others) if w})
            summary = (f"{len(inside)} of {n} dumped processes are inside {top}" + (f" (from {site})" if site else "")
                       + f"; the others are elsewhere ({', '.join(places[:3]) or 'not in a collective'}): they are the "
                       "ones the first wait for (no ranks are stated in the dumps)")
            return [Candidate("missing_ranks", summary, operation=Operation(name=top, callsite=site),
                              findings=[Finding("missing_ranks", summary, (), 0.5, ev)],
                              next_steps=["Name the ranks of the dumped processes (RANK in /proc/<pid>/environ) to "
                                          "know which rank is missing."])]
        ops = Counter(c[0] for _s, c in inside)
        if len(ops) > 1 and len(inside) == n:  # every dumped process in a collective, not all in the same one
            parts = [f"{k} ({v})" for k, v in ops.most_common()]
            summary = (f"{who} are blocked inside different collectives: {', '.join(parts)}; if they share a process "
                       "group, their calls do not match and none completes (stacks carry no group, and no rank is "
                       "stated in the dumps)")
            return [Candidate("collective_mismatch", summary, operation=Operation(name=top, callsite=site),
                              findings=[Finding("collective_mismatch", summary, (), 0.5, ev)],
                              next_steps=["Compare where each process called its collective (the frames under "
                                          f"{' / '.join(ops)}): the ranks must call the same collective in the "
                                          "same order; name the ranks (RANK in /proc/<pid>/environ) to know whose "
                                          "call differs."])]
        summary = f"{who} {'is' if len(inside) == 1 else 'are'} blocked inside {top}" + (
            f" called from {site}" if site else "") + "; no rank is stated and no other rank was dumped"
        return [Candidate("stuck_in_collective", summary, operation=Operation(name=top, callsite=site),
                          findings=[Finding("stuck_in_collective", summary, (), 0.5, ev)],
                          next_steps=["Dump every rank (py-spy dump --pid on each, or `trace attach PID`): a rank not "
                                      f"inside {top} is the one the others wait for."])]
    sync = [s for s, st in states if st == "host_sync_wait"]
    if sync:
        summary = (f"{who} {'waits' if n == 1 else 'wait'} for the GPU on the host ({where(sync[0]) or 'synchronize'}):"
                   " on NCCL a collective issued before it never completed")
        return [Candidate("stuck_in_collective", summary, findings=[Finding("stuck_in_collective", summary, (), 0.4, ev)],
                          next_steps=["Check GPU utilisation (a spinning NCCL kernel reads 100%) and the NCCL log of "
                                      "the last collective; try NCCL_P2P_DISABLE=1."])]
    blocked = [s for s, st in states if st in ("blocked_other", "idle_loop", "running")]
    if blocked and all(_opaque(where(s)) for s in blocked):
        return []  # only the interpreter's own frames (gdb without Python symbols): nothing says what it waits for
    if blocked and len(blocked) == n:
        places = sorted({w for w in (where(s) for s in blocked) if w})
        doing = "blocked" if all(st != "running" for _s, st in states) else "busy"
        summary = (f"{who} {'is' if n == 1 else 'are'} {doing} outside collectives in "
                   f"{', '.join(places[:3]) or 'a wait'}: no communication is involved in what it waits for")
        return [Candidate("blocked_outside_collective", summary,
                          operation=Operation(name=places[0] if places else "wait"),
                          findings=[Finding("blocked_outside_collective", summary, (), 0.5, ev)],
                          next_steps=["The hang is in the application, not in communication: see what it waits for "
                                      f"({', '.join(places[:3]) or 'the innermost frames'})."])]
    return []


#: frames of the interpreter and its binding layer: a native stack whose innermost telling frame is one of these (gdb
#: without Python symbols) says nothing about what the thread waits for
_INTERPRETER = re.compile(r"^(?:\?\?|_PyEval_\w+|_?PyObject_\w*Call\w*|_PyFunction_\w+|PyEval_\w+|method_vectorcall\w*|"
                          r"cfunction_\w+|pybind11::cpp_function::dispatcher|call_function|function_code_fastcall)\b")


def _opaque(frame: str | None) -> bool:
    return frame is None or bool(_INTERPRETER.match(frame))


def _moved_between_dumps(stacks: list) -> bool:
    """Several dumps of the same processes (py-spy run twice, a few seconds apart): some process is at a different
    place in each and none sits in the same collective in all of them (launchers aside): the job moves on, whatever
    call one dump caught."""
    by_pid: dict[int, list[tuple[str, ...]]] = {}
    for st in stacks:
        if st.pid is not None and not launcher_join(st.frames) and not _helper(st.frames):
            by_pid.setdefault(st.pid, []).append(tuple(st.frames))
    again = [dumps for dumps in by_pid.values() if len(dumps) > 1]
    moved = [d for d in again if len(set(d)) > 1]
    # a process parked in one collective in every dump is what a hang looks like, whatever the others do
    parked = [d for d in again if len(set(d)) == 1 and collective_in_stack(d[0]) is not None]
    return bool(moved) and not parked


def _steps_moved_between_dumps(ctx: Model, stacks: list) -> bool:
    """Several dump files of the same processes whose step counters differ (py-spy --locals shows 'step: 58' in one
    and 'step: 96' in the next): steps were taken between the dumps. A hang shows the same step in every dump."""
    files = {st.file for st in stacks if st.file}
    if len(files) < 2 or not _same_processes(stacks):
        return False
    last: dict[str, tuple[int, float]] = {}
    for o in ctx.observations("progress"):
        if o["file"] in files and o["value"] is not None and o["name"] == "step":
            line = o["line"] or 0
            if o["file"] not in last or line >= last[o["file"]][0]:
                last[o["file"]] = (line, float(o["value"]))
    return len(last) >= 2 and len({v for _l, v in last.values()}) > 1


def _left_a_collective(stacks: list) -> bool:
    """A process inside a collective in one dump and out of it (or in another call) in a later dump of the same
    process: that collective returned, so it was no hang. Or a process outside any collective in one dump and inside
    one in the next: it was still arriving while the dumps were taken, so the job was moving then, and a hang is
    not shown (dumps of a hang, taken once it looked stuck, find every rank where it stays). Dumps are ordered by
    file and line."""
    by_pid: dict[int, list[tuple[str, int, tuple[str, ...]]]] = {}
    for st in stacks:
        if st.pid is not None and not launcher_join(st.frames) and not _helper(st.frames):
            by_pid.setdefault(st.pid, []).append((st.file or "", st.line or 0, tuple(st.frames)))
    for dumps in by_pid.values():
        dumps.sort(key=lambda d: (d[0], d[1]))
        for (_f, _l, a), (_g, _m, b) in zip(dumps, dumps[1:]):
            if collective_in_stack(a) != collective_in_stack(b):
                return True
    return False


def _same_processes(stacks: list) -> bool:
    """Some process appears in more than one dump file."""
    files_of: dict[int, set[str]] = {}
    for st in stacks:
        if st.pid is not None:
            files_of.setdefault(st.pid, set()).add(st.file or "")
    return any(len(f) > 1 for f in files_of.values())


def _helper(frames: tuple[str, ...]) -> bool:
    """multiprocessing's resource tracker and similar helpers: processes of the job that are never ranks."""
    return any("resource_tracker.py" in f or "forkserver.py" in f for f in frames[:6])


def _one_per_process(stacks: list) -> list:
    """One stack per dumped process (py-spy and the in-rank agent both answer a burst): the py-spy one, else the
    first; stacks with no pid are each their own."""
    best: dict[object, Any] = {}
    out = []
    for st in stacks:
        if st.pid is None:
            out.append(st)
            continue
        have = best.get(st.pid)
        if have is None or ((have.source or "") != "pyspy" and (st.source or "") == "pyspy"):
            best[st.pid] = st
    return out + list(best.values())


def _importing(frames: tuple[str, ...]) -> bool:
    """The process is executing a module's import (torch registering its ops, a model package loading)."""
    return any("importlib._bootstrap" in f or "importlib/_bootstrap" in f for f in frames)


def launcher_join(frames: tuple[str, ...]) -> bool:
    """A launcher waiting for its workers: torch.multiprocessing.spawn's join, torchrun's agent monitoring loop."""
    return any("ProcessContext.join" in f or ("join (" in f and "multiprocessing/spawn.py" in f)
               or "_invoke_run" in f for f in frames[:16])
