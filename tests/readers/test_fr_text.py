"""torchfrtrace text reader: the real crash / fixed outputs and every message generation."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers import fr_text
from ranktrace.analyzers.readers.base import ReaderError, ReadResult

FIX = Path(__file__).resolve().parent.parent / "data" / "readers" / "fr_text"


@pytest.fixture(scope="module")
def gloo(shared_data: Path) -> Path:
    return shared_data / "local" / "torch-2.13-gloo-hang"


def obs(res: ReadResult, kind: str) -> list[dict[str, Any]]:
    return [o for o in res.observations.to_pylist() if o["kind"] == kind]


def test_real_crash_is_a_skip_not_a_finding(gloo: Path) -> None:
    res = fr_text.read(gloo / "torchfrtrace_output.txt")
    assert res.observations.num_rows == 0
    crash = [s for s in res.skipped if "crashed" in s.reason]
    assert len(crash) == 1 and "KeyError: ('0', 0)" in crash[0].reason and crash[0].line == 17


def test_real_fixed_output_names_rank3(gloo: Path) -> None:
    res = fr_text.read(gloo / "torchfrtrace_fixed_output.txt")
    assert res.observations.schema == schema.OBSERVATIONS
    miss = obs(res, "fr_missing_ranks")
    assert [(m["rank"], m["value"], m["group"], m["name"]) for m in miss] == [(3, 11, "0", "all_reduce")]
    assert "default_pg" in miss[0]["detail"] and "state=scheduled" in miss[0]["detail"]
    assert miss[0]["line"] == 8 and miss[0]["source"] == "fr"
    assert res.world_size == 4 and res.skipped == ()


def test_current_generation_mismatch() -> None:
    res = fr_text.read(FIX / "mismatch_current.txt")
    cul = obs(res, "fr_culprit")
    assert [(c["rank"], c["value"], c["name"]) for c in cul] == [(2, 12, "all_reduce"), (3, 12, "all_reduce")]
    assert cul[0]["detail"].startswith("COLLECTIVE_TYPE_MISMATCH: Expected collective type: 'all_reduce'")
    assert cul[1]["detail"].startswith("COLLECTIVE_DTYPE_MISMATCH")
    mm = obs(res, "fr_mismatch")
    assert [(m["detail"], m["value"], m["rank"]) for m in mm] == [
        ("COLLECTIVE_DTYPE_MISMATCH,COLLECTIVE_TYPE_MISMATCH", 12, None)]
    miss = obs(res, "fr_missing_ranks")
    assert [(m["rank"], m["group"], m["value"]) for m in miss] == [(5, "5", 3), (7, "5", 3)]
    assert [m["rank"] for m in obs(res, "fr_missing_dump")] == [6]
    assert any("too many mismatches" in s.reason for s in res.skipped)


def test_tutorial_generation() -> None:
    res = fr_text.read(FIX / "tutorial_2_5.txt")
    miss = obs(res, "fr_missing_ranks")
    assert [(m["rank"], m["value"], m["group"], m["name"]) for m in miss] == [(1, 5, "0", "all_reduce")]
    assert "record_id=4" in miss[0]["detail"]
    assert len(res.skipped) == 1 and res.skipped[0].line == 1  # the shell prompt line


def test_oldest_generation() -> None:
    res = fr_text.read(FIX / "oldest_print.txt")
    assert [(m["rank"], m["group"], m["name"]) for m in obs(res, "fr_missing_ranks")] == [(3, "0", "all_reduce")]
    cul = obs(res, "fr_culprit")
    assert [(c["rank"], c["name"], c["detail"].split(";")[0]) for c in cul] == [
        (1, "broadcast", "SIZE_OR_SYNTAX_MISMATCH")]
    assert res.skipped == ()


def test_missing_dump_crash() -> None:
    res = fr_text.read(FIX / "missing_dump_crash.txt")
    assert [m["rank"] for m in obs(res, "fr_missing_dump")] == [3]
    assert any("AssertionError" in s.reason for s in res.skipped)


def test_truncated_garbage_empty(gloo: Path, tmp_path: Path) -> None:
    data = (gloo / "torchfrtrace_fixed_output.txt").read_bytes()
    half = tmp_path / "half.txt"
    half.write_bytes(data[: len(data) // 2])
    res = fr_text.read(half)  # cut inside the block: the claim is still read
    assert [m["rank"] for m in obs(res, "fr_missing_ranks")] == [3]
    tb = (gloo / "torchfrtrace_output.txt").read_bytes()
    cut = tmp_path / "cut_tb.txt"
    cut.write_bytes(tb[: tb.index(b"KeyError")])
    assert any("crashed" in s.reason for s in fr_text.read(cut).skipped)
    g = tmp_path / "g.txt"
    g.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(ReaderError):
        fr_text.read(g)
    e = tmp_path / "e.txt"
    e.write_bytes(b"")
    assert fr_text.read(e).observations.num_rows == 0


def test_sniff(gloo: Path, shared_data: Path) -> None:
    for p in [gloo / "torchfrtrace_output.txt", gloo / "torchfrtrace_fixed_output.txt", *FIX.glob("*.txt")]:
        assert fr_text.sniff(p, p.read_bytes()[:4096]), p
    for p in [shared_data / "local" / "README.md", gloo / "fr_gloo_rank0.json", gloo / "pyspy_dump_pid5922.txt"]:
        assert not fr_text.sniff(p, p.read_bytes()[:4096]), p
