"""The message texts of torch's c10d layer (ProcessGroupWrapper, ProcessGroupGloo, TCPStore, socket.cpp,
ProcessGroupNCCL, NCCLUtils, gloo's tcp transport, distributed_c10d.py), as compiled patterns, and the catalogue
signature that marks a line holding one of them."""
from __future__ import annotations

import re

__all__ = ["SIGNATURE", "KEY", "P", "EXC_PREFIX", "ranks_of"]

# Each pattern quotes the source spelling it reads (torch 1.8 – 2.13; ``(≤1.12)`` marks an older form). Patterns are
# ``search``-ed inside a message the scanner already cut to its text (launcher prefix, timestamps, glog and PG leaders
# removed), so an exception type or a logger name in front does not matter. Every pattern is linear: literal-led,
# bounded repetitions, no nested quantifiers.

# --- the catalogue signature --------------------------------------------------------------------------------------
# A message starts the line, or follows up to four leaders that each end in ':' or ']' (a glog leader
# "[E ProcessGroupGloo.cpp:138]", "RuntimeError:", "WARNING:torch.distributed...api:", "[Rank 0]:", "[c10d]", a
# desync "- [0]"). Each leader is one greedy run of a class that excludes its own delimiter, so it matches in one way
# only: the nesting below backtracks at most four times per line.
_HOP = r"[^:\]\n]{0,300}[:\]]"
_LEAD = rf"(?:{_HOP}(?:{_HOP}(?:{_HOP}(?:{_HOP})?)?)?)?"
# ... or follows a glog leader anywhere in the first 1000 characters (a progress bar glued in front of it:
# "Map (num_proc=14):  70%|███| 652383/930514 [6:39:53<4:31:33][E ProcessGroupGloo.cpp:138] Rank 3 ...").
# Up to two bracketed leaders may follow it ("[c10d]", "[PG ID 0 PG GUID 0(default_pg) Rank 2]" twice).
_GLOG_ANYWHERE = (r".{0,1000}?\[[EWIF]\d{0,4}[^\]\n]{0,80}\.(?:cpp|cc|hpp|h):\d{1,6}\]"
                  r"(?: ?\[[^\]\n]{0,300}\])?(?: ?\[[^\]\n]{0,300}\])?")
_KEYS = (
    r"Detected mismatch between collectives", r"Rank \d{1,6} is running (?:inconsistent )?collective",
    r"Collectives differ in the following aspects", r"Ranks? \d{1,6}[\d, ]{0,4000} failed to pass monitoredBarrier",
    r"Rank \d{1,6} successfully reached monitoredBarrier", r"Rank \d{1,6} timed out in monitoredBarrier",
    r"Successfully processed ranks: \d", r"No ranks successfully processed in monitoredBarrier",
    r"ProcessGroupWrapper: Monitored Barrier encountered error", r"Running collective: CollectiveFingerPrint",
    r"Timed out after \d{1,9} seconds waiting for clients", r"Waiting in store based barrier",
    r"Timed out initializing process group in store based barrier", r"Rank \d{1,9}: Completed store-based barrier",
    r"The (?:client|server) socket ", r"connect\(\) timed out", r"Socket Timeout", r"[Ww]ait timeout",
    r"\[\d{1,9}\] is setting up NCCL communicator", r"Failed to recv, got 0 bytes",
    r"Timed out waiting \d{1,12} ?ms for (?:send|recv)", r"Connection closed by peer",
    r"Application timeout caused pair closure", r"Read error \[", r"Gloo connectFullMesh failed",
    r"ProcessGroupNCCL's watchdog got stuck", r"Heartbeat monitor timed out",
    r"First PG on this rank that detected no heartbeat", r"monitoring thread detects no heartbeat",
    r"Terminating the process after attempting to dump debug info", r"Timeout at collective: ",
    r"To our best knowledge", r"\[[\d, ]{1,4000}\] (?:joined but didn't finish|finished) collective #",
    r"#\d{1,12} (?:started|finished) ranks:", r"(?:started|finished) [A-Z_]{3,40}\s*$",
    r"Watchdog caught collective operation timeout(?!(?: for work)?: ?WorkNCCL\()", r"NCCL error in: ",
    r"Some NCCL operations have failed or timed out",
    r"NCCL Error \d", r"NCCL error: ",
    r"NCCL communicator was aborted", r"nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)"
    r"(?:Error)?: ", r"Cuda failure '", r"CUDA error: ", r"terminate called after throwing an instance of",
    r"what\(\): ",
)
# ... or, for the few phrases no other text has, anywhere in the first 400 characters (an application's own logger
# wrapping torch's message: "[RANK 1] 2026-05-19 10:10:29,701 [ERROR] GPU circuit breaker OPEN: cuda_error - Detected
# mismatch between collectives ...").
_UNMISTAKABLE = (r"Detected mismatch between collectives", r"failed to pass monitoredBarrier",
                 r"Watchdog caught collective operation timeout", r"NCCL communicator was aborted",
                 r"Timed out initializing process group in store based barrier", r"is setting up NCCL communicator",
                 r"ProcessGroupNCCL's watchdog got stuck", r"Heartbeat monitor timed out")
SIGNATURE = (rf"(?:(?:{_LEAD}|{_GLOG_ANYWHERE})\s{{0,40}}(?:- |\")?(?:{'|'.join(_KEYS)})"
             rf"|.{{0,400}}?(?:{'|'.join(_UNMISTAKABLE)}))")

#: One search over a line says whether any message is in it (the scanner's cheap filter).
KEY = re.compile("|".join(_KEYS))


def _c(rx: str) -> re.Pattern[str]:
    return re.compile(rx)


P: dict[str, re.Pattern[str]] = {
    # ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL). ≥ 1.13:
    #   Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint(
    #   SequenceNumber=21, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, TensorDeviceTypes=...), but Rank 0
    #   is running collective: CollectiveFingerPrint(...).Collectives differ in the following aspects: ...
    # (≤ 1.12): Rank 1 is running inconsistent collective: CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[20,
    #   10], TensorDtypes=Float, TensorDeviceTypes=cpu        (no sequence number, no closing parenthesis)
    # no tensors: CollectiveFingerPrint(SequenceNumber=5OpType=BARRIER)
    "fp_own": _c(r"Rank (?P<rank>\d{1,6}) is running (?P<old>inconsistent )?collective: CollectiveFingerPrint\("),
    "fp_other": _c(r"but Rank (?P<rank>\d{1,6}) is running collective: CollectiveFingerPrint\("),
    "fp_differ": _c(r"Collectives differ in the following aspects: ?(?P<what>.{0,600})"),
    "fp_seq": _c(r"SequenceNumber=(\d{1,19})"),
    "fp_op": _c(r"OpType=(\w{1,40})"),
    "fp_shape": _c(r"TensorShape=(\[[^\]]{0,2000}\])"),
    "fp_dtype": _c(r"TensorDtypes=(\[[^\]]{0,400}\]|[^,)]{1,200}?)(?:, TensorDeviceTypes|\)|$)"),
    "fp_device": _c(r"TensorDeviceTypes=(?:TensorOptions\(.{0,400}?device=(\w{1,20})|\[?(\w{1,20}))"),
    # ProcessGroupWrapper::runCollectiveChecks (≥ 1.11): "...Monitored Barrier encountered error running
    # collective: CollectiveFingerPrint(...). Error: \n<the monitoredBarrier error>"; with TORCH_CPP_LOG_LEVEL=INFO
    # each collective is logged first: "[Rank 3] Running collective: CollectiveFingerPrint(...)".
    "wrapper": _c(r"Monitored Barrier encountered error running collective: CollectiveFingerPrint\("),
    "running": _c(r"Running collective: CollectiveFingerPrint\("),
    # ProcessGroupGloo::monitoredBarrier (≥ 1.9): "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 30000 ms",
    # wait_all_ranks: "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 30000 ms"; (1.9) without "[Rank 0]: ".
    "mb_failed": _c(r"Ranks? (?P<ranks>\d[\d, ]{0,40000}?) failed to pass monitoredBarrier"
                    r"(?: in (?P<ms>\d{1,12}) ms)?"),
    # "Rank 3 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0.
    #  Please check rank 0 logs for faulty rank."
    "mb_reached": _c(r"Rank (?P<rank>\d{1,6}) successfully reached monitoredBarrier, but received errors while "
                     r"waiting\s?for send/recv from rank (?P<from>\d{1,6})"),
    # checkRemainingTime: "Rank 0 timed out in monitoredBarrier after 30000 ms." + "Successfully processed ranks: 1, 3"
    # | "No ranks successfully processed in monitoredBarrier."
    "mb_timed_out": _c(r"Rank (?P<rank>\d{1,6}) timed out in monitoredBarrier after (?P<ms>\d{1,12}) ms"),
    "mb_processed": _c(r"Successfully processed ranks: (?P<ranks>\d[\d, ]{0,40000})"),
    # TCPStore server (≥ 2.2): DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.
    "store_clients": _c(r"Timed out after (?P<s>\d{1,9}) seconds waiting for clients\.?(?: (?P<got>\d{1,9})/"
                        r"(?P<want>\d{1,9}) clients joined)?"),
    # distributed_c10d._store_based_barrier (1.8 – 2.x):
    #   Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1
    #   (world_size=4, worker_count=16, timeout=0:01:00)      (≥ 2.0: num_workers_joined=, maybe " error=...")
    #   Timed out initializing process group in store based barrier on rank: 0, for key: ... (world_size=...)
    #   (≥ 2.0 "on rank 0, for key"); success: "Rank 0: Completed store-based barrier for key:... with 4 nodes."
    "sbb_wait": _c(r"Waiting in store based barrier to initialize process group for rank: (?P<rank>\d{1,9}), key: "
                   r"(?P<key>[^ ]{1,200}) \(world_size=(?P<ws>\d{1,9}), (?:worker_count|num_workers_joined)="
                   r"(?P<got>\d{1,9}), timeout=(?P<t>[^ )]{1,40})"),
    "sbb_timeout": _c(r"Timed out initializing process group in store based barrier on rank:? (?P<rank>\d{1,9}), "
                      r"for key: (?P<key>[^ ]{1,200}) \(world_size=(?P<ws>\d{1,9}), (?:worker_count|"
                      r"num_workers_joined)=(?P<got>\d{1,9}), timeout=(?P<t>[^ )]{1,40})"),
    "sbb_done": _c(r"Rank (?P<rank>\d{1,9}): Completed store-based barrier for key: ?(?P<key>[^ ]{1,200})"),
    # socket.cpp (≥ 1.13): "[c10d] The client socket has timed out after 900s while trying to connect to (h, p)."
    #   (2.4: "after 300000ms"); "The client socket has failed to connect to any network address of (h, p)."
    #   W (a retry): "The client socket has failed to connect to [h]:p (errno: 111 - Connection refused)."
    #   "The server socket has failed to listen on any local network address." / "...failed to bind to [::]:29500
    #   (errno: 98 - Address already in use)." / "The client socket cannot be initialized to connect to ..."
    "sock_timeout": _c(r"The client socket has timed out after (?P<n>\d{1,12}) ?(?P<unit>ms|s) while trying to "
                       r"connect to (?P<to>\([^)]{1,300}\)|\S{1,300})"),
    "sock_any": _c(r"The client socket has failed to connect to any network address of (?P<to>\([^)]{1,300}\))"),
    "sock_retry": _c(r"The client socket has failed to connect to (?P<to>\S{1,300})(?: \((?P<why>[^)]{1,200})\))?"),
    "sock_init": _c(r"The client socket cannot be initialized to connect to (?P<to>\S{1,300})"),
    "sock_server": _c(r"The server socket has failed to (?P<what>listen on any local network address|bind to "
                      r"\S{1,300}(?: \([^)]{1,200}\))?)"),
    # tcputils (≤ 1.12): "connect() timed out. Original timeout was 1800000 ms."
    "connect_old": _c(r"connect\(\) timed out\.(?: Original timeout was (?P<ms>\d{1,12}) ms)?"),
    # TCPStore get/wait: "Socket Timeout" (≤ 2.1), "Wait timeout" (≤ 1.x), "wait timeout after 600000ms, keys: ..."
    "store_timeout": _c(r"(?:Socket Timeout|[Ww]ait timeout(?: after (?P<ms>\d{1,12}) ?ms)?(?:, keys: "
                        r"(?P<keys>\S{1,300}))?)"),
    # TCPStore client whose server went away (2.x): "Failed to recv, got 0 bytes. Connection was likely closed.
    # Did the remote server shutdown or crash?"
    "store_closed": _c(r"Failed to recv, got 0 bytes"),
    # ProcessGroupNCCL::broadcastUniqueNCCLID (≥ 1.13): "[1] is setting up NCCL communicator and retrieving
    # ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout"
    "unique_id": _c(r"\[(?P<rank>\d{1,9})\] is setting up NCCL communicators? and retrieving ncclUniqueId from "
                    r"\[(?P<root>\d{1,9})\] via c10d key-value store by key '(?P<key>[^']{0,200})'(?:, but store->"
                    r"get\('[^']{0,200}'\) got error: (?P<err>.{0,400}))?"),
    # gloo tcp transport: "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms
    # for recv operation to complete"; pair.cc: "Connection closed by peer [10.0.0.1]:36338", "Read error
    # [192.168.70.92]:25266: Connection reset by peer", "Application timeout caused pair closure";
    # ProcessGroupGloo (init): "Gloo connectFullMesh failed with [...pair.cc:144] no error".
    "gloo_timeout": _c(r"Timed out waiting (?P<ms>\d{1,12}) ?ms for (?P<op>send|recv) operation to complete"),
    "gloo_closed": _c(r"Connection closed by peer (?P<peer>\[[^\]]{1,200}\]:\d{1,6})"),
    "gloo_reset": _c(r"Read error (?P<peer>\[[^\]]{1,200}\]:\d{1,6}): (?P<why>.{1,200})"),
    "gloo_app_timeout": _c(r"Application timeout caused pair closure"),
    "gloo_mesh": _c(r"Gloo connectFullMesh failed with (?P<why>.{0,300})"),
    "gloo_src": _c(r"\[(?P<src>[^\]\s]{0,300}gloo/[^\]\s]{1,200}:\d{1,6})\]"),
    # ProcessGroupNCCL heartbeat monitor (2.2 – 2.13):
    #   "... ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued
    #   collectives. ..." (≥ 2.4) | "Heartbeat monitor timed out! Process will be terminated after dumping debug
    #   info. workMetaList_.size()=3" (2.2 – 2.3) | "First PG on this rank that detected no heartbeat of its
    #   watchdog." | "monitoring thread detects no heartbeat and will finally kill the process!"
    #   F: "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang."
    #      (or "due to collective timeout or exception.")
    "wd_stuck": _c(r"ProcessGroup\w{0,10}'s watchdog got stuck for (?P<s>\d{1,9}) seconds"),
    "hb_timeout": _c(r"Heartbeat monitor timed out!(?:.{0,200}?workMetaList_\.size\(\)=(?P<n>\d{1,9}))?"),
    "hb_first": _c(r"First PG on this rank that detected no heartbeat of its watchdog"),
    "hb_monitor": _c(r"monitoring thread detects no heartbeat"),
    "hb_terminate": _c(r"Terminating the process after attempting to dump debug info, due to (?P<why>[^.]{1,200})"),
    # TORCH_NCCL_DESYNC_DEBUG report (TraceUtils.h retrieveDesyncReport, 1.13 – 2.13), one line per statement:
    #   "- [0] Timeout at collective: ALLREDUCE, #315"
    #   "- To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:"
    #   "  - [3] joined but didn't finish collective #5 (count from 1)"
    #   "    [7] finished collective #182, but didn't join collective #183 (count from 1)"
    #   "- To our best knowledge, ranks [47] are the lagging ranks that caused this timeout. They never joined any
    #    collectives"
    #   "- Snapshot of ranks' latest states:" "#315 started ranks:" "[0, 1, 2] started ALLREDUCE"
    "ds_timeout": _c(r"\[(?P<rank>\d{1,9})\] Timeout at collective: (?P<op>\w{1,40}), #(?P<seq>\d{1,19})"),
    "ds_joined": _c(r"\[(?P<ranks>\d[\d, ]{0,40000}?)\] joined but didn't finish collective "
                    r"#(?P<seq>\d{1,19})"),
    "ds_finished": _c(r"\[(?P<ranks>\d[\d, ]{0,40000}?)\] finished collective #(?P<seq>\d{1,19}), but "
                      r"didn't join collective #(?P<next>\d{1,19})"),
    "ds_never": _c(r"ranks \[(?P<ranks>\d[\d, ]{0,40000}?)\] are the lagging ranks that caused this "
                   r"timeout"),
    "ds_snap_seq": _c(r"^\s{0,40}#(?P<seq>\d{1,19}) (?P<state>started|finished) ranks:"),
    "ds_snap_ranks": _c(r"^\s{0,40}\[(?P<ranks>\d[\d, ]{0,40000}?)\] (?P<state>started|finished) "
                        r"(?P<op>[A-Z_]{3,40})\s*$"),
    # ProcessGroupNCCL watchdog, cut before its WorkNCCL(...) body: "[Rank 1] Watchdog caught collective operation
    # timeout" (the watchdog family reads the lines that keep the body).
    "wd_bare": _c(r"Watchdog caught collective operation timeout"),
    # ProcessGroupNCCL::WorkNCCL::handleException (2.x): "[Rank 0] Some NCCL operations have failed or timed out. Due
    # to the asynchronous nature of CUDA kernels, ..." — this rank's own watchdog found its work failed or timed out
    "wd_some_failed": _c(r"Some NCCL operations have failed or timed out"),
    # NCCL errors surfaced by torch (NCCLUtils C10D_NCCL_CHECK, 1.x – 2.13): "NCCL error in: ../torch/csrc/
    # distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL
    # version 2.20.5" then "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or
    # device error. " then "Last error:" and NCCL's own line; torch/csrc/cuda/nccl.cpp (1.x): "NCCL Error 2:
    # unhandled system error"; vLLM's pynccl: "NCCL error: remote process exited or there was a network error";
    # NCCLComm::getNcclComm: "NCCL communicator was aborted on rank 3.  Original reason for failure was: ..."
    "nccl_in": _c(r"NCCL error in: (?P<src>[^,]{1,300}), (?P<what>[^,\n]{1,200})(?:, NCCL version (?P<ver>\S{1,40}))?"),
    "nccl_err": _c(r"NCCL (?:Error \d{1,3}|error): (?P<what>.{1,300})"),
    "nccl_kind": _c(r"(?P<kind>nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument)(?:Error)?)"
                    r": (?P<what>.{0,300})"),
    "nccl_aborted": _c(r"NCCL communicator was aborted on rank (?P<rank>\d{1,9})\.?(?:\s{1,4}Original reason for "
                       r"failure was: (?P<why>.{0,400}))?"),
    "last_error": _c(r"^\s{0,8}Last error:\s*(?P<what>.{0,300})$"),
    "cuda_failure": _c(r"Cuda failure '(?P<what>[^']{1,300})'"),
    "cuda_error": _c(r"CUDA error: (?P<what>.{1,300})"),
    # std::terminate on an uncaught C++ exception (the watchdog thread's, a c10::Error):
    #   "terminate called after throwing an instance of 'c10::DistBackendError'" then "  what():  [PG 1 Rank 6] ..."
    "terminate": _c(r"terminate called after throwing an instance of '(?P<type>[^']{1,200})'"),
    "what": _c(r"^\s{0,8}what\(\):\s{1,4}(?P<what>.{0,600})"),
}

#: a message that starts with an exception type ("RuntimeError: ...", "torch.distributed.DistStoreError: ...")
EXC_PREFIX = re.compile(r"(?P<type>[A-Za-z_][\w.]{0,120}?(?:Error|Exception)): ")


_DIGITS = re.compile(r"\d{1,9}")


def ranks_of(listed: str) -> tuple[int, ...]:
    """The ranks of a printed list ("1, 2, 5")."""
    return tuple(int(d) for d in _DIGITS.findall(listed))
