"""The wait-for verdicts: missing_ranks, collective_mismatch, stuck_in_collective, and rank_exited when the rank
everybody waits for is gone. All come from the one wait-for graph (analyzers.waitfor)."""
from __future__ import annotations

import re

from ranktrace.analyzers.model import waitfor
from ranktrace.analyzers.diagnose.candidate import (Candidate, group_desc, op_evidence, operation_of, ranks_text, stack_evidence,
                                         where)
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.model.hoststate import RankStack, without_tracer
from ranktrace.analyzers.model.stacks import normalise_frame
from ranktrace.analyzers.verdict import Evidence, Finding, WaitEdge

__all__ = ["mismatch", "waiting", "stuck", "exit_marks"]

TIMEOUT = re.compile(r"timed out|timeout|deadline exceeded", re.IGNORECASE)

PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|remote process exited|Broken pipe|"
                       r"peer .{0,200}?(closed|exited|died)|ECONNRESET|socket closed", re.IGNORECASE)


def mismatch(ctx: Model) -> list[Candidate]:
    out = []
    for m in ctx.graph.mismatches:
        minority = set(m.minority)
        culprit_ops = [o for o in m.ops if o.rank in minority]
        major_ops = [o for o in m.ops if o.rank not in minority]
        what = {waitfor.MatchState.OP_MISMATCH: "op", waitfor.MatchState.DTYPE_MISMATCH: "dtype",
                waitfor.MatchState.SIZE_MISMATCH: "size"}[m.state]
        if major_ops:
            ref = major_ops[0]
            theirs = ", ".join(sorted({_desc(o) for o in culprit_ops}))
            summary = (f"{ranks_text(m.minority)} issued {theirs} where {ranks_text([o.rank for o in major_ops])} "
                       f"issued {_desc(ref)} (group {ref.group}, seq {m.seq}): {what} mismatch")
        else:
            ref = m.ops[0]
            summary = (f"ranks disagree on the {what} of group {ref.group} seq {m.seq}: "
                       + "; ".join(f"{ranks_text([o.rank])} {_desc(o)}" for o in m.ops))
        ev = tuple(op_evidence(o) for o in m.ops)
        conf = 0.9 if major_ops else 0.5
        f = Finding("collective_mismatch", summary, m.minority, conf, ev)
        steps = [f"Make every rank of group {ref.group} issue the same collective at seq {m.seq}: "
                 + "; ".join(f"{ranks_text([o.rank])} called it from {o.callsite}" for o in culprit_ops
                             if o.callsite)]
        out.append(Candidate("collective_mismatch", summary, culprits=m.minority,
                             waiting=tuple(sorted(o.rank for o in major_ops)),
                             operation=operation_of(ref, ctx.graph.members.get(m.chan)),
                             wait_for=tuple(WaitEdge(o.rank, m.minority, o.name, o.group, o.seq) for o in major_ops),
                             findings=[f], next_steps=steps))
    return out


def _desc(o: waitfor.PendingOp) -> str:
    parts = [o.name]
    if o.dtype:
        parts.append(o.dtype)
    if o.shape:
        parts.append(o.shape)
    return " ".join(parts)


def waiting(ctx: Model) -> list[Candidate]:
    """missing_ranks (or rank_exited): the sinks of the wait-for graph."""
    g = ctx.graph
    if not g.edges:
        return []
    succ = g.successors()
    sinks = waitfor.sink_components(succ)
    if not sinks:
        return []
    deps = ctx.departures
    culprits: list[int] = []
    confidence = 0.9
    cycle_notes: list[Finding] = []
    for comp in sinks:
        chosen, conf = waitfor.break_cycles(comp, deps or {})
        culprits.extend(chosen)
        confidence = min(confidence, conf)
        if len(comp) > 1:
            d = (deps or {})
            detail = "; ".join(f"rank {r} ran {d[r].ran!r} where most ranks ran {d[r].majority!r} (op #{d[r].position})"
                               for r in chosen if r in d and d[r].position is not None)
            cycle_notes.append(Finding("wait_cycle", f"{ranks_text(comp)} wait on each other; "
                                       + (detail or "no rank departs from the others: all are reported"),
                                       tuple(comp), conf,
                                       tuple(op_evidence(e.op) for e in g.edges if e.waiter in comp)))
    culprit_set = set(culprits)
    early_exit_ev: list[Evidence] = []
    marked = _exit_marks(ctx)
    first_error = _first_error_ns(ctx)
    stop = ctx.job.ended_from_outside_ns
    if stop is not None:  # exits after a stop (or the guardian's teardown) are that ending's, not "left first"
        marked = {r: m for r, m in marked.items() if (m["wall_ns"] or 0) < stop}
    # culprits whose process exited on its own before any waiter's call failed: they left, nobody timed out
    left = {r for r in culprit_set if r in marked and (first_error is None or (marked[r]["wall_ns"] or 0) < first_error)}
    if left:
        first = min(marked[r]["wall_ns"] or 0 for r in left)
        left_first = {r for r in left if (marked[r]["wall_ns"] or 0) == first}
        early_exit_ev = [Evidence("events", marked[r]["file"], marked[r]["line"],
                                  f"exited first: {marked[r]['detail']}", r) for r in sorted(left_first)]
        if left_first != culprit_set:
            # the other missing ranks died later, by signal and without an exit record (a launcher tearing the
            # job down): the one that left first is the culprit
            torn = culprit_set - left_first
            culprit_set = left_first
            cycle_notes.append(Finding("torn_down", f"{ranks_text(torn)} never issued the op either, but only "
                                       f"after {ranks_text(left_first)} exited first", tuple(sorted(torn)), 0.7,
                                       tuple(early_exit_ev)))
    # reach: every rank with a path to a culprit
    reach: set[int] = set()
    frontier = set(culprit_set)
    pred: dict[int, set[int]] = {}
    for e in g.edges:
        pred.setdefault(e.waits_on, set()).add(e.waiter)
    while frontier:
        nxt = set()
        for v in frontier:
            for u in pred.get(v, ()):
                if u not in reach and u not in culprit_set:
                    reach.add(u)
                    nxt.add(u)
        frontier = nxt
    waiters = tuple(sorted(reach))
    internal = [e for e in g.edges if e.waits_on in culprit_set and e.waiter in culprit_set]
    external = [e for e in g.edges if e.waits_on in culprit_set and e.waiter not in culprit_set]
    # a tied cycle (recv <-> recv): what the culprits wait on each other for is the operation
    into = internal if (internal and len(culprit_set) > 1) else (external or internal)
    # the op the others wait for: the most common (group, seq, name) on edges into the culprits
    counts: dict[tuple, int] = {}
    for e in into:
        k = (e.op.chan, e.op.seq, e.op.name)
        counts[k] = counts.get(k, 0) + 1
    key = max(counts, key=lambda k: (counts[k], -(k[1] or 0)))
    ref = next(e.op for e in into if (e.op.chan, e.op.seq, e.op.name) == key)
    waiting_on_ref = sorted({e.waiter for e in into if (e.op.chan, e.op.seq, e.op.name) == key})
    exited, exit_ev = _exited(ctx, culprit_set, into)
    if early_exit_ev:
        exited |= culprit_set
        exit_ev.extend(early_exit_ev)
    kind = "rank_exited" if exited and exited >= culprit_set else "missing_ranks"
    tied_cycle = into is internal and len(culprit_set) > 1 and confidence <= 0.5
    if kind == "missing_ranks" and tied_cycle:
        kind = "wait_cycle"  # they wait on each other and none departs from the rest: the cycle is the finding
        cycle_notes = [n for n in cycle_notes if n.kind != "wait_cycle"]
    culprit_where = []
    from ranktrace.analyzers.diagnose.serving_rule import STEP_TEXT, open_step
    from ranktrace.analyzers.model.blocked import HOST_WAITS, blocked_states

    host_wait = {r: b for r, b in blocked_states(ctx).items() if r in culprit_set and b.state in HOST_WAITS}
    for r in sorted(culprit_set):
        w = where(ctx.stacks.get(r))
        st = ctx.host_states.get(r)
        step = open_step(ctx, r)
        inside = f" inside {STEP_TEXT.get(step.name, step.name)}" if step is not None else ""
        if r in exited:
            how = ctx.rank_exits.get(r)
            culprit_where.append(f"{ranks_text([r])} exited" + (f" ({how})" if how else ""))
        elif w:
            culprit_where.append(f"{ranks_text([r])} is{inside} in {w}" + (
                f", {host_wait[r].detail}" if r in host_wait else f" ({st})" if st else ""))
        elif inside:
            culprit_where.append(f"{ranks_text([r])} is{inside}")
        else:
            open_ = ctx.open_by_rank().get(r)
            if open_ is not None:
                culprit_where.append(f"{ranks_text([r])} is inside {open_.name}"
                                     + (f" (group {open_.group}, seq {open_.seq})" if open_.seq else ""))
    peer = f" from {ranks_text([ref.peer])}" if ref.category == "p2p" and ref.peer is not None else ""
    desc = group_desc(ref.group_desc)
    gname = f"group {ref.group}{'/' + desc if desc else ''}"
    if into is internal and len(culprit_set) > 1:
        summary = (f"{ranks_text(sorted(culprit_set))} wait on each other in {ref.name} ({gname}, seq {ref.seq}): "
                   f"each waits for a peer that is itself waiting")
        if waiters:
            summary += f"; {ranks_text(waiters)} wait for them"
    else:
        summary = (f"{ranks_text(waiting_on_ref)} {'are' if len(waiting_on_ref) > 1 else 'is'} waiting in "
                   f"{ref.name}{peer} ({gname}, seq {ref.seq}) for {ranks_text(sorted(culprit_set))}, which never "
                   f"issued it")
    if kind == "rank_exited":
        summary += " because it exited"
    if culprit_where:
        summary += "; " + "; ".join(culprit_where)
    cur = ctx.current.get(waiting_on_ref[0]) if waiting_on_ref else None
    if cur is not None and cur.open:
        from ranktrace.analyzers.model.phases import phase_text

        summary += f" (during {phase_text(cur.name, cur.detail)})"
    unobserved = sorted(r for r in culprit_set if r not in ctx.observed_ranks)
    evidence = [op_evidence(e.op, f"waits on rank {e.waits_on}") for e in into[:16]]
    for r in sorted(culprit_set):
        if r in ctx.stacks:
            evidence.append(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")))
        last = _last_issued(ctx, r, ref.chan)
        if last is not None:
            evidence.append(last)
        evidence.extend(host_wait[r].evidence[:1] if r in host_wait else ())
    evidence.extend(exit_ev)
    findings = [Finding(kind, summary, tuple(sorted(culprit_set)), confidence, tuple(evidence))] + cycle_notes
    if unobserved:
        findings.append(Finding("unobserved_culprit",
                                f"{ranks_text(unobserved)} left no evidence at all: blamed only because "
                                f"{ranks_text(waiting_on_ref)} wait for it", tuple(unobserved), 0.5,
                                tuple(op_evidence(e.op) for e in into[:4])))
    steps = _steps(ctx, kind, culprit_set, ref)
    wait_for = _wait_for(g)
    op = operation_of(ref, g.members.get(ref.chan), ctx.phases.get(waiting_on_ref[0]))
    if cur is not None:
        import dataclasses

        op = dataclasses.replace(op, phase=cur.name, phase_detail=cur.detail)
    return [Candidate(kind, summary, culprits=tuple(sorted(culprit_set)), waiting=waiters,
                      operation=op,
                      wait_for=wait_for, findings=findings, next_steps=steps)]


def _wait_for(g: waitfor.WaitForGraph) -> tuple[WaitEdge, ...]:
    merged: dict[tuple, set[int]] = {}
    for e in g.edges:
        merged.setdefault((e.waiter, e.op.name, e.op.group, e.op.seq), set()).add(e.waits_on)
    order = sorted(merged.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2] or "", kv[0][3] or 0))
    return tuple(WaitEdge(r, tuple(sorted(on)), op, grp, seq) for (r, op, grp, seq), on in order)


def _last_issued(ctx: Model, rank: int, chan: str) -> Evidence | None:
    ops = ctx.ops
    import pyarrow.compute as pc

    mine = ops.filter(pc.and_(pc.equal(ops["rank"], rank), pc.equal(ops["chan"], chan)))
    if mine.num_rows == 0:
        return Evidence("events", None, None, f"rank {rank} issued nothing on this channel", rank)
    last = mine.sort_by([("seq", "descending")]).slice(0, 1).to_pylist()[0]
    return Evidence(last["source"] or "events", last["file"], last["line"],
                    f"its last op on group {last['group']} was {last['name']} seq {last['seq']} at {last['callsite']}",
                    rank)


def _first_error_ns(ctx: Model) -> int | None:
    import pyarrow.compute as pc

    ev = ctx.events
    errs = ev.filter(pc.equal(ev["kind"], "error"))["wall_ns"]
    return pc.min(errs).as_py() if len(errs) else None


def exit_marks(ctx: Model) -> dict[int, dict]:
    return _exit_marks(ctx)


def _exit_marks(ctx: Model) -> dict[int, dict]:
    """process_exit marks of each rank's own process: one that issued ops or called init_process_group.

    Every process that imports torch under `trace run` gets a ring and inherits RANK from its environment, so a
    helper subprocess or a DataLoader worker of rank r would otherwise make "rank r exited" look true.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    ev = ctx.events
    marks_t = ev.filter(pc.equal(ev["kind"], "mark"))  # few rows: the name test runs on those alone
    marks = marks_t.filter(pc.equal(marks_t["name"], "process_exit")).to_pylist()
    pids = sorted({m["pid"] for m in marks if m["rank"] is not None and m["pid"] is not None})
    if not pids:
        return {}
    theirs = ev.filter(pc.is_in(ev["pid"], value_set=pa.array(pids, pa.int64())))  # only the marked processes
    workers = theirs.filter(pc.and_(pc.equal(theirs["kind"], "enter"),
                                    pc.is_in(theirs["category"], value_set=pa.array(["collective", "p2p", "init"]))))
    main_pids = set(pc.unique(workers["pid"].drop_null()).to_pylist()) if workers.num_rows else set()
    return {r["rank"]: r for r in marks if r["rank"] is not None and r["pid"] in main_pids}


def _exited(ctx: Model, culprits: set[int], into: list[waitfor.Edge]) -> tuple[set[int], list[Evidence]]:
    """Culprits known to have exited: the others' errors say the peer went away, or its process is gone."""
    gone: set[int] = set()
    ev: list[Evidence] = []
    peer_errors = [e for e in into if e.op.errored and e.op.error and PEER_GONE.search(e.op.error)]
    # A real hang ends in timeouts, and the ranks that time out first then exit, so the remaining waiters see
    # "connection closed" too: peer-gone errors prove an exit only when nobody timed out.
    timed_out = [o for o in ctx.graph.edges if o.op.errored and o.op.error and TIMEOUT.search(o.op.error)]
    first_error = _first_error_ns(ctx)
    outside = ctx.job.ended_from_outside_ns
    if outside is not None and (first_error is None or first_error >= outside):
        peer_errors = []  # the peer went away because it was interrupted, not on its own
    if peer_errors and not timed_out:
        gone |= culprits
        ev.extend(op_evidence(e.op) for e in peer_errors[:4])
    if ctx.job.traced and not ctx.job.ended and ctx.job.liveness_known and ctx.job.lost_ns is None:
        # (a cut run's processes are gone because its guardian ended them: that says nothing of who left first)
        for r in culprits:
            pids = ctx.rank_pids.get(r, ())
            if pids and not any(p in ctx.job.live_pids for p in pids):
                gone.add(r)
                ev.append(Evidence("proc", None, None, f"process(es) {', '.join(map(str, pids))} of rank {r} are gone",
                                   r))
    for o in ctx.observations("process_exit"):
        if o["rank"] in culprits:
            gone.add(o["rank"])
            ev.append(Evidence(o["source"] or "proc", o["file"], o["line"], o["detail"] or "process exited", o["rank"]))
    return gone, ev


def _steps(ctx: Model, kind: str, culprits: set[int], ref: waitfor.PendingOp) -> list[str]:
    rs = ranks_text(sorted(culprits))
    steps = []
    if kind == "rank_exited":
        steps.append(f"Find why {rs} exited first: its stderr, exit code, OOM kills (dmesg), an exception before "
                     f"{ref.name} seq {ref.seq}.")
    elif kind == "wait_cycle":
        if ref.category == "p2p":
            steps.append(f"{rs} each wait in {ref.name} for the other: a send/recv ordering deadlock (both receive "
                         f"before either sends, or both send blocking into each other). Order the pair (one side "
                         f"sends first), or post both directions at once with isend/irecv or batch_isend_irecv.")
        else:
            steps.append(f"{rs} wait on each other on different groups: two communicators taken in opposite order. "
                         f"Make every rank issue its collectives on each group in the same order.")
        if ref.callsite:
            steps.append(f"The {ref.name} that closes the cycle is issued from {ref.callsite}.")
    else:
        w = [where(ctx.stacks.get(r)) for r in sorted(culprits)]
        if any(w):
            steps.append(f"Look at what {rs} does instead of {ref.name}: {', '.join(x for x in w if x)} — a "
                         f"data-dependent branch, a slow/blocked input, or an exception swallowed before the call?")
        if ref.callsite:
            steps.append(f"The others issued {ref.name} (group {ref.group}, seq {ref.seq}) from {ref.callsite}: "
                         f"check that every rank reaches that line the same number of times.")
        if not ctx.stacks:
            steps.append("No stacks were captured: run `trace attach PID` or py-spy dump on the culprit to see where "
                         "it is.")
    return steps


_RAN_FOR = re.compile(r"ran for (\d{1,12}) ms")
_ENQUEUED = re.compile(r"\benqueued=(\d{1,12})")


def _stalled_first(ctx: Model, stucks: list[waitfor.Stuck]) -> list[waitfor.Stuck]:
    """Several groups stuck at once: the one that stalled first leads, since the later stalls are usually its
    consequences (a rank held in one collective stops feeding its other communicators). What tells, in order: the
    earliest issue time of the stuck op; the most work its ranks queued behind it (the watchdog's "last enqueued
    NCCL work", or our own later records on the group: they went on issuing past it, so it is the older stall); the
    longest "ran for". With none of these, the order of the groups stands."""
    if len(stucks) < 2:
        return list(stucks)
    ops = ctx.ops
    enter: dict[tuple[str, int], int] = {}
    last_seq: dict[str, int] = {}
    if ops.num_rows:
        for r in ops.select(["chan", "seq", "wall_enter", "issued"]).to_pylist():
            if r["seq"] is None or not r["issued"]:
                continue
            last_seq[r["chan"]] = max(last_seq.get(r["chan"], r["seq"]), r["seq"])
            if r["wall_enter"] is not None:
                at = (r["chan"], r["seq"])
                enter[at] = min(enter.get(at, r["wall_enter"]), r["wall_enter"])
    queued: dict[str, int] = {}
    for o in ctx.observations("watchdog_pg_status"):
        m = _ENQUEUED.search(o["detail"] or "")
        if m and o["group"] is not None:
            queued[o["group"]] = max(queued.get(o["group"], 0), int(m.group(1)))

    def first_stall(s: waitfor.Stuck) -> tuple[int, int, int]:
        ref = s.ops[0]
        t = enter.get((s.chan, s.seq))
        behind = max(last_seq.get(s.chan, s.seq), queued.get(ref.group or "", s.seq)) - s.seq
        ran = max((int(m.group(1)) for o in s.ops if (m := _RAN_FOR.search(o.error or ""))), default=0)
        return (t if t is not None else 1 << 62, -behind, -ran)

    return sorted(stucks, key=first_stall)  # stable: ties keep the groups' order


def _parked_beneath(ctx: Model, s: waitfor.Stuck) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parked, inside): members of a stuck op whose current stack is their own wait beneath the call (blocked_other
    while inside its frames: a threading/queue/sleep wait, never the transport), and the members waiting in the op
    itself; parked is empty unless some member is inside."""
    inside = tuple(r for r in s.not_completed if ctx.host_states.get(r) == "in_collective")
    if len(s.not_completed) < 2 or not inside:
        return (), inside
    return tuple(r for r in s.not_completed if ctx.host_states.get(r) == "blocked_other" and r in ctx.stacks), inside


def _where_parked(stack: RankStack) -> str:
    """The wait and the application frame that asked for it: 'Condition.wait <- _block (faults.py:45)'."""
    frames = without_tracer(stack.frames)
    app = where(stack)
    inner = normalise_frame(frames[0]) if frames else (app or "an unknown frame")
    return inner if app in (None, inner) else f"{inner} under {app}"


def stuck(ctx: Model) -> list[Candidate]:
    """Every member issued the same op; some or all never completed it (below Python: transport, GPU stream)."""
    out = []
    for s in _stalled_first(ctx, ctx.graph.stuck):
        ref = s.ops[0]
        members = ctx.graph.members.get(s.chan, ())
        # membership an input states (the group's ranks, the default group of a known world, a p2p pair); else only
        # the ranks that reported the op are known, and "every member" would be a claim no input makes
        stated = bool(ctx.group_ranks.get(ref.group or "")) or ref.category == "p2p" or bool(
            ctx.world and (ref.group_desc == "default_pg" or ref.group in ("0", "default_pg")))
        group = f"group {ref.group}" if ref.group else "an unnamed group"
        if (ref.group or "").startswith("hook:") and all(o.returned for o in s.ops) and not any(
                o.errored for o in s.ops) and not any(
                ctx.host_states.get(r) == "host_sync_wait" for r in s.not_completed):
            continue  # a hooked call that returned was enqueued: nothing says it did not finish (DESIGN §2)
        # (a hooked call that never returned is inside the framework's collective: spinning or blocked, it waits)
        if s.completed:
            culprits = s.not_completed
            summary = (f"{ranks_text(s.not_completed)} issued {ref.name} (group {ref.group}, seq {s.seq}) like "
                       f"{ranks_text(s.completed)} but it never completed there")
            conf = 0.7
        elif not any(o.returned for o in s.ops) and (parked_inside := _parked_beneath(ctx, s))[0]:
            # some members entered the call but wait beneath it in their own code, never reaching the transport,
            # while others wait in the transport: those parked are what the others wait for (a stack at hang
            # time outranks the symmetric 'all inside' the records alone would say)
            parked, inside = parked_inside
            culprits = parked
            one = len(parked) == 1
            places = "; ".join(("" if one else f"rank {r} in ") + _where_parked(ctx.stacks[r]) for r in parked)
            summary = (f"{ranks_text(parked)} entered {ref.name} seq {s.seq} of {group} but "
                       f"{'is' if one else 'are'} parked beneath it in {'its' if one else 'their'} own wait "
                       f"({places}), never reaching the transport; {ranks_text(inside)} "
                       f"wait{'s' if len(inside) == 1 else ''} inside it for {'it' if one else 'them'}")
            conf = 0.75
        elif not any(o.returned for o in s.ops):
            culprits = ()
            who = (f"every member of {group} ({ranks_text(members)}) is" if stated else
                   f"{ranks_text(s.not_completed)} {'is' if len(s.not_completed) == 1 else 'are'}")
            summary = (f"{who} inside {ref.name} seq {s.seq}" + (" and none returned from it" if stated else
                                                                  f" of {group} and never returned from it")
                       + ": the call itself waits (spinning or blocked) for a peer, the "
                       "transport or the device" + ("" if stated else "; no input shows the group's other members"))
            conf = 0.6
        else:
            culprits = ()
            who = (f"every member of {group} ({ranks_text(members)})" if stated else ranks_text(s.not_completed))
            summary = (f"{who} issued {ref.name} seq {s.seq}" + ("" if stated else f" of {group}")
                       + " and none completed it: stuck below Python (transport, GPU stream)"
                       + ("" if stated else "; no input shows the group's other members"))
            conf = 0.6
        states = {r: ctx.host_states.get(r) for r in s.not_completed}
        sync = [r for r, st in states.items() if st == "host_sync_wait"]
        if sync:
            summary += f"; {ranks_text(sync)} wait{'s' if len(sync) == 1 else ''} for the GPU on the host " \
                       f"({', '.join(filter(None, (where(ctx.stacks.get(r)) for r in sync)))})"
        ev = [op_evidence(o) for o in s.ops]
        ev.extend(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in s.not_completed
                  if r in ctx.stacks)
        transports = ctx.observations("nccl_transport")
        ev.extend(Evidence(o["source"] or "nccl", o["file"], o["line"], f"transport {o['detail']} {o['name'] or ''}",
                           o["rank"]) for o in transports[:8])
        warns = ctx.observations("nccl_warn")
        ev.extend(Evidence(o["source"] or "nccl", o["file"], o["line"], f"NCCL WARN {o['detail']}", o["rank"])
                  for o in warns[:8])
        steps = []
        if culprits and not s.completed:
            steps.append(f"{ranks_text(culprits)} wait{'s' if len(culprits) == 1 else ''} in code beneath "
                         f"{ref.name} that is not the transport (a lock, an event, a queue, a sleep): read "
                         f"{'its' if len(culprits) == 1 else 'their'} stack for what that wait expects and which "
                         f"thread or process should have set it.")
        elif s.completed:
            steps.append(f"{ranks_text(culprits)}'s GPU stream did not finish {ref.name} seq {s.seq}: look for work "
                         f"queued before it on that GPU (a kernel that never ends, a graph replay) and for Xid "
                         f"errors in dmesg / nvidia-smi.")
        else:
            steps.append("Transport-level hang: read the NCCL INIT/transport lines (P2P/IPC, SHM, NET) for this "
                         "communicator; try NCCL_P2P_DISABLE=1 (P2P transport) or NCCL_IB_DISABLE=1 to isolate it.")
            if any("P2P" in (o["detail"] or "") for o in transports):
                steps.append("NCCL used P2P between these GPUs: a PCIe-only box with broken peer access hangs here; "
                             "rerun once with NCCL_P2P_DISABLE=1.")
        waiting_r = tuple(sorted(set(members) - set(culprits))) if culprits else tuple(s.not_completed)
        out.append(Candidate("stuck_in_collective", summary, culprits=tuple(culprits), waiting=waiting_r,
                             operation=operation_of(ref, members if stated else None),
                             findings=[Finding("stuck_in_collective", summary, tuple(culprits or s.not_completed),
                                               conf, tuple(ev))],
                             next_steps=steps))
    return out
