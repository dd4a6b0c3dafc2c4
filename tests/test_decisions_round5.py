"""#25, decision layer round 5: what a person reads in the verdict when the inputs are a traceback, a statement that
names its rank, several stuck groups at once.

Each case is a small input of the shape the field shows (the factory rows of tests/test_rule_units.py, or a log
written as the servers write it) and the assertion is what the on-call person checks: the headline kind, the culprit,
the operation, and that no line says "rank -1" or "thread ?".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ranktrace.analyzers.api import analyze
from ranktrace.analyzers.diagnose import stacks_rule, waiting_rule
from tests.test_rule_units import IN_ALL_REDUCE, call, model, obs, stack

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO / "tests" / "field"


def _verdict(paths: list[Path]) -> dict:
    return json.loads(json.dumps(analyze(paths, liveness=None).verdict.to_dict()))


def _all_text(v: dict) -> str:
    return json.dumps(v)


# --- an exception's traceback is not a live stack ------------------------------------------------------------------

def test_an_exceptions_traceback_is_not_read_as_where_a_live_process_waits(tmp_path: Path) -> None:
    """A server's console ends in a traceback raised in its own start-up code (no rank, no collective): the process
    raised and went away; nothing says it is "busy outside collectives" there."""
    log = tmp_path / "console.txt"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/srv/app/launch.py", line 40, in <module>\n'
        "    main()\n"
        '  File "/srv/app/launch.py", line 31, in main\n'
        "    engine = build_engine(cfg)\n"
        '  File "/srv/app/engine.py", line 88, in build_engine\n'
        "    raise ValueError(\"max_model_len is larger than the KV cache\")\n"
        "ValueError: max_model_len is larger than the KV cache\n")
    v = _verdict([log])
    assert v["kind"] != "blocked_outside_collective", v["summary"]
    assert "busy outside collectives" not in v["summary"]
    assert v["culprit_ranks"] == []


def test_a_traceback_raised_inside_a_collective_still_says_where_it_waited() -> None:
    """A timeout raised inside all_reduce (no rank stated): that traceback does say where the process waited."""
    raised = stack(None, IN_ALL_REDUCE, state="exception", pid=4242, source="traceback")
    (c,) = stacks_rule.anonymous_stacks(model(stacks=[raised]))
    assert c.operation.name == "all_reduce"
    plain = stack(None, ("build_engine (app/engine.py:88)", "main (app/launch.py:31)"), state="exception", pid=4242,
                  source="traceback")
    assert stacks_rule.anonymous_stacks(model(stacks=[plain])) == []


def test_a_process_dumped_with_no_rank_is_named_by_its_pid_never_as_rank_minus_one() -> None:
    dumped = stack(None, IN_ALL_REDUCE, pid=4242)
    (c,) = stacks_rule.anonymous_stacks(model(stacks=[dumped]))
    lines = [e for f in c.findings for e in f.evidence]
    assert lines and all(e.rank is None for e in lines)
    assert "pid 4242" in lines[0].detail and "?" not in lines[0].detail
    v = _verdict([FIELD / "marin-7344" / "pyspy.txt"])  # a real paste: two processes, no ranks stated
    text = _all_text(v)
    assert "rank -1" not in text and '"rank": -1' not in text and "thread ?" not in text


# --- the rank a statement names ------------------------------------------------------------------------------------

SGLANG_CONFIGURED = (
    "[2025-08-28 21:10:00 DP10 TP10 EP10] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=20.00 GB, mem usage=50.00 GB.\n"
    "[2025-08-28 21:10:00 DP3 TP3 EP3] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=20.00 GB, mem usage=50.00 GB.\n"
    "2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655] Scheduler hit an exception: "
    "Traceback (most recent call last):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2650, in run_scheduler_process\n'
    "    scheduler.event_loop_overlap()\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n")


def test_the_rank_sglangs_configured_logger_names_is_the_culprit_with_its_exception(tmp_path: Path) -> None:
    """SGLang's own logging config writes `2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655]`
    (the prefix as a public thread quotes it, #26): the line names TP rank 10, so rank 10 is the culprit, and the
    exception its traceback goes on to print is in the headline."""
    log = tmp_path / "server.log"
    log.write_text(SGLANG_CONFIGURED)
    v = _verdict([log])
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("crashed", "rank_exited", [10]), v["summary"]
    assert "RuntimeError: CUDA error: an illegal memory access" in v["summary"]
    # the same statement with its logger's stamp kept by a collector in front still names the rank
    stamped = tmp_path / "stamped.log"
    stamped.write_text("".join(f"2025-08-28T21:19:40.000000Z {ln}\n" for ln in SGLANG_CONFIGURED.splitlines()))
    assert _verdict([stamped])["culprit_ranks"] == [10]


# --- several stuck groups: the first stall leads -------------------------------------------------------------------

def _stuck_on(group: str, name: str, seq: int, ranks: tuple[int, ...], t: int) -> list[dict]:
    return [r for k in ranks for r in call(k, name, seq, group=group, backend="nccl", returned=False, ranks=ranks,
                                           t=t + k)]


def test_of_several_stuck_groups_the_one_issued_first_leads_whatever_its_name() -> None:
    """Group "a" stuck in all_reduce issued at t=9 ms, group "z" in all_to_all issued at t=2 ms: z stalled first."""
    rows = _stuck_on("a", "all_reduce", 5, (0, 1), 9_000_000) + _stuck_on("z", "all_to_all", 3, (2, 3), 2_000_000)
    got = waiting_rule.stuck(model(rows, world=4))
    assert [c.operation.group for c in got] == ["z", "a"]
    swapped = _stuck_on("a", "all_reduce", 5, (0, 1), 2_000_000) + _stuck_on("z", "all_to_all", 3, (2, 3), 9_000_000)
    assert [c.operation.group for c in waiting_rule.stuck(model(swapped, world=4))] == ["a", "z"]


def test_of_several_stuck_groups_the_one_with_work_queued_behind_it_leads() -> None:
    """No times (watchdog lines of a paste): group "b"'s rank enqueued 4 works past its stuck seq 216, group "a"'s
    none past 57: b's stall is the older one, a's rank stopped issuing at it."""
    rows = [r for r in call(13, "all_to_all_single", 216, group="b", backend="nccl", returned=False, ranks=None,
                            source="watchdog")] + \
        [r for r in call(15, "all_reduce", 57, group="a", backend="nccl", returned=False, ranks=None,
                         source="watchdog")]
    for r in rows:
        r["wall_ns"] = None
    status = [obs("watchdog_pg_status", 13, group="b", detail="enqueued=220 completed=215 failed_seq=216",
                  source="watchdog"),
              obs("watchdog_pg_status", 15, group="a", detail="enqueued=57 completed=56 failed_seq=57",
                  source="watchdog")]
    got = waiting_rule.stuck(model(rows, status))
    assert [c.operation.name for c in got][:1] == ["all_to_all_single"], [c.summary for c in got]
    assert [c.operation.name for c in waiting_rule.stuck(model(rows))][:1] == ["all_reduce"]  # no evidence: names


def test_nccl_1610s_verdict_is_the_all_to_all(tmp_path: Path) -> None:
    v = _verdict(sorted((FIELD / "nccl-1610").glob("log_*.txt")))
    assert v["operation"]["name"].startswith("all_to_all"), v["summary"]
    assert v["operation"]["seq"] == 216


# --- wording ---------------------------------------------------------------------------------------------------------

def test_a_barrier_timeout_is_said_once_as_a_barrier_and_a_one_element_all_reduce_as_barrier_like() -> None:
    from ranktrace.analyzers.diagnose import watchdog_rule

    v = _verdict([FIELD / "accelerate-1317" / "pdsh_log.txt"])  # a DeepSpeed barrier() that timed out
    assert v["operation"]["name"] == "barrier" and "barrier-like barrier" not in v["summary"], v["summary"]
    rows = [r for k in (1, 2) for r in call(k, "all_reduce", 9, backend="nccl", source="watchdog", shape="[1]",
                                            ranks=None, error="Watchdog caught collective operation timeout")]
    for r in rows:
        r["seq"] = None  # an old watchdog line: no sequence number
    (c,) = watchdog_rule.reported_timeouts(model(rows))
    assert "barrier-like all_reduce (one element" in c.summary, c.summary


# --- a rank's own "Some NCCL operations have failed or timed out" -----------------------------------------------------

def test_a_rank_that_says_its_nccl_work_failed_or_timed_out_waited_and_is_never_the_missing_one() -> None:
    """sqlr1-18 (a Ray paste): rank 2's watchdog timed out in a 1-element all_reduce seq 1, and rank 0 printed
    ProcessGroupNCCL's "Some NCCL operations have failed or timed out ... taking the entire process down". Rank 0
    reported the failure too: it is among the waiting, not "the one not reporting it"."""
    v = _verdict([FIELD / "sqlr1-18" / "ray_log.txt"])
    assert v["culprit_ranks"] == [], v["summary"]
    assert 0 in v["waiting_ranks"] and 2 in v["waiting_ranks"], v["waiting_ranks"]
    assert "rank 0 is the one not reporting it" not in v["summary"]
    from ranktrace.analyzers.diagnose import watchdog_rule

    rows = [r for k in (1, 2, 3) for r in call(k, "all_reduce", 1, backend="nccl", source="watchdog", shape="[1]",
                                               ranks=None, error="Watchdog caught collective operation timeout")]
    said = obs("exception", 0, name="nccl_work_failed", source="torch_c10d",
               detail="Some NCCL operations have failed or timed out.")
    (quiet,) = watchdog_rule.barrier_timeout(model(rows, [obs("progress", 0, name="step", detail="map 40%")]))
    assert quiet.culprits == (0,)  # rank 0 seen, silent about the barrier: the usual suspect, named
    (spoke,) = watchdog_rule.barrier_timeout(model(rows, [said]))
    assert spoke.culprits == () and 0 in spoke.waiting


# --- SGLang's scheduler watchdog ends the server ---------------------------------------------------------------------

def test_sglangs_scheduler_watchdog_is_a_step_that_never_finished_and_ended_the_server(tmp_path: Path) -> None:
    """SGLang's scheduler watchdog (managers/scheduler.py, watchdog_thread) logs a forward batch still running after
    --watchdog-timeout, dumps the schedulers' stacks and sends SIGQUIT to the server: the posted log (sglang-7783,
    verbatim) shows a crash of the serving step, never "not enough evidence". The soft watchdog only logs."""
    v = _verdict([FIELD / "sglang-7783" / "server.log"])
    assert v["status"] == "crashed", v["summary"]
    assert "scheduler watchdog" in v["summary"] and "300 s" in v["summary"], v["summary"]
    assert v["culprit_ranks"] == []
    soft = tmp_path / "soft.log"
    soft.write_text("[2026-01-29 13:12:37 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, "
                    "self.soft=True)\n")
    assert _verdict([soft])["status"] != "crashed"


def test_a_stuck_op_seen_on_one_rank_never_claims_every_member_of_its_group() -> None:
    """A watchdog line of one rank (milabench-pr269-c): the group's other members are in no input, so the verdict says
    what rank 13 did, not "every member of group 0 (rank 13)", and lists no members it does not know."""
    v = _verdict([FIELD / "milabench-pr269-c" / "dinov2_rank13.txt"])
    assert "every member" not in v["summary"] and "Rank 13 is inside reduce seq 2070" in v["summary"], v["summary"]
    assert not v["operation"].get("group_ranks"), v["operation"]
    rows = [r for k in (0, 1) for r in call(k, "all_reduce", 2, backend="nccl", returned=False, ranks=(0, 1))]
    (c,) = waiting_rule.stuck(model(rows, world=2))  # the group's ranks are stated: every member it is
    assert "every member of group 0" in c.summary, c.summary


def test_a_segfault_inside_communicator_set_up_is_a_rank_that_died_not_a_set_up_that_hangs() -> None:
    """hamicore-169 (verbatim): torch's fatal-signal report of a process that segfaulted inside ncclCommInitRank
    (HAMi's cuMemCreate hook). That process died there; the verdict says a rank crashed, and where."""
    v = _verdict([FIELD / "hamicore-169" / "error.txt"])
    assert (v["status"], v["kind"]) == ("crashed", "rank_exited"), v["summary"]
    assert "segmentation fault" in v["summary"] and "ncclCommInitRank" in v["summary"], v["summary"]


# --- a stall that resolved in a run that exited 0 ---------------------------------------------------------------------

SLEEPY = r"""
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def work(rank):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
    t = torch.ones(8)
    for _ in range(20):
        dist.all_reduce(t)
    if rank == 0:
        time.sleep(float(sys.argv[1]))   # rank 0 writes a checkpoint to slow storage; rank 1 waits in the barrier
    dist.barrier()
    for _ in range(20):
        dist.all_reduce(t)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
"""


def test_a_stall_the_watchdog_caught_in_a_run_that_then_finished_is_told_as_resolved(tmp_path: Path) -> None:
    """A real 2-rank gloo job: rank 0 sleeps 10 s past --hang-after while rank 1 waits in the barrier, then both
    finish (exit 0). The live report said what it saw; the run's verdict is COMPLETED, and its findings tell the
    stall once as resolved — no missing_ranks or blocked_outside_collective finding under a COMPLETED headline."""
    import socket

    from tests.helpers import run_trace, trace_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = tmp_path / "sleepy.py"
    job.write_text(SLEEPY)
    run = tmp_path / "run"
    res = run_trace(["run", "--hang-after", "4", "-o", str(run), "--", sys.executable, str(job), "14"], timeout=180,
                    env=trace_env(PORT=str(port)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    assert "HANG" in res.stderr, res.stderr[-3000:]  # the live report while it lasted
    v = json.loads((run / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("completed", "no_hang", []), v["summary"]
    kinds = [f["kind"] for f in v["findings"]]
    assert "stall_resolved" in kinds, kinds
    from ranktrace.analyzers.arbitrate import HANG_KINDS

    assert not set(kinds) & HANG_KINDS, kinds


# --- native stacks: a host sync under its C++ name, and frames that say nothing ----------------------------------------

def test_a_gdb_stack_in_local_scalar_dense_cuda_is_a_host_sync_wait_for_the_gpu() -> None:
    """pytorch-95944 (verbatim gdb): cudaMemcpyAsync under at::native::_local_scalar_dense_cuda, an .item() waiting
    for the GPU stream: the usual signature of GPU-side collective work that never completes, never "busy outside
    collectives"."""
    from ranktrace.analyzers.model.hoststate import classify

    assert classify(("at::native::_local_scalar_dense_cuda(at::Tensor const&) (libtorch_cuda.so)",)) == \
        "host_sync_wait"
    v = _verdict([FIELD / "pytorch-95944" / "last_rank_gdb.txt"])
    assert (v["status"], v["kind"]) == ("hang", "stuck_in_collective"), v["summary"]
    assert "waits for the GPU on the host" in v["summary"], v["summary"]


def test_a_native_stack_of_interpreter_frames_only_claims_nothing_about_communication() -> None:
    """pytorch-52916 (verbatim gdb, no Python symbols): the innermost telling frame is _PyEval_EvalFrameDefault.
    Nothing says what the thread waits for, so no "no communication is involved" claim is made."""
    v = _verdict([FIELD / "pytorch-52916" / "gdb_bt.txt"])
    assert v["kind"] != "blocked_outside_collective", v["summary"]
    assert "_PyEval_EvalFrameDefault" not in v["summary"]
