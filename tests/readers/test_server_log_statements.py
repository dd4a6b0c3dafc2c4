"""server_log's statement rows and the phases the field corpus showed it missed: server_ready completions,
server_stall (vLLM shm broadcast wait, SGLang scheduler watchdog), serving progress, time-only SGLang tags,
redacted pids, pynccl / message-queue / worker-ready phases."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers.readers import catalogue, server_log
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, rows

DATA = REPO / "tests" / "data" / "readers" / "server_log"
FIELD = REPO / "tests" / "field"


def _read(path: Path) -> server_log.ReadResult:
    doc = open_text(path)
    assert "server_log" in catalogue.scan(doc).families
    res = server_log.read_doc(doc)
    check_contract(res, "server_log", "server_log", path)
    assert set(res.events.column("name").to_pylist()) <= set(server_log.PHASE_NAMES)
    return res


def test_shm_broadcast_wait_per_engine_core() -> None:
    res = _read(DATA / "vllm_shm_broadcast_dp.log")
    got = [(r["pid"], r["name"], r["value"], r["line"]) for r in rows(res.observations, kind="server_stall")]
    assert got == [(1455, "shm_broadcast_wait", 180, 1), (1454, "shm_broadcast_wait", 120, 2)]


def test_shm_broadcast_wait_after_a_glued_progress_bar() -> None:
    res = _read(DATA / "vllm_ascend_processed_prompts.log")
    (row,) = rows(res.observations, kind="server_stall")
    assert (row["pid"], row["value"], row["line"]) == (323240, 120, 2)


def test_field_cut_line_with_redacted_pid() -> None:
    res = _read(FIELD / "1catvllm-652" / "engine.log")
    (row,) = rows(res.observations, kind="server_stall")
    assert (row["pid"], row["name"], row["value"], row["line"]) == (None, "shm_broadcast_wait", 60, 1)


def test_field_scheduler_watchdog_names_its_rank() -> None:
    res = _read(FIELD / "sglang-17941" / "server_log_a.txt")
    (row,) = rows(res.observations, kind="server_stall")
    assert (row["name"], row["value"], row["line"]) == ("scheduler_watchdog", 300, 26)
    assert row["detail"].startswith("[PP1 TP1] Scheduler watchdog timeout")


def test_field_time_only_sglang_tags() -> None:
    res = _read(FIELD / "sglang-1479" / "server.log")
    begin = rows(res.events, name="cuda_graph_capture_begin")
    assert sorted(r["rank"] for r in begin) == list(range(8))
    assert {r["wall_ns"] for r in begin} == {None}          # [23:17:01 TP3]: no date, no wall clock


def test_field_vllm_init_phases() -> None:
    res = _read(FIELD / "hami-1853" / "failure.log")
    assert {(r["rank"], r["name"]) for r in res.events.to_pylist()} == {
        (1, "dist_init_begin"), (0, "dist_init_begin"), (0, "nccl_comm_init_begin")}
    res = _read(FIELD / "hami-2641" / "last_line.txt")
    assert [(r["pid"], r["name"], r["line"]) for r in res.events.to_pylist()] == [(960, "nccl_comm_init_begin", 1)]
    res = _read(FIELD / "vllm-5484" / "trace.log")
    assert "worker_ready" in set(res.events.column("name").to_pylist())


def test_field_message_queue_connect() -> None:
    res = _read(FIELD / "sglang-7478" / "node0.log")
    assert sorted(r["rank"] for r in rows(res.events, name="dist_init_mq_connect")) == [2, 3, 5, 6, 7]


def test_field_serving_progress() -> None:
    res = _read(FIELD / "sglang-6291" / "server.log")
    got = {r["name"]: (r["value"], r["line"]) for r in rows(res.observations, kind="progress")}
    assert got == {"batches": (3, 11), "requests": (10, 13)}
    res = _read(FIELD / "sglang-9099" / "output.txt")
    assert [(r["name"], r["value"]) for r in rows(res.observations, kind="progress")] == [("requests", 6)]
    res = _read(FIELD / "vllm-2988" / "error.log")
    assert [(r["name"], r["value"]) for r in rows(res.observations, kind="progress")] == [("running_requests", 67)]


def test_server_ready_completion() -> None:
    text = ("[2025-01-01 10:00:00 TP0] Capture cuda graph end. Time elapsed: 12.3 s\n"
            "[2025-01-01 10:00:02] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n"
            "[2025-01-01 10:00:05] The server is fired up and ready to roll!\n")
    res = server_log.read_doc(text_of_bytes("s.log", text.encode()))
    assert [(r["kind"], r["name"], r["line"]) for r in rows(res.observations, kind="completion")] == [
        ("completion", "server_ready", 2), ("completion", "server_ready", 3)]
