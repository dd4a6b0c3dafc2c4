"""What each rank's host is doing, from its stacks (DESIGN §2 host states).

States: ``host_sync_wait`` (waiting for the GPU: synchronize / item / tolist / cudaStreamSynchronize — on NCCL a
rank hung in a collective usually sits *here*, since the collective call itself returned at enqueue),
``in_collective`` (blocked inside a collective call on the host, as gloo does), ``blocked_other`` (lock, queue,
pipe, socket, store wait, sleep), ``idle_loop`` (an event loop polling for work, a serving worker waiting in its
request queue), ``running``, ``stopped`` (/proc state T: SIGSTOP, Ctrl-Z, a debugger's stop — whatever its stack,
the process does not run), ``uninterruptible`` (/proc state D while its stack says it runs: inside the kernel,
unkillable until the call returns: storage, a driver), ``exited``, ``unknown``. Poller threads (NCCL
watchdog/proxy, gloo runloop, zmq, our agent) never decide a rank's state.

The /proc state comes with the stack: the watchdog's samples write ``stopped`` / ``uninterruptible`` as the thread
state of a thread /proc shows as T / D when it is sampled (py-spy reads a stopped process's stack as usual).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.comm_frames import CALL_FRAME_PATTERN, is_progress_thread

__all__ = ["RankStack", "latest_stacks", "unranked_stacks", "classify", "is_poller", "application_frame", "without_tracer",
           "HOST_STATES", "PROC_STATES"]

HOST_STATES = ("in_init", "host_sync_wait", "in_collective", "blocked_other", "idle_loop", "running", "stopped",
               "uninterruptible", "exited", "unknown")
#: thread states (STACKS.thread_state) that come from /proc, not from the stack
PROC_STATES = {"T": "stopped", "t": "stopped", "D": "uninterruptible"}
_FROM_PROC = frozenset(PROC_STATES.values())

_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("in_init", re.compile(
        r"\b(ncclCommInitRank\w*|ncclCommInitAll|ncclCommSplit|bootstrap(?:Init|Net\w*|Root|AllGather)|"
        r"init_process_group|_store_based_barrier|rendezvous|_create_c10d_store|_new_process_group_helper|"
        r"broadcastUniqueNCCLID|getNCCLComm|initNCCLComm|init_distributed_environment|initialize_model_parallel|"
        r"ensure_model_parallel_initialized|PyNcclCommunicator\.__init__|CustomAllreduce\.__init__|"
        r"TCPStore\.__init__|c10d::TCPStore::TCPStore|c10d::TCPStore::(?:get|doGet|wait|doWait)|"
        r"_init_dist_connection)\b")),
    ("host_sync_wait", re.compile(
        r"\b(synchronize|tolist|item|_local_scalar_dense\w*|cu(da)?StreamSynchronize|cudaDeviceSynchronize|"
        r"cu(da)?EventSynchronize|THPVariable_tolist|THPVariable_item)\b")),
    ("in_collective", re.compile(
        r"distributed_c10d\.py|\b(ProcessGroup\w*|gloo::|c10d::|ncclGroupEnd|ncclAllReduce|Work::wait|"
        r"P?MPI_\w+|ompi_coll_\w+|mca_(?:pml|coll)_\w+|horovod::\w+|"
        r"(?<=\()lib[rn]ccl\.so|"
        r"_coalescing_manager)\b|\((all_reduce|all_gather\w*|reduce_scatter\w*|broadcast|barrier|all_to_all\w*|"
        r"send|recv|wait)\b|"
        # a serving framework's own communicator inside its collective (vLLM's CpuCommunicator / _CPUSHMDistributed
        # .all_reduce -> torch.ops._C.shm_allreduce, CustomAllreduce.custom_all_reduce, PyNcclCommunicator.all_reduce)
        r"\.\w*(?:all_?reduce|all_gather|reduce_scatter|all_to_all)\w* \((?:[\w/.-]*/)?(?:device_communicators|"
        r"distributed)/|"
        + CALL_FRAME_PATTERN)),  # the frameworks' and libraries' own communication frames (model/comm_frames.py)
    ("idle_loop", re.compile(r"\b(event_loop\w*|_run_once|serve_forever|run_forever|recv_requests|uvicorn)\b")),
    ("blocked_other", re.compile(
        r"\b(get|put|wait|acquire|join|select|poll|epoll_wait|recv|recv_into|accept|read|readline|sleep|"
        r"_store_based_barrier|store_wait|futex_wait|pthread_cond_wait)\b|queue\.py|threading\.py|selectors\.py")),
]
_POLLERS = re.compile(r"(nccl|NCCL|gloo|ProcessGroup|watchdog|heartbeat|ras|zmq|pt_autograd|ranktrace|pydevd|"
                      r"QueueFeederThread|_bootstrap_inner)", re.IGNORECASE)


@dataclass(frozen=True)
class RankStack:
    rank: int
    pid: int | None
    thread_name: str | None
    thread_state: str | None
    frames: tuple[str, ...]   # innermost first
    source: str | None
    file: str | None
    line: int | None


# ranktrace's own in-rank files (the wrappers a sampled stack passes through, the agent's thread): never the program
TRACER_FRAME = re.compile(r"[(/]tracer/rank/(wrap_\w+|spans|agent|inject)\.py")
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|[(/]torch/|<frozen|^<|\(threading\.py|\(queue\.py|"
                      r"\(selectors\.py|\(socket\.py|\((multiprocessing|concurrent|asyncio)/|ranktrace|"
                      + TRACER_FRAME.pattern)


def without_tracer(frames: tuple[str, ...]) -> tuple[str, ...]:
    """The stack as the program has it: ranktrace's wrapper frames left out of what a person reads (an innermost
    ``make_wait_wrapper.<locals>.wait (tracer/rank/wrap_work.py)`` reads as if ranktrace were what hangs). The dump
    files keep every frame; host-state rules see them all too."""
    return tuple(f for f in frames if not TRACER_FRAME.search(f))


def application_frame(frames: tuple[str, ...]) -> str | None:
    """Innermost frame of the program itself (not the stdlib, torch or site-packages)."""
    for f in frames:
        if not _LIBRARY.search(f) and not _OPAQUE.match(f) and not _NATIVE_LIB.search(f):
            return f
    return None


def is_poller(thread_name: str | None, frames: tuple[str, ...] = ()) -> bool:
    """Threads that poll by design (NCCL watchdog/proxy, gloo runloop, zmq, ranktrace): never a rank's progress. An
    unnamed thread (gdb) whose frames are a communication library's progress thread is one too."""
    return bool(thread_name and _POLLERS.search(thread_name)) or is_progress_thread(frames)


#: native frames that say nothing about what the thread waits for: unnamed frames of the driver and libc, which
#: can bury the telling frame (``_local_scalar_dense_cuda``, ``ncclCommInitRank``) a dozen frames deep
_OPAQUE = re.compile(r"^\?\? \(|^\?\?$|^<unknown function>|^0x[0-9a-f]+ \(")


#: a native frame of a shared library (``cudaLaunchKernel (libnccl.so.2)``): never the program's own frame
_NATIVE_LIB = re.compile(r"\((?:lib[\w+-]*\.so[\d.]*|[\w/.-]*/lib[\w+-]*\.so[\d.]*)\)$")


#: a serving loop that waits for its next request: the loop's own frame right above the queue read it waits in
#: (vLLM's WorkerProc.worker_busy_loop -> MessageQueue.dequeue -> SpinCondition.wait -> Poller.poll; an engine's
#: run_busy_loop -> a queue get). A call the loop runs (an RPC that blocks) puts other frames between them.
_SERVING_LOOP = re.compile(r"\b\w*(?:busy_loop|event_loop\w*|serve_forever|run_forever)\b")
_QUEUE_READ = re.compile(r"\b(?:dequeue|recv\w*|get|get_nowait|poll|select|acquire_read|_recv_\w+)\b")


def _waits_for_work(top: tuple[str, ...]) -> bool:
    """The innermost serving-loop frame calls a queue read directly, and nothing above it is a collective, an init
    step or a host sync (those keep their own state)."""
    top = without_tracer(top)  # a profile's wrapper of the queue read sits between the loop and the read
    for i, f in enumerate(top):
        if _SERVING_LOOP.search(f.split(" (", 1)[0]):
            return (i > 0 and bool(_QUEUE_READ.search(top[i - 1].split(" (", 1)[0]))
                    and not any(pat.search(g) for _state, pat in _RULES[:3] for g in top[:i]))
    return False


#: a Python-level wait a thread parks in: a lock / condition / event (threading.py), a queue, a selector, a sleep
_PY_WAIT = re.compile(r"\((?:threading|queue|selectors)\.py:|^(?:\w+\.)*sleep \(")
#: beneath a collective frame, the communicator's own way down to its transport: torch's op dispatch
#: (torch.ops._C.shm_allreduce), a native frame of a library (the transport's C code), or a framework communicator's
#: own Python (vLLM's device_communicators/: shm_broadcast's MessageQueue polls with select / sleep while it waits)
_TRANSPORT = re.compile(r"[(/]torch/_ops\.py:|[(/]device_communicators/|" + _NATIVE_LIB.pattern)


def _parked_under_collective(top: tuple[str, ...], thread_state: str | None) -> bool:
    """Inside a collective's frame, yet parked in something else beneath it: a Python wait (a lock, an event, a
    queue, a sleep) or, where the sampler says the thread is idle, a blocking call of a frame that is no part of
    communication — never the transport (torch's op dispatch, a native library frame, another collective frame).
    Its peers wait *for* it inside the same call (vLLM's rank 0 spinning in torch.ops._C.shm_allreduce while
    rank 1 sits in a lock its own code took beneath CpuCommunicator.all_reduce): it is blocked, not waiting."""
    top = without_tracer(top)
    coll = _RULES[2][1]
    inner: list[str] = []
    for f in top:
        if coll.search(f):
            break
        inner.append(f)
    else:
        return False  # no collective frame at all
    if not inner or any(_TRANSPORT.search(f) or any(p.search(f) for _s, p in _RULES[:3]) for f in inner):
        return False
    return bool(_PY_WAIT.search(inner[0])) or thread_state == "idle"


def classify(frames: tuple[str, ...], thread_state: str | None = None) -> str:
    """Host state of one thread from its innermost frames (unnamed driver/libc frames skipped); a /proc stop (T)
    decides whatever the frames say, a /proc D only where the frames say the thread runs."""
    if thread_state == "stopped":
        return "stopped"
    top = tuple(f for f in frames[:64] if not _OPAQUE.match(f))[:12]
    if _waits_for_work(top):
        return "idle_loop"
    if _parked_under_collective(top, thread_state):
        return "blocked_other"
    state = _classify_frames(top, thread_state)
    if thread_state == "uninterruptible" and state in ("running", "unknown"):
        return "uninterruptible"
    return state


def _classify_frames(top: tuple[str, ...], thread_state: str | None) -> str:
    frames = top
    for state, pat in _RULES:
        for f in top[:4] if state == "blocked_other" else top:
            if pat.search(f):
                return state
    if thread_state and (thread_state.startswith("active") or thread_state == "uninterruptible"):
        return "running"
    if thread_state == "idle":
        return "blocked_other"
    return "unknown" if not frames else "running"


def latest_stacks(stacks: pa.Table, prefer: dict[int, int] | None = None) -> dict[int, RankStack]:
    """Each rank's most telling thread in its latest snapshot: MainThread, else the first non-poller thread.

    `prefer`: rank -> the pid that issued the rank's ops. A rank's helper processes (a serving engine's tokenizer,
    data workers) inherit its RANK and so its rank; when the op-issuing process has stacks, only its stacks count."""
    st = stacks.filter(pc.is_valid(stacks["rank"]))
    if st.num_rows == 0:
        return {}
    if prefer:
        ranks, pids = st["rank"].to_pylist(), st["pid"].to_pylist()
        have = {(r, p) for r, p in zip(ranks, pids) if prefer.get(r) == p}
        keep = [prefer.get(r) is None or (r, prefer[r]) not in have or p == prefer[r] for r, p in zip(ranks, pids)]
        st = st.filter(pa.array(keep, pa.bool_()))
    st = st.sort_by([("wall_ns", "ascending"), ("file", "ascending"), ("line", "ascending")])
    rows = st.select(["rank", "pid", "tid", "thread_name", "thread_state", "frames", "native", "source", "file", "line",
                      "snapshot", "wall_ns"]).to_pylist()
    # the /proc state of each thread as last sampled (the watchdog's samples carry it; a py-spy file of the same
    # moment does not): a thread stopped at its latest timed sample is stopped in the snapshot chosen below too
    proc_now: dict[tuple, str | None] = {}
    for r in rows:
        if r["wall_ns"] is not None and r["pid"] is not None:
            proc_now[(r["pid"], r["tid"])] = r["thread_state"] if r["thread_state"] in _FROM_PROC else None
    latest_snapshot: dict[int, tuple[str | None, str | None]] = {}
    for r in rows:  # burst files sort by their timestamped folder, so the last one seen is the latest
        latest_snapshot[r["rank"]] = (r["file"], r["snapshot"])
    best: dict[int, tuple[float, RankStack]] = {}
    for r in rows:
        rank = r["rank"]
        if (r["file"], r["snapshot"]) != latest_snapshot[rank] or not r["frames"]:
            continue
        name = r["thread_name"] or ""
        score = 3 if name == "MainThread" else (0 if is_poller(name, tuple(r["frames"])) else 1)
        if r["native"]:
            score -= 0.5  # prefer Python frames when both exist
        state = r["thread_state"]
        if state not in _FROM_PROC and proc_now.get((r["pid"], r["tid"])):
            state = proc_now[(r["pid"], r["tid"])]
        cand = RankStack(rank, r["pid"], r["thread_name"], state, tuple(r["frames"]), r["source"], r["file"],
                         r["line"])
        if rank not in best or score > best[rank][0]:
            best[rank] = (score, cand)
    return {rank: c for rank, (_s, c) in best.items()}


#: an exception's traceback still says where its process waited when it was raised in one of these (a timeout)
_WAITED_IN = frozenset({"in_init", "in_collective", "host_sync_wait"})


def unranked_stacks(stacks: pa.Table) -> list[RankStack]:
    """The most telling thread of each process dumped without any rank (a single py-spy or gdb paste): its state
    still says whether the process waits in a collective, in init, or elsewhere. Rank -1 marks them."""
    st = stacks.filter(pc.is_null(stacks["rank"])) if stacks.num_rows else stacks
    if st.num_rows == 0:
        return []
    best: dict[tuple, tuple[float, RankStack]] = {}
    for r in st.select(["pid", "thread_name", "thread_state", "frames", "native", "source", "file", "line",
                        "snapshot"]).to_pylist():
        if not r["frames"]:
            continue
        name = r["thread_name"] or ""
        frames = tuple(r["frames"])
        state = classify(frames, r["thread_state"])
        if r["thread_state"] == "exception" and state not in _WAITED_IN:
            continue  # where an exception was raised, not where a live process waits: that process has gone on
        score = 3 if name == "MainThread" else (0 if is_poller(name, frames) else 1)
        score += {"in_init": 2, "in_collective": 2, "host_sync_wait": 2}.get(state, 0)
        if r["native"]:
            score -= 0.5
        key = (r["file"], r["snapshot"], r["pid"])
        cand = RankStack(-1, r["pid"], r["thread_name"], r["thread_state"], frames, r["source"], r["file"], r["line"])
        if key not in best or score > best[key][0]:
            best[key] = (score, cand)
    return [c for _s, c in best.values()]
