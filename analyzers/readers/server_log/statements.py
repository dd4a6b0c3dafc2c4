"""What a server says about its own processes failing, as data: one ``Statement`` per message (a worker died, a
scheduler raised, a capture failed, a CUDA check failed), the observation it becomes and where its text was read.
Outcomes, not phases: they count wherever they occur, with or without a log prefix; a statement that names the
process (``VllmWorker-3``) gives the rank, else the line's own tag does."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from ranktrace.analyzers.model.vocabulary import CAPTURE_FAILED

__all__ = ["Statement", "STATEMENTS", "StatementHit", "find_statements", "CATALOGUE", "LITERALS"]


@dataclass(frozen=True)
class Statement:
    """One message: what it means, the OBSERVATIONS row it becomes, and the release / thread it was read from."""

    name: str
    kind: str                  # OBSERVATIONS kind: rank_exit | transport_error | exception
    literal: str               # a literal every matching line holds (cheap filter before the pattern)
    pattern: re.Pattern[str]   # searched in the message; groups: rank / code / what
    read_from: str
    exit_status: int | None = None   # the status the message implies when it states none


def _s(name: str, kind: str, literal: str, regex: str, read_from: str, exit_status: int | None = None) -> Statement:
    return Statement(name, kind, literal, re.compile(regex), read_from, exit_status)


STATEMENTS: tuple[Statement, ...] = (
    # vllm/v1/executor/multiproc_executor.py monitor_workers: logger.error("Worker proc %s died unexpectedly, shutting
    # down executor.", proc.name) with proc.name = f"VllmWorker-{rank}" (0.8 ... 0.11); later releases add
    # " (exit code: N)" (vllm-project/vllm#56180, vllm-ascend#7742)
    _s("vllm_worker_died", "rank_exit", "died unexpectedly",
       r"Worker proc (?:VllmWorker-(?P<rank>\d{1,6})|[\w.-]{1,64}) died unexpectedly"
       r"(?: \(exit code: (?P<code>-?\d{1,6}|None)\))?",
       "vLLM v1/executor/multiproc_executor.py (0.8-0.11 and later); vllm-project/vllm#20657, OpenPipe/ART#201"),
    # sglang/srt/entrypoints/engine.py launch_phase_sigquit_handler: a scheduler / detokenizer sends SIGQUIT to the
    # main process when it fails (its exception, its watchdog), which then kills the process tree
    _s("sglang_child_failed", "rank_exit", "Received sigquit from a child proces",
       r"Received sigquit from a child process?\.",
       "SGLang srt/entrypoints/engine.py (0.3 ... 0.5); sgl-project/sglang#3752, #8974"),
    # sglang/srt/utils/watchdog.py SubprocessWatchdog._check_processes (0.5.2x): logger.error(f"Subprocess {name}
    # (pid={proc.pid}) crashed with exit code {proc.exitcode}. Triggering SIGQUIT for cleanup..."), names
    # f"scheduler_{i}" (engine.py; i counts this node's scheduler processes, not a global rank: no rank is taken);
    # a negative code is the signal that ended it (multiprocessing's exitcode)
    _s("sglang_subprocess_crashed", "rank_exit", "crashed with exit code",
       r"Subprocess (?P<what>[\w.-]{1,64})(?: \(pid=\d{1,10}\))? crashed with exit code (?P<code>-?\d{1,6}|None)",
       "SGLang srt/utils/watchdog.py SubprocessWatchdog (0.5.23 source)"),
    # sglang/srt/managers/tokenizer_manager.py running_phase_sigquit_handler: logger.error(f"SIGQUIT received.
    # {signum=}, {frame=}. It usually means one child failed.") then kill_process_tree: a scheduler / detokenizer
    # that failed (its exception, its watchdog, SubprocessWatchdog) sent it; which one, the line does not say
    _s("sglang_sigquit_child_failed", "rank_exit", "one child failed",
       r"SIGQUIT received\..{0,200}?It usually means one child failed",
       "SGLang srt/managers/tokenizer_manager.py (0.4 ... 0.5); sgl-project/sglang#32893"),
    # sglang/srt/managers/scheduler.py run_scheduler_process: logger.error(f"Scheduler hit an exception: {traceback}")
    # then parent_process.send_signal(SIGQUIT): that scheduler (the line's TP rank) ends
    _s("sglang_scheduler_exception", "rank_exit", "Scheduler hit an exception",
       r"Scheduler hit an exception",
       "SGLang srt/managers/scheduler.py run_scheduler_process (0.3 ... 0.5); sgl-project/sglang#12567"),
    # Ray (RL frameworks OpenRLHF / verl, vLLM's Ray executor). GCS actor manager, the death cause an ActorDiedError
    # prints after its "class_name: / actor_id: / pid: / name: / namespace: / ip:" block (Ray 2.x): "The actor is dead
    # because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly
    # exits with a connection error code 2. End of file. ..." -- no rank (an actor name such as WorkerDict_0:3 counts
    # placement-group bundles, not ranks): the rank only from a prefix that states one
    _s("ray_actor_died", "rank_exit", "because its worker process has died",
       r"The actor is dead because its worker process has died\.?(?: Worker exit type: (?P<type>[A-Z_]{2,40}))?"
       r"(?: Worker exit detail: (?P<what>.{0,300}))?",
       "Ray src/ray/gcs/gcs_actor_manager (2.x); ray python/ray/exceptions.py ActorDiedError; OpenRLHF/OpenRLHF#265, "
       "verl-project/verl#4921"),
    # the raylet's worker_died error pushed to the driver (node_manager.cc, Ray 2.x; "RayTask ID" before "Lease ID"):
    # "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the
    # problem, check the logs for the dead worker. RayTask ID: .. Worker ID: .. Node ID: .. Worker IP address: A
    # Worker port: P Worker PID: N Worker exit type: T Worker exit detail: D"; Ray 1.x: "... while executing task <id>."
    _s("ray_worker_died", "rank_exit", "A worker died or was killed while executing",
       r"A worker died or was killed while executing (?:a task|task \w{1,80})"
       r"(?:.{0,400}? Worker IP address: (?P<ip>[0-9A-Fa-f.:]{3,45}))?(?:.{0,80}? Worker PID: (?P<pid>\d{1,10}))?"
       r"(?: Worker exit type: (?P<type>[A-Z_]{2,40}))?(?: Worker exit detail: (?P<what>.{0,300}))?",
       "Ray src/ray/raylet/node_manager.cc (1.x - 2.x); OpenRLHF/OpenRLHF#265, vllm-project/vllm#13535"),
    # the CUDACHECK macro of vLLM csrc/custom_all_reduce.cuh (and sgl-kernel's copy): printf("Failed: Cuda error
    # %s:%d '%s'\n", ...) then exit(EXIT_FAILURE); older releases print "Failed: %s:%d '%s'" (vllm-project/vllm#5613)
    # sglang/srt/model_executor/cuda_graph_runner.py: raise Exception(f"Capture cuda graph failed: {e}...") around
    # the whole capture: the capture raised (whatever `e` is: a gloo timeout, a CUDA error, an OOM)
    _s("capture_failed", "exception", "raph failed", CAPTURE_FAILED,
       "SGLang srt/model_executor/cuda_graph_runner.py (0.3 ... 0.5); sgl-project/sglang#4205, #5883, #11957"),
    _s("cuda_check_failed", "transport_error", "Failed: ",
       r"Failed: (?:Cuda error )?(?P<file>[\w./-]{0,200}?[\w-]{1,80}\.cuh?):(?P<line>\d{1,6}) '(?P<what>[^']{1,200})'",
       "vLLM csrc/custom_all_reduce.cuh CUDACHECK; vllm-project/vllm#56180, ai-dynamo/dynamo#787", exit_status=1),
)

#: literals a line must hold for any statement to be tried (the catalogue's and the parser's cheap filter)
LITERALS: tuple[str, ...] = tuple(sorted({s.literal for s in STATEMENTS}))
#: the catalogue's line signatures for these statements (matched with a bounded lead: they sit behind any prefix)
CATALOGUE: tuple[str, ...] = tuple(r".{0,300}?" + re.sub(r"\(\?P<\w+>", "(?:", s.pattern.pattern) for s in STATEMENTS)


class StatementHit(NamedTuple):
    """One statement found in a line: the observation it becomes (rank None: the line's own tag decides; pid / host:
    the process the statement is about, when it names one that is not the line's writer)."""

    statement: Statement
    kind: str
    name: str
    value: int | None
    ranks: tuple[int, ...]
    detail: str
    pid: int | None = None
    host: str | None = None


#: Ray's exit types that are no failure: the actor was ended on purpose (exit_actor(), ray.kill, its job finished)
_RAY_INTENDED = frozenset({"INTENDED_USER_EXIT", "INTENDED_SYSTEM_EXIT"})
_RAY_EXIT_CODE = re.compile(r"[Ee]xit code:? (-?\d{1,6})\b")
_RAY_SIGNAL = re.compile(r"receives a (SIG[A-Z]{2,6})\b")
_SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGABRT": 6, "SIGKILL": 9, "SIGSEGV": 11, "SIGTERM": 15}


def _ray_exit(found: dict[str, str | None]) -> tuple[str, int | None]:
    """(rank_exit name, value) of a Ray worker death from its exit type and detail: a clean exit on purpose (0), the
    OOM monitor's kill, a signal it names ("The process receives a SIGTERM"), an exit code it names, else unknown."""
    kind, what = found.get("type") or "", found.get("what") or ""
    if kind in _RAY_INTENDED:
        return "exit", 0
    if kind == "NODE_OUT_OF_MEMORY" or "running low on memory" in what:
        return "oom", None
    m = _RAY_SIGNAL.search(what)
    if m and m.group(1) in _SIGNALS:
        return "signal", _SIGNALS[m.group(1)]
    m = _RAY_EXIT_CODE.search(what)
    if m:
        code = int(m.group(1))
        return ("signal", -code) if code < 0 else ("exit", code)
    return "exit", None


def find_statements(message: str) -> Iterator[StatementHit]:
    """The statements in one line's message (usually none: every statement needs its literal first)."""
    if not any(lit in message for lit in LITERALS):
        return
    for st in STATEMENTS:
        if st.literal not in message:
            continue
        m = st.pattern.search(message)
        if m is None:
            continue
        found = m.groupdict()
        ranks: tuple[int, ...] = (int(found["rank"]),) if found.get("rank") else ()
        detail = message[m.start():m.start() + 300].strip()
        if st.kind == "transport_error":
            yield StatementHit(st, "transport_error", "cuda_error", None, ranks, detail)
            # the macro ends the process: a rank exit whose cause is this very line
            yield StatementHit(st, "rank_exit", "exit", st.exit_status, ranks, detail)
            continue
        if st.kind == "exception":
            yield StatementHit(st, "exception", "CudaGraphCaptureError", None, ranks, detail)
            continue
        if st.name.startswith("ray_"):
            name, value = _ray_exit(found)
            pid = int(found["pid"]) if found.get("pid") else None
            said = message[m.start():m.start() + 300].split(". ", 1)[0].strip().rstrip(".") + "."
            for label, key in (("Worker PID", "pid"), ("Worker IP address", "ip"), ("Worker exit type", "type"),
                               ("Worker exit detail", "what")):
                if found.get(key):
                    said += f" {label}: {found[key]}"
            yield StatementHit(st, "rank_exit", name, value, ranks, said[:300].strip(), pid, found.get("ip"))
            continue
        code = found.get("code")
        if code is not None and code != "None":
            status = int(code)
            name, value = ("signal", -status) if status < 0 else ("exit", status)
        elif st.name == "sglang_scheduler_exception":
            name, value = "exception", None
        else:
            name, value = "exit", st.exit_status
        yield StatementHit(st, "rank_exit", name, value, ranks, detail)
