"""Watchdog reader: the three generations of ProcessGroupNCCL timeout / PG-status lines and the
watchdog_seq_mismatch scenario."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import watchdog
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import check_contract, rows

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "data" / "readers" / "watchdog"
SCEN = HERE.parent / "data" / "scenarios"


def read(path: Path) -> Any:
    result = watchdog.read(path)
    check_contract(result, "watchdog", "watchdog", path)
    return result


def sniff(path: Path) -> bool:
    return watchdog.sniff(path, path.read_bytes()[:65536])


def test_generation1_pg_rank_only_no_pg_and_no_seqnum() -> None:
    path = FIX / "gen1_torch1.log"
    assert sniff(path)
    r = read(path)
    ev = r.events.to_pylist()
    assert [(e["rank"], e["name"], e["seq"], e["group"], e["state"]) for e in ev] == [
        (2, "all_reduce", 5, None, "scheduled"), (2, "broadcast", None, None, "scheduled")]
    assert ev[1]["shape"] == "[1024, 16]"
    assert "ran_ms=1800406" in ev[0]["detail"] and "timeout_ms=1800000" in ev[0]["detail"]
    # "[Rank 2]" is a rank inside an unknown PG
    assert [(o["rank"], o["detail"]) for o in rows(r.observations, kind="rank_space")] == [(2, "pg:unknown")]
    reasons = " ".join(s.reason for s in r.skipped)
    assert "SeqNum" in reasons and "group left null" in reasons


def test_generation2_global_rank_prefix_and_last_enqueued_completed() -> None:
    r = read(FIX / "gen2_torch22.log")
    ev = r.events.to_pylist()
    assert [(e["rank"], e["name"], e["seq"], e["group"], e["group_desc"]) for e in ev] == [
        (0, "all_reduce", 6463, "0", "default_pg"), (1, "all_gather_into_tensor", 7, "1", None)]
    assert ev[1]["shape"] == "[1024]->[16384]" and ev[1]["category"] == "collective"
    st = rows(r.observations, kind="watchdog_pg_status")
    # "Exception ... detected" and "Timeout at NCCL work" repeat the same counters: one row
    assert [(s["rank"], s["group"], s["value"], s["detail"].split(" trigger")[0]) for s in st] == [
        (0, "0", 6462, "enqueued=6463 completed=6462 failed_seq=6463"),
        (1, "1", 6, "enqueued=8 completed=6 failed_seq=7")]
    assert not rows(r.observations, kind="rank_space")  # [rankN]: gives global ranks


def test_generation3_pg_guid_dump_signal_ray_prefix_and_p2p() -> None:
    r = read(FIX / "gen3_torch25.log")
    ev = r.events.to_pylist()
    # rank 0's timeout is repeated inside "watchdog thread terminated with exception": one event
    assert [(e["rank"], e["name"], e["category"], e["seq"], e["group"], e["group_desc"]) for e in ev] == [
        (0, "all_reduce", "collective", 2635, "0", "default_pg"), (2, "send", "p2p", 12, "5", "pp_group")]
    assert (ev[0]["pid"], ev[0]["host"]) == (3490361, "10.2.0.11")
    assert ev[0]["state"] == "scheduled" and ev[0]["kind"] == "enter"
    assert "pg_id=3" in ev[1]["detail"] and "pg_rank=0" in ev[1]["detail"]
    st = {(s["rank"], s["name"]): s for s in rows(r.observations, kind="watchdog_pg_status")}
    assert st[(0, "failure")]["detail"].startswith("enqueued=2635 completed=2634")
    # rank 1 did not time out; it was told to dump by rank 0 and had completed everything it enqueued
    dump = st[(1, "dump_signal")]
    assert dump["value"] == 2634 and "from=rank0" in dump["detail"] and dump["group"] == "0"
    assert st[(2, "failure")]["group"] == "5"


def test_last_started_marks_the_work_started(tmp_path: Path) -> None:
    p = tmp_path / "w.log"
    p.write_text(
        "[rank3]:[E0101 00:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=18, OpType=_REDUCE_SCATTER_BASE, NumelIn=419840, NumelOut=52480, Timeout(ms)=300000) "
        "ran for 300021 milliseconds before timing out.\n"
        "[rank3]:[E0101 00:00:00.001 ProcessGroupNCCL.cpp:2271] [PG ID 1 PG GUID 1 Rank 3]  failure detected by "
        "watchdog at work sequence id: 18 PG status: last enqueued work: 39, last started work: 19 "
        "(_ALLGATHER_BASE), last completed work: 17\n")
    r = read(p)
    e = r.events.to_pylist()[0]
    assert (e["name"], e["seq"], e["group"], e["state"]) == ("reduce_scatter_tensor", 18, "1", "started")
    s = rows(r.observations, kind="watchdog_pg_status")[0]
    assert s["detail"].startswith("enqueued=39 completed=17 started=19 failed_seq=18")


def test_pg_rank_of_a_non_default_group_lives_in_that_group(tmp_path: Path) -> None:
    p = tmp_path / "w.log"
    p.write_text(
        "[E ProcessGroupNCCL.cpp:574] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=RECV, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600029 milliseconds before timing out.\n"
        "[E ProcessGroupNCCL.cpp:1540] [PG 4 Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 7, "
        "last completed NCCL work: 6.\n")
    r = read(p)
    e = r.events.to_pylist()[0]
    assert (e["rank"], e["name"], e["category"], e["group"]) == (1, "recv", "p2p", "4")
    assert [(o["rank"], o["detail"]) for o in rows(r.observations, kind="rank_space")] == [(1, "pg:4")]


def test_truncated_line_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    text = (FIX / "gen2_torch22.log").read_text()
    p = tmp_path / "cut.log"
    p.write_text(text[: text.index("NumelOut=16384") + 5])  # cut inside rank 1's WorkNCCL(...)
    r = read(p)
    assert [e["rank"] for e in r.events.to_pylist()] == [0]
    assert any(s.line == 4 and "cut" in s.reason for s in r.skipped)


def test_mixed_encoding_empty_binary_and_unrelated_files(tmp_path: Path) -> None:
    p = tmp_path / "latin1.log"
    p.write_bytes(b"d\xe9marrage\n" + (FIX / "gen1_torch1.log").read_bytes().replace(b"Epoch", b"\xc9poque"))
    r = read(p)
    assert r.events.num_rows == 2
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert not sniff(empty) and [s.reason for s in watchdog.read(empty).skipped] == ["empty file"]
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01\x02WorkNCCL(\x00timeout")
    assert not sniff(binary)
    with pytest.raises(ReaderError):
        watchdog.read(binary)
    plain = tmp_path / "plain.log"
    plain.write_text("epoch 1 loss 2.0\n")
    assert not sniff(plain)
    with pytest.raises(ReaderError):
        watchdog.read(plain)


def test_sniff_finds_watchdog_lines_at_the_end_of_a_long_log(tmp_path: Path) -> None:
    p = tmp_path / "long.log"
    p.write_bytes(b"step loss 1.0 lr 3e-4\n" * 20000 + (FIX / "gen3_torch25.log").read_bytes())
    assert sniff(p)


# ---------------------------------------------------------------------------------------- scenario

def test_scenario_watchdog_seq_mismatch_rank2_is_one_behind() -> None:
    path = SCEN / "watchdog_seq_mismatch" / "train.log"
    assert sniff(path)
    r = read(path)
    ev = r.events.to_pylist()
    assert len(ev) == 4  # rank 0's repeated exception text is not a second event
    by_rank = {e["rank"]: e for e in ev}
    assert {k: v["seq"] for k, v in by_rank.items()} == {0: 43, 1: 43, 2: 42, 3: 43}
    assert {(e["name"], e["group"], e["group_desc"], e["kind"], e["state"]) for e in ev} == {
        ("all_reduce", "0", "default_pg", "enter", "scheduled")}
    assert {e["shape"] for e in ev} == {"[4096]"}
    st = {s["rank"]: s for s in rows(r.observations, kind="watchdog_pg_status")}
    assert {k: v["value"] for k, v in st.items()} == {0: 42, 1: 42, 2: 41, 3: 42}
    assert st[2]["detail"].startswith("enqueued=42 completed=41")
    assert not rows(r.observations, kind="rank_space")
