"""gdb and py-spy readers on the stacks of the field corpus as posted: trimmed dumps, frames at the margin, wrapped
frame tails, info threads, banners, pastes cut after attaching. Every thread's stack must come out as a row, with
the rank the file name / prefix / command line gives."""
from __future__ import annotations


import pytest

from ranktrace.analyzers.readers import catalogue, gdb, pyspy
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO

FIELD = REPO / "tests" / "field"


def _read(mod, rel: str):
    doc = open_text(FIELD / rel)
    assert mod.FORMAT in catalogue.scan(doc).families
    return mod.read_doc(doc)


def _stacks(res) -> list[tuple]:
    return [(r["rank"], r["pid"], r["tid"], r["frames"][0] if r["frames"] else None, len(r["frames"]))
            for r in res.stacks.to_pylist()]


@pytest.mark.parametrize("rel,expected", [
    ("trtllm-2560/rank1_bt.txt", [(1, None, 1705706, "syscall (libc.so.6)", 11)]),
    ("trtllm-2560-b/rank1.txt", [(1, None, 1705706, "sched_yield (libc.so.6)", 7)]),
    ("nccl-1550/rank1.txt", [(1, None, 1705706, "sched_yield (libc.so.6)", 7)]),
    ("horovod-361/node_bt.txt", [(None, None, 24453, "btl_openib_component_progress (mca_btl_openib.so)", 4)]),
    # cut above its first header: the orphan frames are a thread of their own
    ("trtllm-2560-b/gdb.txt", [(None, None, None, "?? (libcudadebugger.so.1)", 9),
                               (None, None, 3913167, "poll (libc.so.6)", 6),
                               (None, None, 3913159, "epoll_wait (libc.so.6)", 5)]),
    # a plain `bt` (no thread header), its last frame's library wrapped onto the next line and cut
    ("pytorch-95944/last_rank_gdb.txt", [(None, None, None, "?? (libcuda.so.1)", 16)]),
    ("pytorch-52916/gdb_bt.txt", [(None, None, None, "pybind11::cpp_function::dispatcher (libtorch_python.so)", 16)]),
    ("pytorch-20355/gdb_info_threads.txt", [(None, None, 23578, "poll (libc.so.6)", 1),
                                            (None, None, 23614, "accept4 (libc.so.6)", 1),
                                            (None, None, 23644, "poll (libc.so.6)", 1)]),
])
def test_gdb_field_stacks(rel: str, expected: list[tuple]) -> None:
    assert _stacks(_read(gdb, rel)) == expected


def test_gdb_native_nccl_and_cuda_frames() -> None:
    res = _read(gdb, "pytorch-52916-b/master_gdb.txt")
    frames = res.stacks.to_pylist()[0]["frames"]
    assert frames[:3] == ["__libc_accept (../sysdeps/unix/sysv/linux/accept.c:26)", "bootstrapNetAccept (bootstrap.cc:106)",
                          "bootstrapInit (bootstrap.cc:315)"]
    assert "ncclCommInitRankSync (init.cc:840)" in frames
    frames = _read(gdb, "pytorch-95944/last_rank_gdb.txt").stacks.to_pylist()[0]["frames"]
    assert "cudaMemcpyAsync (libcudart.so.11.0)" in frames
    assert frames[-1].startswith("at::native::_local_scalar_dense_cuda")    # its cut library is not invented


def test_gdb_wrapped_tail_and_cut_address() -> None:
    text = ("#0  0x00007f3a in pthread_cond_wait@@GLIBC_2.3.2 () from /lib64/libpthread.so.0\n"
            "#1  0x00007f1 in cuStreamSynchronize ()\n   from /usr/lib64/libcuda.so.1\n"
            "#2  0x00007f2 in ncclGroupEnd () from /usr/lib/libnccl.so.2\n#3  0x00007f3\n")
    res = gdb.read_doc(text_of_bytes("rank2_gdb.txt", text.encode()))
    (row,) = res.stacks.to_pylist()
    assert row["rank"] == 2
    assert row["frames"] == ["pthread_cond_wait@@GLIBC_2.3.2 (libpthread.so.0)", "cuStreamSynchronize (libcuda.so.1)",
                             "ncclGroupEnd (libnccl.so.2)"]


def test_gdb_cut_after_attaching_names_the_process() -> None:
    res = _read(gdb, "pytorch-15638/gdb_attach.txt")
    assert res.stacks.num_rows == 0
    (row,) = res.observations.to_pylist()
    assert (row["kind"], row["pid"], row["source"]) == ("process", 40855, "gdb")
    assert "cmd=python3.6" in row["detail"]


@pytest.mark.parametrize("rel,expected", [
    ("vllm-50835/engine_core_stack.txt", [(None, 4085279, 4085279, "poll (zmq/sugar/poll.py:106)", 7)]),
    ("vllm-17676/pyspy.txt", [(None, 2403, 2403, "top_k_top_p_sampling_from_logits (flashinfer/sampling.py:1548)",
                               21)]),
    ("accelerate-3104/py-spy.txt", [(None, None, 3295, "all_gather_coalesced "
                                     "(deepspeed/runtime/zero/partition_parameters.py:1254)", 21)]),
    ("fairseq-4816/rank0.txt", [(0, None, None, "wait (threading.py:302)", 12)]),
    ("pytorch-87995/rank0_stack.txt", [(0, None, None, "wait (threading.py:302)", 10)]),
    # frames pasted at the margin, no thread header, last frame cut
    ("sglang-35822/pyspy_both_ranks.txt", [(None, None, None, "tree_speculative_sampling_target_only "
                                                              "(sgl_kernel/speculative.py:36)", 2)]),
    ("sglang-40744/node0_schedulers.txt", [(None, None, None, "monitored_barrier "
                                                              "(torch/distributed/distributed_c10d.py:5435)", 1)]),
])
def test_pyspy_field_stacks(rel: str, expected: list[tuple]) -> None:
    assert _stacks(_read(pyspy, rel)) == expected


def test_pyspy_sglang_watchdog_dumps_in_a_log() -> None:
    res = _read(pyspy, "sglang-17941/server_log_a.txt")
    got = _stacks(res)
    assert (None, 88693, 88693, "0x7fa2d1487d71 (libc.so.6)", 4) in got
    assert res.stacks.to_pylist()[-1]["frames"][-1] == "c10d::ProcessGroupGloo::RecvWork::wait (libtorch_cpu.so)"
    (proc,) = res.observations.to_pylist()
    assert (proc["kind"], proc["pid"]) == ("process", 88693) and proc["detail"].endswith("cmd=sglang::scheduler_PP2_TP1")


def test_pyspy_banner_and_dump_cut_after_its_header() -> None:
    res = _read(pyspy, "returnn-1484/pyspy_6473.txt")
    assert res.stacks.num_rows == 0
    (row,) = res.observations.to_pylist()
    assert (row["kind"], row["pid"], row["line"]) == ("process", 6473, 2)
    assert "rnn.py" in row["detail"]


def test_pyspy_banner_gives_the_pid_of_a_headerless_dump_and_ranks_from_titles() -> None:
    text = ("$ py-spy dump --pid 4242\nThread 4242 (idle): \"MainThread\"\nwait (threading.py:320)\n"
            "all_reduce (torch/distributed/distributed_c10d.py:2501)\n\n"
            "Process 77: sglang::scheduler_TP3\nPython v3.12.3 (/usr/bin/python3.12)\n\n"
            "Thread 77 (active): \"MainThread\"\n    forward (model.py:10)\n")
    res = pyspy.read_doc(text_of_bytes("dumps.txt", text.encode()))
    rows = res.stacks.to_pylist()
    assert [(r["pid"], r["rank"], r["frames"]) for r in rows] == [
        (4242, None, ["wait (threading.py:320)", "all_reduce (torch/distributed/distributed_c10d.py:2501)"]),
        (77, 3, ["forward (model.py:10)"])]
    assert [(o["pid"], o["rank"]) for o in res.observations.to_pylist()] == [(77, 3)]
