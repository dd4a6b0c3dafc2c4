"""Verdicts from how ranks failed: set-up that never finished (store, rendezvous, NCCL unique id, communicator
init) and ranks that died (an exit code, a signal, a segfault, an OOM kill) while the others waited.

These statements come from launchers and torch's own errors (torchelastic's failure table, DistStoreError,
"failed to connect", gdb stacks parked in ncclCommInitRank); the wait-for graph cannot see them because the rank
they are about issued nothing more.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence, where
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding, Operation

__all__ = ["init_failure", "rank_exit", "vanished_first", "CONSEQUENTIAL_SIGNALS"]

#: signals a launcher sends to the *other* ranks once one failed: consequences, never the cause
CONSEQUENTIAL_SIGNALS = {15, 2, 1}   # SIGTERM, SIGINT, SIGHUP
_STAGE_TEXT = {
    "store": "the TCP store (MASTER_ADDR:MASTER_PORT) did not answer or not every rank joined it",
    "store_barrier": "not every rank reached the store-based barrier of init_process_group",
    "rendezvous": "the rendezvous did not complete (not every node joined in time)",
    "nccl_unique_id": "the NCCL unique id was never published through the store by the root rank",
    "nccl_init": "NCCL communicator init (bootstrap / transport set-up) did not finish",
    "connect": "a rank could not connect to its peers or to the store",
}


def _evidence(rows: list[dict[str, Any]], what: str, limit: int = 8) -> list[Evidence]:
    return [Evidence(r["source"] or "log", r["file"], r["line"], f"{what}: {(r['detail'] or r['name'] or '')[:200]}",
                     r["rank"]) for r in rows[:limit]]


def _progressed(ctx: Model) -> bool:
    """The job got past set-up: some collective beyond the first couple was issued (or completed)."""
    ev = ctx.events
    if ev.num_rows == 0:
        return False
    coll = ev.filter(pc.is_in(ev["category"], value_set=pa.array(["collective", "p2p"])))
    if coll.num_rows == 0:
        return False
    seqs = [s for col in ("seq", "backend_seq") for s in coll[col].to_pylist() if s is not None]
    return bool(seqs) and max(seqs) >= 3


#: an NCCL error thrown by the call itself, of the kind communicator creation gives (socket, bootstrap, system):
#: with no sign that any collective ran before, it is the lazy set-up of the first collective's communicator
_SETUP_NCCL_ERROR = re.compile(r"unhandled system error|ncclSystemError|ncclInternalError|[Bb]ootstrap|socket|"
                               r"Socket|ncclInvalidUsage")


def _ran_collectives(ctx: Model) -> bool:
    """Some collective visibly completed before (a benchmark's result rows, a later watchdog seq)."""
    return _progressed(ctx) or any(o["name"] == "nccl_tests_size" for o in ctx.observations("progress"))


def init_failure(ctx: Model) -> list[Candidate]:
    rows = ctx.observations("init_failure") + [
        {**o, "name": "nccl_init"} for o in ctx.observations("transport_error") + ctx.observations("exception")
        if (o["kind"] == "exception" or o["name"] == "nccl_error") and "NCCL" in (o["detail"] or "")
        and _SETUP_NCCL_ERROR.search(o["detail"] or "") and not _ran_collectives(ctx)]
    # a process that segfaulted inside set-up did not hang there: it died (rank_exit says so, with where)
    segfaulted = [r for r in rows if (r["detail"] or "").startswith("segfault inside")]
    rows = [r for r in rows if r not in segfaulted]
    if segfaulted and not rows:
        return []  # its stack (in set-up) is where it died, not where it waits
    stacks_in_init = {r: s for r, s in ctx.stacks.items() if ctx.host_states.get(r) == "in_init"}
    anon_in_init = [s for s in ctx.anon_stacks if _state(s) == "in_init"]
    if not rows and not stacks_in_init and not anon_in_init:
        return []
    if _progressed(ctx):
        return []
    if not rows and stacks_in_init and len(stacks_in_init) < len(ctx.stacks):
        return []  # some ranks are in init, others elsewhere: the stacks rules say who never arrived
    stages = Counter(r["name"] for r in rows if r["name"])
    stage = stages.most_common(1)[0][0] if stages else "nccl_init"
    ranks = sorted({r["rank"] for r in rows if r["rank"] is not None} | set(stacks_in_init))
    op = _init_op(ctx)
    first = next((r for r in rows if r["detail"]), None)
    what = _STAGE_TEXT.get(stage, stage)
    if ranks:
        summary = f"{ranks_text(ranks)} never got past process-group set-up: {what}"
    else:
        summary = f"the job never got past process-group set-up: {what}"
    if op and op != "init_process_group":
        summary += f" (while creating the communicator for its first {op})"
    if first:
        summary += f" — {first['detail'][:160]}"
    ev = _evidence(rows, stage)
    ev += [stack_evidence(s, "in_init") for s in list(stacks_in_init.values())[:4] + anon_in_init[:4]]
    if not rows and anon_in_init:
        w = where(anon_in_init[0])
        summary = f"the dumped process is inside communicator / process-group set-up" + (f" ({w})" if w else "")
    steps = ["Check that every rank was started and reaches init with the same MASTER_ADDR/MASTER_PORT, WORLD_SIZE "
             "and a reachable network interface (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); the first rank that "
             "never logs its init is the one to look at.",
             "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET: the last bootstrap line of each rank "
             "names the step it never finished."]
    return [Candidate("init_hang", summary, culprits=(), waiting=tuple(ranks),
                      operation=Operation(name=op or "init_process_group", phase="init"),
                      findings=[Finding("init_hang", summary, tuple(ranks), 0.7 if rows else 0.5, tuple(ev))],
                      next_steps=steps)]


def _state(stack: Any) -> str:
    from ranktrace.analyzers.model.hoststate import classify

    return classify(stack.frames, stack.thread_state)


def _init_op(ctx: Model) -> str | None:
    """The collective during whose lazy communicator creation set-up failed (a first barrier, say), if shown."""
    ev = ctx.events
    if ev.num_rows == 0:
        return None
    entered = ev.filter(pc.and_(pc.equal(ev["kind"], "enter"), pc.equal(ev["category"], "collective")))
    names = Counter(n for n in entered["name"].to_pylist() if n)
    return names.most_common(1)[0][0] if names else None


_LOCAL = re.compile(r"\blocal_rank[=:] ?(\d{1,6})")
_ROOT = re.compile(r"root cause|first observed failure|root_cause=yes", re.IGNORECASE)
#: an exit that is the watchdog (or a timeout, or the launcher) ending a rank that was itself waiting: a consequence
_CONSEQUENCE = re.compile(r"[Ww]atchdog|[Tt]imed? ?out|Timeout|terminated_by=|Terminating the process|"
                          r"Connection (?:closed|reset) by peer|communicator was aborted|Socket Timeout")
_FATAL_CAUSE = re.compile(r"Segmentation fault|Bus error|Floating point exception|Illegal instruction")


def _fatal_errors(ctx: Model) -> list[dict[str, Any]]:
    """faulthandler's "Fatal Python error: Segmentation fault" (not "Aborted": that is usually the watchdog's abort)
    as a rank exit."""
    out = []
    for o in ctx.observations("py_fatal_error"):
        if _FATAL_CAUSE.search(o["detail"] or ""):
            out.append({**o, "name": "segfault", "value": 11})
    return out


def rank_exit(ctx: Model) -> list[Candidate]:
    """A rank died first (its exit is stated); the others were then waiting for it or were torn down."""
    rows = [r for r in ctx.observations("rank_exit")] + _fatal_errors(ctx)
    causes = [r for r in rows if not (r["name"] == "signal" and r["value"] in CONSEQUENTIAL_SIGNALS)
              and not (r["name"] == "exit" and r["value"] == 0) and not _CONSEQUENCE.search(r["detail"] or "")]
    if not causes:
        return []
    root = [r for r in causes if _ROOT.search(r["detail"] or "")] or causes
    # a statement that names its rank says more than one that does not ("a child failed" before the scheduler's own
    # exception): it leads the sentence
    root = sorted(root, key=lambda r: r["rank"] is None)
    culprits = tuple(sorted({r["rank"] for r in root if r["rank"] is not None}))
    assumed_local = False
    if not culprits:  # only a launcher's local rank is known: on one node (the usual paste) it is the rank
        local = {int(m.group(1)) for r in root if (m := _LOCAL.search(r["detail"] or ""))}
        if local and len({r["host"] for r in rows if r["host"]}) <= 1:
            culprits, assumed_local = tuple(sorted(local)), True
    pending = ctx.ops.filter(ctx.ops["issued"]) if ctx.ops.num_rows else ctx.ops
    waiting_ops = [r for r in pending.to_pylist() if not r.get("completed") and r["rank"] not in culprits] \
        if pending.num_rows else []
    waiting = tuple(sorted({r["rank"] for r in waiting_ops if r["rank"] is not None}))
    op_name = Counter(r["name"] for r in waiting_ops if r["name"]).most_common(1)
    how = root[0]
    cause = {"signal": f"was killed by signal {how['value']}", "segfault": "crashed (segmentation fault)",
             "oom": "was killed for running out of memory", "exception": "raised an exception",
             "exit": f"exited with status {how['value']}" if how["value"] is not None else "exited"}.get(
        how["name"] or "", "exited")
    if how["name"] == "exception" and (exc := _its_exception(ctx, how)) is not None:
        cause += f" ({exc})"
    if how["name"] == "segfault":
        inside = next((o["detail"] for o in ctx.observations("init_failure") if o["file"] == how["file"]
                       and o["line"] == how["line"] and (o["detail"] or "").startswith("segfault inside")), None)
        if inside:
            cause += inside[len("segfault"):]  # " inside ncclCommInitRank": where in set-up it died
    who = ranks_text(culprits) if culprits else "a process of the job"  # which rank, no input says
    if assumed_local:
        who = ("local " + who) + " (the global rank, if this is one node)"
    summary = f"{who} {cause}" + (f" while {ranks_text(waiting)} waited in {op_name[0][0]}" if waiting and op_name
                                   else "") + "; the rest of the job was torn down after it"
    steps = [f"Read {who}'s own output just before it ended (its traceback, an OOM-killer line in dmesg, a CUDA error): "
             "that is the failure; the other ranks' errors are consequences."]
    return [Candidate("rank_exited", summary, culprits=culprits, waiting=waiting,
                      operation=Operation(name=op_name[0][0]) if op_name else None,
                      findings=[Finding("rank_exited", summary, culprits, 0.8, tuple(_evidence(root, "exited")))],
                      next_steps=steps)]


def _its_exception(ctx: Model, said: dict[str, Any]) -> str | None:
    """The exception a "hit an exception" statement goes on to print: the first traceback's exception line after it
    in the same file (within a traceback's length), from the same rank or from no stated rank."""
    line = said["line"]
    if line is None:
        return None
    after = [o for o in ctx.observations("exception") if o["file"] == said["file"] and o["line"] is not None
             and line < o["line"] <= line + 400 and o["rank"] in (None, said["rank"]) and o["name"]]
    if not after:
        return None
    o = min(after, key=lambda o: o["line"])
    text = f"{o['name']}: {o['detail']}" if o["detail"] else o["name"]
    return text if len(text) <= 160 else text[:157] + "..."


#: a rank's process gone this long before any other rank's: it left first (two watchdog samples at least)
VANISHED_GAP_NS = 3_000_000_000


def vanished_first(ctx: Model) -> list[Candidate]:
    """A rank whose process vanished without an exit record (SIGKILL, the OOM killer, a crash below Python) while the
    others were still alive: the watchdog's process samples say when each was last seen, and the one gone first is
    the one the rest of the job waited for or was torn down after."""
    if not ctx.job.traced:
        return []
    last: dict[int, tuple[int, dict[str, Any]]] = {}   # rank -> when its process was last sampled alive
    for o in ctx.observations("proc_memory"):
        r, w = o["rank"], o["wall_ns"]
        if r is not None and w is not None and (r not in last or w > last[r][0]):
            last[r] = (w, o)
    seen = {r: w for r, (w, _o) in last.items()}
    # a rank that recorded its own exit is rank_exit's (and the stop's) to judge
    last = {r: v for r, v in last.items() if r not in ctx.rank_exits}
    if len(seen) < 2 or not last:
        return []
    later = max(seen.values())
    first_w = min(w for w, _ in last.values())
    gone = sorted(r for r, (w, _) in last.items() if w - first_w < VANISHED_GAP_NS)
    others = [w for r, w in seen.items() if r not in gone]
    stop = ctx.job.stopped_ns
    if not others or min(others) - first_w < VANISHED_GAP_NS or (stop is not None and first_w >= stop):
        return []
    if ctx.job.state == "running" and any(p in ctx.job.live_pids for r in gone for p in ctx.rank_pids.get(r, ())):
        return []  # still alive: only its samples stopped
    waiting = tuple(sorted(r for r in seen if r not in gone and ctx.host_states.get(r) in (
        "blocked_other", "in_collective", "in_init", "idle_loop", "host_sync_wait")))
    import datetime

    at = datetime.datetime.fromtimestamp(first_w / 1e9).strftime("%H:%M:%S")
    where_text = "; ".join(f"rank {r} in {where(ctx.stacks[r])}" for r in waiting if r in ctx.stacks
                           and where(ctx.stacks[r]))
    summary = (f"{ranks_text(gone)}'s process vanished at about {at} with no exit record (killed by a signal such as "
               f"SIGKILL, the OOM killer, or a crash below Python) while {ranks_text(sorted(r for r in seen if r not in gone))} "
               f"stayed alive {(later - first_w) / 1e9:.0f} s longer" + (f", waiting ({where_text})" if where_text else ""))
    ev = [Evidence("proc", o["file"], None, f"last sampled alive at {at}: {o['name']} pid {o['pid']}", r)
          for r, (_w, o) in sorted(last.items()) if r in gone]
    ev += [stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in waiting if r in ctx.stacks][:4]
    steps = [f"Find what ended {ranks_text(gone)}: `dmesg -T | grep -i -E 'killed process|out of memory'` (the OOM "
             "killer), the launcher's log for its exit status, a core dump; the others only waited for it."]
    return [Candidate("rank_exited", summary, culprits=tuple(gone), waiting=waiting,
                      findings=[Finding("rank_exited", summary, tuple(gone), 0.75, tuple(ev))], next_steps=steps)]
