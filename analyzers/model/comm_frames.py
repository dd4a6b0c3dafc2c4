"""Stack frames that mean "inside communication", as data: each with the framework and the release (or the public
thread) its name was read from, and whether the thread that shows it is *calling* into communication (the rank waits
there: ``in_collective``) or is a library's own progress thread (NCCL's proxy threads: communication machinery that
exists in every rank, hung or not, so never a rank's state by itself).

torch's own c10d frames (``distributed_c10d.py``, ``ProcessGroup*``, ``Work::wait``) are in hoststate's rules; these
are the frameworks above and the libraries below it, whose frames a stack shows innermost when the wait is theirs
(DeepSpeed's ZeRO-3 parameter all-gather, TensorRT-LLM's NCCL plugins, NCCL's own entry points, vLLM's CPU and
pynccl communicators). Without them such a stack read as "busy outside collectives: no communication is involved".

A pattern is searched in one frame as the readers spell it: ``func (file.py:12)`` (py-spy, tracebacks), ``func
(lib.so)`` / ``ns::Class::method (file.cc:12)`` (gdb, py-spy --native). Imports nothing (model and readers share it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CommFrame", "COMM_FRAMES", "CALL_FRAME_PATTERN", "PROGRESS_FRAME_PATTERN", "is_comm_call",
           "is_progress_thread", "op_of_frame"]


@dataclass(frozen=True)
class CommFrame:
    """One frame name (a regex) that is communication, where it was read, and what a thread showing it does."""

    pattern: str
    framework: str
    read_from: str
    role: str = "call"        # "call": the thread waits in it | "progress": a library's own progress thread
    op: str | None = ""       # the operation it is: "" = the frame's own function name, None = not named by it


#: a collective's function name, its suffix included (broadcast_object, recv_tensor_dict); one \w* only, so the
#: patterns stay linear in the frame's length
_COLL = r"(?:all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|barrier|gather|scatter|send|recv)\w*"

COMM_FRAMES: tuple[CommFrame, ...] = (
    # DeepSpeed ZeRO-3: the parameter fetch and the gradient reduce-scatter, each issuing a coalesced collective
    CommFrame(r"^all_gather_coalesced \([\w/.-]*deepspeed/runtime/zero/partition_parameters\.py",
              "DeepSpeed", "0.10-0.16 deepspeed/runtime/zero/partition_parameters.py (huggingface/accelerate#3104)"),
    CommFrame(r"^reduce_scatter_coalesced \([\w/.-]*deepspeed/runtime/comm/coalesced_collectives\.py",
              "DeepSpeed", "0.10-0.16 deepspeed/runtime/comm/coalesced_collectives.py"),
    CommFrame(r"^" + _COLL + r" \([\w/.-]*deepspeed/comm/(?:torch|comm|ccl)\.py",
              "DeepSpeed", "0.9-0.16 deepspeed/comm/{comm,torch}.py (the deepspeed.comm facade over torch.distributed)"),
    # TensorRT-LLM's NCCL plugins (cpp/tensorrt_llm/plugins/ncclPlugin/*.cpp): the engine's collectives
    CommFrame(r"(?:tensorrt_llm::plugins::|^)AllgatherPlugin::", "TensorRT-LLM",
              "0.9-1.2 cpp/tensorrt_llm/plugins/ncclPlugin/allgatherPlugin.cpp (NVIDIA/TensorRT-LLM#2560)",
              op="all_gather"),
    CommFrame(r"(?:tensorrt_llm::plugins::|^)All[Rr]educePlugin::", "TensorRT-LLM",
              "0.9-1.2 cpp/tensorrt_llm/plugins/ncclPlugin/allreducePlugin.cpp", op="all_reduce"),
    CommFrame(r"(?:tensorrt_llm::plugins::|^)ReduceScatterPlugin::", "TensorRT-LLM",
              "0.9-1.2 cpp/tensorrt_llm/plugins/ncclPlugin/reduceScatterPlugin.cpp", op="reduce_scatter"),
    CommFrame(r"(?:tensorrt_llm::plugins::|^)(?:Send|Recv)Plugin::", "TensorRT-LLM",
              "0.9-1.2 cpp/tensorrt_llm/plugins/ncclPlugin/{send,recv}Plugin.cpp (pipeline parallel)", op=None),
    # NCCL's own entry points: a host thread inside one is inside the collective's launch (2.2-2.3 block in the
    # cross-thread CPU barrier of a multi-GPU-per-process communicator; later releases in the group launch)
    CommFrame(r"^nccl(?:AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AllToAll|Gather|Scatter|"
              r"GroupEnd\w*|GroupStart|EnqueueCheck|CpuBarrier(?:In|Out|Wait)|LaunchKernel|BarrierEnqueue\w*)\b",
              "NCCL", "2.2-2.28 src/enqueue.cc, src/group.cc, src/collectives.cc (NVIDIA/nccl#176, #899)",
              op=None),  # the collective itself is named by torch's / stacks_rule's native frame mapping
    # vLLM / SGLang communicators (device_communicators/*.py): CPU shared-memory all-reduce, pynccl, custom
    # all-reduce, and the GroupCoordinator / communication_op layer above them, spelt function-first by py-spy
    # (shm_broadcast.py is not one: its MessageQueue is the engine's control plane, a worker waiting in it waits for work)
    CommFrame(r"^" + _COLL + r" \([\w/.-]*(?:device_communicators/(?!shm_broadcast)\w+\.py|"
              r"distributed/parallel_state\.py|"
              r"distributed/communication_op\.py)",
              "vLLM / SGLang", "vLLM 0.6-0.11 distributed/device_communicators (CpuCommunicator, PyNcclCommunicator, "
              "CustomAllreduce), GroupCoordinator; SGLang srt/distributed (the same layout)"),
    CommFrame(r"^(?:custom_all_reduce|_all_reduce_out_place|_all_reduce_in_place|ncclAllReduce|ncclAllGather|"
              r"ncclReduceScatter|ncclBroadcast|ncclSend|ncclRecv) \([\w/.-]*device_communicators/",
              "vLLM / SGLang", "vLLM 0.6-0.11 device_communicators/{custom_all_reduce,pynccl_wrapper}.py"),
    CommFrame(r"\bshm_all_?reduce\b", "vLLM",
              "vLLM 0.8-0.11 csrc/cpu/shm.cpp via torch.ops._C (CpuCommunicator / _CPUSHMDistributed)",
              op="all_reduce"),
    CommFrame(r"\bshm_all_?gather\b", "vLLM", "vLLM 0.9-0.11 csrc/cpu/shm.cpp", op="all_gather"),
    # NCCL's proxy and service threads progress every rank's network / p2p transfers: present in a healthy rank too
    CommFrame(r"^(?:ncclProxy\w*|persistentThread|proxyProgressAsync|ncclIbAsyncThreadMain)\b", "NCCL",
              "2.4-2.28 src/proxy.cc, transport/net_ib.cc (NVIDIA/nccl#719, #901)", role="progress", op=None),
)

CALL_FRAME_PATTERN = "|".join(f"(?:{f.pattern})" for f in COMM_FRAMES if f.role == "call")
PROGRESS_FRAME_PATTERN = "|".join(f"(?:{f.pattern})" for f in COMM_FRAMES if f.role == "progress")
_CALL = re.compile(CALL_FRAME_PATTERN)
_PROGRESS = re.compile(PROGRESS_FRAME_PATTERN)
_BY_ENTRY = tuple((re.compile(f.pattern), f) for f in COMM_FRAMES if f.role == "call")


def is_comm_call(frame: str) -> bool:
    """The frame is a framework's or library's communication call (the thread waits inside communication)."""
    return bool(_CALL.search(frame))


def is_progress_thread(frames: tuple[str, ...]) -> bool:
    """The thread is a communication library's own progress thread (its innermost frames are one's)."""
    return any(_PROGRESS.search(f) for f in frames[:8])


def op_of_frame(frame: str) -> str | None:
    """The operation a communication frame is inside (``all_gather_coalesced``, ``all_reduce``), where the frame
    names one; None for frames that do not (NCCL's group launch, a p2p plugin) or are not communication."""
    for rx, entry in _BY_ENTRY:
        if rx.search(frame):
            if entry.op is None:
                return None
            return entry.op or frame.split(" (", 1)[0].rsplit(".", 1)[-1] or None
    return None
