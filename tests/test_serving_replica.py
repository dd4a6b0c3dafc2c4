"""Issue #14 on a real job: an SGLang-style TP4 start-up (examples/replica, at SGLang's real module paths) run under
`trace run` with NO --hook: the shipped sglang profile is picked from the command and every verdict below comes
from what it records, the job's own output and the stacks.

Each scenario plants one hang with the replica's --fault; --on-hang kill ends it (the replica's timeouts are far
beyond the test), so a wrong verdict fails fast instead of hanging. All scenarios run once, up front, two at a time
(most of each is the wait for --hang-after), the 30 s JIT start-up first; every test reads the run it needs.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, meta, run_trace, trace_env

REPLICA = REPO / "examples" / "replica"


def serve(tmp_path: Path, *server: str, hang_after: str = "5", extra: tuple[str, ...] = (),
          timeout: float = 240, jit_dir: bool = False) -> tuple:
    run = tmp_path / "r"
    env = trace_env(PYTHONPATH=os.pathsep.join([str(REPLICA), str(REPO)]),
                    **({"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")} if jit_dir else {}))
    t0 = time.monotonic()
    res = run_trace(["run", "-o", str(run), "--hang-after", hang_after, "--on-hang", "kill", *extra, "--", PY, "-m",
                     "sglang.launch_server", "--tp", "4", *server], env=env, timeout=timeout)
    v = json.loads((run / "verdict.json").read_text())
    return res, v, run, time.monotonic() - t0


#: scenario -> (the server's arguments, serve()'s keywords); the longest first
SCENARIOS: dict[str, tuple[tuple[str, ...], dict]] = {
    "jit": (("--jit-seconds", "30"), {"timeout": 300}),
    "enqueued-ar": (("--fault", "enqueued-ar", "--fault-step", "4"), {}),
    "capture-stall": (("--fault", "capture-stall", "--fault-rank", "2", "--fault-bs", "4"), {}),
    "register-one": (("--fault", "register-one", "--fault-rank", "3"), {}),
    "register-all": (("--fault", "register-all"), {}),
    "draft-sync": (("--fault", "draft-sync", "--fault-rank", "1"), {}),
    "comm-init": (("--fault", "comm-init"), {}),
    "die": (("--fault", "die", "--fault-rank", "2"), {"hang_after": "30"}),
    "nojoin": (("--fault", "nojoin", "--fault-rank", "3"), {}),
    "stale-jit-lock": (("--fault", "stale-jit-lock"), {"jit_dir": True}),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple | BaseException]:
    base = tmp_path_factory.mktemp("serving")

    def one(name: str) -> tuple[str, tuple | BaseException]:
        args, kw = SCENARIOS[name]
        (base / name).mkdir()
        try:
            return name, serve(base / name, *args, **kw)
        except Exception as e:  # raised in the test that reads this scenario, not in all of them
            return name, e

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, SCENARIOS))


def scenario(served: dict[str, tuple | BaseException], name: str) -> tuple:
    got = served[name]
    if isinstance(got, BaseException):
        raise got
    return got


def test_all_ranks_stall_after_an_enqueued_pynccl_all_reduce(served):
    """The seed: every rank returned from pynccl all_reduce #4 (its kernel never completes) and waits for the GPU."""
    res, v, run, _ = scenario(served, "enqueued-ar")
    assert res.returncode == 3, res.stderr[-3000:]
    assert "profile sglang" in res.stderr and "picked from the command" in res.stderr
    assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "stuck_in_collective", [],
                                                                                 [0, 1, 2, 3])
    op = v["operation"]
    assert (op["name"], op["group_desc"], op["seq"], op["phase"], op["phase_detail"]) == (
        "all_reduce", "pynccl", 4, "cuda_graph_capture", "bs=4")
    assert "ranks 0-3 in cuda-graph capture bs=4" in v["summary"].lower()
    assert "the last call each made was pynccl all_reduce #4, returned" in v["summary"]
    assert "wait for the GPU in torch.cuda.synchronize" in v["summary"]
    steps = v["next_steps"]
    assert "NCCL_P2P_DISABLE=1" in steps[0] and "--disable-custom-all-reduce" in steps[1] and \
        "--disable-cuda-graph" in steps[2]
    assert all(v["ranks"][str(r)]["phase"] == "cuda_graph_capture" and v["ranks"][str(r)]["state"] ==
               "host_sync_wait" and v["ranks"][str(r)]["roles"] == "TP" + str(r) for r in range(4))
    # the ledger: every rank went through the start-up phases in order, the capture bs=4 still open
    mine = [p for p in v["phases"] if p["rank"] == 2]
    names = [p["name"] for p in mine]
    assert names[:5] == ["torch_distributed_init", "weight_loading", "kv_cache_alloc", "kernel_warmup",
                         "cuda_graph_init"]
    assert [(p["detail"], p["open"]) for p in mine if p["name"] == "cuda_graph_capture"] == [("bs=8", False),
                                                                                             ("bs=4", True)]
    assert all(p["start"] and p["seconds"] is not None for p in mine)
    assert "start-up phases" in res.stderr and "cuda-graph capture bs=4" in res.stderr
    assert "s silent: ranks 0-3 in cuda_synchronize (during cuda-graph capture bs=4)" in res.stderr
    page = (run / "report.html").read_text()
    assert "Start-up phases" in page and "cuda-graph capture bs=4" in page
    # the job's own output was kept and read (its log lines are in the run dir)
    assert "Capture cuda graph begin" in next(run.glob("*/output.log")).read_text()


def test_one_rank_stalls_in_capture(served):
    res, v, _run, _ = scenario(served, "capture-stall")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [2], [0, 1, 3])
    assert (v["operation"]["phase"], v["operation"]["phase_detail"]) == ("cuda_graph_capture", "bs=4")
    assert "capture_one_batch_size" in v["summary"] and "during cuda-graph capture bs=4" in v["summary"]
    assert v["ranks"]["2"]["phase_detail"] == "bs=4"


def test_one_rank_stalls_in_graph_buffer_registration(served):
    res, v, _run, _ = scenario(served, "register-one")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [3], [0, 1, 2])
    assert "rank 3 is inside custom all-reduce graph-buffer registration in CustomAllreduce._get_graph_buffer_ipc_meta" \
        in v["summary"]


def test_all_ranks_stall_in_graph_buffer_registration(served):
    res, v, _run, _ = scenario(served, "register-all")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["waiting_ranks"], v["operation"]["name"]) == ("graph_capture", [0, 1, 2, 3],
                                                                      "register_graph_buffers")
    assert "all inside custom all-reduce graph-buffer registration" in v["summary"]
    assert "--disable-custom-all-reduce" in v["next_steps"][0]


def test_one_rank_stuck_in_a_host_sync_during_draft_capture(served):
    res, v, _run, _ = scenario(served, "draft-sync")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [1], [0, 2, 3])
    assert v["ranks"]["1"]["state"] == "host_sync_wait" and v["ranks"]["1"]["innermost_open"] == "cuda_synchronize"
    assert v["operation"]["phase"] == "draft_graph_capture"


def test_communicator_init_hang(served):
    res, v, _run, _ = scenario(served, "comm-init")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["operation"]["name"], v["waiting_ranks"]) == ("init_hang", "ncclCommInitRank", [0, 1, 2, 3])
    assert "NCCL communicator init" in v["summary"] and "not the application" in v["summary"]


def test_a_rank_that_died(served):
    res, v, _run, _ = scenario(served, "die")
    assert res.returncode == 1, res.stderr[-3000:]  # the server's own status: it saw its scheduler die
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("crashed", "rank_exited", [2])
    assert "Rank 2 scheduler is dead" in res.stdout


def test_a_rank_parked_before_any_collective_is_reported_after_hang_after(served):
    """Rank 3 never reaches torch.distributed; the others wait in init_process_group: a known wait with no
    progress gets its verdict after --hang-after, not after the 600 s start-up window."""
    res, v, _run, elapsed = scenario(served, "nojoin")
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("init_hang", [3], [0, 1, 2])
    assert elapsed < 120


def test_a_healthy_start_up_with_a_30_s_jit_build_is_not_a_hang(served):
    """A JIT build in a child process (CPU-busy, no ring of its own) while the rank waits for it is progress."""
    res, v, run, _ = scenario(served, "jit")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "silent" not in res.stderr and "--on-hang kill" not in res.stderr
    assert (v["status"], v["kind"]) == ("completed", "no_hang")
    warm = [p for p in v["phases"] if p["name"] == "kernel_warmup"]
    assert len(warm) == 4 and all(p["seconds"] >= 29 and not p["open"] for p in warm)
    assert "The server is fired up and ready to roll!" in res.stdout
    # a target the replica does not define is said once and listed in meta.json; the job ran on
    problems = {p["target"] for p in meta(run)["hook_problems"]}
    assert "profile sglang: sglang.srt.managers.scheduler:Scheduler.event_loop_overlap" in problems
    assert res.stderr.count("Scheduler.event_loop_overlap") == 1


def test_a_stale_jit_build_lock_left_by_a_killed_start_is_named_with_no_hook(served):
    """Issue #29's seed cause: a start killed mid-build left torch's cpp_extension lock; every rank of the next start
    waits for it in FileBaton.wait at 0% CPU. Named from the watchdog's /proc samples alone: the path, its age, that
    no live process holds it or builds, and how to clear it."""
    res, v, run, _ = scenario(served, "stale-jit-lock")
    assert res.returncode == 3, res.stderr[-3000:]
    lock = run.parent / "torch_extensions" / "sampling_kernels" / "lock"
    assert (v["status"], v["kind"], v["operation"]["name"]) == ("hang", "blocked_outside_collective", "file_lock")
    assert v["culprit_ranks"] == [0, 1, 2, 3], v["summary"]
    assert str(lock) in v["summary"] and "(age " in v["summary"] and "no live process holds it or builds" in v["summary"]
    assert any(f"rm {lock}" in s for s in v["next_steps"])
    assert all(v["ranks"][str(r)]["blocked"] == "lock_wait" and v["ranks"][str(r)]["phase"] == "kernel_warmup"
               for r in range(4)), v["ranks"]
    assert "Loading JIT ops" in next(run.glob("*/output.log")).read_text()
