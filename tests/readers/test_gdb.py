"""gdb reader on the real `thread apply all bt` of a hung gloo rank and on a cuda-gdb fixture."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers import gdb
from ranktrace.analyzers.readers.base import ReaderError

FIX = Path(__file__).resolve().parent.parent / "data" / "readers" / "gdb"


@pytest.fixture(scope="module")
def gloo(shared_data: Path) -> Path:
    return shared_data / "local" / "torch-2.13-gloo-hang"


def test_real_gloo_rank(gloo: Path) -> None:
    res = gdb.read(gloo / "gdb_bt_rank1.txt")
    rows = res.stacks.to_pylist()
    assert res.stacks.schema == schema.STACKS
    assert [(r["tid"], r["thread_name"]) for r in rows] == [
        (5969, "pt_gloo_runloop"), (5968, "pt_gloo_runloop"), (5963, "gloo_tcp_loop"), (5923, "python")]
    assert {(r["pid"], r["rank"], r["native"], r["source"]) for r in rows} == {(5923, 1, True, "gdb")}
    # the gloo worker thread is the one inside the ring all-reduce, waiting to receive
    busy = rows[0]["frames"]
    assert "gloo::transport::tcp::UnboundBuffer::waitRecv (libtorch_cpu.so)" in busy
    assert "gloo::(anonymous namespace)::allreduce (libtorch_cpu.so)" in busy
    assert busy[0] == "__futex_abstimed_wait_common64 (./nptl/futex-internal.c:57)"
    main = rows[3]["frames"]
    assert main[6] == "c10d::Work::wait (libtorch_cpu.so)"
    assert main[-1] == "_start"
    assert all(s.line is None for s in res.skipped)  # only gdb chatter, summarised


def test_two_processes_fixture() -> None:
    res = gdb.read(FIX / "two_processes_cuda_gdb.txt")
    rows = res.stacks.to_pylist()
    assert [(r["pid"], r["tid"], r["thread_name"]) for r in rows] == [
        (7001, 7011, "pt_nccl_watchdg"), (7001, 7010, "cuda-EvtHandlr"), (7001, 7001, "python3"),
        (7002, 7020, None), (7002, 7002, None)]
    assert rows[2]["frames"][2:4] == ["cudaStreamSynchronize (libtorch_cuda.so)",
                                      "c10::cuda::memcpy_and_sync (libtorch_cuda.so)"]
    assert rows[4]["frames"] == ["ncclGroupEnd (libnccl.so.2)", "c10d::ProcessGroupNCCL::allreduce (libtorch_cuda.so)"]
    assert {r["rank"] for r in rows} == {None}
    assert [s.line for s in res.skipped if "torn" in s.reason] == [29]


@pytest.mark.parametrize(
    ("rest", "text"),
    [
        ("0x00007f in c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) () from /x/libtorch_cpu.so",
         "c10d::Work::wait (libtorch_cpu.so)"),
        ("__futex_abstimed_wait_common (futex_word=0x1, expected=0) at ./nptl/futex-internal.c:87",
         "__futex_abstimed_wait_common (./nptl/futex-internal.c:87)"),
        ("0x00007f in ?? () from /lib/libstdc++.so.6", "?? (libstdc++.so.6)"),
        ("0x0000 in _start ()", "_start"),
        ("kernel<<<(1,1,1),(32,1,1)>>> (p=0x0) at k.cu:12", "kernel<<<(1,1,1),(32,1,1)>>> (k.cu:12)"),
        ("0x0 in _PyEval_EvalFrameDefault (tstate=<optimized out>, frame=<optimi", None),
    ],
)
def test_frame_text(rest: str, text: str | None) -> None:
    assert gdb.frame_text(rest) == text


def test_truncated_garbage_empty(gloo: Path, tmp_path: Path) -> None:
    data = (gloo / "gdb_bt_rank1.txt").read_bytes()
    half = tmp_path / "gdb_bt_rank1.txt"
    half.write_bytes(data[: len(data) // 2])
    rows = gdb.read(half).stacks.to_pylist()
    assert 1 <= len(rows) <= 4 and rows[0]["thread_name"] == "pt_gloo_runloop"
    g = tmp_path / "core"
    g.write_bytes(b"\x7fELF\x00\x00" + bytes(200))
    with pytest.raises(ReaderError):
        gdb.read(g)
    e = tmp_path / "e.txt"
    e.write_text("")
    assert gdb.read(e).stacks.num_rows == 0
    with pytest.raises(ReaderError):
        gdb.read(gloo / "pyspy_dump_pid5922.txt")


def test_sniff(gloo: Path) -> None:
    assert gdb.sniff(gloo / "gdb_bt_rank1.txt", (gloo / "gdb_bt_rank1.txt").read_bytes()[:4096])
    f = FIX / "two_processes_cuda_gdb.txt"
    assert gdb.sniff(f, f.read_bytes()[:4096])
    for name in ("pyspy_dump_pid5922.txt", "faulthandler_rank0.txt", "fr_gloo_rank0.json", "fr_gloo_rank0.pkl"):
        assert not gdb.sniff(gloo / name, (gloo / name).read_bytes()[:4096])
