"""Every rule of diagnose.RULES, alone, on a model built from a few factory rows (no reader, no file): the fault it
exists for is planted and the rule must name it — kind, culprits, waiting ranks, operation — and a neighbouring
healthy picture must leave it silent. The last test checks that no rule of RULES goes without a case here.

The rows are the shapes the readers produce (tracer/formats/schema.py); each case says in words which input it
stands for. Rules are called directly: what the arbitration later does with their candidates is
tests/test_engine_units.py's subject.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import pytest

from ranktrace.analyzers.diagnose import RULES
from ranktrace.analyzers.diagnose.candidate import Candidate
from ranktrace.analyzers.diagnose import (blocked_rule, failure_rule, graph_rule, host_wait_rule, init_rule,
                                          serving_rule, stacks_rule, startup_rule, statement_rule, watchdog_rule,
                                          waiting_rule)
from ranktrace.analyzers.model.build import Model, build_model
from ranktrace.analyzers.model.records import Inputs
from ranktrace.analyzers.model.values import HostRun
from ranktrace.tracer.formats import schema

WALL0 = 1_700_000_000_000_000_000
_SPANS = itertools.count(1)  # span ids: unique per call (0 means none)


def call(rank: int, name: str, seq: int, *, group: str = "0", backend: str = "gloo", returned: bool = True,
         completed: bool = False, category: str = "collective", source: str = "events", shape: str | None = None,
         error: str | None = None, ranks: tuple[int, ...] | None = (0, 1, 2, 3),
         t: int | None = None) -> list[dict[str, Any]]:
    """The rows one call leaves in the events table: enter, exit if it returned (error if it failed), complete."""
    t = t if t is not None else seq * 1_000_000 + rank
    base = {"rank": rank, "pid": 100 + rank, "tid": 100 + rank, "host": "h", "name": name, "category": category,
            "group": group, "backend": backend, "group_ranks": None if ranks is None else list(ranks), "seq": seq, "t_ns": t,
            "wall_ns": WALL0 + t, "source": source, "file": f"{source}-{rank}", "line": seq * 10, "span_id": next(_SPANS),
            "shape": shape}
    rows = [{**base, "kind": "enter"}]
    if error is not None:
        rows.append({**base, "kind": "error", "error": error, "t_ns": t + 500, "wall_ns": base["wall_ns"] + 500})
    elif returned:
        rows.append({**base, "kind": "exit", "t_ns": t + 1000, "wall_ns": base["wall_ns"] + 1000})
    if completed:
        rows.append({**base, "kind": "complete", "t_ns": t + 2000, "wall_ns": base["wall_ns"] + 2000})
    return rows


def steps(who: range | tuple[int, ...], upto: int, **kw: Any) -> list[dict[str, Any]]:
    return [r for rank in who for seq in range(1, upto + 1) for r in call(rank, "all_reduce", seq, **kw)]


def obs(kind: str, rank: int | None, *, name: str | None = None, detail: str | None = None, value: int | None = None,
        group: str | None = None, source: str = "log", wall_ns: int | None = None, line: int = 1) -> dict[str, Any]:
    return {"kind": kind, "rank": rank, "name": name, "detail": detail, "value": value, "group": group,
            "source": source, "file": f"{source}.log", "line": line, "wall_ns": wall_ns,
            "pid": None if rank is None else 100 + rank}


def stack(rank: int | None, frames: tuple[str, ...], state: str = "idle", *, pid: int | None = None,
          snapshot: str = "dump-1", source: str = "pyspy") -> dict[str, Any]:
    pid = pid if pid is not None else 100 + (rank if rank is not None else 50)
    return {"rank": rank, "pid": pid, "tid": pid, "host": "h", "wall_ns": WALL0 + 10**12, "t_ns": 10**12,
            "thread_name": "MainThread", "thread_state": state, "frames": list(frames), "snapshot": snapshot,
            "source": source, "file": f"{snapshot}.txt", "line": 1}


IN_ALL_REDUCE = ("all_reduce (torch/distributed/distributed_c10d.py:3252)", "train_step (train.py:88)")
IN_QUEUE = ("get (queue.py:180)", "next_batch (train.py:40)")
IN_SYNC = ("synchronize (torch/cuda/__init__.py:985)", "step (train.py:9)")


def model(events: list[dict[str, Any]] = (), observations: list[dict[str, Any]] = (),
          stacks: list[dict[str, Any]] = (), world: int | None = None, hosts: list[HostRun] = ()) -> Model:
    inputs = Inputs(events=schema.table_from_rows(schema.EVENTS, events),
                    stacks=schema.table_from_rows(schema.STACKS, stacks),
                    observations=schema.table_from_rows(schema.OBSERVATIONS, observations),
                    world_size=world, hosts=list(hosts))
    return build_model(inputs, None)


def one(rule: Callable[[Model], list[Candidate]], m: Model) -> Candidate:
    got = rule(m)
    assert len(got) == 1, [c.kind for c in got]
    return got[0]


# --- each rule on the fault it names, and silent on the healthy neighbour ------------------------------------------

def case_init_hang() -> None:
    """Ranks 0-2 entered init_process_group (world 4) and never returned; rank 3 never called it."""
    rows = [r for k in range(3) for r in call(k, "init_process_group", 0, category="init", returned=False,
                                              group="default")]
    c = one(init_rule.init_hang, model(rows, world=4))
    assert (c.kind, c.culprits, c.waiting, c.operation.name) == ("init_hang", (3,), (0, 1, 2), "init_process_group")
    healthy = [r for k in range(4) for r in call(k, "init_process_group", 0, category="init", group="default")]
    assert init_rule.init_hang(model(healthy, world=4)) == []


def case_nccl_init_hang() -> None:
    """NCCL logs: ranks 0-3 of comm 0xab printed Init START, only 0-2 Init COMPLETE."""
    starts = [obs("nccl_init_start", r, group="0xab", value=4, source="nccl") for r in range(4)]
    done = [obs("nccl_init_complete", r, group="0xab", source="nccl") for r in range(3)]
    c = one(init_rule.nccl_init_hang, model(observations=starts + done))
    assert (c.kind, c.culprits, c.waiting) == ("init_hang", (3,), (0, 1, 2))
    all_done = starts + done + [obs("nccl_init_complete", 3, group="0xab", source="nccl")]
    assert init_rule.nccl_init_hang(model(observations=all_done)) == []


def case_enqueued_then_sync() -> None:
    """Both ranks' last all_reduce is a NCCL one that returned (enqueued, never seen complete); both now wait in
    torch.cuda.synchronize: the collective hangs on the GPU."""
    rows = steps((0, 1), 3, backend="nccl", completed=True, ranks=(0, 1))
    rows = [r for r in rows if not (r["seq"] == 3 and r["kind"] == "complete")]
    rows += [r for k in (0, 1) for r in call(k, "cuda_synchronize", 0, category="sync", returned=False,
                                             group="sync", t=9_000_000 + k)]
    c = one(serving_rule.enqueued_then_sync, model(rows, world=2))
    assert (c.kind, c.culprits, c.waiting, c.operation.name, c.operation.seq) == (
        "stuck_in_collective", (), (0, 1), "all_reduce", 3)
    gloo = [{**r, "backend": "gloo"} for r in rows]  # a gloo exit is completion: nothing was merely enqueued
    assert serving_rule.enqueued_then_sync(model(gloo, world=2)) == []


def case_setup_step() -> None:
    """Both ranks inside custom_all_reduce_init (a profile's set-up step), nothing below it, no edge."""
    rows = [r for k in (0, 1) for r in call(k, "custom_all_reduce_init", 0, category="init", returned=False,
                                            group="tp")]
    c = one(serving_rule.setup_step, model(rows, world=2))
    assert (c.kind, c.culprits, c.waiting, c.operation.name) == ("init_hang", (), (0, 1), "custom_all_reduce_init")
    only_one = [r for r in rows if r["rank"] == 0] + call(1, "custom_all_reduce_init", 0, category="init", group="tp")
    assert serving_rule.setup_step(model(only_one, world=2)) == []


def case_graph_capture() -> None:
    """Rank 1 is still inside cuda_graph_capture; rank 0 finished its capture (world 2)."""
    rows = call(0, "cuda_graph_capture", 0, category="graph", group="g") + \
        call(1, "cuda_graph_capture", 0, category="graph", group="g", returned=False)
    c = one(graph_rule.graph_capture, model(rows, world=2))
    assert (c.kind, c.culprits) == ("graph_capture", (1,))
    done = call(0, "cuda_graph_capture", 0, category="graph", group="g") + \
        call(1, "cuda_graph_capture", 0, category="graph", group="g")
    assert graph_rule.graph_capture(model(done, world=2)) == []


def case_mismatch() -> None:
    """At seq 3 ranks 0-2 issued all_reduce and rank 3 broadcast, none returned."""
    rows = steps(range(4), 2) + [r for k in range(3) for r in call(k, "all_reduce", 3, returned=False)]
    rows += call(3, "broadcast", 3, returned=False)
    c = one(waiting_rule.mismatch, model(rows, world=4))
    assert (c.kind, c.culprits, c.waiting) == ("collective_mismatch", (3,), (0, 1, 2))
    assert waiting_rule.mismatch(model(steps(range(4), 3), world=4)) == []


def case_stated_mismatch() -> None:
    """torchfrtrace printed 'culprit rank 2' for a mismatch at all_reduce seq 7."""
    rows = [obs("fr_culprit", 2, name="all_reduce", value=7, group="0", source="fr_text")]
    c = one(statement_rule.stated_mismatch, model(observations=rows))
    assert (c.kind, c.culprits, c.operation.seq) == ("collective_mismatch", (2,), 7)
    assert statement_rule.stated_mismatch(model(observations=[obs("progress", 0, name="step")])) == []


def case_stated_missing() -> None:
    """Horovod's stall inspector: 'Missing ranks: 3' for an all_reduce ranks 0-2 submitted."""
    rows = [obs("missing_rank", 3, name="all_reduce", detail="Missing ranks: 3", source="horovod")]
    c = one(statement_rule.stated_missing, model(observations=rows, world=4))
    assert (c.kind, c.culprits) == ("missing_ranks", (3,))
    assert statement_rule.stated_missing(model(observations=[obs("progress", 0, name="step")])) == []


def case_waiting() -> None:
    """Ranks 0-2 are inside all_reduce seq 5 (gloo, never returned); rank 3 stopped after seq 4."""
    rows = steps(range(4), 4) + [r for k in range(3) for r in call(k, "all_reduce", 5, returned=False)]
    c = one(waiting_rule.waiting, model(rows, world=4))
    assert (c.kind, c.culprits, c.waiting, c.operation.name, c.operation.seq) == (
        "missing_ranks", (3,), (0, 1, 2), "all_reduce", 5)
    assert waiting_rule.waiting(model(steps(range(4), 5), world=4)) == []


def case_cannot_run() -> None:
    """/proc says rank 1 is stopped (T); rank 0 waits in an all_reduce."""
    st = [stack(0, IN_ALL_REDUCE), stack(1, IN_QUEUE, state="stopped")]
    c = one(host_wait_rule.cannot_run, model(stacks=st, world=2))
    assert (c.kind, c.culprits, c.waiting) == ("blocked_outside_collective", (1,), (0,))
    assert host_wait_rule.cannot_run(model(stacks=[stack(0, IN_ALL_REDUCE), stack(1, IN_QUEUE)], world=2)) == []


def case_init_failure() -> None:
    """An init_failure statement (NCCL's bootstrap could not connect) on rank 1, before any collective ran."""
    rows = [obs("init_failure", 1, name="bootstrap", detail="NCCL WARN Bootstrap : no socket interface found",
                source="nccl")]
    c = one(failure_rule.init_failure, model(observations=rows, world=2))
    assert (c.kind, c.culprits, c.waiting) == ("init_hang", (), (1,))
    assert failure_rule.init_failure(model(observations=[obs("progress", 0, name="step")])) == []


def case_rank_exit() -> None:
    """A launcher says rank 2 exited with status 1 (not a watchdog abort) while ranks 0, 1, 3 wait in seq 4."""
    rows = steps(range(4), 3) + [r for k in (0, 1, 3) for r in call(k, "all_reduce", 4, returned=False)]
    exits = [obs("rank_exit", 2, name="exit", value=1, detail="local_rank: 2 (pid: 102) exitcode: 1",
                 source="torch_elastic")]
    c = one(failure_rule.rank_exit, model(rows, exits, world=4))
    assert (c.kind, c.culprits, c.waiting) == ("rank_exited", (2,), (0, 1, 3))
    torn = [obs("rank_exit", 2, name="signal", value=6, detail="Watchdog caught collective operation timeout",
                source="torch_elastic")]
    assert failure_rule.rank_exit(model(rows, torn, world=4)) == []  # an abort by the watchdog is a consequence


def case_vanished_first() -> None:
    """Our own traced run: rank 1's process was last sampled 20 s before rank 0's, with no exit record."""
    host = HostRun(host_dir=__import__("pathlib").Path("/nonexistent/run/h"), meta={"exit": None, "pids": {}},
                   ended=False)
    samples = [obs("proc_memory", 0, name="rss", wall_ns=WALL0 + s * 10**9, source="proc") for s in range(0, 40, 2)]
    samples += [obs("proc_memory", 1, name="rss", wall_ns=WALL0 + s * 10**9, source="proc") for s in range(0, 20, 2)]
    c = one(failure_rule.vanished_first, model(observations=samples, stacks=[stack(0, IN_ALL_REDUCE)], world=2,
                                               hosts=[host]))
    assert (c.kind, c.culprits, c.waiting) == ("rank_exited", (1,), (0,))
    together = [o for o in samples if o["rank"] == 0 and o["wall_ns"] < WALL0 + 20 * 10**9] + \
        [o for o in samples if o["rank"] == 1]
    assert failure_rule.vanished_first(model(observations=together, world=2, hosts=[host])) == []


def _timeouts(name: str, shape: str | None, ranks: tuple[int, ...]) -> list[dict[str, Any]]:
    """Watchdog timeout lines of `ranks` (they carry the op, seq and NumelIn, never the group's members)."""
    return [r for k in ranks for r in call(k, name, 9, backend="nccl", source="watchdog", shape=shape, ranks=None,
                                           error="Watchdog caught collective operation timeout")]


def case_barrier_timeout() -> None:
    """Watchdog lines alone (no world size): ranks 1-3 timed out in a 1-element all_reduce (a barrier, NumelIn=1);
    rank 0, seen only in a progress line, reported nothing: rank-0-only work keeps it from the barrier."""
    rows = _timeouts("all_reduce", "[1]", (1, 2, 3))
    c = one(watchdog_rule.barrier_timeout, model(rows, [obs("progress", 0, name="step", detail="map 40%")]))
    assert (c.kind, c.culprits, c.waiting) == ("missing_ranks", (0,), (1, 2, 3))
    big = _timeouts("all_reduce", "[1048576]", (1, 2, 3))  # a real all_reduce: not a barrier
    assert watchdog_rule.barrier_timeout(model(big)) == []
    unseen = one(watchdog_rule.barrier_timeout, model(rows))  # rank 0 appears nowhere: a suspect, never a culprit
    assert unseen.culprits == () and "suspect" in " ".join(f.summary for f in unseen.findings)


def case_stuck() -> None:
    """Every member issued all_reduce seq 2 (NCCL, returned = enqueued) and none completed it."""
    rows = steps((0, 1), 1, backend="nccl", completed=True, ranks=(0, 1)) + \
        [r for k in (0, 1) for r in call(k, "all_reduce", 2, backend="nccl", returned=False, ranks=(0, 1))]
    c = one(waiting_rule.stuck, model(rows, world=2))
    assert (c.kind, c.culprits, c.waiting, c.operation.seq) == ("stuck_in_collective", (), (0, 1), 2)
    assert waiting_rule.stuck(model(steps((0, 1), 2, ranks=(0, 1)), world=2)) == []


def case_reported_timeouts() -> None:
    """Old watchdog lines: ranks 0 and 1 timed out in a large all_reduce, no sequence number to align."""
    rows = [r for k in (0, 1) for r in call(k, "all_reduce", 0, backend="nccl", source="watchdog", shape="[4096]",
                                            error="Watchdog caught collective operation timeout")]
    for r in rows:
        r["seq"] = None
    c = one(watchdog_rule.reported_timeouts, model(rows))
    assert (c.kind, c.waiting, c.operation.name) == ("stuck_in_collective", (0, 1), "all_reduce")
    assert watchdog_rule.reported_timeouts(model(steps((0, 1), 2, ranks=(0, 1)))) == []


def case_gloo_timeout() -> None:
    """gloo on rank 0: 'Timed out waiting 30000ms for recv operation to complete'."""
    rows = [obs("transport_error", 0, name="gloo_timeout", source="torch_errors",
                detail="Timed out waiting 30000ms for recv operation to complete")]
    c = one(watchdog_rule.gloo_timeout, model(observations=rows))
    assert (c.kind, c.culprits, c.waiting) == ("missing_ranks", (), (0,))
    closed = [obs("transport_error", 0, name="connection_closed", detail="Connection closed by peer")]
    assert watchdog_rule.gloo_timeout(model(observations=closed)) == []


def case_lock_wait() -> None:
    """Both ranks' stacks sit in torch's FileBaton.wait (a cpp_extension build lock), nothing collective pending."""
    baton = ("wait (torch/utils/file_baton.py:42)", "FileBaton.wait (torch/utils/file_baton.py:42)",
             "_jit_compile (torch/utils/cpp_extension.py:1700)")
    c = one(host_wait_rule.lock_wait, model(stacks=[stack(0, baton), stack(1, baton)], world=2))
    assert (c.kind, c.culprits, c.operation.name) == ("blocked_outside_collective", (0, 1), "file_lock")
    assert host_wait_rule.lock_wait(model(stacks=[stack(0, IN_QUEUE), stack(1, IN_QUEUE)], world=2)) == []


def case_stacks_only() -> None:
    """py-spy dumps only: ranks 0-2 inside all_reduce, rank 3 in a data loader's queue get."""
    st = [stack(k, IN_ALL_REDUCE) for k in range(3)] + [stack(3, IN_QUEUE)]
    c = one(stacks_rule.stacks_only, model(stacks=st, world=4))
    assert (c.kind, c.culprits, c.waiting, c.operation.name) == ("missing_ranks", (3,), (0, 1, 2), "all_reduce")
    assert stacks_rule.stacks_only(model(stacks=[stack(k, IN_QUEUE) for k in range(4)], world=4)) == []


def case_anonymous_stacks() -> None:
    """One py-spy paste of a process whose rank nothing states, blocked in all_reduce."""
    c = one(stacks_rule.anonymous_stacks, model(stacks=[stack(None, IN_ALL_REDUCE, pid=4242)]))
    assert (c.kind, c.culprits, c.operation.name) == ("stuck_in_collective", (), "all_reduce")
    ranked = [stack(0, IN_ALL_REDUCE)]
    assert stacks_rule.anonymous_stacks(model(stacks=ranked)) == []  # ranked stacks are stacks_only's


def case_blocked_outside() -> None:
    """Every rank waits in queue.get and no collective is pending."""
    c = one(blocked_rule.blocked_outside, model(stacks=[stack(k, IN_QUEUE) for k in range(2)], world=2))
    assert (c.kind, c.culprits, c.waiting) == ("blocked_outside_collective", (0, 1), ())
    running = [stack(k, ("forward (model.py:12)",), state="active") for k in range(2)]
    assert blocked_rule.blocked_outside(model(stacks=running, world=2)) == []


def case_startup_stall() -> None:
    """A server log that reached 'Init torch distributed begin' on TP0 and TP1 and printed nothing after it."""
    marks = [{"rank": k, "name": "dist_init_begin", "kind": "mark", "source": "server_log", "file": "server.log",
              "line": 10 + k, "detail": "Init torch distributed begin."} for k in (0, 1)]
    c = one(startup_rule.startup_stall, model(marks))
    assert (c.kind, c.waiting, c.operation.name) == ("init_hang", (0, 1), "init_process_group")
    later = marks + [{**marks[0], "name": "load_weights_begin", "line": 30}, {**marks[0], "name": "serving",
                                                                               "line": 40}]
    assert startup_rule.startup_stall(model(later)) == []


CASES: dict[str, Callable[[], None]] = {
    "init_hang": case_init_hang, "nccl_init_hang": case_nccl_init_hang, "enqueued_then_sync": case_enqueued_then_sync,
    "setup_step": case_setup_step, "graph_capture": case_graph_capture, "mismatch": case_mismatch,
    "stated_mismatch": case_stated_mismatch, "stated_missing": case_stated_missing, "waiting": case_waiting,
    "cannot_run": case_cannot_run, "init_failure": case_init_failure, "rank_exit": case_rank_exit,
    "vanished_first": case_vanished_first, "barrier_timeout": case_barrier_timeout, "stuck": case_stuck,
    "reported_timeouts": case_reported_timeouts, "gloo_timeout": case_gloo_timeout, "lock_wait": case_lock_wait,
    "stacks_only": case_stacks_only, "anonymous_stacks": case_anonymous_stacks, "blocked_outside": case_blocked_outside,
    "startup_stall": case_startup_stall,
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_names_its_fault_and_stays_silent_on_the_healthy_neighbour(rule: str) -> None:
    CASES[rule]()


def test_every_rule_has_a_case() -> None:
    assert sorted(r.__name__ for r in RULES) == sorted(CASES)
