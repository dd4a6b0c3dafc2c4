"""faulthandler reader on the real SIGUSR1 dump and on a multi-dump fixture."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers import faulthandler as fh
from ranktrace.analyzers.readers.base import ReaderError

FIX = Path(__file__).resolve().parent.parent / "data" / "readers" / "faulthandler"


@pytest.fixture(scope="module")
def gloo(shared_data: Path) -> Path:
    return shared_data / "local" / "torch-2.13-gloo-hang"


def test_real_dump(gloo: Path) -> None:
    res = fh.read(gloo / "faulthandler_rank0.txt")
    assert res.stacks.schema == schema.STACKS and res.skipped == ()
    (row,) = res.stacks.to_pylist()
    assert row["rank"] == 0 and row["thread_name"] == "<current>" and row["source"] == "faulthandler"
    assert row["frames"][0] == \
        "all_reduce (/home/user/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)"
    assert row["frames"][2] == "worker (jobs/fh_hang.py:11)" and row["frames"][-1] == "<module> (<string>:1)"
    assert (row["tid"], row["pid"], row["native"], row["thread_state"]) == (None, None, False, "unknown")


def test_repeated_and_fatal_dumps() -> None:
    res = fh.read(FIX / "fatal_and_repeat.txt")
    rows = res.stacks.to_pylist()
    assert [r["snapshot"] for r in rows] == ["fatal_and_repeat.txt#1"] * 2 + ["fatal_and_repeat.txt#2"] * 2 + \
        ["fatal_and_repeat.txt#3"] * 2
    assert [r["rank"] for r in rows] == [1, 1, 1, 1, None, None]
    # glued frame lines are split; the cut one is reported, the rest of that stack kept
    assert rows[2]["frames"] == rows[0]["frames"]
    assert rows[3]["frames"] == [f for f in rows[1]["frames"] if not f.startswith("wrapper")]
    assert [s.line for s in res.skipped if "torn" in s.reason] == [21]
    assert rows[4]["frames"] == [] and rows[5]["frames"][0] == "crash (/work/ext.py:12)"
    fatal = res.observations.to_pylist()
    assert [(o["kind"], o["detail"], o["line"]) for o in fatal] == [("py_fatal_error", "Segmentation fault", 24)]


def test_truncated_garbage_empty(gloo: Path, tmp_path: Path) -> None:
    data = (gloo / "faulthandler_rank0.txt").read_bytes()
    half = tmp_path / "faulthandler_rank0.txt"
    half.write_bytes(data[: len(data) // 2])
    res = fh.read(half)
    (row,) = res.stacks.to_pylist()
    assert 1 <= len(row["frames"]) < 9 and row["rank"] == 0
    g = tmp_path / "g.txt"
    g.write_bytes(b"\x00garbage" * 50)
    with pytest.raises(ReaderError):
        fh.read(g)
    e = tmp_path / "e.txt"
    e.write_text("")
    assert fh.read(e).stacks.num_rows == 0
    tb = tmp_path / "traceback.txt"  # an exception traceback is not a faulthandler dump
    tb.write_text('Traceback (most recent call last):\n  File "x.py", line 3, in <module>\nValueError: x\n')
    assert not fh.sniff(tb, tb.read_bytes())
    with pytest.raises(ReaderError):
        fh.read(tb)


def test_sniff(gloo: Path) -> None:
    assert fh.sniff(gloo / "faulthandler_rank0.txt", (gloo / "faulthandler_rank0.txt").read_bytes())
    assert fh.sniff(FIX / "fatal_and_repeat.txt", (FIX / "fatal_and_repeat.txt").read_bytes()[:4096])
    for name in ("pyspy_dump_pid5922.txt", "gdb_bt_rank1.txt", "fr_gloo_rank0.json", "torchfrtrace_output.txt"):
        assert not fh.sniff(gloo / name, (gloo / name).read_bytes()[:4096])
