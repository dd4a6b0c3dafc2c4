"""py-spy reader on real py-spy 0.4.3 output (text, JSON, native, locals, subprocesses, errors) and fixtures."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers import pyspy
from ranktrace.analyzers.readers.base import ReaderError

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "data" / "readers" / "pyspy"
SCEN = HERE.parent / "data" / "scenarios"
PID_RANK = {5922: 0, 5923: 1, 5924: 2, 5925: 3}  # shared/data/local/README.md


@pytest.fixture(scope="module")
def gloo(shared_data: Path) -> Path:
    return shared_data / "local" / "torch-2.13-gloo-hang"


@pytest.fixture(scope="module")
def gen(shared_data: Path) -> Path:
    return shared_data / "external" / "local-generated" / "py-spy-0.4.3"


def stacks(path: Path) -> list[dict[str, Any]]:
    return pyspy.read(path).stacks.to_pylist()


def main_thread(rows: list[dict[str, Any]], pid: int | None = None) -> dict[str, Any]:
    (m,) = [r for r in rows if r["thread_name"] == "MainThread" and (pid is None or r["pid"] == pid)]
    return m


def test_waiting_ranks_sit_in_all_reduce(gloo: Path) -> None:
    """Ranks 0-2's main thread is inside all_reduce; rank 3 is elsewhere (it skipped the collective)."""
    for pid, rank in PID_RANK.items():
        m = main_thread(stacks(gloo / f"pyspy_dump_pid{pid}.txt"))
        assert (m["pid"], m["tid"], m["thread_state"], m["native"], m["source"]) == (pid, pid, "idle", False, "pyspy")
        top = m["frames"][0]
        if rank < 3:
            assert top == "all_reduce (torch/distributed/distributed_c10d.py:3252)"
            assert m["frames"][2] == "worker (ddp_loop.py:36)"
        else:
            assert "all_reduce" not in " ".join(m["frames"]) and top == "worker (ddp_loop.py:43)"
        assert m["rank"] is None  # a pid in the file name is not a rank
        assert m["frames"][-1] == "<module> (<string>:1)"


def test_subprocesses_file(gloo: Path) -> None:
    res = pyspy.read(gloo / "pyspy_dump_parent_subprocesses.txt")
    rows = res.stacks.to_pylist()
    assert res.stacks.schema == schema.STACKS and res.skipped == ()
    assert [r["pid"] for r in rows] == [5892, 5922, 5921, 5923, 5924, 5925]
    assert len({r["snapshot"] for r in rows}) == 6
    in_ar = sorted(r["pid"] for r in rows if r["frames"][0].startswith("all_reduce ("))
    assert in_ar == [5922, 5923, 5924]


def test_json_matches_text(gloo: Path) -> None:
    j = main_thread(stacks(gloo / "pyspy_dump_rank0--json.txt"))
    t = main_thread(stacks(gloo / "pyspy_dump_pid5922.txt"))
    assert j["frames"] == t["frames"]
    assert (j["pid"], j["tid"], j["thread_state"]) == (t["pid"], t["tid"], t["thread_state"])
    assert j["rank"] == 0  # from the file name


def test_native_json_rank3(gloo: Path) -> None:
    m = main_thread(stacks(gloo / "pyspy_dump_rank3_native.json"))
    assert m["native"] and m["rank"] == 3
    assert m["frames"][:3] == ["clock_nanosleep (libc.so.6)", "time_sleep (libpython3.11.so.1.0)",
                               "worker (ddp_loop.py:43)"]


def test_dump_text_json_locals_native(gen: Path) -> None:
    txt = {r["tid"]: r for r in stacks(gen / "dump.txt")}
    js = {r["tid"]: r for r in stacks(gen / "dump.json")}
    loc = {r["tid"]: r for r in stacks(gen / "dump_locals.txt")}
    nat = {r["tid"]: r for r in stacks(gen / "dump_native.txt")}
    assert set(txt) == set(js) == set(loc) == set(nat) == {9802, 9844, 9845}
    for tid in txt:
        assert txt[tid]["frames"] == js[tid]["frames"] == loc[tid]["frames"]  # --locals lines are skipped
        assert txt[tid]["thread_state"] == js[tid]["thread_state"]
        assert [f for f in nat[tid]["frames"] if f in txt[tid]["frames"]] == txt[tid]["frames"]
    assert txt[9845]["thread_state"] == "active+gil" and txt[9845]["thread_name"] == "busy-thread"
    assert not txt[9802]["native"] and nat[9802]["native"]
    assert nat[9844]["frames"][0] == "0x7f76f78a3f16 (libc.so.6)"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("dump_eperm.stderr", "permission_denied"), ("dump_nopid.stderr", "no_such_process"),
     ("dump_notpython.stderr", "not_python")],
)
def test_pyspy_error_outputs(gen: Path, name: str, kind: str) -> None:
    p = gen / name
    assert pyspy.sniff(p, p.read_bytes())
    res = pyspy.read(p)
    assert res.stacks.num_rows == 0
    (s,) = res.skipped
    assert f"({kind})" in s.reason and s.line == 1


def test_sglang_watchdog_log() -> None:
    res = pyspy.read(FIX / "sglang_watchdog.log")
    rows = res.stacks.to_pylist()
    assert sorted({(r["pid"], r["rank"], r["native"]) for r in rows}) == [(8812, 1, True), (8814, 2, False)]
    m = main_thread(rows, 8812)
    assert m["thread_state"] == "active" and "cudaStreamSynchronize (libcudart.so.12)" in m["frames"]
    assert main_thread(rows, 8814)["frames"][0].startswith("broadcast (torch/distributed/")
    reasons = [s.reason for s in res.skipped]
    assert any("pid 8813 (other)" in r and "UNW_EBADREG" in r for r in reasons)
    assert any("pid 8813 (permission_denied)" in r for r in reasons)
    assert any("all py-spy attempts failed for pid 8813" in r for r in reasons)
    assert any("outside py-spy dumps" in r for r in reasons)


def test_torchrun_prefix_gives_rank() -> None:
    rows = stacks(FIX / "torchrun_prefixed.txt")
    assert [(r["pid"], r["rank"], r["frames"][0]) for r in rows] == [
        (7702, 2, "all_reduce (torch/distributed/distributed_c10d.py:3252)"),
        (7703, 3, "save (torch/serialization.py:966)")]


def test_trimmed_and_hex_ids() -> None:
    rows = stacks(FIX / "trimmed_top_frames.txt")
    assert [(r["tid"], r["thread_state"], r["frames"]) for r in rows] == [
        (812, "active", ["synchronize (torch/cuda/__init__.py:1040)", "train_step (train.py:70)"]),
        (866, "idle", ["Condition.wait (threading.py:331)"])]
    assert rows[0]["pid"] is None
    hexr = stacks(FIX / "hex_thread_ids.txt")
    assert [(r["pid"], r["tid"], r["thread_name"]) for r in hexr] == [(3311, None, "MainThread"), (3311, None, None)]


def test_torn_lines() -> None:
    res = pyspy.read(FIX / "torn_lines.txt")
    rows = {r["tid"]: r for r in res.stacks.to_pylist()}
    assert rows[9802]["frames"] == ["all_reduce_like (hangdemo.py:13)"]
    assert rows[9844]["frames"][-2:] == ["Thread._bootstrap_inner (threading.py:1045)",
                                         "Thread._bootstrap (threading.py:1002)"]
    assert rows[9845]["frames"] == ["spinner (hangdemo.py:8)"]
    assert len(res.skipped) == 1 and res.skipped[0].line == 6


def test_truncated_garbage_empty_misleading(gloo: Path, gen: Path, tmp_path: Path) -> None:
    data = (gloo / "pyspy_dump_parent_subprocesses.txt").read_bytes()
    half = tmp_path / "half.txt"
    half.write_bytes(data[: len(data) // 2])
    rows = stacks(half)
    assert 0 < len(rows) < 6 and rows[0]["pid"] == 5892
    head_only = tmp_path / "head_only.txt"
    head_only.write_bytes(b"".join(data.splitlines(keepends=True)[:2]))
    res = pyspy.read(head_only)
    assert res.stacks.num_rows == 0 and "no thread" in res.skipped[0].reason
    js = (gen / "dump.json").read_bytes()
    hj = tmp_path / "half.json"
    hj.write_bytes(js[: len(js) // 2])
    res = pyspy.read(hj)
    assert 1 <= res.stacks.num_rows < 3 and "truncated" in res.skipped[0].reason
    g = tmp_path / "garbage.txt"
    g.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ReaderError):
        pyspy.read(g)
    e = tmp_path / "empty.txt"
    e.write_bytes(b"")
    assert pyspy.read(e).stacks.num_rows == 0
    m = FIX / "misleading" / "pyspy_dump_rank0.json"
    assert not pyspy.sniff(m, m.read_bytes())
    with pytest.raises(ReaderError):
        pyspy.read(m)
    other = tmp_path / "pyspy_rank1.json"
    other.write_text('[{"name": "x", "ph": "X"}]')
    with pytest.raises(ReaderError):
        pyspy.read(other)
    with pytest.raises(ReaderError):
        pyspy.read(gloo / "gdb_bt_rank1.txt")


def test_sniff(gloo: Path, gen: Path) -> None:
    yes = [*gloo.glob("pyspy_*"), gen / "dump.txt", gen / "dump.json", gen / "dump_locals.txt",
           gen / "dump_native.txt", *[p for p in FIX.glob("*") if p.suffix != ".md" and p.is_file()]]
    for p in yes:
        assert pyspy.sniff(p, p.read_bytes()[:4096]), p
    for p in [gloo / "gdb_bt_rank1.txt", gloo / "faulthandler_rank0.txt", gloo / "fr_gloo_rank0.json",
              gloo / "fr_gloo_rank0.pkl", gloo / "torchfrtrace_output.txt", gen / "rcs.txt"]:
        assert not pyspy.sniff(p, p.read_bytes()[:4096]), p


def test_scenario_pyspy_one_elsewhere() -> None:
    mains = {r: main_thread(stacks(SCEN / "pyspy_one_elsewhere" / f"rank{r}.txt")) for r in range(4)}
    assert {r: m["rank"] for r, m in mains.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    for r in range(3):
        assert mains[r]["frames"][0] == "all_reduce (torch/distributed/distributed_c10d.py:3252)"
        assert mains[r]["frames"][2:4] == mains[0]["frames"][2:4]  # same train-step call site
    assert not any("all_reduce" in f for f in mains[3]["frames"])


def test_scenario_nccl_not_completed_stacks() -> None:
    d = SCEN / "fr_nccl_not_completed"
    m3 = main_thread(stacks(d / "pyspy_rank3.txt"))
    assert m3["rank"] == 3 and m3["native"] and m3["thread_state"] == "active"
    assert any("tolist" in f for f in m3["frames"]) and any("cudaStreamSynchronize" in f for f in m3["frames"])
    for r in range(3):
        assert main_thread(stacks(d / f"pyspy_rank{r}.txt"))["frames"][0].startswith("barrier (")
