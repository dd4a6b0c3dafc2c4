"""Direct unit tests of the decision engine's stages, on events made by a small factory (the style of PyTorch's
Flight Recorder analyzer tests: one event per call, a few ranks, one planted fault each), without any reader:

* the wait-for graph (analyzers/model/waitfor.py) over the ops table (analyzers/model/timeline.py): who waits on whom;
* the host-state classifier (analyzers/model/hoststate.py): what a stack says a rank is doing;
* the arbitration (analyzers/arbitrate.py): which candidate becomes the verdict, and which are set aside.

Each test states the fault in words; a wrong engine fails it (these are no snapshots of today's output).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from ranktrace.analyzers.model import hoststate, timeline, waitfor
from ranktrace.tracer.formats import schema
from ranktrace.analyzers import arbitrate
from ranktrace.analyzers.diagnose import diagnose
from ranktrace.analyzers.model.build import build_model
from ranktrace.analyzers.diagnose.candidate import Candidate
from ranktrace.analyzers.model.records import Inputs
from ranktrace.analyzers.verdict import Evidence, Finding


def call(rank: int, name: str, seq: int, *, group: str = "0", backend: str = "nccl", returned: bool = True,
         completed: bool = False, t: int | None = None, source: str = "events", category: str = "collective",
         ranks: tuple[int, ...] = (0, 1, 2, 3), peer: int | None = None) -> list[dict[str, Any]]:
    """The rows one call leaves: its enter, its exit if it returned, a complete row if the backend said so."""
    t = t if t is not None else seq * 1_000_000
    base = {"rank": rank, "pid": 100 + rank, "tid": 100 + rank, "host": "h", "name": name, "category": category,
            "group": group, "backend": backend, "group_ranks": list(ranks), "seq": seq, "t_ns": t,
            "wall_ns": 1_700_000_000_000_000_000 + t, "source": source, "file": f"rings/{100 + rank}.ring",
            "line": seq, "peer": peer, "span_id": seq}
    rows = [{**base, "kind": "enter"}]
    if returned:
        rows.append({**base, "kind": "exit", "t_ns": t + 1000, "wall_ns": base["wall_ns"] + 1000})
    if completed:
        rows.append({**base, "kind": "complete", "t_ns": t + 2000, "wall_ns": base["wall_ns"] + 2000})
    return rows


def graph_of(rows: list[dict[str, Any]], world: int = 4) -> waitfor.WaitForGraph:
    ops = timeline.build_ops(schema.table_from_rows(schema.EVENTS, rows))
    return waitfor.build_graph(ops, {"0": tuple(range(world))}, world)


def steps(ranks: range, upto: int, **kw: Any) -> list[dict[str, Any]]:
    return [r for rank in ranks for seq in range(1, upto + 1) for r in call(rank, "all_reduce", seq, **kw)]


# --- the wait-for graph ------------------------------------------------------------------------------------------

def test_ranks_in_a_collective_another_rank_never_issued_wait_on_it() -> None:
    """Ranks 0-2 issued all_reduce seq 5; rank 3 stopped after seq 4: every edge points at rank 3."""
    rows = steps(range(4), 4) + [r for rank in range(3) for r in call(rank, "all_reduce", 5, returned=False)]
    g = graph_of(rows)
    assert {(e.waiter, e.waits_on) for e in g.edges} == {(0, 3), (1, 3), (2, 3)}
    assert {e.op.seq for e in g.edges} == {5} and not g.mismatches


def test_different_collectives_at_one_position_are_a_mismatch() -> None:
    """At seq 5 rank 3 calls broadcast where ranks 0-2 call all_reduce."""
    rows = steps(range(4), 4) + [r for rank in range(3) for r in call(rank, "all_reduce", 5, returned=False)] \
        + call(3, "broadcast", 5, returned=False)
    g = graph_of(rows)
    assert g.mismatches, g
    names = {o.rank: o.name for m in g.mismatches for o in m.ops}
    assert names[3] == "broadcast" and names[0] == "all_reduce"


def test_every_rank_inside_one_nccl_collective_is_stuck_not_missing() -> None:
    """All four issued seq 5 on NCCL and none has a completion: nobody is missing, the op is stuck below Python."""
    rows = steps(range(4), 4) + [r for rank in range(4) for r in call(rank, "all_reduce", 5, returned=False)]
    g = graph_of(rows)
    assert not g.edges and [s.seq for s in g.stuck] == [5]
    assert set(g.stuck[0].not_completed) == {0, 1, 2, 3}


def test_gloo_returned_means_finished_but_nccl_returned_means_enqueued() -> None:
    """gloo returns once the collective is done (DESIGN §2); NCCL returns once it is enqueued."""
    gloo = timeline.build_ops(schema.table_from_rows(schema.EVENTS, call(0, "all_reduce", 1, backend="gloo")))
    nccl = timeline.build_ops(schema.table_from_rows(schema.EVENTS, call(0, "all_reduce", 1, backend="nccl")))
    assert gloo["completed"].to_pylist() == [True] and nccl["completed"].to_pylist() == [False]


def test_a_later_op_on_a_channel_shows_the_earlier_one_finished() -> None:
    """An NCCL op never says it completed; the next one on the same channel of the same rank says it did."""
    ops = timeline.build_ops(schema.table_from_rows(schema.EVENTS, steps(range(1), 3)))
    assert ops.sort_by("seq")["completed"].to_pylist() == [True, True, False]


# --- the host-state classifier ----------------------------------------------------------------------------------

def test_host_states_from_stacks() -> None:
    c = hoststate.classify
    assert c(("all_reduce (torch/distributed/distributed_c10d.py:3252)", "train_step (train.py:88)"), "idle") \
        == "in_collective"
    assert c(("get (queue.py:180)", "next_batch (train.py:40)"), "idle") == "blocked_other"
    assert c(("synchronize (torch/cuda/__init__.py:985)", "step (train.py:9)"), "idle") == "host_sync_wait"
    assert c(("forward (model.py:12)",), "active") == "running"
    assert c(("get (queue.py:180)",), "stopped") == "stopped"   # /proc T wins over what the stack says


# --- the arbitration ---------------------------------------------------------------------------------------------

def context_of(rows: list[dict[str, Any]], observations: list[dict[str, Any]] = ()) -> Any:
    inputs = Inputs(events=schema.table_from_rows(schema.EVENTS, rows), stacks=schema.empty(schema.STACKS),
                    observations=schema.table_from_rows(schema.OBSERVATIONS, observations))
    return build_model(inputs, None)


def cand(kind: str, source: str, culprits: tuple[int, ...] = (), waiting: tuple[int, ...] = (),
         rank: int | None = None) -> Candidate:
    return Candidate(kind, f"{kind} from {source}", culprits=culprits, waiting=waiting,
                     findings=[Finding(kind, f"{kind} from {source}", culprits, 0.6,
                                       (Evidence(source, "f.log", 1, "issued, not completed", rank),))])


def test_our_own_records_outrank_an_earlier_rule_resting_on_log_lines() -> None:
    ctx = context_of(steps(range(4), 2))
    weak = cand("stuck_in_collective", "nccl", waiting=(0, 1, 2, 3))
    strong = cand("missing_ranks", "events", culprits=(3,), waiting=(0, 1, 2), rank=3)
    d = arbitrate.arbitrate(ctx, [weak, strong])
    assert d.primary is strong
    same_tier = cand("missing_ranks", "watchdog", culprits=(3,), waiting=(0, 1, 2), rank=3)
    assert arbitrate.arbitrate(ctx, [weak, same_tier]).primary is weak  # within a tier the rules' order stands


def test_a_culprit_no_input_mentions_is_not_blamed() -> None:
    ctx = context_of(steps(range(3), 2))           # ranks 0-2 appear; rank 7 appears nowhere
    c = cand("missing_ranks", "watchdog", culprits=(7,), waiting=(0, 1, 2))
    d = arbitrate.arbitrate(ctx, [c])
    assert d.primary is not None and d.primary.culprits == ()
    assert any(n.kind == "unwitnessed_culprits" and n.ranks == (7,) for n in d.notes)


def test_completion_afterwards_vetoes_a_stuck_claim_from_issue_only_lines() -> None:
    done = [{"rank": r, "kind": "completion", "name": "nccl_destroy", "detail": f"comm 0x1 rank {r} nranks 2 - "
             "Destroy COMPLETE", "source": "nccl", "file": "nccl.log", "line": 900 + r} for r in (0, 1)]
    ctx = context_of([], done)
    c = cand("stuck_in_collective", "nccl", waiting=(0, 1))
    d = arbitrate.arbitrate(ctx, [c])
    assert d.primary is None and [n.kind for n in d.notes] == ["completed_after"]
    v = diagnose(ctx)
    assert v.status == "completed" and v.kind == "no_hang"


def test_one_hang_is_told_once() -> None:
    ctx = context_of(steps(range(4), 2))
    main = cand("missing_ranks", "events", culprits=(3,), waiting=(0, 1, 2), rank=3)
    rival = cand("rank_exited", "traceback", culprits=(2,), rank=2)
    again = cand("missing_ranks", "events", culprits=(3,), waiting=(0, 1, 2), rank=3)
    d = arbitrate.arbitrate(ctx, [main, rival, again])
    kinds = [(f.kind, f.ranks) for f in d.findings([main, rival, again])]
    assert kinds == [("missing_ranks", (3,))]


def test_strength_table_puts_own_records_and_hang_time_stacks_first() -> None:
    s = arbitrate.STRENGTH
    assert s["events"] == s["pyspy"] == s["agent"] == max(s.values())
    assert s["events"] > s["fr"] > s["nccl"] and s["fr"] > s["watchdog"]


def test_factory_rows_fit_the_events_schema() -> None:
    t = schema.table_from_rows(schema.EVENTS, call(0, "all_reduce", 1))
    assert isinstance(t, pa.Table) and t.num_rows == 2 and t.schema == schema.EVENTS
