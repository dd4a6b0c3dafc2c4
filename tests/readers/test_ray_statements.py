"""Ray's statements that a worker process of the job died (GCS's ActorDiedError death cause, the raylet's worker_died
error) as ``rank_exit`` rows, and a ProcessGroupNCCL work that raised an async NCCL error as the watchdog family's
failed ``enter``, with or without a Ray prefix. Every line is a real one from a public thread or Ray's docs."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import catalogue, server_log, watchdog
from ranktrace.analyzers.readers.text import open_text
from tests.readers.shared_reader_checks import REPO, check_contract, rows

FIELD = REPO / "tests" / "field"


def _exits(path: Path) -> list[dict]:
    doc = open_text(path)
    assert "server_log" in catalogue.scan(doc).families
    res = server_log.read_doc(doc)
    check_contract(res, "server_log", "server_log", path)
    return rows(res.observations, kind="rank_exit")


def _write(tmp_path: Path, text: str, name: str = "ray.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_actor_died_block_names_the_dead_process_but_no_rank() -> None:
    # verl-project/verl#4921: the driver's ActorDiedError, its "pid:" / "ip:" block, then GCS's death cause
    (row,) = _exits(FIELD / "verl-4921" / "ray.log")
    assert (row["rank"], row["pid"], row["host"], row["line"]) == (None, 87687, "10.29.214.5", 15)
    assert (row["name"], row["value"]) == ("exit", None)      # "connection error code 2": killed, how unknown
    assert row["detail"].startswith("The actor is dead because its worker process has died.")
    assert "Worker exit type: SYSTEM_ERROR" in row["detail"]


def test_raylet_worker_died_takes_the_worker_pid_and_ip() -> None:
    # verl-project/verl#2987
    (row,) = _exits(FIELD / "verl-2987" / "ray.log")
    assert (row["rank"], row["pid"], row["host"]) == (None, 909447, "100.96.31.18")
    assert row["detail"].startswith("A worker died or was killed while executing a task by an unexpected system "
                                    "error. Worker PID: 909447")


def test_raylet_line_behind_a_writer_prefix_is_about_the_dead_worker(tmp_path: Path) -> None:
    # vllm-project/vllm#38529: the engine core relays the raylet's line; the process that died is Worker PID 442
    line = ("(EngineCore pid=1879) (raylet) A worker died or was killed while executing a task by an unexpected system "
            "error. To troubleshoot the problem, check the logs for the dead worker. Lease ID: 0300000079077fa3da0bf8f1f"
            "bd84bafa1cd6a9c6a844e6d60c9b5a5691acb0f Worker ID: 389fd34f25c9d2fc9c7fcb53075f5029ee428fe83fd70f9e183229e8"
            " Node ID: 824dbaf53959a00247d77a2f9342eff09810a8b07f945e3208b13663 Worker IP address: 192.168.13.226 Worker"
            " port: 10002 Worker PID: 442 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits "
            "with a connection error code 2. End of file. Some common causes include: (1) the process was killed by the"
            " OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed "
            "unexpectedly due to SIGSEGV or another unexpected error.\n")
    (row,) = _exits(_write(tmp_path, line))
    assert (row["rank"], row["pid"], row["host"]) == (None, 442, "192.168.13.226")


def test_exit_detail_gives_the_signal_the_oom_kill_or_a_clean_exit(tmp_path: Path) -> None:
    sigterm = ("(raylet) A worker died or was killed while executing a task by an unexpected system error. To "
               "troubleshoot the problem, check the logs for the dead worker. RayTask ID: ffffffffffffffffc90bbe1574830f1"
               "0a33b147c01000000 Worker ID: f7ea96b1e8e804f578390a97c97d6bf28b5bc9fed13f0ef433e444c7 Node ID: cc69c4cc9"
               "7291a2847bc91bcfbd1f19c419b6e6fbe86aad345f2f665 Worker IP address: 192.168.100.8 Worker port: 41497 "
               "Worker PID: 269812 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly by a "
               "signal. SystemExit is raised (sys.exit is called). Exit code: 1. The process receives a SIGTERM.\n")
    # Ray's docs (ray-core scheduling, OOM prevention): the memory monitor's kill
    oom = ("WARNING worker.py:1839 -- A worker died or was killed while executing a task by an unexpected system "
           "error. To troubleshoot the problem, check the logs for the dead worker. RayTask ID: 8ce7275b7a7953cc794f8c1"
           "38a616d91cb907c1b01000000 Worker ID: 5c9ac30f8a9eda340f651a204de5d94f1ff965c5d9f72175579bd8dd Node ID: 3a4b"
           "60759256926fd0e84a9ff596dab3d7be854134107ef21b0e0260 Worker IP address: 172.17.0.2 Worker port: 10003 Worker"
           " PID: 69161 Worker exit type: SYSTEM_ERROR Worker exit detail: Task was killed due to the node running low "
           "on memory.\n")
    # Ray's docs (actor termination): exit_actor() ends the actor on purpose
    intended = ("The actor is dead because its worker process has died. Worker exit type: INTENDED_USER_EXIT Worker "
                "exit detail: Worker exits by a user request. exit_actor() is called.\n")
    got = [(r["name"], r["value"], r["pid"]) for r in _exits(_write(tmp_path, sigterm + oom + intended))]
    assert got == [("signal", 15, 269812), ("oom", None, 69161), ("exit", 0, None)]


def test_death_after_its_own_watchdog_timeout_is_its_consequence() -> None:
    # vllm-project/vllm#13535: worker 270291 ([rank3]) times out its all_reduce; the raylet then reports PID 270291 dead
    path = FIELD / "vllm-13535" / "ray.log"
    (row,) = _exits(path)
    assert (row["rank"], row["pid"]) == (None, 270291)
    assert row["detail"].startswith("after its own NCCL watchdog caught a timeout or error (line 1): A worker died")
    v = api.analyze([path], liveness=None).verdict.to_dict()
    assert (v["kind"], v["operation"]["name"]) == ("stuck_in_collective", "all_reduce")   # the timeout, not the exit


def test_a_death_nobody_explains_is_an_exit_of_a_process_of_the_job() -> None:
    v = api.analyze([FIELD / "easyr1-300" / "ray.log"], liveness=None).verdict.to_dict()
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("crashed", "rank_exited", [])
    assert v["summary"].startswith("A process of the job exited")     # no line says which rank it was


# A real async-exception line (torch 2.5, a training run's train.log as published), alone and behind the real Ray
# prefix of vllm-project/vllm#13535's worker.
_ASYNC = ("[rank7]:[E814 01:57:12.984417033 ProcessGroupNCCL.cpp:542] [Rank 7] Collective WorkNCCL(SeqNum=1915265, "
          "OpType=ALLREDUCE, NumelIn=196608, NumelOut=196608, Timeout(ms)=600000) raised the following async exception:"
          " NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n")


def _failed_work(path: Path) -> dict:
    assert watchdog.sniff(path, path.read_bytes())
    doc = open_text(path)
    assert "watchdog" in catalogue.scan(doc).families
    for res in (watchdog.read(path), watchdog.read_doc(doc)):
        check_contract(res, "watchdog", "watchdog", path)
    (ev,) = rows(watchdog.read_doc(doc).events, kind="enter")
    return ev


def test_async_exception_is_the_rank_s_failed_work(tmp_path: Path) -> None:
    ev = _failed_work(_write(tmp_path, _ASYNC))
    assert (ev["rank"], ev["name"], ev["seq"], ev["shape"]) == (7, "all_reduce", 1915265, "[196608]")
    assert ev["error"].startswith("async exception: WorkNCCL(OpType=ALLREDUCE) raised NCCL error: unhandled system")
    assert "timeout" not in ev["error"].lower()      # a failure NCCL reported, not a watchdog timeout


def test_async_exception_behind_a_ray_prefix(tmp_path: Path) -> None:
    ev = _failed_work(_write(tmp_path, "(RayWorkerWrapper pid=270291, ip=10.175.94.190) " + _ASYNC))
    assert (ev["rank"], ev["pid"], ev["host"], ev["name"], ev["seq"]) == (7, 270291, "10.175.94.190", "all_reduce",
                                                                          1915265)
