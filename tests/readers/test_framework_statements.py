"""What SGLang, vLLM, DeepSpeed, TensorRT-LLM and NCCL write about their own failures and waits, read from real
posted artifacts (tests/field/<case>/, each with its thread's URL in case.json; a few excerpts inline, URL beside):
server statements (a worker died, a scheduler raised, a capture failed, a CUDA check failed), communication frames
beyond torch's c10d, gdb frames whose arguments wrap, Markdown / hard-wrapped watchdog pastes, NCCL's own mismatch
WARN without its host:pid:tid prefix, and opCount from NCCL 2.27 on."""
from __future__ import annotations

import json
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.model.comm_frames import COMM_FRAMES, is_progress_thread, op_of_frame
from ranktrace.analyzers.model.hoststate import classify
from ranktrace.analyzers.readers import catalogue, gdb, nccl_log, server_log
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, rows

FIELD = REPO / "tests" / "field"


def _verdict(case: str) -> dict:
    meta = json.loads((FIELD / case / "case.json").read_text())
    return api.analyze([FIELD / case / f for f in meta["files"]], liveness=None).verdict.to_dict()


def _brief(v: dict) -> tuple:
    return v["status"], v["kind"], (v["operation"] or {}).get("name"), v["culprit_ranks"]


def _server_obs(case: str, name: str) -> list[dict]:
    doc = open_text(FIELD / case / name)
    assert "server_log" in catalogue.scan(doc).families
    return server_log.read_doc(doc).observations.to_pylist()


def test_a_vllm_worker_that_died_is_the_rank_that_exited() -> None:
    # https://github.com/OpenPipe/ART/issues/201: "Worker proc VllmWorker-1 died unexpectedly, shutting down executor."
    (row,) = [o for o in _server_obs("openpipeart-201", "vllm.log") if o["kind"] == "rank_exit"]
    assert (row["rank"], row["name"], row["line"]) == (1, "exit", 2)
    assert _brief(_verdict("openpipeart-201")) == ("crashed", "rank_exited", None, [1])
    # https://github.com/vllm-project/vllm-ascend/pull/7742: vLLM-Ascend's own prefix, "(exit code: None)"
    assert _brief(_verdict("vllmascend-pr7742")) == ("crashed", "rank_exited", None, [14])


def test_a_cuda_check_failure_in_custom_all_reduce_is_a_crash_with_its_cause() -> None:
    # https://github.com/ai-dynamo/dynamo/issues/787: "VLLM: Failed: /workspace/csrc/custom_all_reduce.cuh:368
    # 'invalid argument'" behind dynamo's logger (CUDACHECK prints it, then exit(EXIT_FAILURE))
    obs = _server_obs("dynamo-787", "dynamo.log")
    errors = [o for o in obs if o["kind"] == "transport_error"]
    assert len(errors) == 7 and {o["name"] for o in errors} == {"cuda_error"}
    assert "custom_all_reduce.cuh:368 'invalid argument'" in errors[0]["detail"]
    assert {(o["name"], o["value"]) for o in obs if o["kind"] == "rank_exit"} == {("exit", 1)}
    v = _verdict("dynamo-787")
    assert v["status"] == "crashed" and not v["culprit_ranks"]  # no line says which worker printed it
    assert any("custom_all_reduce.cuh:368" in e["detail"] for f in v["findings"] for e in f["evidence"])


def test_sglang_capture_failed_is_a_failed_capture_whatever_its_cause() -> None:
    # https://github.com/sgl-project/sglang/issues/4205 (traceback) and #5883 (one line inside prose): SGLang wraps
    # any error of the capture in "Capture cuda graph failed: ..."; here a gloo peer went away / timed out
    for case in ("sglang-4205", "sglang-5883"):
        v = _verdict(case)
        assert _brief(v)[:3] == ("crashed", "graph_capture", "cuda_graph_capture"), case
        assert "a CUDA call that capture does not allow" not in v["summary"]  # that is not what failed here
        assert "gloo" in v["summary"]
    # a forbidden call inside capture keeps its explanation (sgl-project/sglang#7918)
    assert "a CUDA call that capture does not allow" in _verdict("sglang-7918")["summary"]


def test_an_sglang_child_that_failed_after_its_watchdog_is_the_watchdog_s_consequence() -> None:
    # https://github.com/sgl-project/sglang/issues/3752: all eight TP schedulers' watchdogs fire, then the main process
    # "Received sigquit from a child proces": a crash, and no rank is the cause
    (row,) = [o for o in _server_obs("sglang-3752", "server.log") if o["kind"] == "rank_exit"]
    assert row["rank"] is None and row["detail"].startswith("after the scheduler watchdog timeout of line 1")
    v = _verdict("sglang-3752")
    assert (v["status"], v["culprit_ranks"]) == ("crashed", []) and "watchdog" in v["summary"]


def test_an_sglang_scheduler_exception_ends_that_scheduler() -> None:
    # https://github.com/SemiAnalysisAI/InferenceX/pull/1570 ("026-05-28 ... DP0 TP0 EP0] Scheduler hit an exception:",
    # the line's first characters cut) and https://github.com/sgl-project/sglang/issues/8974 (pynccl init error, then
    # the main process's sigquit): the exception line is the rank's exit; set-up's failure stays the verdict
    (row,) = [o for o in _server_obs("inferencex-pr1570", "ci.log") if o["kind"] == "rank_exit"]
    assert (row["name"], row["line"]) == ("exception", 1)
    assert _brief(_verdict("inferencex-pr1570"))[:2] == ("crashed", "rank_exited")
    assert _brief(_verdict("sglang-8974"))[:2] == ("crashed", "init_hang")


def test_a_statement_quoted_in_prose_counts_and_the_prose_is_skipped() -> None:
    # https://github.com/sgl-project/sglang/issues/5883: a paragraph of prose around one exception line
    doc = open_text(FIELD / "sglang-5883" / "report.md")
    scan = catalogue.scan(doc)
    assert scan.lines["server_log"] == [4] and scan.used < scan.total
    (read,) = _verdict("sglang-5883")["input_reads"]
    assert read["lines_used"] >= 1 and read["lines_total"] == 9


def test_deepspeed_zero3_all_gather_is_inside_communication() -> None:
    # https://github.com/huggingface/accelerate/issues/3104: py-spy of a hung ZeRO-3 rank, innermost
    # all_gather_coalesced (deepspeed/runtime/zero/partition_parameters.py:1254); it read "busy outside collectives"
    assert _brief(_verdict("accelerate-3104"))[:3] == ("hang", "stuck_in_collective", "all_gather_coalesced")
    frame = "all_gather_coalesced (deepspeed/runtime/zero/partition_parameters.py:1254)"
    assert classify((frame, "wrapped_fn (deepspeed/utils/nvtx.py:18)"), "active") == "in_collective"


def test_tensorrt_llm_plugin_frames_name_their_collective() -> None:
    # https://github.com/NVIDIA/TensorRT-LLM/issues/2560: rank1's executor thread in AllgatherPlugin::enqueue (gdb)
    res = gdb.read_doc(open_text(FIELD / "trtllm-2560" / "rank1_bt.txt"))
    frames = [f for r in res.stacks.to_pylist() for f in r["frames"] if "AllgatherPlugin" in f]
    assert frames and op_of_frame(frames[0]) == "all_gather"
    assert _verdict("trtllm-2560")["kind"] == "stuck_in_collective"  # was "unknown": no collective seen


def test_vllm_message_queue_is_not_communication() -> None:
    # https://github.com/vllm-project/vllm/issues/50835: the engine waits in shm_broadcast's MessageQueue (its control
    # plane), not in a collective: still blocked outside collectives
    assert _verdict("vllm-50835")["kind"] == "blocked_outside_collective"
    assert not op_of_frame("recv (vllm/distributed/device_communicators/shm_broadcast.py:802)")
    assert op_of_frame("all_reduce (vllm/distributed/device_communicators/cpu_communicator.py:40)") == "all_reduce"


# https://github.com/NVIDIA/nccl/issues/901 (rank0's "thread apply all bt", two of its threads): NCCL's proxy threads
# exist in a healthy rank too; they are communication machinery, never the rank's state
_NCCL_901 = """(gdb) thread apply all bt

Thread 10 (Thread 0x7f322e3fa000 (LWP 496156)):
#0  futex_wait_cancelable (private=<optimized out>, expected=0, futex_word=0x7f322e7fb158) at ../sysdeps/nptl/futex-internal.h:183
#1  __pthread_cond_wait_common (abstime=0x0, clockid=0, mutex=0x7f322e7fb108, cond=0x7f322e7fb130) at pthread_cond_wait.c:508
#2  __pthread_cond_wait (cond=cond@entry=0x7f322e7fb130, mutex=mutex@entry=0x7f322e7fb108) at pthread_cond_wait.c:647
#3  0x00007f326f3d9740 in ncclProxyGetPostedOps (added=<synthetic pointer>, proxyState=0x5603cb96d1e0) at proxy.cc:713
#4  ncclProxyProgress (proxyState_=0x5603cb96d1e0) at proxy.cc:868
#5  0x00007f326f33f609 in start_thread (arg=<optimized out>) at pthread_create.c:477
#6  0x00007f326ef18133 in clone () at ../sysdeps/unix/sysv/linux/x86_64/clone.S:95

Thread 9 (Thread 0x7f32517fd000 (LWP 496152)):
#0  0x00007f326ef0b99f in __GI___poll (fds=fds@entry=0x7f32517f09e0, nfds=nfds@entry=65, timeout=timeout@entry=500) at ../sysdeps/unix/sysv/linux/poll.c:29
#1  0x00007f326f3d9da7 in poll (__timeout=500, __nfds=65, __fds=0x7f32517f09e0) at /usr/include/x86_64-linux-gnu/bits/poll2.h:46
#2  ncclProxyService (_args=0x5603cb96d1e0) at proxy.cc:1437
"""


def test_nccl_proxy_threads_are_progress_threads_not_a_rank_in_a_collective() -> None:
    res = gdb.read_doc(text_of_bytes("nccl-901.txt", _NCCL_901.encode()))
    stacks = [tuple(r["frames"]) for r in res.stacks.to_pylist()]
    assert len(stacks) == 2 and all(is_progress_thread(s) for s in stacks)
    assert all(classify(s, None) != "in_collective" for s in stacks)
    assert {f.framework for f in COMM_FRAMES} >= {"DeepSpeed", "TensorRT-LLM", "NCCL", "vLLM"}
    assert all(f.read_from for f in COMM_FRAMES)


def test_gdb_frames_whose_arguments_wrap_are_read_whole() -> None:
    # https://github.com/NVIDIA/nccl/issues/176: ncclEnqueueCheck's and ncclAllReduce's arguments continue on
    # indented lines; the frames were dropped as torn and the stack read "busy outside collectives"
    res = gdb.read_doc(open_text(FIELD / "nccl-176" / "gdb.txt"))
    (stack,) = res.stacks.to_pylist()
    assert [f.split(" (")[0] for f in stack["frames"]] == [
        "sched_yield", "ncclCpuBarrierWait", "ncclEnqueueCheck", "ncclAllReduce", "dh::AllReducer::AllReduceSum"]
    assert stack["frames"][2] == "ncclEnqueueCheck (misc/enqueue.cu:205)"
    assert not res.skipped
    assert _brief(_verdict("nccl-176"))[:3] == ("hang", "stuck_in_collective", "all_reduce")


def test_a_markdown_paste_of_a_hard_wrapped_watchdog_line_is_read() -> None:
    # https://github.com/sgl-project/sglang/issues/3932: a backtick, **bold**, and wraps mid-number and mid-word
    doc = open_text(FIELD / "sglang-3932" / "comment.md")
    texts = [ln.text for ln in doc.lines]
    assert any("OpType=_ALLGATHER_BASE, NumelIn=8080, NumelOut=129280, Timeout(ms)=600000) ran for" in t for t in texts)
    assert any("last enqueued NCCL work: 151721" in t for t in texts)
    assert _brief(_verdict("sglang-3932"))[:3] == ("crashed", "stuck_in_collective", "all_gather_into_tensor")
    # a C++ pointer is no Markdown
    assert text_of_bytes("x", b"#1  f (char**, char**) at a.cc:3\n").lines[0].text == "#1  f (char**, char**) at a.cc:3"


def test_nccl_s_own_mismatch_warn_without_its_prefix() -> None:
    # https://github.com/NVIDIA/nccl/issues/296: "init.cc:1247 NCCL WARN Mismatched collective detected, please check
    # your collective calls at and around rank 39" with no host:pid:tid: exit 2 before
    res = nccl_log.read_doc(open_text(FIELD / "nccl-296" / "warn.txt"))
    (row,) = rows(res.observations, kind="nccl_mismatch")
    assert (row["rank"], row["value"], row["name"]) == (None, 39, "init.cc:1247")
    v = _verdict("nccl-296")
    assert (v["kind"], v["culprit_ranks"]) == ("collective_mismatch", [])  # "at and around" is a hint, not a culprit
    assert "rank 39" in v["summary"]


# https://github.com/pytorch/torchtitan/issues/1369: two ranks of one TP communicator mid-run (no Init lines), their
# opCounts in step; with the version line of https://github.com/NVIDIA/nccl/issues/1762 ("NCCL version 2.27.3
# compiled with CUDA 12.9") in front, opCount is not a position (NVIDIA/nccl#2021: "2.27+ single node, opCount
# always 0"), so neither rank is numbered by it
_TITAN_1369 = """NCCL version 2.27.3 compiled with CUDA 12.9
hopper01:191370:191425 [1] NCCL INFO AllGather: opCount d sendbuff 0x7fa921200000 recvbuff 0x7fa915800000 count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] stream 0x55fca193e8e0
hopper01:191369:191420 [0] NCCL INFO ReduceScatter: opCount e sendbuff 0x7fdf57c00000 recvbuff 0x7fdf61a00000 count 2097152 datatype 7 op 0 root 0 comm 0x55e290bd32d0 [nranks=2] stream 0x55e29067e430
hopper01:191369:191420 [0] NCCL INFO AllGather: opCount f sendbuff 0x7fdf61200000 recvbuff 0x7fdf55800000 count 2097152 datatype 7 op 0 root 0 comm 0x55e290bd32d0 [nranks=2] stream 0x55e29067e430
hopper01:191370:191425 [1] NCCL INFO ReduceScatter: opCount e sendbuff 0x7fa917c00000 recvbuff 0x7fa921a00000 count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] stream 0x55fca193e8e0
hopper01:191370:191425 [1] NCCL INFO AllGather: opCount f sendbuff 0x7fa921200000 recvbuff 0x7fa915800000 count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] stream 0x55fca193e8e0
"""


def test_opcount_is_no_position_from_nccl_2_27_on() -> None:
    body = _TITAN_1369.split("\n", 1)[1]
    old = nccl_log.read_doc(text_of_bytes("titan.log", body.encode()))
    new = nccl_log.read_doc(text_of_bytes("titan.log", _TITAN_1369.encode()))
    assert {r["detail"] for r in rows(old.observations, kind="nccl_seq_basis")} == {"opcount"}
    assert {r["detail"] for r in rows(new.observations, kind="nccl_seq_basis")} == {"line_from_log_start"}
    assert any("NCCL 2.27.3" in s.reason for s in new.skipped)
    seqs = sorted(r["seq"] for r in rows(new.events, kind="enter"))
    assert seqs == [1, 1, 2, 2, 3]   # positions in each rank's own lines, not opCount + 1 (14, 15, 16)


def test_an_nvidia_smi_table_without_its_banner_is_read() -> None:
    # https://github.com/facebookresearch/Mask2Former/issues/74: a condensed GPU list and nvidia-smi's process table,
    # no "NVIDIA-SMI ... Driver Version" line above them (exit 2 before); nothing in it says hang, so no verdict does
    from ranktrace.analyzers.readers import nvidia_smi

    doc = open_text(FIELD / "mask2former-74" / "nvidia-smi.txt")
    assert "nvidia_smi" in catalogue.scan(doc).families
    procs = rows(nvidia_smi.read_doc(doc).observations, kind="gpu_process")
    assert [(p["name"], p["pid"], p["value"]) for p in procs][:2] == [("0", 18684, 13195), ("1", 18685, 13223)]
    assert len(procs) == 6
    v = _verdict("mask2former-74")
    assert v["status"] not in ("hang", "crashed") and not v["culprit_ranks"]


def test_a_vllm_start_up_log_that_only_states_its_release_is_read() -> None:
    # https://github.com/vllm-project/vllm/issues/12292: the API server's version and args, hard-wrapped (exit 2
    # before); the release is a fact, not a verdict
    (row,) = [o for o in _server_obs("vllm-12292", "startup.log") if o["kind"] == "version"]
    assert (row["name"], row["detail"], row["line"]) == ("vllm", "0.5.4", 2)
    assert _verdict("vllm-12292")["status"] == "inconclusive"


def test_a_server_whose_scheduler_watchdog_fired_is_not_idle() -> None:
    # https://github.com/sgl-project/sglang/issues/7783: requests served (POST ... 200), then TP3's scheduler watchdog
    # fires on a batch of 109 requests; the served requests must not make that an idle server
    v = _verdict("sglang-7783")
    assert v["status"] not in ("idle", "completed")
    # a server that serves, with only its DP controller's own watchdog dump, is (sgl-project/sglang#20766)
    v = _verdict("sglang-pr20766")
    assert (v["status"], v["culprit_ranks"]) == ("idle", [])
    assert {r for read in v["input_reads"] for r in read["recognised"]} == {"pyspy", "server_log"}


def test_a_container_stamp_before_vllm_s_own_prefix_and_the_engine_start_wait() -> None:
    # https://github.com/vllm-project/vllm/issues/18260: "2025-05-16T13:12:16.645427617Z DEBUG 05-16 13:12:16
    # [core_client.py:425] Waiting for 1 core engine proc(s) to start: {0}" every 10 s (exit 2 before: the stamp
    # took vLLM's level with it); one stall row spanning the waits, no verdict of its own
    doc = open_text(FIELD / "vllm-18260" / "container.log")
    assert doc.lines[0].text == "Waiting for 1 core engine proc(s) to start: {0}"
    (row,) = [o for o in _server_obs("vllm-18260", "container.log") if o["kind"] == "server_stall"]
    assert (row["name"], row["value"], row["line"]) == ("engine_start_wait", 50, 1)
    assert _verdict("vllm-18260")["status"] == "inconclusive"
