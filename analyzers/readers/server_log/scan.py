"""The line walk of an SGLang / vLLM server log: each line's rank tags, pid and time, and the lines that matter
(start-up phases, graph registrations and capture bars, stalls, serving progress) kept as hits; ranks are resolved
once the whole file is read (:mod:`.rows`)."""
from __future__ import annotations

import datetime as _dt
import re
from typing import Iterator, NamedTuple, cast

from ranktrace.analyzers.model.vocabulary import CAPTURE_ERROR
from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.server_log.statements import find_statements

__all__ = ["SOURCE", "PHASE_NAMES", "PHASES", "Phase", "Hit", "LogParser", "ANSI", "LOG_PREFIX", "SNIFF_MARKERS",
           "iter_lines"]

SOURCE = "server_log"
_DETAIL_CHARS = 300

PHASE_NAMES = ("dist_init_begin", "dist_init_end", "nccl_comm_init_begin", "dist_init_mq_connect", "worker_ready",
               "load_weights_begin", "load_weights_end", "kv_cache_alloc", "cuda_graph_capture_begin",
               "cuda_graph_capture_end", "cuda_graph_capture_error", "serving")


class Phase(NamedTuple):
    """A start-up phase: its name, category, the message pattern and the server that prints it."""

    name: str
    category: str
    pattern: re.Pattern[str]
    server: str


def _p(name: str, category: str, regex: str, server: str) -> Phase:
    return Phase(name, category, re.compile(regex), server)


# Ordered: the first pattern found in a line wins.
PHASES: tuple[Phase, ...] = (
    _p("dist_init_begin", "phase", r"Init torch distributed begin|Init parallel begin", "sglang"),
    _p("dist_init_end", "phase", r"Init torch distributed ends|Init parallel ends", "sglang"),
    _p("dist_init_begin", "phase", r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method=", "vllm"),
    _p("dist_init_end", "phase", r"rank \d+ in world size \d+ is assigned as", "vllm"),
    _p("nccl_comm_init_begin", "phase", r"vLLM is using nccl==", "vllm"),
    _p("dist_init_mq_connect", "phase", r"Connecting to (?:tcp|ipc)://", "any"),
    _p("worker_ready", "phase", r"Worker ready; awaiting tasks", "vllm"),
    _p("load_weights_begin", "phase", r"Load weight begin", "sglang"),
    _p("load_weights_end", "phase", r"Load weight end", "sglang"),
    _p("load_weights_begin", "phase", r"Starting to load model", "vllm"),
    # vLLM >= 0.1x prints "Loading weights took 0.04 seconds" (model_loader/default_loader.py) as the weights are in,
    # "Model loading took" (GPU model runner) after; the CPU model runner prints only the first
    _p("load_weights_end", "phase", r"Model loading took|Loading model weights took|Loading weights took", "vllm"),
    _p("kv_cache_alloc", "phase", r"KV Cache is allocated|Memory pool end", "sglang"),
    _p("kv_cache_alloc", "phase", r"GPU KV cache size:|# (?:GPU|CUDA|cuda) blocks:", "vllm"),
    _p("cuda_graph_capture_begin", "graph", r"Capture (?:[\w-]+ ){0,3}graph begin", "sglang"),
    _p("cuda_graph_capture_end", "graph", r"Capture (?:[\w-]+ ){0,3}graph end", "sglang"),
    _p("cuda_graph_capture_begin", "graph", r"Capturing cudagraphs for decoding|Capturing the model for CUDA graphs",
       "vllm"),
    _p("cuda_graph_capture_end", "graph", r"Graph capturing finished in", "vllm"),
    # a CUDA call a capture does not allow (a sync, a host copy, an NCCL call outside the captured stream): torch's
    # "CUDA error: operation not permitted when stream is capturing" / "Search for `cudaErrorStreamCaptureUnsupported'"
    _p("cuda_graph_capture_error", "graph", CAPTURE_ERROR, "any"),
    _p("serving", "phase", r"The server is fired up and ready to roll", "sglang"),
    _p("serving", "phase", r"Uvicorn running on|Starting vLLM (?:API )?server|Application startup complete", "any"),
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[[0-9;]{1,8}m(?=\S|\s)")
_SGLANG_TAG = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2})(?:[.,]\d+)?(?P<tags>(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)"
    r"\]")
#: SGLang under a logging config of its own (SGLANG_LOGGING_CONFIG_PATH): date, level, pid, then the tags and the
#: call site in brackets — "2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655] ..." (quoted from a
#: public thread in issue #26)
_SGLANG_CONFIGURED = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[.,]\d+)? (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<pid>\d{1,10}) "
    r"\[ ?(?P<tags>(?:(?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d{1,6} ?){1,8})(?:[\w.-]{1,80}\.py:\d{1,6})? ?\]")
_VLLM_PAREN = re.compile(r"\((?P<name>[A-Za-z][\w]*?)(?: rank=(?P<rank>\d+))? pid=(?P<pid>\d+|\.\.\.)(?:, ip=[^)]*)?\)")
_VLLM_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d{2}-\d{2}) (?P<hms>\d{2}:\d{2}:\d{2})")
_FULL_DATE = re.compile(r"\b(\d{4})-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:")
_TAG_TOKENS = re.compile(r"(ATTN_CP|MOE_DP|DP|PP|TP|EP|PCP|DCP|CP)_?(\d+)")
_REGISTER = re.compile(r"Registering (\d+) cuda graph addresses")
_VLLM_VERSION = re.compile(r"vLLM API server version (\S{1,60})")
_LABEL_NOTE = re.compile(r"\s{0,40}\((?:bs=|avail_mem=)[^)]{0,200}\)")
_ASSIGNED = re.compile(r"rank (\d+) in world size (\d+) is assigned as (.*)")
_INIT_LINE = re.compile(r"world_size=(\d+) rank=(\d+) local_rank=\d+")
_PROGRESS = re.compile(r"(?P<label>Capturing (?:batches|CUDA graphs|num tokens)[^:|]*?)\s*:\s*\d+%\|[^|]*\|\s*"
                       r"(?P<done>\d+)/(?P<total>\d+)")
_STALLS = ((re.compile(r"No available shared memory broadcast block found in (\d{1,9}) ?s"), "shm_broadcast_wait"),
           (re.compile(r"[Ww]atchdog timeout \(self\.watchdog_timeout=(\d{1,9})"), "scheduler_watchdog"))
#: vLLM's API server while its engine core process has not come up (v1 core_client / utils wait loop, repeated):
#: "Waiting for 1 core engine proc(s) to start: {0}", later "Waiting for 1 local, 0 remote core engine proc(s) to start."
_ENGINE_WAIT = re.compile(r"Waiting for \d{1,6} (?:local, \d{1,6} remote )?core engine proc\(s\) to start")
_BATCH = re.compile(r"(?:Prefill|Decode) batch[.,]")
_HTTP_OK = re.compile(r"\"(?:POST|GET|PUT) /\S{0,300} HTTP/\d(?:\.\d)?\" 200\b")
_RUNNING = re.compile(r"Avg prompt throughput: .{0,200}?Running: (\d{1,9}) reqs")
_TP_SIZE = re.compile(r"\btp_size=(\d+)|\btensor_parallel_size=(\d+)")
_PP_SIZE = re.compile(r"\bpp_size=(\d+)|\bpipeline_parallel_size=(\d+)")
SNIFF_MARKERS = re.compile(
    r"No available shared memory broadcast block|[Ww]atchdog timeout \(self\.watchdog_timeout=|"
    r"vLLM is using nccl==|Worker ready; awaiting tasks|world_size=\d+ rank=\d+ local_rank=\d+ distributed_init|"
    r"Init torch distributed (?:begin|ends)|Init parallel (?:begin|ends)|Load weight (?:begin|end)|Capture (?:[\w-]+ ){0,3}graph (?:begin|end)|"
    r"fired up and ready to roll|server_args=ServerArgs\(|is assigned as DP rank|Starting to load model|"
    r"cudaErrorStreamCapture\w|operation not permitted when stream is capturing|"
    r"Registering \d+ cuda graph addresses|Initializing a V\d LLM engine|Initializing an LLM engine|"
    r"vLLM API server|Starting vLLM server on|Loading weights took|Graph capturing finished|KV Cache is allocated|Memory pool end|"
    r"\((?:VllmWorker|EngineCore|Worker|APIServer)[\w]*(?: rank=\d+)? pid=(?:\d+|\.\.\.)\)|"
    r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?: (?:DP|PP|TP|EP)\d+)+\]")
# What starts a real log line (after an optional "container | " prefix): SGLang's "[date time ...]", vLLM's
# "(Worker pid=N)" or "LEVEL MM-DD hh:mm:ss", uvicorn's "INFO:     ", a "[logger]" tag, torch's "[rankN]:".
# Phase messages are taken only from such lines, so prose that quotes them (a README) is not a log.
LOG_PREFIX = re.compile(
    r"^(?:[\w.:/ -]{1,64} \| )?(?:\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}|\([A-Za-z]\w*(?: rank=\d+)? pid=(?:\d+|\.\.\.)|"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: \d{2}-\d{2} \d{2}:\d{2}:\d{2}|:\s)|\[[\w.-]+\] |\[rank\d+\]:)")



#: a process's own NCCL watchdog found its work timed out or failed (then takes the whole process down)
_WATCHDOG_ENDS = re.compile(r"Watchdog caught collective operation timeout|[Ww]atchdog thread terminated with exception")
#: the "pid: N" / "ip: A" lines of a Ray ActorDiedError's block (tab-indented in the exception text)
_RAY_BLOCK = re.compile(r"pid: (?P<pid>\d{1,10})\s*$|ip: \[?(?P<ip>[0-9A-Fa-f.:]{3,45})")


class Hit(NamedTuple):
    """One useful line, before ranks are resolved (resolution needs the whole file)."""

    line: int
    what: str                  # "mark" | "registration" | "progress"
    name: str
    category: str | None
    value: int | None
    detail: str
    tags: dict[str, int]
    vllm_rank: int | None
    pid: int | None
    wall_ns: int | None
    server: str = ""
    host: str | None = None


class LogParser:
    """Reads lines in order; ``hits``, ``progress`` (last state per key), ``pid_rank`` and the TP / PP sizes are
    what :mod:`.rows` needs."""

    def __init__(self, file: str, mtime_year: int) -> None:
        self.file = file
        self.year = mtime_year
        self.recognised = False
        self.hits: list[Hit] = []
        self.progress: dict[str, Hit] = {}
        self.pid_rank: dict[int, tuple[int, int | None, str]] = {}
        self.tp_size: int | None = None
        self.pp_size: int | None = None
        self.skipped: list[Skipped] = []
        self.ray_pid: tuple[int, int] | None = None   # (line, pid) of the last ActorDiedError "pid: N" line
        self.ray_ip: tuple[int, str] | None = None
        self.watchdog_ended: dict[int, int] = {}   # pid -> first line where its NCCL watchdog caught a timeout / error

    def line(self, number: int, raw: str) -> None:
        line = ANSI.sub("", raw).strip()
        if not line:
            return
        tags: dict[str, int] = {}
        vllm_rank: int | None = None
        pid: int | None = None
        wall: int | None = None
        d = _FULL_DATE.search(line)
        if d:
            self.year = int(d.group(1))
        m = _SGLANG_TAG.search(line)
        message = line
        if m:
            tags = {k: int(v) for k, v in _TAG_TOKENS.findall(m.group("tags"))}
            self.recognised = self.recognised or bool(tags)
            wall = _wall(m.group("ts"))
            message = line[m.end():].strip()
        elif (c := _SGLANG_CONFIGURED.match(line)) is not None:
            tags = {k: int(v) for k, v in _TAG_TOKENS.findall(c.group("tags"))}
            self.recognised = self.recognised or bool(tags)
            wall, pid = _wall(c.group("ts")), int(c.group("pid"))
            message = line[c.end():].strip()
        parens = list(_VLLM_PAREN.finditer(line))
        if parens:
            self.recognised = True
            inner = parens[-1]
            pid = int(inner.group("pid")) if inner.group("pid").isdigit() else None
            if inner.group("rank") is not None:
                vllm_rank = int(inner.group("rank"))
            for paren in reversed(parens):  # innermost (worker) tags first, engine tags (DP) fill in
                for k, v in _TAG_TOKENS.findall(paren.group("name")):
                    tags.setdefault(k, int(v))
            message = line[inner.end():].strip()
        t = _VLLM_TIME.search(message)
        if t and wall is None:
            wall = _wall(f"{self.year}-{t.group('md')} {t.group('hms')}")
        r = _TORCH_RANK.search(line)
        if r and vllm_rank is None and "TP" not in tags:
            vllm_rank = int(r.group(1))
        self._sizes(line)
        if pid is not None and pid not in self.watchdog_ended and "atchdog" in message \
                and _WATCHDOG_ENDS.search(message):
            self.watchdog_ended[pid] = number
        if message[:4] in ("pid:", "ip: ") and (b := _RAY_BLOCK.match(message)) is not None:
            if b.group("pid"):
                self.ray_pid = (number, int(b.group("pid")))
            else:
                self.ray_ip = (number, b.group("ip"))
            return
        if self._statements(number, message, tags, vllm_rank, pid, wall):
            return
        # SGLang's scheduler watchdog stays a statement when quoted without its log prefix (a report's prose)
        if LOG_PREFIX.match(line) or _PROGRESS.search(line) or "atchdog timeout (self.watchdog_timeout=" in line:
            self._line_kinds(number, line, message, tags, vllm_rank, pid, wall)

    def _statements(self, number: int, message: str, tags: dict[str, int], vllm_rank: int | None, pid: int | None,
                    wall: int | None) -> bool:
        """A server's statement that a process died or raised (:mod:`.statements`), with or without a log prefix:
        one ``statement`` hit per observation (per rank the statement names)."""
        found = False
        for st in find_statements(message):
            found = self.recognised = True
            server = st.statement.name.split("_", 1)[0]
            server = server if server in ("vllm", "sglang") else "any"
            named: list[int | None] = [*st.ranks] or [None]
            about_pid, about_host = st.pid, st.host
            if about_pid is None and st.statement.name == "ray_actor_died":
                about_pid, about_host = self._ray_actor_block(number)
            for r in named:
                hit_tags = {k: v for k, v in tags.items() if k != "TP"} if r is not None else tags
                self.hits.append(Hit(number, "statement", st.name, st.kind, st.value,
                                     _detail(tags, st.detail), hit_tags, r if r is not None else vllm_rank,
                                     about_pid if about_pid is not None else pid, wall, server, about_host))
        return found

    def _ray_actor_block(self, number: int) -> tuple[int | None, str | None]:
        """The pid and ip of the ActorDiedError block just above a Ray actor's death cause ("\tpid: 87687" and
        "\tip: 10.0.0.1" lines, at most eight lines before it): the process that died."""
        pid = self.ray_pid if self.ray_pid is not None and 0 < number - self.ray_pid[0] <= 8 else None
        ip = self.ray_ip if self.ray_ip is not None and 0 < number - self.ray_ip[0] <= 8 else None
        return (pid[1] if pid else None), (ip[1] if ip else None)

    def _sizes(self, line: str) -> None:
        if "tp_size=" in line or "tensor_parallel_size=" in line:
            m = _TP_SIZE.search(line)
            if m:
                self.tp_size = int(m.group(1) or m.group(2))
            m = _PP_SIZE.search(line)
            if m:
                self.pp_size = int(m.group(1) or m.group(2))

    def _line_kinds(self, number: int, line: str, message: str, tags: dict[str, int], vllm_rank: int | None,
                    pid: int | None, wall: int | None) -> None:
        a = _ASSIGNED.search(message)
        if a and pid is not None:
            self.pid_rank[pid] = (int(a.group(1)), int(a.group(2)), a.group(3).strip())
        i = _INIT_LINE.search(message)
        if i and pid is not None and pid not in self.pid_rank:
            self.pid_rank[pid] = (int(i.group(2)), int(i.group(1)), "")
        for rx, stall in _STALLS:
            st = rx.search(message) if ("shared memory broadcast" in message or "atchdog timeout" in message) \
                else None
            if st:   # repeated every N s while the wait lasts: one row per process, value = the time stated
                self.recognised = True
                key = f"stall {stall} {pid} {sorted(tags.items())} {vllm_rank}"
                first = self.progress.get(key)
                waited = int(st.group(1)) + (first.value or 0 if first else 0)
                self.progress[key] = Hit(first.line if first else number, "stall", stall, None, waited,
                                          first.detail if first else _detail(tags, message), tags, vllm_rank, pid,
                                          first.wall_ns if first else wall)
                return
        if "core engine proc" in message and _ENGINE_WAIT.search(message):
            self._engine_wait(number, message, tags, vllm_rank, pid, wall)
            return
        if self._serving_progress(number, message, tags, vllm_rank, pid, wall):
            return
        ver = _VLLM_VERSION.search(message) if "version" in message else None
        if ver:  # "vLLM API server version 0.5.4": which release wrote this log
            self.recognised = True
            self.hits.append(Hit(number, "version", "vllm", None, None, ver.group(1), tags, vllm_rank, pid, wall,
                                 "vllm"))
            return
        reg = _REGISTER.search(message)
        if reg:
            self.recognised = True
            self.hits.append(Hit(number, "registration", "graph_registration", None, int(reg.group(1)),
                                  _detail(tags, message), tags, vllm_rank, pid, wall))
            return
        prog = _PROGRESS.search(line)
        if prog:
            self.recognised = True
            label = _LABEL_NOTE.sub("", prog.group("label")).strip()
            done, total = int(prog.group("done")), int(prog.group("total"))
            self.progress[f"{pid} {label}"] = Hit(number, "progress", label, None, done,
                                                   f"{done}/{total} {prog.group('label').strip()}", tags, vllm_rank,
                                                   pid, wall)
            return
        for phase in PHASES:
            if phase.pattern.search(message):
                self.recognised = True
                self.hits.append(Hit(number, "mark", phase.name, phase.category, None, _detail(tags, message),
                                      tags, vllm_rank, pid, wall, phase.server))
                return

    def _engine_wait(self, number: int, message: str, tags: dict[str, int], vllm_rank: int | None, pid: int | None,
                     wall: int | None) -> None:
        """The API server still waits for its engine core: one ``engine_start_wait`` stall row, its value the seconds
        between the first and the last such line (when the lines carry times), its line the first."""
        self.recognised = True
        key = f"stall engine_start_wait {pid}"
        first = self.progress.get(key)
        start = first.wall_ns if first else wall
        waited = (wall - start) // 1_000_000_000 if wall is not None and start is not None else None
        self.progress[key] = Hit(first.line if first else number, "stall", "engine_start_wait", None, waited,
                                  first.detail if first else _detail(tags, message), tags, vllm_rank, pid, start)

    def _serving_progress(self, number: int, message: str, tags: dict[str, int], vllm_rank: int | None,
                          pid: int | None, wall: int | None) -> bool:
        """SGLang batch lines, HTTP 200 responses, vLLM 'Running: N reqs': the server was serving (kept per rank
        and kind: the count seen and the last line)."""
        what = value = None
        if "batch" in message and _BATCH.search(message):
            what = "batches"
        elif " 200" in message and _HTTP_OK.search(message):
            what = "requests"
        elif "Avg prompt throughput" in message:
            m = _RUNNING.search(message)
            if m:
                what, value = "running_requests", int(m.group(1))
        if what is None:
            return False
        self.recognised = True
        key = f"serve {what} {pid} {sorted(tags.items())} {vllm_rank}"
        count = (cast(int, self.progress[key].value) + 1) if key in self.progress and value is None else 1
        self.progress[key] = Hit(number, "serve", what, None, value if value is not None else count,
                                  _detail(tags, message), tags, vllm_rank, pid, wall)
        return True


def _detail(tags: dict[str, int], message: str) -> str:
    tag = " ".join(f"{k}{v}" for k, v in tags.items())
    text = message[:_DETAIL_CHARS]
    return f"[{tag}] {text}" if tag else text


def _wall(stamp: str) -> int | None:
    try:
        t = _dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000


def iter_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, segment); tqdm's carriage-return updates are segments of one line."""
    for number, raw_line in enumerate(text.split("\n"), start=1):
        for segment in raw_line.split("\r"):
            yield number, segment
