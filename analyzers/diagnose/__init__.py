"""Diagnose: rules -> findings -> one verdict. The ordered rule list below *is* the priority; the job's status
(hang / crashed / completed / idle / inconclusive) is decided apart from the kind, from what the job itself did."""
from __future__ import annotations

import re
from collections import Counter
from typing import Callable

import pyarrow.compute as pc

from ranktrace.analyzers.model import blocked
from ranktrace.analyzers.model import hosts as hosts_mod
from ranktrace.analyzers.model import hoststate
from ranktrace.analyzers.model import stacks as stacks_mod
from ranktrace.analyzers import arbitrate as arbitration
from ranktrace.analyzers.diagnose.blocked_rule import blocked_outside
from ranktrace.analyzers.diagnose.candidate import Candidate, op_evidence, ranks_text, stack_evidence
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.diagnose.graph_rule import graph_capture
from ranktrace.analyzers.diagnose.host_wait_rule import cannot_run, lock_wait
from ranktrace.analyzers.diagnose.init_rule import init_hang, nccl_init_hang
from ranktrace.analyzers.diagnose.failure_rule import init_failure, rank_exit, vanished_first
from ranktrace.analyzers.diagnose.stacks_rule import anonymous_stacks, stacks_only
from ranktrace.analyzers.diagnose.serving_rule import enqueued_then_sync, setup_step
from ranktrace.analyzers.diagnose.startup_rule import startup_stall
from ranktrace.analyzers.diagnose.statement_rule import stated_mismatch, stated_missing
from ranktrace.analyzers.diagnose.watchdog_rule import barrier_timeout, gloo_timeout, reported_timeouts
from ranktrace.analyzers.diagnose.waiting_rule import mismatch, stuck, waiting
from ranktrace.analyzers.model.records import Inputs
from ranktrace.analyzers.verdict import Evidence, Finding, HostSummary, InputSummary, RankState, Verdict

__all__ = ["RULES", "Rule", "diagnose"]

Rule = Callable[[Model], list[Candidate]]
RULES: list[Rule] = [init_hang, nccl_init_hang, enqueued_then_sync, setup_step, graph_capture, mismatch, stated_mismatch, stated_missing, waiting, cannot_run,
                     init_failure, rank_exit, vanished_first, barrier_timeout, stuck, reported_timeouts, gloo_timeout, lock_wait, stacks_only, anonymous_stacks,
                     blocked_outside, startup_stall]


def diagnose(ctx: Model) -> Verdict:
    """One verdict from the built model (``model.build.build_model``): the first primary candidate, every rule's findings."""
    inputs = ctx.inputs
    candidates: list[Candidate] = []
    for rule in RULES:
        candidates.extend(rule(ctx))
    decision = arbitration.arbitrate(ctx, candidates)
    primary = decision.primary
    job = ctx.job
    if job.traced and job.ended and job.exit_code == 0 and not job.signal and not job.killed_on_hang:
        primary = None  # a job that exited 0 did not hang; ops "in flight" at exit are NCCL/async bookkeeping
    cut = _cut_finding(ctx, primary)
    if cut is not None and not (primary is not None and _reported_live(ctx)):
        primary = None  # a trace cut by killing trace run shows what was open then, never that it hung
    findings: list[Finding] = decision.findings(candidates)
    if primary is None and job.traced and job.ended and job.exit_code == 0 and not job.signal:
        findings = _resolved_stalls(ctx, findings)
    if cut is not None:
        findings.insert(0, cut)
    if job.traced and job.ended and job.interrupted:
        findings.insert(0, _interrupt_finding(ctx))
    findings.extend(_input_findings(inputs))
    findings.extend(_unknown_findings(ctx))
    findings.extend(_job_state_findings(ctx))
    findings.extend(_inferred_rank_findings(ctx))
    findings.extend(_disagreement_findings(ctx))
    status = _stopped_status(ctx) if decision.stopped_clean else _status(ctx, primary)
    world = ctx.world
    unobserved = tuple(sorted(set(range(world)) - ctx.observed_ranks)) if world else ()
    if primary is None:
        kind, summary, steps = _no_primary(ctx, status)
        building = next((f for f in findings if f.kind == "lock_held_by_build"), None)
        if building is not None and kind == "unknown" and status not in ("crashed", "stopped", "interrupted"):
            # the ranks wait on a lock a live compiler holds: said as the progress it is, not as "no evidence"
            kind, summary, steps = "no_hang", _sentence(building.summary), []
        verdict_args = dict(kind=kind, summary=summary, next_steps=tuple(steps))
    else:
        verdict_args = dict(kind=primary.kind, summary=_placed(_sentence(primary.summary), primary.culprits, ctx),
                            operation=primary.operation,
                            culprit_ranks=primary.culprits, waiting_ranks=primary.waiting,
                            wait_for=primary.wait_for, next_steps=tuple(primary.next_steps))
    if unobserved:
        findings.append(Finding("unobserved_ranks", f"no evidence at all from {ranks_text(unobserved)} "
                                f"(world size {world})", unobserved, 1.0,
                                (Evidence("meta", None, None, f"world size {world}"),)))
    rank_space = "global"
    rs_obs = ctx.observations("rank_space")
    if rs_obs and not ctx.inputs.has_ranktrace and all((o["detail"] or "").startswith("comm:") for o in rs_obs) \
            and len({o["detail"] for o in rs_obs}) == 1 and not ctx.world:
        rank_space = rs_obs[0]["detail"]
    return Verdict(
        status=status, unobserved_ranks=unobserved, rank_space=rank_space, findings=tuple(findings),
        ranks=_rank_table(ctx, primary.culprits + primary.waiting if primary is not None else ()), world_size=world, stack_tree=_stack_tree(ctx), phases=tuple(ctx.ledger),
        inputs=tuple(sorted({str(h.host_dir) for h in inputs.hosts} | set(inputs.formats))),
        input_reads=tuple(InputSummary(r.file, r.recognised, r.ranks, r.lines_used, r.lines_total, r.note)
                          for r in inputs.reads),
        hosts=_hosts(ctx),
        **verdict_args,  # type: ignore[arg-type]
    )


def _resolved_stalls(ctx: Model, findings: list[Finding]) -> list[Finding]:
    """A run that exited 0 after the watchdog caught a silence (a rank asleep in a checkpoint write while the others
    waited in a barrier): what the burst showed is told once, as a stall that resolved, never as a hang finding
    beside a COMPLETED headline."""
    stalls = [f for f in findings if f.kind in arbitration.HANG_KINDS]
    if not stalls:
        return findings
    first = stalls[0]
    when = ""
    live = next((v for h in ctx.inputs.hosts if isinstance(v := (h.meta or {}).get("hang_reported"), dict)), None)
    if live and live.get("wall_ns"):
        import datetime

        when = " at " + datetime.datetime.fromtimestamp(int(live["wall_ns"]) / 1e9).strftime("%H:%M:%S")
    told = Finding("stall_resolved", f"a stall the watchdog caught{when} resolved and the job went on to exit 0 (what it "
                   f"showed then: {first.summary})", first.ranks, min(first.confidence, 0.5), first.evidence)
    return [told] + [f for f in findings if f.kind not in arbitration.HANG_KINDS]


def _stopped_status(ctx: Model) -> str:
    """A clean stop from outside: `interrupted` for a SIGINT (a Ctrl-C), `stopped` for any other signal or a
    scheduler's cancel."""
    if ctx.job.traced:
        return "interrupted" if ctx.job.interrupted else "stopped"
    sigs = {o["value"] for o in ctx.observations("stopped")}
    if not sigs and any(o["name"] == "KeyboardInterrupt" for o in ctx.observations("exception")):
        return "interrupted"  # a console whose only stop is a Ctrl-C (arbitrate._ctrl_c_only)
    return "interrupted" if sigs == {2} else "stopped"


def _placed(summary: str, culprits: tuple[int, ...], ctx: Model) -> str:
    """A run across hosts: the sentence says where the culprits ran ("Culprit: rank 37 on node-4.")."""
    where = hosts_mod.where_text(culprits, ctx.rank_hosts) if ctx.rank_hosts and culprits else ""
    return f"{summary} Culprit{'s' if len(culprits) > 1 else ''}: {where}." if where else summary


def _hosts(ctx: Model) -> tuple[HostSummary, ...]:
    """Each host of a run across hosts, its ranks and its clock (analyzers.clocks); () for one host. Directories of
    one machine (Slurm tasks) are one host: its clock is its best-aligned directory's (the reference, else the smallest
    error bound)."""
    if not ctx.rank_hosts:
        return ()
    names = hosts_mod.display_names(ctx.inputs.hosts)
    dirs: dict[str, list[str]] = {}
    for dir_name, shown in names.items():
        dirs.setdefault(shown, []).append(dir_name)
    out = []
    for shown, dir_names in dirs.items():
        ranks = tuple(sorted(r for r, h in ctx.rank_hosts.items() if h == shown))
        clocks = [ctx.host_clocks[d] for d in dir_names if d in ctx.host_clocks]
        c = min(clocks, key=lambda x: (x.basis != "reference", x.error_ns is None, x.error_ns or 0), default=None)
        out.append(HostSummary(shown, ranks, None if c is None else c.offset_ns, None if c is None else c.error_ns,
                               "none" if c is None else c.basis, 0 if c is None else c.ops))
    return tuple(sorted(out, key=lambda h: (h.ranks[0] if h.ranks else 1 << 30, h.host)))


def _sentence(s: str) -> str:
    s = s.strip()
    return (s[0].upper() + s[1:] + ("" if s.endswith(".") else ".")) if s else s




def _status(ctx: Model, primary: Candidate | None) -> str:
    job = ctx.job
    if job.traced and job.state in ("cut", "gone"):
        # a hang the watchdog reported live before trace run was lost stays the hang; anything else is a cut trace
        return "hang" if primary is not None and job.state == "cut" and _reported_live(ctx) else "inconclusive"
    if job.traced and job.ended:
        if job.killed_on_hang:
            return "hang" if primary is not None else "inconclusive"
        if job.interrupted:
            return "interrupted"  # a person's (or a scheduler's) SIGINT ended it: its own outcome, never a crash
        if job.exit_code == 0 and primary is None:
            return "completed"
        return "crashed" if (job.exit_code or job.signal) else ("hang" if primary else "completed")
    if not job.traced and (ctx.observations("watchdog_pg_status") or _watchdog_timeouts(ctx) or _crash_shown(ctx)):
        return "crashed"
    if primary is not None:
        return "hang"
    if arbitration.serving(ctx):
        return "idle"
    if not job.traced and _finished(ctx):
        return "completed"
    return "inconclusive"


def _crash_shown(ctx: Model) -> bool:
    """The inputs show a rank ending in an error (an exception other than a person's Ctrl-C, a fatal signal, a
    transport or NCCL error, an exit status other than 0): the job crashed, whatever else is known. Errors and exits
    the files show after the job was stopped from outside (arbitrate.stop_point) are the stop's, not a crash."""
    stop = arbitration.stop_point(ctx)

    def mine(o: dict) -> bool:  # not a consequence of the stop
        return stop is None or o["file"] != stop[0] or o["line"] is None or o["line"] < stop[1]

    obs = {k: [o for o in ctx.observations(k) if mine(o)] for k in (
        "rank_exit", "exception", "init_failure", "transport_error", "py_fatal_error", "watchdog_stuck", "fingerprint")}
    if any(not (o["name"] == "exit" and o["value"] == 0) for o in obs["rank_exit"]):
        return True
    if any(o["name"] not in ("KeyboardInterrupt", None) for o in obs["exception"]):
        return True
    st = ctx.inputs.stacks
    if st.num_rows and any(r["thread_state"] == "exception" and mine(r)
                           for r in st.select(["thread_state", "file", "line"]).to_pylist()):
        return True  # a traceback was printed: an exception ended that process, even if the paste cuts its line
    if any(not _STILL_TRYING.search(o["detail"] or "") for o in obs["init_failure"]):
        return True  # a set-up timeout is raised (DistStoreError, DistNetworkError, RuntimeError)
    if any(mine(o) for o in _step_watchdog_kills(ctx)):
        return True  # SGLang's scheduler watchdog ends the server after it reports a step that never finished
    return bool(obs["transport_error"] or obs["py_fatal_error"] or obs["watchdog_stuck"] or obs["fingerprint"])


def _step_watchdog_kills(ctx: Model) -> list[dict]:
    """SGLang's scheduler watchdog reports (server_log's server_stall "scheduler_watchdog"): a forward batch still
    running after --watchdog-timeout seconds. Unless it is the soft watchdog (``self.soft=True``: it only logs), the
    scheduler then dumps its stacks and sends SIGQUIT to the server (python/sglang/srt/managers/scheduler.py,
    watchdog_thread, 0.4 on; "Watchdog timeout (self.watchdog_timeout=300)" before 0.5, "Scheduler watchdog timeout
    (self.watchdog_timeout=300, self.soft=False)" after): the server ended itself."""
    return [o for o in ctx.observations("server_stall") if o["name"] == "scheduler_watchdog"
            and "soft=True" not in (o["detail"] or "")]


_STILL_TRYING = re.compile(r"still waiting|retrying|^Waiting", re.IGNORECASE)


def _first_error(ctx: Model) -> str | None:
    for kind in ("rank_exit", "exception", "transport_error", "py_fatal_error", "watchdog_stuck"):
        for o in ctx.observations(kind):
            text = (o["detail"] or o["name"] or "").strip()
            if text:
                who = f"rank {o['rank']}: " if o["rank"] is not None else ""
                return who + text[:200]
    return None


def _finished(ctx: Model) -> bool:
    """The inputs say the job (or every communicator it shows) finished normally."""
    return any(o["name"] != "server_ready" for o in ctx.observations("completion"))


def _watchdog_timeouts(ctx: Model) -> bool:
    ev = ctx.events
    if ev.num_rows == 0:
        return False
    import pyarrow.compute as pc

    return bool(pc.any(pc.equal(ev["source"], "watchdog")).as_py())


def _recorded_nothing(ctx: Model) -> bool:
    """A run of ours in which no process of the job wrote a record: no ring, no rank, no stack."""
    ev = ctx.events
    ours = ev.num_rows and bool(pc.any(pc.equal(ev["source"], "events")).as_py())
    pids = any((h.meta or {}).get("pids") for h in ctx.inputs.hosts)
    return not ours and not pids and not ctx.rank_pids and ctx.inputs.stacks.num_rows == 0


def _rings_lost(ctx: Model) -> tuple[int, int]:
    """(rings made and then lost, of them cut to 0 bytes): the job was traced, its records are gone (trace run's
    finalize names each such ring in meta.json)."""
    lost = cut = 0
    for h in ctx.inputs.hosts:
        problems = (h.meta or {}).get("finalize_problems") or []
        for p in [problems] if isinstance(problems, str) else problems:
            lost += str(p).count(".ring:")
            cut += str(p).count("a ring cut to 0 bytes")
    return lost, cut


def _no_primary(ctx: Model, status: str) -> tuple[str, str, list[str]]:
    job = ctx.job
    lost, cut = _rings_lost(ctx) if status == "completed" and job.traced else (0, 0)
    if lost and _recorded_nothing(ctx):
        how = (f", {cut} of them cut to 0 bytes by another process while the job ran" if cut < lost else
               ", cut to 0 bytes by another process while the job ran") if cut else ""
        return ("no_hang", f"The job exited with status 0; it was traced, but its records were lost ({lost} "
                f"ring{'s' if lost != 1 else ''} unreadable{how}): nothing is known about its collectives.",
                ["Keep cleanup scripts and log rotation (copytruncate) away from the run folder's rings/ while a job "
                 "runs."] if cut else [])
    if status == "completed" and job.traced and _recorded_nothing(ctx):
        why = next((str(u) for h in ctx.inputs.hosts if (u := (h.meta or {}).get("untraced"))), None)
        return ("no_hang", "The job exited with status 0, but no process of it was traced"
                + (f" ({why.split(', so ranktrace')[0]})" if why else " (ranktrace never loaded into it)")
                + ": nothing is known about its collectives.",
                ["Run it again without the option that keeps ranktrace out." if why else
                 "Check that the job's Python reads PYTHONPATH (no -I / -E / -S, no wrapper that clears the "
                 "environment): ranktrace enters through it."])
    if status == "completed" and ctx.ops.num_rows == 0:
        return "no_hang", "The job completed, as its inputs say; they record no collective, and none is pending.", []
    if status == "completed":
        return "no_hang", "The job completed: every collective that was issued completed.", []
    if status == "interrupted":
        return ("no_hang", "The job was interrupted (SIGINT) while nothing was pending: no hang was seen before it.",
                [])
    if status == "stopped" and not job.traced:
        return ("no_hang", "The job was stopped from outside (a signal to its launcher, a scheduler's cancel); "
                "nothing before the stop shows a hang or a failure, so nobody is blamed.", [])
    if status == "stopped":
        if arbitration.serving(ctx):
            return ("no_hang", "The server was serving when it was stopped from outside (a scheduler, `timeout`, a "
                    "person): no hang was seen before the stop, so nobody is blamed.", [])
        return ("no_hang", "The job was stopped from outside (a scheduler, `timeout`, a person) while it was making "
                "progress: no hang was seen before the stop, so nobody is blamed.", [])
    if job.traced and job.state == "cut":
        return ("unknown", "The trace is incomplete: trace run was killed before the job ended, and its guardian "
                "ended the job; calls open at that moment were cut off, not shown to hang.",
                ["If the job was hung when trace run was killed, run it again under trace run (with --hang-after) or "
                 "`trace attach PID` while it hangs."])
    if status == "idle":
        return "no_hang", "The job is serving and idle: ranks wait for requests, nothing is pending.", []
    if status == "crashed" and not job.traced and (kills := _step_watchdog_kills(ctx)):
        ranks = sorted({o["rank"] for o in kills if o["rank"] is not None})
        secs = max((o["value"] for o in kills if o["value"] is not None), default=None)
        who = f"on {ranks_text(ranks)} " if ranks else ""
        return ("unknown", f"SGLang's scheduler watchdog {who}found its forward batch still running after "
                f"{secs if secs is not None else '--watchdog-timeout'} s (a step that hung: a kernel or a collective "
                "inside it) and ended the server; nothing in the inputs says which collective or rank the step "
                "waited for.",
                ["Read the scheduler's own dump just after the watchdog line (py-spy stacks of every scheduler, the "
                 "batch it ran): a rank outside the forward, or one in a different collective, is the culprit.",
                 "If py-spy is missing there (\"py-spy: command not found\"), install it in the server's environment, "
                 "or run the server under `trace run`, which takes every rank's stack when the job goes silent."])
    if status == "crashed" and not job.traced:
        what = _first_error(ctx)
        return ("unknown", f"A rank failed{': ' + what if what else ''}; nothing shows which collective or rank the "
                "others were waiting for.",
                ["Read the first error of each rank (its stderr / log): the earliest one is the cause, later ones "
                 "(timeouts, aborted communicators) are consequences."])
    if status == "completed" and not job.traced:
        return "no_hang", "The inputs show the job finishing normally; nothing in them is left pending.", []
    if status == "crashed":
        code = f"signal {job.signal}" if job.signal else f"status {job.exit_code}"
        what = _first_error(ctx)
        return ("unknown", f"The job ended with {code}" + (f" after its own error ({what})" if what else "")
                + "; no collective was left pending, so this is a crash, not a hang.",
                ["Read the job's first exception" + (" (above)" if what else " or signal in its stderr")
                 + ": later errors are consequences of it."])
    if job.traced and job.state == "gone":
        return ("unknown", "The run has no exit status and none of its processes is alive here: the trace is "
                "incomplete (trace run was killed with its job).", [])
    unknown = " (job state unknown: no exit status, and nobody looked at its processes)" if (
        job.traced and job.state == "unknown") else ""
    return ("unknown", f"Nothing pending and no stacks that show a blocked rank: not enough evidence for a "
            f"verdict{unknown}.",
            ["Capture stacks while it is hung (`trace attach PID`, or py-spy dump) and analyze again."])


def _rank_table(ctx: Model, named: tuple[int, ...] = ()) -> dict[int, RankState]:
    """Every rank the inputs show, the world's, and every rank the verdict names (a culprit a stall inspector states
    has a row, marked, even where no line of its own was posted)."""
    ranks = set(ctx.observed_ranks) | (set(range(ctx.world)) if ctx.world else set()) | set(named)
    opens = ctx.open_by_rank()
    from ranktrace.analyzers.model.timeline import last_issued

    last_ops = {r: f"{op['name']} group={op['group']} seq={op['seq']}" for r, op in last_issued(ctx.ops).items()}
    out: dict[int, RankState] = {}
    blocked_on = blocked.blocked_states(ctx)
    for r in sorted(ranks):
        o = opens.get(r)
        state = ctx.host_states.get(r)
        if state is None:
            if o is not None and o.category in ("collective", "p2p"):
                state = "in_collective"
            elif ctx.job.traced and ctx.job.ended:
                state = "exited"
            elif ctx.job.traced and ctx.job.liveness_known and ctx.rank_pids.get(r) and not any(
                    p in ctx.job.live_pids for p in ctx.rank_pids[r]):
                state = "exited"
            else:
                state = "unknown"
        st = ctx.stacks.get(r)
        cur = ctx.current.get(r)
        ended = ctx.rank_exits.get(r)
        if ended is not None and r not in ctx.exits_after_stop:
            state = "exited"  # its own process recorded its exit: no older sample or open call says otherwise
        exit_text = ended
        if exit_text is None and ctx.job.traced and (state == "exited" or ctx.job.ended):
            exit_text = "no exit record: ended by a signal (its launcher tearing the job down, SIGKILL, a crash)"
        out[r] = RankState(
            state=state, phase=ctx.phases.get(r), phase_detail=cur.detail if cur else None,
            phase_seconds=round(cur.seconds, 3) if cur and cur.seconds is not None else None, roles=ctx.roles.get(r),
            exit=exit_text,
            innermost_open=(f"{o.name}" + (f" group={o.group} seq={o.seq}" if o.seq is not None else "")) if o else None,
            stack=tuple(stacks_mod.normalise_frame(f) for f in (hoststate.without_tracer(st.frames)[:12] if st else ())),
            last_op=last_ops.get(r), pids=ctx.rank_pids.get(r, ()), where=_where(st), host=ctx.rank_hosts.get(r),
            blocked=blocked_on[r].state if r in blocked_on and state != "exited" else None,
            blocked_detail=blocked_on[r].text() if r in blocked_on and state != "exited" else None,
        )
    return out


def _where(st: "hoststate.RankStack | None") -> str | None:
    if st is None or not st.frames:
        return None
    app = hoststate.application_frame(st.frames)
    return stacks_mod.normalise_frame(app) if app else None


def _stack_tree(ctx: Model) -> str:
    if not ctx.stacks:
        return ""
    shown = {r: hoststate.without_tracer(s.frames) for r, s in ctx.stacks.items()}
    tree = stacks_mod.render(stacks_mod.merge(shown))
    if any(len(shown[r]) < len(s.frames) for r, s in ctx.stacks.items()):
        tree += "\n(ranktrace's own wrapper frames are left out here; the stack dumps keep them)"
    return tree


def _unknown_findings(ctx: Model) -> list[Finding]:
    """Ranks the wait-for graph could not place because their ring wrapped past the channel (never blamed)."""
    by_rank: dict[int, list] = {}
    for u in ctx.graph.unknown:
        by_rank.setdefault(u.rank, []).append(u.op)
    out = []
    for rank, ops in sorted(by_rank.items()):
        o = ops[0]
        waiters = sorted({x.rank for x in ops})
        out.append(Finding(
            "ring_wrapped", f"rank {rank}'s ring wrapped and holds no record of group {o.group}: whether it issued "
            f"{o.name} seq {o.seq} ({ranks_text(waiters)} {'waits' if len(waiters) == 1 else 'wait'} in it) is unknown, "
            "so it is not blamed for it",
            (rank,), 0.5, tuple(op_evidence(x) for x in ops[:3])))
    return out


def _reported_live(ctx: Model) -> bool:
    """The watchdog reported a hang (meta.json hang_reported) before trace run was lost: the cut came after the
    hang, so what was open is the hang it saw, not an artefact of the cut."""
    lost = ctx.job.lost_ns
    for h in ctx.inputs.hosts:
        said = (h.meta or {}).get("hang_reported")
        if isinstance(said, dict) and isinstance(said.get("wall_ns"), int) and (lost is None or said["wall_ns"] <= lost):
            return True
    return False


def _cut_finding(ctx: Model, primary: Candidate | None) -> Finding | None:
    """trace run was killed (its guardian ended the job: state cut) or vanished with its job (gone): the rings stop
    there, and what they show open was cut off, not hung. The finding names it, and what was open."""
    job = ctx.job
    if not job.traced or job.state not in ("cut", "gone"):
        return None
    when = ""
    if job.lost_ns:
        import datetime

        when = " at " + datetime.datetime.fromtimestamp(job.lost_ns / 1e9).strftime("%H:%M:%S")
    how = ("trace run was killed" + when + " before the job ended; its guardian ended the job"
           if job.state == "cut" else "the run has no exit status and none of its processes is alive")
    opened = ""
    if primary is not None and _reported_live(ctx):
        opened = "; the watchdog had reported the hang below before that, live"
    elif primary is not None:
        opened = f"; open at the cut (not shown to hang): {primary.summary}"
    ev = tuple(Evidence("meta", str(h.host_dir / "meta.json"), None,
                        "launcher_lost" if (h.meta or {}).get("launcher_lost") else "no exit status")
               for h in ctx.inputs.hosts if not h.ended)[:3]
    return Finding("trace_incomplete", f"the trace is incomplete: {how}{opened}",
                   primary.culprits if primary is not None else (), 1.0, ev)


def _interrupt_finding(ctx: Model) -> Finding:
    import datetime

    t = ctx.job.interrupted_ns or 0
    at = datetime.datetime.fromtimestamp(t / 1e9).strftime("%H:%M:%S") if t else "?"
    return Finding("interrupted", f"the job was interrupted: trace run received SIGINT (a Ctrl-C, or a scheduler) at "
                   f"{at} and forwarded it; exits and errors after it are the interrupt's, not a crash", (), 1.0,
                   tuple(Evidence("meta", str(h.host_dir / "meta.json"), None, "exit.interrupted")
                         for h in ctx.inputs.hosts[:1]))


_INSIDE = frozenset({"in_collective", "in_init", "host_sync_wait"})
_OUTSIDE = frozenset({"blocked_other", "idle_loop", "running"})


def _disagreement_findings(ctx: Model) -> list[Finding]:
    """Two posted files that disagree about one rank (one shows it inside a collective, the other outside any
    communication) are said to disagree, naming both, rather than one silently winning. Our own run's samples and
    bursts are one record over time, not witnesses against each other: only files that are not our own are compared."""
    st = ctx.inputs.stacks
    if st.num_rows == 0 or ctx.job.traced:
        return []
    import pyarrow.compute as pc

    ranked = st.filter(pc.is_valid(st["rank"]))
    files = sorted({f for f in ranked["file"].to_pylist() if f})
    if len(files) < 2:
        return []
    seen: dict[int, list[tuple[str, "hoststate.RankStack", str]]] = {}
    for f in files:
        for r, s in hoststate.latest_stacks(ranked.filter(pc.equal(ranked["file"], f))).items():
            seen.setdefault(r, []).append((f, s, hoststate.classify(s.frames, s.thread_state)))
    out = []
    for r, views in sorted(seen.items()):
        inside = [v for v in views if v[2] in _INSIDE]
        outside = [v for v in views if v[2] in _OUTSIDE]
        if not inside or not outside:
            continue
        a, b = inside[0], outside[0]
        out.append(Finding("inputs_disagree", f"the inputs disagree about rank {r}: {a[0]} shows it {a[2]} in "
                           f"{_where(a[1]) or 'a collective'}, {b[0]} shows it {b[2]} in {_where(b[1]) or 'other code'}"
                           " (dumps of different moments, or of different processes given the same rank)", (r,), 0.5,
                           (stack_evidence(a[1], a[2]), stack_evidence(b[1], b[2]))))
    return out[:4]


def _inferred_rank_findings(ctx: Model) -> list[Finding]:
    """`trace attach` read no RANK from some processes and numbered them by their order under one parent: every
    claim about those ranks rests on that guess, so it is said."""
    out = []
    for h in ctx.inputs.hosts:
        pids = (h.meta or {}).get("pids") or {}
        guessed = sorted((info["rank"], int(pid)) for pid, info in pids.items()
                         if info.get("rank") is not None and "inferred" in str(info.get("rank_from") or ""))
        if guessed:
            ranks = [r for r, _ in guessed]
            out.append(Finding("ranks_inferred", f"{ranks_text(ranks)} were inferred from the order of their processes (none had RANK in its environment): "
                               "check them against your launcher before acting on a rank number", tuple(ranks), 0.6,
                               tuple(Evidence("meta", str(h.host_dir / "meta.json"), None,
                                              f"pid {p} -> rank {r} (sibling order)", r) for r, p in guessed[:8])))
    return out


def _job_state_findings(ctx: Model) -> list[Finding]:
    """An unfinished run whose processes nobody looked at (an offline analysis, another machine's run): its state
    is unknown, said once, rather than read as "gone" or "running"."""
    job = ctx.job
    if not job.traced or job.state != "unknown":
        return []
    unfinished = [h for h in ctx.inputs.hosts if not h.ended]
    return [Finding("job_state_unknown", "job state unknown: the run has no exit status and whether its processes "
                    "are alive was not looked at (analyzed offline, or on another machine)", (), 1.0,
                    tuple(Evidence("meta", str(h.host_dir / "meta.json"), None, "no exit status") for h in
                          unfinished[:3]))]


def _input_findings(inputs: Inputs) -> list[Finding]:
    by_file: dict[str, list] = {}
    for s in inputs.skipped:
        by_file.setdefault(s.file, []).append(s)
    out = []
    for f, items in sorted(by_file.items()):
        reasons = Counter(s.reason for s in items)
        top = "; ".join(f"{r}" + (f" (x{n})" if n > 1 else "") for r, n in reasons.most_common(3))
        out.append(Finding("input_skipped", f"{f}: {len(items)} item(s) not used: {top}", (), 1.0,
                           tuple(Evidence("input", f, s.line, s.reason) for s in items[:3])))
    return out
