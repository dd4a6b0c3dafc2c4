"""One arbitration over every rule's candidates: which one is the verdict, by the strength of the evidence behind it.

The rules propose; this step decides, in one place, with the strength table below (also docs/EVIDENCE.md):

1. **Vetoes first.** A candidate that a stronger fact contradicts is set aside, and the fact is kept as a finding:
   - completion: the inputs show the work it calls stuck finished (every rank it names destroyed its communicator
     normally, the nccl-tests run concluded, the training loop said it finished);
   - progress after a dump: a candidate resting only on stacks a person dumped from a job nobody traced, when the job
     then says it finished or its output goes on with progress lines after every dump it rests on;
   - a recording that merely ends mid-flight: launches without a completion that are the very last records of an
     export whose host-side ranges all closed (a trace cut at its end, not a kernel that never ended);
   - hang-time stacks: a candidate built on statements (logs, Flight Recorder) that puts ranks inside a collective
     while their stacks, sampled while the job was silent, show every one of them outside communication;
   - a stop from outside (SIGTERM/SIGINT/SIGHUP/SIGQUIT to the job, from a scheduler, `timeout` or a person; a
     console whose only stop is a launcher's KeyboardInterrupt) with no hang seen before it (for files nobody traced:
     no rule's claim resting on a line before the stop, no stack dumped before it without progress after): what was
     open then was cut by the stop, not shown to hang.
2. **Blame needs a witness.** A culprit must be a rank some input says something about; ranks no input mentions
   are "unobserved" and are taken off the culprit list (the finding says so).
3. **The strongest remaining candidate wins**; between equals, the rules' order (diagnose.RULES) decides.

Rules stay functions of the Model; nothing here reads files.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ranktrace.analyzers.diagnose.candidate import Candidate, from_burst, ranks_text
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding

__all__ = ["STRENGTH", "strength", "Decision", "arbitrate", "DEFAULT_HANG_AFTER_S", "hang_seen_before_stop",
           "stop_point"]

# verdict kinds that tell a hang (a second finding of one of these is a second story)
HANG_KINDS = frozenset({"missing_ranks", "collective_mismatch", "stuck_in_collective", "graph_capture", "init_hang",
                        "rank_exited", "blocked_outside_collective", "wait_cycle"})

# The order of strength of evidence sources, strongest first (docs/EVIDENCE.md is this table in words). Our own
# records of every call and the stacks sampled while the job was silent say what each rank did at the time; a
# communicator's own counters come next; statements a process printed about itself or others come after; a line
# of a log that only shows a call being issued says the least.
STRENGTH: dict[str, int] = {
    "events": 6,        # our own ring records (issue / return / error of every call, in the rank)
    "agent": 6,         # the in-rank agent's stacks at the burst
    "pyspy": 6,         # py-spy stacks (ours at the burst, or a dump a person took while it hung)
    "gdb": 5, "faulthandler": 5,
    "ras": 5,           # NCCL RAS: the communicator's own per-rank op counts
    "fr": 4,            # the Flight Recorder: torch's record of issued / started / completed work
    "nsys": 4, "kineto": 3,
    "watchdog": 3, "torch_c10d": 3, "horovod": 3, "nccl_ras": 3,
    "nccl": 2,          # NCCL debug lines: issue only, never completion
    "traceback": 2, "torch_elastic": 2, "mpi_launcher": 2, "server_log": 2, "progress": 2, "nccl_tests": 2,
    "proc": 2, "ps_top": 1, "gpu": 1, "env_versions": 0, "meta": 0, "input": 0,
}
_DEFAULT_STRENGTH = 2

DEFAULT_HANG_AFTER_S = 60.0  # trace run's default silence threshold: an op open this long before a stop was a hang

# the sources whose presence makes a candidate a statement about itself rather than our own observation
_OWN = frozenset({"events", "agent", "pyspy"})
# host states that put a rank outside any communication (hoststate.classify)
_OUTSIDE = frozenset({"blocked_other", "idle_loop"})
# kinds that claim ranks are inside a collective / p2p call
_IN_COLLECTIVE_KINDS = frozenset({"stuck_in_collective", "missing_ranks", "collective_mismatch", "wait_cycle"})
# job-level completion statements (analyzers.readers: nccl_tests, progress, torch_elastic)
_JOB_DONE = frozenset({"nccl_tests_ok", "training_done", "exit_ok"})


def strength(c: Candidate) -> int:
    """A candidate's strength: the strongest source among the evidence of its own findings."""
    best = -1
    for f in c.findings:
        for e in f.evidence:
            best = max(best, STRENGTH.get(e.source or "", _DEFAULT_STRENGTH))
    return best if best >= 0 else _DEFAULT_STRENGTH


@dataclass
class Decision:
    """The verdict's candidate (or None), and the findings that say what was set aside and why."""

    primary: Candidate | None
    notes: list[Finding]
    stopped_clean: bool = False   # stopped from outside with no hang seen before the stop
    set_aside: tuple[int, ...] = ()  # ids of candidates a veto removed: their findings would contradict the verdict

    def findings(self, candidates: list[Candidate]) -> list[Finding]:
        """The notes, then the findings of the candidates that were not set aside (none after a clean stop).

        One hang is told once: the verdict's own candidate first; another candidate's findings only where they add a
        fact and never contradict it — a rival that blames other ranks than the verdict does is left out, and a
        finding that repeats one already told (same kind, same ranks) is told once."""
        if self.stopped_clean:
            return list(self.notes)
        p = self.primary
        ordered = ([p] if p is not None else []) + [c for c in candidates if c is not p and not (
            p is not None and c.summary == p.summary and c.kind == p.kind)]
        out, told = list(self.notes), set()
        for c in ordered:
            if id(c) in self.set_aside:
                continue
            if p is not None and c is not p and c.primary and c.kind in HANG_KINDS and c.culprits and p.culprits \
                    and not set(c.culprits) & set(p.culprits):
                continue  # a rival story about other ranks: the verdict already chose
            for f in c.findings:
                key = (f.kind, tuple(f.ranks))
                if f.kind in HANG_KINDS and key in told:
                    continue
                told.add(key)
                out.append(f)
        return out


_SERVING_PROGRESS = frozenset({"requests", "batches", "running_requests"})


def serving(ctx: Model) -> bool:
    """The server says it serves (a ready line, a serving phase) or its log shows requests being served, and not that
    a step it runs never finished (SGLang's scheduler watchdog: a batch in flight past its timeout is no idle wait)."""
    if any(o["name"] == "scheduler_watchdog" for o in ctx.observations("server_stall")):
        return False
    return any(p == "serving" for p in ctx.phases.values()) or any(
        o["name"] == "server_ready" for o in ctx.observations("completion")) or any(
        o["name"] in _SERVING_PROGRESS for o in ctx.observations("progress"))


def arbitrate(ctx: Model, candidates: list[Candidate]) -> Decision:
    notes: list[Finding] = []
    aside: list[int] = []
    if serving(ctx):  # after "serving", a rank waiting for requests is idle, not hung
        aside += [id(c) for c in candidates if c.kind == "blocked_outside_collective" and not any(
            ctx.host_states.get(r) in ("stopped", "uninterruptible") for r in c.culprits)]
    live = [c for c in candidates if id(c) not in aside]
    stop = _stop_without_hang(ctx, live)
    if stop is not None:
        if not (ctx.job.traced and ctx.job.interrupted):  # a Ctrl-C has its own finding (diagnose._interrupt_finding)
            notes.append(stop)
        return Decision(None, notes, stopped_clean=True)
    kept: list[tuple[int, int, Candidate]] = []
    for order, c in enumerate(live):
        if not c.primary:
            continue
        veto = (_completion_veto(ctx, c) or _progress_after_dump_veto(ctx, c) or _recording_end_veto(ctx, c)
                or _stacks_veto(ctx, c))
        if veto is not None:
            aside.append(id(c))
            if not any(n.summary == veto.summary for n in notes):
                notes.append(veto)
            continue
        c, note = _witnessed(ctx, c)
        if note is not None:
            notes.append(note)
        kept.append((strength(c), order, c))
    if not kept:
        return Decision(None, notes, set_aside=tuple(aside))
    first = kept[0]
    best = max(kept, key=lambda k: (k[0], -k[1]))
    # A later rule overrides the rules' order only from a clearly stronger tier: our own records or hang-time stacks
    # over statements and logs (a difference of 2 or more); within a tier the order of the rules stands.
    # A candidate that cites no evidence at all keeps its place (a rule reading our own records directly).
    weaker = bool(_sources(first[2])) and first[0] + 2 <= best[0]
    primary = best[2] if weaker and best[0] >= STRENGTH["events"] else first[2]
    return Decision(primary, notes, set_aside=tuple(aside))


def _ranks_of(c: Candidate) -> set[int]:
    return set(c.culprits) | set(c.waiting)


def _sources(c: Candidate) -> set[str]:
    return {e.source or "" for f in c.findings for e in f.evidence}


def _states(c: Candidate) -> list[str]:
    return [e.detail or "" for f in c.findings for e in f.evidence]


def _failed(c: Candidate) -> bool:
    """Its evidence shows an error or a timeout (a watchdog abort, a failed call): not a plain 'in flight'."""
    return any(("failed" in d or "timed out" in d or "timeout" in d.lower() or "error" in d.lower())
               for d in _states(c))


def _completion_veto(ctx: Model, c: Candidate) -> Finding | None:
    """Completion is a veto: finished work is never a hang. Only for inputs that are not our own run (ours know the
    job's exit status and are judged by it)."""
    if ctx.job.traced or c.kind not in ("stuck_in_collective", "missing_ranks"):
        return None
    if _failed(c) or _sources(c) & _OWN:
        return None
    done = ctx.observations("completion")
    job_done = [o for o in done if o["name"] in _JOB_DONE]
    destroyed = {o["rank"] for o in done if o["name"] == "nccl_destroy" and o["rank"] is not None}
    ranks = _ranks_of(c)
    if job_done:
        o = job_done[-1]
        why = f"the job says it finished ({o['name']}: {(o['detail'] or '').strip()[:120]})"
    elif ranks and ranks <= destroyed:
        o = next(x for x in done if x["name"] == "nccl_destroy")
        why = (f"every rank it names ({ranks_text(ranks)}) destroyed its NCCL communicator normally afterwards "
               f"(Destroy COMPLETE)")
    else:
        return None
    return Finding("completed_after", f"not a hang: {c.summary[:160].rstrip('.')} — but {why}", (), 1.0,
                   (Evidence(o["source"] or "log", o["file"], o["line"], (o["detail"] or o["name"] or "")[:200],
                             o["rank"]),))


# sources of a stack a person dumped (py-spy, faulthandler, gdb, a traceback): a look at one moment
_DUMP_SOURCES = frozenset({"pyspy", "faulthandler", "gdb", "traceback"})
_STACK_KINDS = frozenset({"stuck_in_collective", "missing_ranks", "blocked_outside_collective", "collective_mismatch"})


def _progress_after_dump_veto(ctx: Model, c: Candidate) -> Finding | None:
    """Completion and progress after a stack are evidence that the stack was not a hang. A candidate resting only on
    stacks a person dumped from a job nobody traced (no burst of ours: those were taken on silence) is set aside when
    the job then says it finished, or when its own output goes on with progress lines after every dump it rests on.
    Stacks that show a failure are not set aside, and nothing here touches our own records."""
    if ctx.job.traced or c.kind not in _STACK_KINDS or _failed(c):
        return None
    ev = [e for f in c.findings for e in f.evidence]
    if not ev or any((e.source or "") not in _DUMP_SOURCES or from_burst(e.file) for e in ev):
        return None
    done = [o for o in ctx.observations("completion") if o["name"] in _JOB_DONE]
    if done:
        o = done[-1]
        why = f"the job says it finished afterwards ({(o['detail'] or o['name'] or '').strip()[:120]})"
    else:
        last: dict[str, dict] = {}
        for o in ctx.observations("progress"):
            if o["file"] and (o["file"] not in last or (o["line"] or 0) >= (last[o["file"]]["line"] or 0)):
                last[o["file"]] = o
        for f in {r["file"] for r in ctx.inputs.stacks.select(["source", "file"]).to_pylist()
                  if r["source"] in ("pyspy", "gdb")}:
            last.pop(f, None)  # a py-spy / gdb dump holds no program output: its 'step: N' are locals of the dump
        dumps = [(e.file, e.line) for e in ev if e.file]
        if not dumps or not all(f in last and line is not None and (last[f]["line"] or 0) > line
                                for f, line in dumps):
            return None
        o = last[dumps[0][0]]
        why = f"the job's output goes on after the dump ({(o['detail'] or '').strip()[:120]})"
    return Finding("progress_after_dump", f"not a hang: {c.summary[:160].rstrip('.')} — but {why}", (), 0.9,
                   (Evidence(o["source"] or "progress", o["file"], o["line"], (o["detail"] or o["name"] or "")[:200],
                             o["rank"]),))


def _recording_end_veto(ctx: Model, c: Candidate) -> Finding | None:
    """A profiler recording that ends with work in flight, which is what every trace of a running job shows: a Kineto
    trace (written only once its window closed), or an nsys export whose last records are launches without a
    completion while every host-side range in it closed."""
    if ctx.job.traced or c.kind != "stuck_in_collective":
        return None
    srcs = _sources(c)
    if not srcs or not srcs <= {"nsys", "kineto"} or _failed(c) or ctx.open_spans:
        return None
    if srcs == {"kineto"}:
        e = c.findings[0].evidence[0]
        return Finding("recording_ends_in_flight",
                       "not shown to hang: a Kineto (torch.profiler) trace is written when its profiling window "
                       "closes, so the process ran past every call in it; a call whose kernel is not in the trace "
                       "was still in flight when the window closed", (), 0.8, (e,))
    ev = ctx.events
    if ev.num_rows == 0:
        return None
    import pyarrow.compute as pc

    last = pc.max(ev["wall_ns"]).as_py()
    launches = [e for f in c.findings for e in f.evidence if "no completion" in (e.detail or "")]
    walls = ev.filter(pc.and_(pc.equal(ev["kind"], "enter"), pc.equal(ev["state"], "scheduled")))["wall_ns"]
    pending = [w for w in walls.to_pylist() if w is not None]
    if last is None or not pending or min(pending) < last - 50_000_000:  # 50 ms: the very end of the records
        return None
    e = launches[0] if launches else c.findings[0].evidence[0]
    return Finding("recording_ends_in_flight",
                   f"not shown to hang: the recording ends with {len(pending)} launch(es) in flight as its very last "
                   "records, and every host-side range in it closed; a kernel that never ended leaves the recording "
                   "going on without it", (), 0.8, (e,))


def _stacks_veto(ctx: Model, c: Candidate) -> Finding | None:
    """Hang-time stacks outrank statements: a candidate resting on logs or the Flight Recorder that puts ranks inside
    a collective, while stacks sampled at the hang show every one of those ranks outside communication."""
    if c.kind not in _IN_COLLECTIVE_KINDS or _sources(c) & _OWN:
        return None
    inside = set(c.waiting) or set(c.culprits)
    if not inside:
        return None
    live = {r: s for r, s in ctx.stacks.items() if (s.source or "") in ("pyspy", "agent", "gdb")}
    if not inside <= set(live) or not all(ctx.host_states.get(r) in _OUTSIDE for r in inside):
        return None
    r0 = min(inside)
    st = live[r0]
    return Finding("contradicted_by_stacks",
                   f"set aside: {c.summary[:140].rstrip('.')} — the stacks sampled at the hang show "
                   f"{ranks_text(inside)} outside any communication", tuple(sorted(inside)), 0.9,
                   (Evidence(st.source or "pyspy", st.file, st.line, f"rank {r0}: {ctx.host_states.get(r0)}", r0),))


def _witnessed(ctx: Model, c: Candidate) -> tuple[Candidate, Finding | None]:
    """Blame needs a witness: culprits no input says anything about are taken off (they are 'unobserved')."""
    if not c.culprits or not ctx.observed_ranks:
        return c, None
    named = _named_ranks(c) | {r for members in ctx.group_ranks.values() for r in members}  # a stated membership
    keep = tuple(r for r in c.culprits if r in ctx.observed_ranks or r in named)
    if keep == c.culprits:
        return c, None
    dropped = tuple(r for r in c.culprits if r not in keep)
    cited = tuple(e for f in c.findings for e in f.evidence)[:3] or (
        Evidence("meta", None, None, f"no record, stack or line of {ranks_text(dropped)} in any input"),)
    note = Finding("unwitnessed_culprits", f"{ranks_text(dropped)} would be blamed, but no input says anything about "
                   f"{'it' if len(dropped) == 1 else 'them'}: not named as culprit{'s' if len(dropped) > 1 else ''}",
                   dropped, 0.9, cited)
    return replace(c, culprits=keep), note


def _named_ranks(c: Candidate) -> set[int]:
    """Ranks a candidate's own evidence names (a stall inspector's "missing ranks: 1, 5" is a statement about 1, 5)."""
    return set(c.stated) | {e.rank for f in c.findings for e in f.evidence if e.rank is not None}


def hang_seen_before_stop(ctx: Model) -> bool:
    """Before the job was stopped from outside, was a hang already seen? A burst the watchdog (or a person's
    `trace snapshot`) took before the stop, or a call left open since at least the default silence threshold."""
    stop = ctx.job.stopped_ns
    if stop is None:
        return True
    st = ctx.inputs.stacks
    if st.num_rows:
        for f, w in zip(st["file"].to_pylist(), st["wall_ns"].to_pylist()):
            if from_burst(f) and (w is None or w < stop):
                return True
    limit = stop - int(DEFAULT_HANG_AFTER_S * 1e9)
    ops = ctx.ops
    if ops.num_rows:
        import pyarrow.compute as pc

        pend = ops.filter(pc.and_(ops["issued"], pc.invert(pc.fill_null(ops["completed"], False))))
        walls = [w for w in pend["wall_enter"].to_pylist() if w is not None]
        if walls and min(walls) <= limit:
            return True
    return False


# exits and exceptions that a stop itself causes (the launcher's SIGTERM/SIGINT to its workers, Ctrl-C)
_STOP_CONSEQUENCE = ("terminated_by=", "KeyboardInterrupt", "closing signal", "SIGINT", "SIGTERM", "SIGHUP")


def stop_point(ctx: Model) -> tuple[str | None, int] | None:
    """Where files of a job nobody traced show it stopped from outside: (file, line) of the first stop line (a
    launcher's "Received N death signal", Slurm's "CANCELLED AT", a Ctrl-C's first interrupted traceback), or None.
    Errors and exits from that line on are the stop's."""
    if ctx.job.traced:
        return None
    stops = ctx.observations("stopped")
    if stops:
        stop = min(stops, key=lambda o: o["line"] or 0)
        return stop["file"], stop["line"] or 0
    ctrl_c = _ctrl_c_only(ctx)
    return (ctrl_c[0]["file"], ctrl_c[1]) if ctrl_c is not None else None


def _untraced_stop(ctx: Model, candidates: list[Candidate]) -> Finding | None:
    """Files that show the job stopped from outside (a launcher's "Received 2 death signal", Slurm's "CANCELLED
    AT"), with no candidate resting on anything said before that line and no rank failing on its own before it."""
    if ctx.job.traced:
        return None
    stops = ctx.observations("stopped")
    if stops:
        stop = min(stops, key=lambda o: o["line"] or 0)
        f, at = stop["file"], stop["line"] or 0
    else:
        ctrl_c = _ctrl_c_only(ctx)
        if ctrl_c is None:
            return None
        stop, at = ctrl_c
        f = stop["file"]

    def before(file: str | None, line: int | None) -> bool:
        return file != f or line is None or line < at

    for c in candidates:
        if c.primary and c.kind not in ("rank_exited", "blocked_outside_collective") and any(
                before(e.file, e.line) for x in c.findings for e in x.evidence if e.source not in ("meta", "input")):
            return None  # something looked hung before the stop: the stop does not explain it away
    if _stalled_dump_before(ctx, f, at):
        return None  # a stack dumped before the stop with no progress after it: a hang was seen before the stop
    for kind in ("rank_exit", "exception", "transport_error", "py_fatal_error", "watchdog_stuck", "fingerprint"):
        for o in ctx.observations(kind):
            text = f"{o['name'] or ''} {o['detail'] or ''}"
            if kind == "rank_exit" and o["name"] == "exit" and o["value"] == 0:
                continue
            if before(o["file"], o["line"]) and not any(k in text for k in _STOP_CONSEQUENCE):
                return None  # a rank failed on its own before the stop
    what = ("the scheduler cancelled it" if stop["name"] == "scheduler_cancel"
            else "a Ctrl-C: KeyboardInterrupt" if stop["kind"] == "exception"
            else f"its launcher received {_signame(stop['value'])}")
    return Finding("stopped_from_outside",
                   f"the job was stopped from outside ({what}); nothing before the stop shows a hang or a failure, and "
                   "the exits after it are the stop's", (), 1.0,
                   (Evidence(stop["source"] or "log", f, stop["line"], (stop["detail"] or "")[:200]),))


def _ctrl_c_only(ctx: Model) -> tuple[dict, int] | None:
    """A console whose only stop is a Ctrl-C and whose interrupted tracebacks are all a launcher's (torch's spawn join,
    torchrun's agent loop): a launcher waits for its workers whatever they do, so its traceback says nothing about
    them, and the Ctrl-C is what the file shows. A worker or server interrupted in its own code is a stack of that
    process at the interrupt — what people post of a hang — and stays for the rules. Returns the interrupt and the
    first line of the first interrupted traceback (the traceback is the interrupt's, not something seen before it)."""
    from ranktrace.analyzers.diagnose.stacks_rule import launcher_join

    kis = [o for o in ctx.observations("exception") if o["name"] == "KeyboardInterrupt"]
    st = ctx.inputs.stacks
    if not kis or not st.num_rows:
        return None
    first = min(kis, key=lambda o: o["line"] or 0)
    starts = []
    for r in st.select(["source", "thread_name", "thread_state", "frames", "file", "line"]).to_pylist():
        if r["file"] != first["file"] or r["source"] != "traceback" or r["thread_state"] != "interrupted":
            continue
        if not ((r["thread_name"] or "").startswith("launcher") or launcher_join(tuple(r["frames"] or ()))):
            return None
        starts.append(r["line"] or 0)
    if not starts:
        return None
    stop = dict(first, kind="exception", value=2)
    return stop, min(starts)


def _stalled_dump_before(ctx: Model, file: str | None, at: int) -> bool:
    """A stack a person dumped (faulthandler, py-spy, gdb) into the same output before the stop, with no progress line
    between it and the stop: the job sat where the dump shows until it was stopped — a hang seen before the stop."""
    st = ctx.inputs.stacks
    if not st.num_rows or file is None:
        return False
    dumped = [r["line"] for r in st.select(["source", "file", "line"]).to_pylist()
              if r["file"] == file and r["source"] in ("faulthandler", "pyspy", "gdb") and r["line"] is not None
              and r["line"] < at]
    if not dumped:
        return False
    last = max(dumped)
    return not any(o["file"] == file and o["line"] is not None and last < o["line"] < at
                   for o in ctx.observations("progress"))


def _stop_without_hang(ctx: Model, candidates: list[Candidate]) -> Finding | None:
    """A stop from outside with no hang seen before it: no culprit, the stop is the outcome."""
    job = ctx.job
    if not job.traced:
        return _untraced_stop(ctx, candidates)
    if not job.ended or job.killed_on_hang or job.stopped_ns is None:
        return None
    # nothing any rule would call a hang: the stop is the whole story; else it must not have been seen before it
    if any(c.primary for c in candidates) and hang_seen_before_stop(ctx):
        return None
    if set(ctx.rank_exits) - set(ctx.exits_after_stop):
        return None  # a rank ended on its own before the stop: that is what happened, not the stop
    import datetime

    at = datetime.datetime.fromtimestamp(job.stopped_ns / 1e9).strftime("%H:%M:%S")
    sig = job.signal
    return Finding("stopped_from_outside",
                   f"the job was stopped from outside ({_signame(sig)} forwarded at about {at}) while it was making "
                   "progress: no call had been open for long and no hang was reported before the stop, so the calls "
                   "it cut are not a hang", (), 1.0,
                   tuple(Evidence("meta", str(h.host_dir / "meta.json"), None, "exit.stopped_wall_ns")
                         for h in ctx.inputs.hosts[:1]))


def _signame(sig: int | None) -> str:
    import signal as signal_mod

    if not sig:
        return "a signal"
    try:
        return signal_mod.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
