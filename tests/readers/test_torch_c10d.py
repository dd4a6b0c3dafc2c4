"""torch_c10d family: torch's c10d error and status messages as posted (field corpus and public threads) become the
rows of docs/EVIDENCE.md, each citing its line."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import catalogue, torch_c10d
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import check_contract, check_field_map, rows

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO / "tests" / "field"
FIX = REPO / "tests" / "data" / "readers" / "torch_c10d"


def read(path: Path) -> Any:
    doc = open_text(path)
    assert "torch_c10d" in catalogue.scan(doc).families, "the catalogue must route this input to torch_c10d"
    result = torch_c10d.read_doc(doc)
    check_contract(result, "torch_c10d", "torch_c10d", path)
    return result


def obs(result: Any, kind: str) -> list[dict[str, Any]]:
    return rows(result.observations, kind=kind)


def test_field_map_names_real_columns() -> None:
    check_field_map(torch_c10d)


# --- TORCH_DISTRIBUTED_DEBUG=DETAIL -------------------------------------------------------------------------------
def test_mismatch_report_gives_one_fingerprint_per_rank() -> None:
    r = read(FIELD / "msswift-pr9443" / "mismatch.txt")
    fps = sorted(obs(r, "fingerprint"), key=lambda o: o["rank"])
    assert [(o["rank"], o["name"], o["value"], o["line"]) for o in fps] == [
        (0, "all_reduce", 3104, 1), (1, "all_reduce", 3104, 1)]
    assert "shape=[51123456]" in fps[0]["detail"] and "shape=[195812480]" in fps[1]["detail"]
    assert all("by=1" in o["detail"] and "dtype=BFloat16" in o["detail"] and "device=cuda" in o["detail"]
               for o in fps)


def test_mismatch_with_allgather_base_and_a_custom_prefix() -> None:
    r = read(FIELD / "opendde-23" / "error.txt")
    assert {(o["rank"], o["name"], o["value"]) for o in obs(r, "fingerprint")} == {
        (1, "all_gather_into_tensor", 0), (2, "all_gather_into_tensor", 0)}
    # "2 :Error in RewardModelTrainer.compute_loss: Detected mismatch ..." (an application's own prefix)
    r = read(FIELD / "spavlrlhf-2" / "rank2.log")
    fps = {o["rank"]: o for o in obs(r, "fingerprint")}
    assert set(fps) == {0, 2} and {o["name"] for o in fps.values()} == {"broadcast"}
    assert "differ=Tensor Tensor shapes: 38838272vs 33554432" in fps[2]["detail"]


def test_mismatch_cut_before_the_other_rank_keeps_the_first_and_says_so() -> None:
    r = read(FIELD / "lightning-19106" / "traceback.txt")
    assert [(o["rank"], o["name"], o["value"], o["line"]) for o in obs(r, "fingerprint")] == [(1, "broadcast", 21, 14)]
    assert any("cut before the other rank" in s.reason for s in r.skipped)


def test_old_inconsistent_collective_and_wrapper_collectives() -> None:
    r = read(FIX / "source_wordings.log")
    old = [o for o in obs(r, "fingerprint") if o["line"] == 5]
    assert [(o["rank"], o["name"], o["value"]) for o in old] == [(1, "all_reduce", None)]
    assert "shape=[20, 10]" in old[0]["detail"] and "device=cpu" in old[0]["detail"]
    # the collective whose monitoredBarrier failed, and the last "Running collective" of rank 3
    ev = {(e["rank"], e["name"], e["seq"], e["line"]): e for e in r.events.to_pylist()}
    assert set(ev) == {(0, "broadcast", 42, 3), (3, "broadcast", 42, 2)}
    assert "failed" in ev[(0, "broadcast", 42, 3)]["error"] and "last of 2" in ev[(3, "broadcast", 42, 2)]["detail"]
    # ranks 1 and 2 did not reach the pre-check of that broadcast (rank 0 says so)
    missing = [o for o in obs(r, "missing_rank") if o["line"] == 4]
    assert [(o["rank"], o["name"], o["value"]) for o in missing] == [(1, "broadcast", 42), (2, "broadcast", 42)]
    assert all("by=0" in o["detail"] and "via=monitored_barrier" in o["detail"] for o in missing)


# --- monitoredBarrier ---------------------------------------------------------------------------------------------
def test_monitored_barrier_missing_and_joined_ranks() -> None:
    r = read(FIELD / "cosyvoice-180" / "train.log")
    assert [(o["rank"], o["name"], o["line"]) for o in obs(r, "missing_rank")] == [(2, "monitored_barrier", 2)]
    assert "by=0" in obs(r, "missing_rank")[0]["detail"] and "timeout_ms=30000" in obs(r, "missing_rank")[0]["detail"]
    # line 4 repeats line 1 behind an application's log prefix: one row per statement
    assert sorted((o["rank"], o["line"]) for o in obs(r, "joined_rank")) == [(1, 3), (3, 1)]
    assert [(o["name"], o["value"], o["line"]) for o in obs(r, "transport_error")] == [("gloo_timeout", 30000, 6)]


def test_monitored_barrier_all_failed_ranks_and_processed_ranks() -> None:
    r = read(FIX / "nccl849_monitored_barrier.txt")
    assert [o["rank"] for o in obs(r, "missing_rank")] == [4, 5, 6, 7]
    assert all(o["value"] is None and "by=0" in o["detail"] and "timeout_ms=2000000" in o["detail"]
               for o in obs(r, "missing_rank"))
    r = read(FIX / "source_wordings.log")
    assert sorted(o["rank"] for o in obs(r, "joined_rank") if o["line"] == 7) == [1, 3]


def test_monitored_barrier_behind_a_progress_bar() -> None:
    # the message follows a datasets progress bar on the same line (no newline between them)
    r = read(FIELD / "deepspeed-4488" / "output.txt")
    assert [(o["rank"], o["name"], o["line"]) for o in obs(r, "joined_rank")] == [(3, "monitored_barrier", 10)]


# --- store / socket / ncclUniqueId --------------------------------------------------------------------------------
def test_client_socket_timeout_is_a_connect_failure() -> None:
    r = read(FIELD / "pytorch-105782" / "error.txt")
    assert [(o["name"], o["value"], o["line"]) for o in obs(r, "init_failure")] == [("connect", 900, 1)]
    r = read(FIELD / "pytorch-79388" / "node_log.txt")
    assert [(o["name"], o["value"], o["line"]) for o in obs(r, "init_failure")] == [("connect", 60, 15)]


def test_store_based_barrier_waiting_and_timed_out() -> None:
    # its five equal-width "Waiting" lines are taken for one terminal-wrapped line by the opener: cited at line 6
    r = read(FIELD / "yolov5-4409" / "train_output.txt")
    assert r.world_size == 4
    [o] = obs(r, "init_failure")
    assert (o["rank"], o["name"], o["value"], o["line"]) == (0, "store_barrier", 60, 10)
    assert "num_workers_joined=16 world_size=4" in o["detail"] and "still waiting" in o["detail"]
    r = read(FIX / "megatronds338_store_barrier.txt")
    assert sorted((o["rank"], o["value"], o["line"]) for o in obs(r, "init_failure")) == [(5, 30, 5), (7, 30, 1)]
    # each rank's latest waiting line is cited; rank 2's line 6 is cut before its numbers, so its line 4 is
    r = read(FIX / "metaseq52_store_barrier.txt")
    got = {(o["rank"], o["line"], o["value"]) for o in obs(r, "init_failure")}
    assert got == {(4330, 2, 1800), (0, 5, 1800), (2, 4, 1800)}


def test_unique_id_exchange_failure_names_the_waiting_rank() -> None:
    r = read(FIELD / "sglang-4096" / "server_error.txt")   # one srun task ("0: ") wrote it all: no rank in that
    [o] = obs(r, "init_failure")
    assert (o["name"], o["line"], o["rank"]) == ("nccl_unique_id", 15, 1)   # the one the message states
    r = read(FIX / "source_wordings.log")
    [o] = [o for o in obs(r, "init_failure") if o["name"] == "nccl_unique_id"]
    assert (o["rank"], o["value"], o["line"]) == (5, 600, 9)


def test_socket_retry_warning_is_marked_as_a_retry() -> None:
    r = read(FIX / "source_wordings.log")
    [o] = [o for o in obs(r, "init_failure") if o["name"] == "connect"]
    assert o["line"] == 8 and o["detail"].startswith("retrying") and "Connection refused" in o["detail"]


# --- gloo / NCCL ---------------------------------------------------------------------------------------------------
def test_gloo_transport_errors() -> None:
    r = read(FIELD / "dfine-75" / "error.log")
    assert [(o["name"], o["value"], o["line"]) for o in obs(r, "transport_error")] == [
        ("gloo_timeout", 1800000, 1), ("gloo_timeout", 1800000, 2)]
    assert "unbound_buffer.cc:133" in obs(r, "transport_error")[0]["detail"]
    r = read(FIX / "pytorch75512_gloo_closed.txt")
    [o] = obs(r, "transport_error")
    assert (o["name"], o["line"]) == ("connection_closed", 2) and "[18.25.6.30]:28048" in o["detail"]
    r = read(FIX / "rvc1882_gloo_reset.txt")
    assert [o["name"] for o in obs(r, "transport_error")] == ["connection_closed"]


def test_nccl_errors_keep_their_reason_lines_per_rank() -> None:
    r = read(FIELD / "pytorch-131781-b" / "ranks_error.txt")
    errs = {o["rank"]: o for o in obs(r, "transport_error")}
    assert set(errs) == {10, 13} and {o["name"] for o in errs.values()} == {"nccl_error"}
    assert "unhandled system error" in errs[13]["detail"] and "ncclSystemError" in errs[13]["detail"]
    assert "Traceback" not in errs[10]["detail"]   # the next rank's traceback is not rank 10's "Last error"
    assert [(o["name"], o["detail"], o["line"]) for o in obs(r, "version")] == [("nccl", "2.20.5", 15)]
    r = read(FIX / "nccl2076_remote_error.txt")
    [o] = obs(r, "transport_error")
    assert "remote process exited" in o["detail"] and "ncclRemoteError" in o["detail"]
    assert "Connection reset by peer" in o["detail"] and o["line"] == 1


def test_nccl_internal_error_with_a_cuda_failure_as_its_last_error() -> None:
    text = (b"[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp"
            b":317, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5\n"
            b"[rank1]: ncclInternalError: Internal check failed.\n"
            b"[rank1]: Last error:\n"
            b"[rank1]: Cuda failure 'peer access is not supported between these two devices'\n"
            b"Cuda failure 'out of memory'\n")
    r = torch_c10d.read_doc(text_of_bytes("e.log", text))
    got = {(o["rank"], o["name"], o["line"]): o for o in obs(r, "transport_error")}
    assert set(got) == {(1, "nccl_error", 1), (None, "cuda_error", 5)}
    assert "peer access is not supported" in got[(1, "nccl_error", 1)]["detail"]
    assert "ncclInternalError" in got[(1, "nccl_error", 1)]["detail"]


def test_communicator_aborted_names_its_rank() -> None:
    r = read(FIELD / "mmdetection-12392" / "log.txt")
    [o] = obs(r, "transport_error")
    assert (o["rank"], o["name"], o["line"]) == (1, "nccl_error", 3)


# --- the NCCL watchdog's own health, desync, abort -----------------------------------------------------------------
def test_watchdog_stuck_per_process_group() -> None:
    r = read(FIELD / "msswift-7992" / "exit.log")
    got = sorted((o["rank"], o["name"], o["value"], o["group"]) for o in obs(r, "watchdog_stuck"))
    assert got == [(0, "watchdog_hang", 480, "117"), (4, "watchdog_hang", 480, "99")]


def test_heartbeat_and_fatal_termination() -> None:
    r = read(FIX / "source_wordings.log")
    stuck = {(o["name"], o["line"]): o for o in obs(r, "watchdog_stuck")}
    assert set(stuck) == {("heartbeat", 10), ("watchdog_hang", 11)}
    assert all(o["rank"] == 2 for o in stuck.values())
    exits = {o["line"]: o for o in obs(r, "rank_exit")}
    assert (exits[11]["rank"], exits[11]["name"], exits[11]["value"]) == (2, "signal", 6)


def test_desync_report_names_the_lagging_rank() -> None:
    r = read(FIELD / "pytorch-152623" / "rank0_desync.log")
    [m] = obs(r, "missing_rank")
    assert (m["rank"], m["name"], m["value"], m["line"]) == (7, None, 183, 5) and "by=0" in m["detail"]
    joined = {(o["rank"], o["name"], o["value"]) for o in obs(r, "joined_rank")}
    assert {(0, "all_reduce", 315), (1, "all_reduce", 315), (2, "all_reduce", 315)} <= joined
    assert {(r_, "all_gather_into_tensor", 317) for r_ in (3, 4, 5, 6)} <= joined
    assert not r.events.num_rows     # desync numbers are not the watchdog's SeqNum


def test_desync_never_joined() -> None:
    r = read(FIX / "source_wordings.log")
    never = [o for o in obs(r, "missing_rank") if "never joined" in o["detail"]]
    assert [(o["rank"], o["value"], o["line"]) for o in never] == [(6, None, 14), (7, None, 14)]
    assert all("by=4" in o["detail"] for o in never)


def test_terminate_on_the_watchdog_exception() -> None:
    r = read(FIELD / "catalystrl-15" / "output.txt")
    [ex] = obs(r, "rank_exit")
    assert (ex["rank"], ex["name"], ex["value"], ex["line"]) == (6, "signal", 6, 8)
    [e] = obs(r, "exception")
    assert e["name"] == "DistBackendError" and "Watchdog caught collective operation timeout" in e["detail"]
    # "[PG 1 Rank 6]": a rank inside group 1, not a global rank
    r = read(FIELD / "megatron-935" / "stderr.txt")
    [ex] = obs(r, "rank_exit")
    assert ex["rank"] is None and "pg_rank=6" in ex["detail"]


def test_watchdog_timeout_cut_before_its_body_is_an_exception() -> None:
    r = read(FIX / "source_wordings.log")
    [e] = [o for o in obs(r, "exception") if o["line"] == 15]
    assert (e["rank"], e["name"]) == (1, "watchdog_timeout")
    [e] = [o for o in obs(r, "exception") if o["line"] == 16]
    assert e["name"] == "DistBackendError" and e["rank"] == 6 and "illegal memory access" in e["detail"]
    assert [o["name"] for o in obs(r, "transport_error") if o["line"] == 17] == []   # what() is the exception's


# --- contract edges -----------------------------------------------------------------------------------------------
def test_a_false_alarm_is_a_reader_error_and_torn_lines_are_no_error() -> None:
    with pytest.raises(ReaderError):
        torch_c10d.read_doc(text_of_bytes("y.log", b"nothing about torch here\n"))
    torn = (b"[E ProcessGroupGloo.cpp:138] [Rank 0]: Ranks 1, failed to pass monitoredBarrier in 9999999999999 ms\n"
            b"Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint(Seq\n"
            b"Timed out initializing process group in store based barrier on rank: 0, for key: k (world_size=2\n")
    r = torch_c10d.read_doc(text_of_bytes("torn.log", torn))
    assert [(o["rank"], o["value"]) for o in obs(r, "fingerprint")] == [(1, None)]
    assert "cut" in obs(r, "fingerprint")[0]["detail"]


def test_signature_is_linear_on_huge_lines() -> None:
    rx = re.compile(torch_c10d.SIGNATURE)
    for line in ("x" * (1 << 20), ":" * (1 << 20), "]" * (1 << 20), "[E a.cpp:1]" * (1 << 16), "a: " * (1 << 18),
                 "Ranks 1" + ", 2" * (1 << 18)):
        t = time.perf_counter()
        rx.match(line)
        assert time.perf_counter() - t < 0.05
