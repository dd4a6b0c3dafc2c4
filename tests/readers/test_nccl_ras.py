"""NCCL RAS reader: text (2.24 and 2.26+ shapes, INCOMPLETE / DEAD, monitor mode), JSON, and the ras_two_ahead
scenario."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import nccl_ras
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import check_contract, rows

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "data" / "readers" / "ras"
SCEN = HERE.parent / "data" / "scenarios"


def read(path: Path) -> Any:
    result = nccl_ras.read(path)
    check_contract(result, "nccl_ras", "ras", path)
    return result


def sniff(path: Path) -> bool:
    return nccl_ras.sniff(path, path.read_bytes()[:65536])


def counts(result: Any, name: str = "total") -> dict[int | None, int]:
    return {o["rank"]: o["value"] for o in rows(result.observations, kind="ras_op_count", name=name)}


def test_text_2_24_listed_ranks_and_the_unlisted_majority() -> None:
    path = FIX / "text_2_24_mismatch.txt"
    assert sniff(path)
    r = read(path)
    assert r.world_size == 32
    c = counts(r)
    assert len(c) == 32
    assert {k for k, v in c.items() if v == 6649} == {0, 2, 3, 4, 5, 7}
    assert {v for k, v in c.items() if k not in {0, 2, 3, 4, 5, 7}} == {6650}
    listed = [o for o in rows(r.observations, kind="ras_op_count") if o["detail"].startswith("listed")]
    assert {(o["rank"], o["pid"], o["host"]) for o in listed} >= {(0, 483072, "172.16.64.210")}
    assert {o["group"] for o in rows(r.observations, kind="ras_op_count")} == {"0x27a079b828ff1a75"}
    mm = rows(r.observations, kind="ras_mismatch")[0]
    assert mm["detail"].startswith("6650x26 6649x6")


def test_text_2_26_listed_outliers_can_be_the_ranks_ahead() -> None:
    r = read(FIX / "text_2_26_ahead.txt")
    first = {o["rank"]: o["value"] for o in rows(r.observations, kind="ras_op_count", group="0xc4e9a1d2b3f405")}
    # the two listed ranks (2 and 5) are AHEAD of the six others
    assert first == {0: 64, 1: 64, 2: 65, 3: 64, 4: 64, 5: 65, 6: 64, 7: 64}
    assert {o["name"] for o in rows(r.observations, kind="ras_op_count")} == {"all_reduce"}
    second = {o["rank"]: o["value"] for o in rows(r.observations, kind="ras_op_count", group="0x78db921d1c117b4a")}
    assert second[7] == 60 and {v for k, v in second.items() if k != 7} == {64}
    status = {o["rank"]: o["name"] for o in rows(r.observations, kind="ras_rank_status")}
    assert status[6] == "FINALIZE" and status[0] == "RUNNING"


def test_text_incomplete_then_dead_over_two_queries() -> None:
    r = read(FIX / "text_incomplete_dead.txt")
    missing = rows(r.observations, kind="ras_missing_rank")
    assert [(m["rank"], m["group"], m["detail"].split()[-1]) for m in missing] == [
        (21, "0xcf264af53edbe986", "snapshot=1"), (21, "0xcf264af53edbe986", "snapshot=2")]
    dead = rows(r.observations, kind="ras_dead_rank")
    assert [(d["rank"], d["pid"], d["host"]) for d in dead] == [(21, 3487984, "172.16.64.213")]
    assert [(p["pid"], p["detail"]) for p in rows(r.observations, kind="ras_missing_process")] == [
        (3487984, "gpus=5 snapshot=1")]
    assert [p["pid"] for p in rows(r.observations, kind="ras_dead_process")] == [3487984]


def test_json_counts_status_and_missing_rank() -> None:
    path = FIX / "json_2_29.json"
    assert sniff(path)
    r = read(path)
    assert r.version == "2.29.1" and r.world_size == 2
    assert counts(r, "all_reduce") == {0: 0}
    st = rows(r.observations, kind="ras_rank_status")
    assert [(s["rank"], s["name"], s["value"]) for s in st] == [(0, "RUNNING", 0)]
    miss = rows(r.observations, kind="ras_missing_rank")
    assert [(m["rank"], m["pid"], m["group"]) for m in miss] == [(1, 1524345, "0xae94423cfbb2ef4a")]
    assert "unresponsive=true" in miss[0]["detail"]
    assert not rows(r.observations, kind="ras_dead_rank")
    assert miss[0]["line"] == 39 and st[0]["line"] == 16  # the line of each rank's "rank" key


def test_monitor_mode_peer_dead() -> None:
    path = FIX / "monitor.txt"
    assert sniff(path)
    r = read(path)
    dead = rows(r.observations, kind="ras_dead_process")
    assert [(d["pid"], d["host"]) for d in dead] == [(1524345, "172.16.64.245")]
    assert dead[0]["wall_ns"] is not None


def test_truncated_json_and_text(tmp_path: Path) -> None:
    text = (FIX / "text_2_24_mismatch.txt").read_text()
    cut = tmp_path / "cut.txt"
    cut.write_text(text[: text.index("Rank 4 --")])
    r = read(cut)
    assert {o["rank"] for o in rows(r.observations, kind="ras_op_count", value=6649)} == {0, 2, 3}
    doc = (SCEN / "ras_two_ahead" / "ras.json").read_text()
    two = tmp_path / "two.json"
    two.write_text(doc + doc[: len(doc) // 2])  # a second query cut in the middle
    r2 = read(two)
    assert counts(r2, "all_reduce") == {0: 100, 1: 100, 2: 101, 3: 101}
    assert any("cut or invalid" in s.reason for s in r2.skipped)


def test_empty_binary_and_unrelated(tmp_path: Path) -> None:
    empty = tmp_path / "e.txt"
    empty.write_text("")
    assert not sniff(empty) and [s.reason for s in nccl_ras.read(empty).skipped] == ["empty file"]
    b = tmp_path / "b.bin"
    b.write_bytes(b"\x00\x00Job summary\x00Communicators")
    assert not sniff(b)
    with pytest.raises(ReaderError):
        nccl_ras.read(b)
    other = tmp_path / "o.json"
    other.write_text('{"traceEvents": []}')
    assert not sniff(other)
    with pytest.raises(ReaderError):
        nccl_ras.read(other)


def test_nccl_log_sample_is_not_ras(shared_data: Path) -> None:
    path = shared_data / "external" / "nccl-tests-Timez-zx" / "nccl.log"
    assert not sniff(path)


# ---------------------------------------------------------------------------------------- scenario

def test_scenario_ras_two_ahead_ranks_2_and_3_launched_one_more_all_reduce() -> None:
    path = SCEN / "ras_two_ahead" / "ras.json"
    assert sniff(path)
    r = read(path)
    assert r.world_size == 4
    assert counts(r, "all_reduce") == {0: 100, 1: 100, 2: 101, 3: 101}
    assert counts(r, "total") == {0: 101, 1: 101, 2: 102, 3: 102}
    assert {o["group"] for o in r.observations.to_pylist() if o["group"]} == {"0x5b1e9d2c8a7f3064"}
    assert {o["name"] for o in rows(r.observations, kind="ras_rank_status")} == {"RUNNING"}
    assert not rows(r.observations, kind="ras_missing_rank")
