"""torch_elastic family: what torchrun's agent, torch.multiprocessing.spawn and the launchers around them say about
their workers, as posted (field corpus and public threads)."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import catalogue, torch_elastic
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import check_contract, check_field_map, rows

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO / "tests" / "field"
FIX = REPO / "tests" / "data" / "readers" / "torch_elastic"


def read(path: Path) -> Any:
    doc = open_text(path)
    assert "torch_elastic" in catalogue.scan(doc).families, "the catalogue must route this input to torch_elastic"
    result = torch_elastic.read_doc(doc)
    check_contract(result, "torch_elastic", "torch_elastic", path)
    return result


def exits(result: Any) -> list[dict[str, Any]]:
    return rows(result.observations, kind="rank_exit")


def test_field_map_names_real_columns() -> None:
    check_field_map(torch_elastic)


def test_agent_names_the_failed_worker_and_the_ones_it_stopped() -> None:
    r = read(FIELD / "pytorch-88251" / "error.txt")
    ex = exits(r)
    failed = [o for o in ex if "terminated_by" not in o["detail"]]
    assert [(o["rank"], o["name"], o["value"], o["pid"], o["line"]) for o in failed] == [
        (None, "exit", 1, 59469, 8)]
    assert "local_rank=5" in failed[0]["detail"]
    stopped = [o for o in ex if "terminated_by=agent" in o["detail"]]
    assert len(stopped) == 7 and {o["value"] for o in stopped} == {15}


def test_sigkill_of_local_rank_0() -> None:
    r = read(FIELD / "rlhfv-11" / "detail.txt")        # quoted ("> ") in the ticket
    [o] = [o for o in exits(r) if "terminated_by" not in o["detail"]]
    assert (o["name"], o["value"], o["pid"], o["line"]) == ("signal", 9, 484375, 9)
    assert "local_rank=0" in o["detail"]


def test_root_cause_table_gives_the_global_rank() -> None:
    r = read(FIX / "cppo6_root_cause.txt")
    [o] = exits(r)
    assert (o["rank"], o["name"], o["value"], o["pid"], o["line"]) == (0, "signal", 9, 14750, 18)
    assert "root_cause=yes" in o["detail"] and "host=mlxlab115" in o["detail"]


def test_failures_table_cut_at_the_top() -> None:
    r = read(FIX / "pytorch121209_failures.txt")
    got = sorted((o["rank"], o["name"], o["value"], o["pid"], "root_cause=yes" in o["detail"]) for o in exits(r))
    assert got == [(0, "exit", 1, 69811, True), (2, "exit", 1, 69813, False), (3, "exit", 1, 69814, False)]
    assert len(rows(r.observations, rank=1)) == 0   # its entry header was cut: its fields are not guessed


def test_agent_line_and_table_of_one_pid_merge() -> None:
    text = (b"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 812917) "
            b"of binary: /usr/bin/python\n"
            b"Root Cause (first observed failure):\n[0]:\n  time      : 2023-08-01_01:06:47\n  host      : n1\n"
            b"  rank      : 7 (local_rank: 3)\n  exitcode  : -9 (pid: 812917)\n  error_file: <N/A>\n"
            b"  traceback : Signal 9 (SIGKILL) received by PID 812917\n")
    r = torch_elastic.read_doc(text_of_bytes("agent.log", text))
    [o] = exits(r)
    assert (o["rank"], o["value"], o["pid"], o["line"]) == (7, 9, 812917, 3)


def test_glued_line_with_many_statements() -> None:
    r = read(FIX / "firefly171_glued.txt")
    ex = exits(r)
    assert sorted(o["pid"] for o in ex if "terminated_by=agent" in o["detail"]) == [
        899505, 899506, 899507, 899508, 899510]
    [o] = [o for o in ex if "terminated_by" not in o["detail"]]
    assert (o["value"], o["pid"]) == (9, 899509) and "local_rank=4" in o["detail"]


def test_newest_exitcode_spelling_and_glog_agent_line() -> None:
    r = torch_elastic.read_doc(text_of_bytes("t.log", b"Root Cause (first observed failure):\n[0]:\n"
                                                      + (FIX / "pr175254_signal_name.txt").read_bytes()
                                                          .replace(b"exitcode", b"  rank      : 1 (local_rank: 1)\n"
                                                                                b"  exitcode")))
    [o] = exits(r)
    assert (o["rank"], o["name"], o["value"], o["pid"]) == (1, "segfault", 11, 5277)
    r = read(FIX / "nccl1657_heartbeat_and_agent.txt")
    [o] = exits(r)
    assert (o["name"], o["value"], o["pid"], o["line"]) == ("exit", 1, 88, 3)


def test_rendezvous_failures() -> None:
    r = read(FIELD / "pytorch-64926" / "run.log")
    [o] = rows(r.observations, kind="init_failure")
    assert (o["name"], o["value"], o["line"]) == ("rendezvous", 900, 23)   # 900 s: the rdzv_configs timeout
    assert "RendezvousConnectionError" in o["detail"]
    r = read(FIELD / "avhubert-19" / "error_handler.json.txt")
    [o] = rows(r.observations, kind="init_failure")
    assert (o["name"], o["line"]) == ("rendezvous", 3) and o["detail"].startswith("RendezvousTimeoutError")
    r = read(FIELD / "pytorch-76287" / "log.txt")
    [o] = rows(r.observations, kind="transport_error")
    assert o["name"] == "connection_closed" and "keep-alive" in o["detail"] and o["line"] == 1


def test_spawn_exits() -> None:
    r = read(FIELD / "bcnet-53" / "traceback.txt")
    [o] = exits(r)
    assert (o["rank"], o["name"], o["value"], o["line"]) == (3, "exception", None, 12)
    r = read(FIELD / "torchdata-659" / "stack_trace.txt")   # pytest's E column
    assert [(o["rank"], o["name"]) for o in exits(r)] == [(5, "exception")]
    r = read(FIX / "hybrik198_spawn_old.txt")
    [o] = exits(r)
    assert (o["rank"], o["name"], o["value"], o["line"]) == (3, "signal", 9, 13)


def test_ctrl_c_sigint_then_sigterm_one_row_per_pid() -> None:
    r = read(FIX / "colossalai5179_ctrl_c.txt")
    ex = exits(r)
    assert sorted((o["pid"], o["value"]) for o in ex) == [(423964, 2), (423965, 2)]


def test_group_finished_and_rendezvous_result_maps_local_ranks() -> None:
    r = read(FIX / "torchx492_ray_agents.txt")
    [o] = rows(r.observations, kind="completion")
    assert (o["name"], o["line"]) == ("exit_ok", 16)
    assert r.world_size == 2
    text = ((FIX / "torchx492_ray_agents.txt").read_bytes()
            + b"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 7) of "
              b"binary: /usr/bin/python\n")
    r = torch_elastic.read_doc(text_of_bytes("agents.log", text))
    [o] = exits(r)
    assert o["rank"] == 0 and "rank_from=rendezvous_result" in o["detail"]


def test_lightning_and_deepspeed_launchers() -> None:
    text = (b"[rank: 2] Child process with PID 13117 terminated with code -6. Forcefully terminating all other "
            b"processes to avoid zombies\n"
            b"[2023-08-01 01:06:47,123] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
            b"'--local_rank=3'] exits with return code = -9\n")
    r = torch_elastic.read_doc(text_of_bytes("launch.log", text))
    got = {(o["rank"], o["name"], o["value"], o["line"]) for o in exits(r)}
    assert got == {(2, "signal", 6, 1), (None, "signal", 9, 2)}
    assert any("local_rank=3" in o["detail"] for o in exits(r))


def test_absl_signal_report_of_a_serving_worker() -> None:
    r = read(FIELD / "vllm-2988" / "error.log")
    got = sorted((o["name"], o["value"], o["line"]) for o in exits(r))
    # ROCr's "Memory access fault by GPU node-2" (2) is why it aborts: absl's SIGABRT report (3) is the same death,
    # and its repeat in Ray's log line (7) is cut before "received at time="
    assert got == [("signal", 6, 2)]


def test_rocr_device_fault_is_an_abort_once_per_input() -> None:
    r = read(FIELD / "rocmbuild-4021" / "train.log")   # "HW Exception by GPU node-9 ... reason :GPU Hang" x 10
    got = [(o["name"], o["value"], o["line"]) for o in exits(r)]
    assert got == [("signal", 6, 2)] and "reason :GPU Hang" in exits(r)[0]["detail"]


def test_false_alarm_is_a_reader_error() -> None:
    with pytest.raises(ReaderError):
        torch_elastic.read_doc(text_of_bytes("x.log", b"Failures:\nnothing here\n"))


def test_signature_is_linear_on_huge_lines() -> None:
    rx = re.compile(torch_elastic.SIGNATURE)
    for line in ("x" * (1 << 20), ":" * (1 << 20), "a: " * (1 << 18), "exitcode " * (1 << 17)):
        t = time.perf_counter()
        rx.match(line)
        assert time.perf_counter() - t < 0.05
