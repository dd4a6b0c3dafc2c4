"""init_hang: ranks wait inside init_process_group / new_group for ranks that never called it."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.model.values import OpenSpan
from ranktrace.analyzers.verdict import Evidence, Finding, Operation, WaitEdge

__all__ = ["init_hang"]

INIT_NAMES = ("init_process_group", "new_group")


def init_hang(ctx: Model) -> list[Candidate]:
    opened: dict[int, OpenSpan] = {r: s for r, s in ctx.open_by_rank().items()
                                    if s.category == "init" and s.name in INIT_NAMES}
    ev = ctx.events
    failed = ev.filter(pc.and_(pc.equal(ev["kind"], "error"), pc.is_in(ev["name"], value_set=pa.array(INIT_NAMES))))
    failed_rows = {r["rank"]: r for r in failed.to_pylist() if r["rank"] is not None}
    if not opened and not failed_rows:
        return []
    names = {s.name for s in opened.values()} | {r["name"] for r in failed_rows.values()}
    name = "init_process_group" if "init_process_group" in names else sorted(names)[0]
    entered = {int(r) for r in ev.filter(pc.and_(pc.equal(ev["name"], name), pc.equal(ev["kind"], "enter")))[
        "rank"].drop_null().to_pylist()}
    waiting = tuple(sorted(set(opened) | set(failed_rows)))
    if name == "init_process_group":
        universe = set(range(ctx.world)) if ctx.world else set(entered)
    else:  # new_group: every rank of the world must call it
        universe = set(range(ctx.world)) if ctx.world else set(entered)
    never = tuple(sorted(universe - entered))
    evidence = [Evidence("events", s.file, s.line, f"entered {s.name} at {s.callsite}, never returned", r)
                for r, s in sorted(opened.items())]
    evidence += [Evidence(f["source"] or "events", f["file"], f["line"], f"{f['name']} failed: {f['error']}", r)
                 for r, f in sorted(failed_rows.items())]
    culprit_ev: list[Evidence] = []
    for pid in ctx.unranked_pids:
        culprit_ev.append(Evidence("events", None, None,
                                   f"pid {pid} imported torch.distributed but never called {name} (no rank known)"))
    for r in never:
        if r in ctx.stacks:
            culprit_ev.append(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")))
    if never:
        summary = (f"{ranks_text(waiting)} waited in {name} for {ranks_text(never)}, which never called it"
                   + (f" (world size {ctx.world})" if ctx.world else ""))
        conf = 0.9 if ctx.world else 0.6
    else:
        summary = f"{ranks_text(waiting)} are inside {name} and it has not returned on any of them"
        conf = 0.5
    findings = [Finding("init_hang", summary, tuple(never or waiting), conf, tuple(evidence + culprit_ev))]
    steps = []
    if never:
        steps.append(f"Check how {ranks_text(never)} was launched: does it reach {name} (RANK/WORLD_SIZE/"
                     f"MASTER_ADDR/MASTER_PORT in its environment, an exception or a long load before it)?")
        if ctx.unranked_pids:
            steps.append(f"Look at the stack of pid(s) {', '.join(map(str, ctx.unranked_pids))}: a process of the job "
                         f"that never initialised.")
    else:
        steps.append("Every rank entered init: check the rendezvous store (MASTER_ADDR/PORT reachable, same port) "
                     "and, on NCCL, the NCCL INIT/BOOTSTRAP lines for the first rank that stops.")
    # the world size every waiting rank passed to init is a statement that ranks 0..world-1 exist: the ones that
    # never joined are named by it (witnessed), not guessed
    return [Candidate("init_hang", summary, culprits=never, waiting=waiting, stated=never if ctx.world else (),
                      operation=Operation(name=name, phase="init"),
                      wait_for=tuple(WaitEdge(r, never, name, None, None) for r in waiting if never),
                      findings=findings, next_steps=steps)]


def nccl_init_hang(ctx: Model) -> list[Candidate]:
    """A communicator whose NCCL init started on some ranks and never completed on some (NCCL log evidence).

    Ranks are communicator ranks (``rank_space`` may be ``comm:<id>``); ranks of the communicator that never even
    printed Init START are reported as never having joined.
    """
    starts = ctx.observations("nccl_init_start")
    if not starts:
        return []
    completes = ctx.observations("nccl_init_complete")
    out: list[Candidate] = []
    for comm in sorted({s["group"] for s in starts if s["group"]}):
        started = {s["rank"]: s for s in starts if s["group"] == comm and s["rank"] is not None}
        done = {c["rank"] for c in completes if c["group"] == comm and c["rank"] is not None}
        nranks = max((s["value"] or 0 for s in starts if s["group"] == comm), default=0)
        members = set(range(nranks)) if nranks else set(started)
        stuck = sorted(set(started) - done)
        never = sorted(members - set(started) - done)
        if not stuck and not never:
            continue
        culprits = tuple(stuck or never)
        waiting = tuple(sorted(done))
        what = (f"{ranks_text(stuck)} started NCCL init of communicator {comm} and never completed it"
                if stuck else f"{ranks_text(never)} never started NCCL init of communicator {comm}")
        summary = what + (f" while {ranks_text(waiting)} completed it" if waiting else "")
        ev = [Evidence(s["source"] or "nccl", s["file"], s["line"], f"Init START comm {comm} nranks {s['value']}", r)
              for r, s in sorted(started.items()) if r in stuck]
        ev += [Evidence(c["source"] or "nccl", c["file"], c["line"], f"Init COMPLETE comm {comm}", c["rank"])
               for c in completes if c["group"] == comm][:8]
        steps = [f"Read the NCCL INIT/BOOTSTRAP lines of {ranks_text(culprits)} after Init START: the last one names "
                 f"the step (bootstrap connect, topology, transport setup) it never finished; check that rank's "
                 f"network interface (NCCL_SOCKET_IFNAME) and GPU."]
        out.append(Candidate("init_hang", summary, culprits=culprits, waiting=waiting,
                             operation=Operation(name="nccl_comm_init", group=comm, group_ranks=tuple(sorted(members)),
                                                 phase="init"),
                             findings=[Finding("init_hang", summary, culprits, 0.8, tuple(ev))], next_steps=steps))
    return out
