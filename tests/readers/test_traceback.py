"""traceback family: Python tracebacks (and torch's C++ backtraces) as posted — prefixed by torchrun, printed by
torch.multiprocessing.spawn, cut at either end, interleaved, in pytest's E column — become STACKS rows, exception
observations and, when raised inside a torch.distributed op, an enter event naming it."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import catalogue, traceback
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from ranktrace.analyzers.readers.traceback.frames import short_file
from tests.readers.shared_reader_checks import check_contract, check_field_map, rows

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO / "tests" / "field"
FIX = REPO / "tests" / "data" / "readers" / "traceback"


def read(path: Path) -> Any:
    doc = open_text(path)
    assert "traceback" in catalogue.scan(doc).families, "the catalogue must route this input to traceback"
    result = traceback.read_doc(doc)
    check_contract(result, "traceback", "traceback", path)
    assert set(result.stacks.column("source").to_pylist()) == {"traceback"}
    return result


def stacks(result: Any) -> list[dict[str, Any]]:
    return result.stacks.to_pylist()


def test_field_map_names_real_columns() -> None:
    check_field_map(traceback)


def test_short_file_names_like_py_spy() -> None:
    assert short_file("/opt/conda/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py") == \
        "torch/distributed/distributed_c10d.py"
    assert short_file("/usr/local/lib/python3.10/dist-packages/deepspeed/comm/comm.py") == "deepspeed/comm/comm.py"
    assert short_file("/usr/lib/python3.10/multiprocessing/process.py") == "multiprocessing/process.py"
    assert short_file("/home/ubuntu/test.py") == "/home/ubuntu/test.py"


def test_rank_prefixed_traceback_raised_in_all_reduce() -> None:
    r = read(FIELD / "pytorch-131781-b" / "ranks_error.txt")
    [st] = stacks(r)
    assert (st["rank"], st["thread_state"], st["line"]) == (13, "exception", 4)
    assert st["frames"][:3] == ["all_reduce (torch/distributed/distributed_c10d.py:2219)",
                                "wrapper (torch/distributed/c10d_logger.py:75)", "run (/home/ubuntu/test.py:9)"]
    [ex] = rows(r.observations, kind="exception")
    assert (ex["rank"], ex["name"], ex["group"], ex["line"]) == (13, "DistBackendError", "all_reduce", 15)
    assert ex["detail"].startswith("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970")
    [ev] = r.events.to_pylist()
    assert (ev["rank"], ev["kind"], ev["name"], ev["category"], ev["line"]) == (13, "enter", "all_reduce",
                                                                                "collective", 13)
    assert ev["callsite"] == "run (/home/ubuntu/test.py:9)" and ev["error"].startswith("DistBackendError: NCCL")


def test_spawn_child_gets_its_process_index_and_the_op_from_the_cut_code_line() -> None:
    r = read(FIELD / "bcnet-53" / "traceback.txt")
    parent, child = stacks(r)
    assert (parent["rank"], parent["thread_name"]) == (None, "launcher (spawn)")
    assert child["rank"] == 3 and child["frames"][0].startswith("_pad_to_largest_tensor (")
    [ev] = r.events.to_pylist()    # cut inside dist.all_gather( : the call the cut-off frames were in
    assert (ev["rank"], ev["name"], ev["line"]) == (3, "all_gather", 22) and "via=code" in ev["detail"]
    assert ev["callsite"].startswith("_pad_to_largest_tensor (") and "cut" in ev["error"]
    assert any("cut before its exception line" in s.reason for s in r.skipped)


def test_spawn_parent_and_child_with_an_empty_message() -> None:
    r = read(FIX / "tczhangzhi18_spawn.txt")
    parent, child = stacks(r)
    assert parent["thread_name"] == "launcher (spawn)" and parent["rank"] is None
    assert child["rank"] == 1 and child["line"] == 16
    [ex] = rows(r.observations, kind="exception")
    assert (ex["name"], ex["detail"]) == ("ProcessRaisedException", "-- Process 1 terminated with the following error:")


def test_p2p_send_with_gloo_error_and_ci_stamps() -> None:
    r = read(FIX / "pfedsd3_send_gloo.txt")
    [ev] = r.events.to_pylist()
    assert (ev["name"], ev["category"], ev["line"]) == ("send", "p2p", 13)
    assert ev["callsite"] == "_send_model_to_master (/content/pFedSD/pcode/workers/worker_base.py:304)"
    r = read(FIX / "pytorch61670_ci_stamps.txt")
    [ev] = r.events.to_pylist()
    assert (ev["name"], ev["line"]) == ("barrier", 2) and "Connection closed by peer" in ev["error"]


def test_interleaved_ranks_still_name_the_op() -> None:
    r = read(FIELD / "lightning-19106" / "traceback.txt")
    [ex] = rows(r.observations, kind="exception")
    assert (ex["name"], ex["group"], ex["line"]) == ("RuntimeError", "broadcast", 14)
    assert ex["detail"].startswith("Detected mismatch between collectives on ranks.")


def test_pytest_column_and_nested_ray_prefixes() -> None:
    r = read(FIELD / "torchdata-659" / "stack_trace.txt")
    [st] = stacks(r)
    assert st["rank"] == 5 and st["frames"][-1] == "_wrap (torch/multiprocessing/spawn.py:69)"
    assert st["frames"][-2] == "training (/mreso/test_timeout_repro.py:20)"
    r = read(FIELD / "skyrl-284" / "engine_err.txt")
    [st] = stacks(r)
    assert st["pid"] == 892803 and st["frames"][0].startswith("_tcp_rendezvous_handler (")
    [ev] = r.events.to_pylist()
    assert (ev["name"], ev["category"]) == ("init_process_group", "init")
    [init] = rows(r.observations, kind="init_failure")
    assert init["name"] == "store" and "_tcp_rendezvous_handler" in init["detail"]


def test_barrier_through_srun_prefix_and_init_process_group() -> None:
    r = read(FIELD / "sglang-4096" / "server_error.txt")
    [ev] = r.events.to_pylist()
    assert (ev["name"], ev["line"]) == ("barrier", 13)
    assert ev["callsite"].startswith("init_weights_update_group (")
    r = read(FIELD / "yolov5-4409" / "train_output.txt")
    [ev] = r.events.to_pylist()
    assert ev["name"] == "init_process_group" and ev["callsite"] == "main (train.py:494)"


def test_keyboard_interrupt_in_barrier_and_chained_wrapper_exception() -> None:
    r = read(FIX / "source_shapes.log")
    by_state = {s["thread_state"]: s for s in stacks(r)}
    assert by_state["interrupted"]["rank"] == 1
    evs = {e["name"]: e for e in r.events.to_pylist()}
    assert (evs["barrier"]["rank"], evs["barrier"]["error"]) == (1, "KeyboardInterrupt")
    assert evs["barrier"]["callsite"] == "main (/workspace/train.py:80)"
    # DeepSpeed's wrapper names the op when torch's own frames are not in the paste
    assert (evs["all_reduce"]["rank"], evs["all_reduce"]["line"]) == (2, 18)
    assert "via=deepspeed/comm/torch.py" in evs["all_reduce"]["detail"]
    chained = [o for o in rows(r.observations, kind="exception") if o["name"] == "RuntimeError"]
    assert chained and "while handling an earlier exception" in chained[0]["detail"]


def test_loguru_annotations_and_old_agent_tracebacks() -> None:
    r = read(FIX / "acumen4_loguru.txt")
    [st] = stacks(r)
    assert st["frames"] == ["join (torch/multiprocessing/spawn.py:130)",
                            "start_processes (torch/multiprocessing/spawn.py:188)",
                            "spawn (torch/multiprocessing/spawn.py:230)"]
    [ex] = rows(r.observations, kind="exception")
    assert (ex["name"], ex["detail"]) == ("ProcessExitedException", "process 0 terminated with signal SIGKILL")
    r = read(FIX / "lightning3029_chained_elastic.txt")
    first = stacks(r)[0]
    assert first["frames"] == ["_distributed_broadcast_coalesced (torch/nn/parallel/distributed.py:549)"]
    [ev] = r.events.to_pylist()
    assert (ev["name"], ev["line"]) == ("broadcast", 2) and "NCCL error in" in ev["error"]
    assert stacks(r)[2]["rank"] == 0      # "-- Process 0 terminated with the following error:"


def test_caret_lines_and_a_traceback_cut_at_both_ends() -> None:
    r = read(FIX / "torchrec3560_rank_prefix.txt")
    [st] = stacks(r)
    assert st["rank"] == 0 and len(st["frames"]) == 6 and st["frames"][0] == "wait (torchrec/distributed/types.py:319)"
    assert not rows(r.observations, kind="exception") and not r.events.num_rows


def test_cpp_backtrace_of_the_unique_id_exchange() -> None:
    r = read(FIELD / "llamafactory-5769" / "error.log")
    [st] = stacks(r)
    assert st["native"] and st["rank"] == 2 and st["frames"][0] == "c10d::TCPStore::get(std::string const&) " \
                                                                    "(libtorch_cpu.so)"
    assert any("broadcastUniqueNCCLID" in f for f in st["frames"])
    [init] = rows(r.observations, kind="init_failure")
    assert (init["rank"], init["name"], init["line"]) == (2, "nccl_unique_id", 1)


def test_watchdog_cpp_backtrace_is_the_watchdog_thread() -> None:
    r = read(FIELD / "megatron-935" / "stderr.txt")
    [st] = stacks(r)
    assert st["native"] and st["thread_name"] == "pt_nccl_watchdg"
    assert not rows(r.observations, kind="init_failure")


def test_segfault_report_is_a_native_stack_innermost_first() -> None:
    r = read(FIELD / "hamicore-169" / "error.txt")
    [st] = stacks(r)
    assert st["native"] and st["line"] == 2
    assert st["frames"][:2] == ["get_current_device_memory_limit (/libvgpu/src/multiprocess/multiprocess_memory_limit.c"
                                ":833)", "oom_check (/libvgpu/src/allocator/allocator.c:44)"]
    assert "_PyObject_MakeTpCall (<unknown>)" in st["frames"]
    [ex] = rows(r.observations, kind="rank_exit")
    assert (ex["name"], ex["value"], ex["line"]) == ("segfault", 11, 2)
    [init] = rows(r.observations, kind="init_failure")
    assert init["name"] == "nccl_init" and "ncclCommInitRank" in init["detail"]
    assert not any("cut before its exception" in s.reason for s in r.skipped)


def test_torchrun_own_traceback_is_the_launcher() -> None:
    r = read(FIELD / "pytorch-88251" / "error.txt")      # cut after torchrun's first frames
    [st] = stacks(r)
    assert (st["rank"], st["thread_name"]) == (None, "launcher (torchrun)")


def test_same_traceback_twice_is_one_stack() -> None:
    one = (FIX / "pfedsd3_send_gloo.txt").read_bytes()
    r = traceback.read_doc(text_of_bytes("twice.log", one + one))
    assert len(stacks(r)) == 1


def test_false_alarm_is_a_reader_error_and_torn_lines_are_notes() -> None:
    with pytest.raises(ReaderError):
        traceback.read_doc(text_of_bytes("x.log", b"Traceback (most recent call last):\nsomething else\n"))
    torn = b'Traceback (most recent call last):\n  File "/a.py", line 99999999999, in f\n  File "/b.py", line 3, in g\n'
    r = traceback.read_doc(text_of_bytes("torn.log", torn))
    assert stacks(r)[0]["frames"] == ["g (/b.py:3)"]


def test_signature_is_linear_on_huge_lines() -> None:
    rx = re.compile(traceback.SIGNATURE)
    for line in ("x" * (1 << 20), ' File "' + "a" * (1 << 20), "frame #1: " + "(" * (1 << 20), "T" * (1 << 20)):
        t = time.perf_counter()
        rx.match(line)
        assert time.perf_counter() - t < 0.05
