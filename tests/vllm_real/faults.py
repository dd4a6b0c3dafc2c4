"""Fault injection of the real-vLLM tests (issue #24), never part of ranktrace and never touching it.

setup_env.py copies this file into the vLLM environment's site-packages as `ranktrace_test_vllm_faults` and adds a
`.pth` line that imports it in every Python process of that environment. Without RANKTRACE_TEST_VLLM_FAULT it does
nothing at all. With it, one vLLM function is patched in the worker of rank RANKTRACE_TEST_VLLM_FAULT_RANK (default
1) right after its module executes (a meta-path finder of our own), so that rank hangs or dies there for real:

  before-dist-init   CPUWorker.init_device blocks before init_worker_distributed_environment (rank 0 then waits in
                     torch.distributed's rendezvous)
  shm-setup          _CPUSHMDistributed._init_cpu_shm blocks before its first collective (the CPU shared-memory
                     all-reduce set-up; rank 0 waits in its gloo all_reduce)
  memory-profiling   get_memory_node_info, called inside CPUWorker.determine_available_memory, blocks
  first-request-ar   tensor_model_parallel_all_reduce blocks once this rank executes a model step with tokens
                     scheduled (the first request) — or, with RANKTRACE_TEST_VLLM_FAULT_ARM=PATH, the first request
                     after the file PATH exists (the server serves healthy until then): rank 0 spins in
                     torch.ops._C.shm_allreduce waiting for it
  in-shm-allreduce   _CPUSHMDistributed.all_reduce (under CpuCommunicator.all_reduce, under the hooked
                     GroupCoordinator._all_reduce_out_place) blocks on the first request, before calling
                     torch.ops._C.shm_allreduce: both ranks are inside the TP all-reduce, rank 0 spins in the C op
  sleep-in-allreduce torch.ops._C.shm_allreduce's caller sleeps forever in a time.sleep loop on the first request
                     (a rank that never finishes its own work inside the collective)
  in-shm-allgather   _CPUSHMDistributed.all_gather_into_tensor (the logits all-gather: LogitsProcessor ->
                     GroupCoordinator._all_gather_out_place -> CpuCommunicator.all_gather) blocks on the first
                     request: rank 0 spins in torch.ops._C.shm_all_gather
  kill-loading       get_model (weight loading in CPUModelRunner.load_model) SIGKILLs its own process

"Blocks" is a plain threading.Event().wait(): a thread parked in a lock, as a real lost wake-up would be.
"""
from __future__ import annotations

import os
import sys

FAULT = os.environ.get("RANKTRACE_TEST_VLLM_FAULT", "")
RANK = int(os.environ.get("RANKTRACE_TEST_VLLM_FAULT_RANK", "1") or 1)
ARM = os.environ.get("RANKTRACE_TEST_VLLM_FAULT_ARM", "")
_armed = [False]


def _block(where: str) -> None:
    import threading

    sys.stderr.write(f"[test-fault] rank {RANK} blocks in {where} (pid {os.getpid()})\n")
    sys.stderr.flush()
    threading.Event().wait()


def _dist_rank() -> int | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
    except Exception:
        pass
    return None


def _patch_init_device(mod) -> None:
    cls = mod.CPUWorker
    orig = cls.init_device

    def init_device(self, *a, **kw):
        if self.rank == RANK:
            _block("CPUWorker.init_device, before torch.distributed init")
        return orig(self, *a, **kw)

    cls.init_device = init_device


def _patch_shm(mod) -> None:
    cls = mod._CPUSHMDistributed
    orig = cls._init_cpu_shm

    def _init_cpu_shm(self, *a, **kw):
        if self.communicator.rank == RANK:
            _block("_CPUSHMDistributed._init_cpu_shm")
        return orig(self, *a, **kw)

    cls._init_cpu_shm = _init_cpu_shm


def _patch_memory(mod) -> None:
    orig = mod.get_memory_node_info

    def get_memory_node_info(*a, **kw):
        if _dist_rank() == RANK:
            _block("get_memory_node_info (CPUWorker.determine_available_memory)")
        return orig(*a, **kw)

    mod.get_memory_node_info = get_memory_node_info


def _patch_comm_op(mod) -> None:
    orig = mod.tensor_model_parallel_all_reduce

    def tensor_model_parallel_all_reduce(*a, **kw):
        if _armed[0] and _dist_rank() == RANK:
            _block("tensor_model_parallel_all_reduce (first request)")
        return orig(*a, **kw)

    mod.tensor_model_parallel_all_reduce = tensor_model_parallel_all_reduce


def _patch_shm_allreduce(mod) -> None:
    cls = mod._CPUSHMDistributed
    orig = cls.all_reduce

    def all_reduce(self, *a, **kw):
        if _armed[0] and self.communicator.rank == RANK:
            _block("_CPUSHMDistributed.all_reduce (first request)")
        return orig(self, *a, **kw)

    cls.all_reduce = all_reduce


def _sleep_forever(where: str) -> None:
    import time

    sys.stderr.write(f"[test-fault] rank {RANK} sleeps forever in {where} (pid {os.getpid()})\n")
    sys.stderr.flush()
    while True:
        time.sleep(0.05)


def _patch_shm_allreduce_sleep(mod) -> None:
    cls = mod._CPUSHMDistributed

    def all_reduce(self, input, group=None):
        if _armed[0] and self.communicator.rank == RANK:
            _sleep_forever("_CPUSHMDistributed.all_reduce, instead of torch.ops._C.shm_allreduce (first request)")
        mod.torch.ops._C.shm_allreduce(self.handle, input)

    cls.all_reduce = all_reduce


def _patch_shm_allgather(mod) -> None:
    cls = mod._CPUSHMDistributed
    orig = cls.all_gather_into_tensor

    def all_gather_into_tensor(self, *a, **kw):
        if _armed[0] and self.communicator.rank == RANK:
            _block("_CPUSHMDistributed.all_gather_into_tensor (first request)")
        return orig(self, *a, **kw)

    cls.all_gather_into_tensor = all_gather_into_tensor


def _patch_execute(mod) -> None:
    cls = mod.Worker
    orig = cls.execute_model

    def execute_model(self, scheduler_output, *a, **kw):
        if getattr(scheduler_output, "total_num_scheduled_tokens", 0) and (not ARM or os.path.exists(ARM)):
            _armed[0] = True
        return orig(self, scheduler_output, *a, **kw)

    cls.execute_model = execute_model


def _patch_get_model(mod) -> None:
    orig = mod.get_model

    def get_model(*a, **kw):
        if _dist_rank() == RANK:
            import signal

            sys.stderr.write(f"[test-fault] rank {RANK} SIGKILLs itself while loading weights (pid {os.getpid()})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return orig(*a, **kw)

    mod.get_model = get_model


PLANS = {
    "before-dist-init": {"vllm.v1.worker.cpu_worker": _patch_init_device},
    "shm-setup": {"vllm.distributed.device_communicators.cpu_communicator": _patch_shm},
    "memory-profiling": {"vllm.v1.worker.cpu_worker": _patch_memory},
    "first-request-ar": {"vllm.distributed.communication_op": _patch_comm_op,
                         "vllm.v1.worker.gpu_worker": _patch_execute},
    "in-shm-allreduce": {"vllm.distributed.device_communicators.cpu_communicator": _patch_shm_allreduce,
                         "vllm.v1.worker.gpu_worker": _patch_execute},
    "sleep-in-allreduce": {"vllm.distributed.device_communicators.cpu_communicator": _patch_shm_allreduce_sleep,
                           "vllm.v1.worker.gpu_worker": _patch_execute},
    "in-shm-allgather": {"vllm.distributed.device_communicators.cpu_communicator": _patch_shm_allgather,
                         "vllm.v1.worker.gpu_worker": _patch_execute},
    "kill-loading": {"vllm.v1.worker.cpu_model_runner": _patch_get_model},
}


class _Finder:
    """Runs a patch right after its module executed (the import itself is the real one)."""

    def __init__(self, plan: dict) -> None:
        self.plan = dict(plan)

    def find_spec(self, name, path=None, target=None):
        if name not in self.plan:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        patch, loader = self.plan.pop(name), spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


if FAULT:
    if FAULT not in PLANS:
        sys.stderr.write(f"[test-fault] unknown RANKTRACE_TEST_VLLM_FAULT={FAULT!r}\n")
    else:
        sys.meta_path.insert(0, _Finder(PLANS[FAULT]))
