"""Reader for SGLang and vLLM server logs, as evidence of which start-up phase each rank reached.

Why: an inference server that hangs while starting (a TP rank stuck in distributed init, in weight loading, or in
CUDA-graph capture while its peers wait in a collective) leaves no op records, but its log says how far every rank
got. This reader turns the phase lines into EVENTS ``mark`` rows per rank so the analyzer can see that TP3 printed
"Capture cuda graph begin" and never "Capture cuda graph end" while TP0–2 did.

Message texts are the real ones printed by the servers (verified in ``sgl-project/sglang``
``python/sglang/srt/model_executor/model_runner.py``, ``mem_cache/memory_pool.py``, ``managers/scheduler.py`` and in
vLLM ``distributed/parallel_state.py``, ``worker/model_runner.py``, ``v1/worker/gpu_model_runner.py``,
``distributed/device_communicators/custom_all_reduce.py`` and real logs quoted in issues), see :data:`PHASES`.

Output:

* EVENTS ``kind="mark"``, ``source="server_log"``, ``category="phase"`` (``"graph"`` for CUDA-graph capture
  begin/end), ``name`` = one of ``dist_init_begin, dist_init_end, load_weights_begin, load_weights_end,
  kv_cache_alloc, cuda_graph_capture_begin, cuda_graph_capture_end, serving``; ``detail`` = the message (first
  300 chars) prefixed by the rank tag seen (``[DP0 TP3] ...``); ``line`` = 1-based line number in the file.
* OBSERVATIONS ``graph_registration``: "Registering N cuda graph addresses" (custom all-reduce, SGLang and vLLM),
  ``value`` = N, per rank (N may differ between ranks; a rank that never printed it never finished capture).
* OBSERVATIONS ``graph_capture_progress``: the last state of each capture progress bar ("Capturing batches (bs=..
  avail_mem=..)", vLLM "Capturing CUDA graphs (...)"), ``value`` = batches done, ``detail`` = ``done/total label``.
  tqdm bars carry no rank tag (SGLang draws them on TP rank 0 only), so their ``rank`` is null.
* OBSERVATIONS ``server_rank``: each (pid, rank, world) learned from a vLLM line
  "rank R in world size W is assigned as DP rank d, PP rank p, TP rank t".
* OBSERVATIONS ``completion`` ``server_ready`` next to each ``serving`` mark (the server says it serves).
* OBSERVATIONS ``server_stall`` (docs/EVIDENCE.md): vLLM's engine "No available shared memory broadcast block found
  in 60 second(s)" (``shm_broadcast_wait``: a worker has not taken the last broadcast, it is stuck or busy) and
  SGLang's "Scheduler watchdog timeout (self.watchdog_timeout=300 ...)" (``scheduler_watchdog``); one row per
  process, ``value`` = the seconds stated over all repeats, ``line`` = the first.
* OBSERVATIONS ``progress`` while serving: ``batches`` (SGLang "Prefill batch." / "Decode batch." lines, ``value`` =
  count), ``requests`` (HTTP ``200`` responses, count), ``running_requests`` (vLLM metrics "Running: N reqs", the
  last N); per rank, ``line`` = the last such line.

Phases added from the field corpus: ``nccl_comm_init_begin`` (vLLM "vLLM is using nccl==X", printed as its
PyNcclCommunicator starts ``ncclCommInitRank``), ``dist_init_mq_connect`` ("Connecting to tcp://..": a TP group's
message-queue broadcaster connecting, the end of distributed init), ``worker_ready`` (vLLM "Worker ready; awaiting
tasks"). SGLang tags with a time but no date (``[23:17:01 TP7]``, older releases) carry ranks but no ``wall_ns``; a
pid redacted in a paste (``(EngineCore pid=...)``) gives ``pid`` null.

Rank (``rank`` column), first rule that applies:

1. vLLM ``(VllmWorker rank=R pid=P)`` → R (the worker's rank in the engine's world).
2. vLLM ``... rank R in world size W is assigned as ...`` → R, and every line of that pid gets R.
3. SGLang ``[<time> DP0 PP1 TP3 EP3]`` / vLLM ``(Worker_PP1_TP3 pid=P)`` → with a PP rank and a known TP size
   (``tp_size=`` in ``server_args=``/``tensor_parallel_size=`` in vLLM's config line, else the largest TP index + 1
   in the file) the global rank ``pp × tp_size + tp`` (how both servers number their world); otherwise the TP rank.
   DP ranks never change the rank: with SGLang DP attention TP indices are already global; without it each DP
   replica is a separate world — the DP tag stays in ``detail`` so replicas can be told apart.
4. torch's ``[rankR]:`` prefix → R. Lines without any tag (API server, tqdm) have ``rank`` null.

``world`` is set when a line states it (vLLM) or from ``tp_size × pp_size`` in SGLang's ``server_args``.

Time: SGLang ``[YYYY-MM-DD HH:MM:SS ...]`` and vLLM ``INFO MM-DD HH:MM:SS`` are local times without zone; they
are stored in ``wall_ns`` as if UTC (compare within one host only). vLLM omits the year: it is taken from the last
full date seen earlier in the file, else the file's modification time.

Only lines that start like a log line (:data:`_LOG_PREFIX`: ``[date time ...]``, ``(Worker pid=N)``,
``INFO MM-DD hh:mm:ss``, ``INFO:     `` (uvicorn), ``[logger] ``, ``[rankN]:``, after an optional
``container | `` prefix) count, plus tqdm bars: prose that quotes the messages (a README, a bug report) does not.
Tolerates: ANSI colour codes, ``docker compose`` prefixes (``sglang_0 | ``), carriage-return progress updates,
interleaved and torn lines (a line that matches nothing is ignored; nothing raises). A file with none of the
known prefixes or messages → ReaderError (not a server log).

Known limits: newer SGLang filters INFO lines of non-zero TP ranks in some components (``RankZeroFilter``), so the
absence of a phase line on a rank is weaker evidence than its presence; "init_distributed_environment" appears
only in tracebacks/stacks and is not treated as a phase; NPU/HPU graph captures map to the same graph phases.
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.base import ReaderError, ReadResult, Skipped
from ranktrace.analyzers.readers.text import TextDoc

__all__ = [
    "FORMAT",
    "sniff",
    "read", "read_doc",
    "FieldMap",
    "FIELD_MAP",
    "PHASES",
    "PHASE_NAMES",
    "OBSERVATION_KINDS",
]

FORMAT = "server_log"
SOURCE = "server_log"
_DETAIL_CHARS = 300


class FieldMap(NamedTuple):
    """One raw log field and where it goes (the reader's declared mapping, style.md point 3)."""

    raw: str
    column: str
    type: str
    default: Any
    since: str


FIELD_MAP: tuple[FieldMap, ...] = (
    FieldMap("SGLang '[YYYY-MM-DD HH:MM:SS' / vLLM 'LEVEL MM-DD HH:MM:SS'", "EVENTS.wall_ns", "local time", None,
             "all"),
    FieldMap("SGLang tag ' TP<n>'", "EVENTS.rank", "int", None, "all (prefix only when tp_size > 1)"),
    FieldMap("SGLang tag ' PP<n>' + tp_size", "EVENTS.rank (pp*tp_size+tp)", "int", None, "pp_size > 1"),
    FieldMap("SGLang tags ' DP<n>', ' EP<n>', ' ATTN_CP<n>', ' MOE_DP<n>'", "EVENTS.detail", "str", None, "varies"),
    FieldMap("vLLM '(VllmWorker rank=R pid=P)'", "EVENTS.rank, EVENTS.pid", "int", None, "V1 multiproc ~0.8"),
    FieldMap("vLLM '(Worker_TP<n> pid=P)', '(Worker_PP<p>_TP<n> pid=P)', '(EngineCore_DP<d> pid=P)'",
             "EVENTS.rank, EVENTS.pid, EVENTS.detail", "int", None, "~0.10"),
    FieldMap("vLLM 'rank R in world size W is assigned as ...'", "EVENTS.rank/world (per pid)", "int", None, "~0.7"),
    FieldMap("torch '[rankR]:'", "EVENTS.rank", "int", None, "torch ≥ 2.1"),
    FieldMap("phase message (PHASES)", "EVENTS.name/category", "str", None, "see PHASES"),
    FieldMap("'Registering N cuda graph addresses'", "OBSERVATIONS graph_registration value", "int", None, "all"),
    FieldMap("tqdm 'Capturing ...: P%|...| d/t'", "OBSERVATIONS graph_capture_progress value/detail", "int", None,
             "all"),
    FieldMap("SGLang server_args 'tp_size=' 'pp_size=' / vLLM 'tensor_parallel_size='", "world (derived)", "int",
             None, "all"),
)

PHASE_NAMES = ("dist_init_begin", "dist_init_end", "nccl_comm_init_begin", "dist_init_mq_connect", "worker_ready",
               "load_weights_begin", "load_weights_end", "kv_cache_alloc", "cuda_graph_capture_begin",
               "cuda_graph_capture_end", "serving")


class _Phase(NamedTuple):
    name: str
    category: str
    pattern: re.Pattern[str]
    server: str


def _p(name: str, category: str, regex: str, server: str) -> _Phase:
    return _Phase(name, category, re.compile(regex), server)


# Ordered: the first pattern found in a line wins.
PHASES: tuple[_Phase, ...] = (
    _p("dist_init_begin", "phase", r"Init torch distributed begin", "sglang"),
    _p("dist_init_end", "phase", r"Init torch distributed ends", "sglang"),
    _p("dist_init_begin", "phase", r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method=", "vllm"),
    _p("dist_init_end", "phase", r"rank \d+ in world size \d+ is assigned as", "vllm"),
    _p("nccl_comm_init_begin", "phase", r"vLLM is using nccl==", "vllm"),
    _p("dist_init_mq_connect", "phase", r"Connecting to (?:tcp|ipc)://", "any"),
    _p("worker_ready", "phase", r"Worker ready; awaiting tasks", "vllm"),
    _p("load_weights_begin", "phase", r"Load weight begin", "sglang"),
    _p("load_weights_end", "phase", r"Load weight end", "sglang"),
    _p("load_weights_begin", "phase", r"Starting to load model", "vllm"),
    _p("load_weights_end", "phase", r"Model loading took|Loading model weights took", "vllm"),
    _p("kv_cache_alloc", "phase", r"KV Cache is allocated|Memory pool end", "sglang"),
    _p("kv_cache_alloc", "phase", r"GPU KV cache size:|# (?:GPU|CUDA|cuda) blocks:", "vllm"),
    _p("cuda_graph_capture_begin", "graph", r"Capture (?:[\w-]+ ){0,3}graph begin", "sglang"),
    _p("cuda_graph_capture_end", "graph", r"Capture (?:[\w-]+ ){0,3}graph end", "sglang"),
    _p("cuda_graph_capture_begin", "graph", r"Capturing cudagraphs for decoding|Capturing the model for CUDA graphs",
       "vllm"),
    _p("cuda_graph_capture_end", "graph", r"Graph capturing finished in", "vllm"),
    _p("serving", "phase", r"The server is fired up and ready to roll", "sglang"),
    _p("serving", "phase", r"Uvicorn running on|Starting vLLM API server|Application startup complete", "any"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "completion": "name = server_ready (the server says it serves: fired up, Uvicorn running, startup complete, "
                  "vLLM API server starting), detail = the line",
    "server_stall": "name = shm_broadcast_wait | scheduler_watchdog, value = seconds, detail = the line",
    "progress": "name = batches (SGLang Prefill/Decode batch lines) | requests (HTTP 200 responses) | "
                "running_requests (vLLM metrics 'Running: N reqs'); value = count seen (batches, requests) or the "
                "last value; line = the last such line",
    "graph_registration": "rank (null when the line has no rank tag), value = N from 'Registering N cuda graph "
                          "addresses', detail = the line",
    "graph_capture_progress": "name = bar label, value = batches done, detail = 'done/total label' (last state)",
    "server_rank": "pid, rank, value = world size (vLLM rank assignment line), detail = the DP/PP/TP ranks",
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[[0-9;]{1,8}m(?=\S|\s)")
_SGLANG_TAG = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2})(?:[.,]\d+)?(?P<tags>(?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d+)*)"
    r"\]")
_VLLM_PAREN = re.compile(r"\((?P<name>[A-Za-z][\w]*?)(?: rank=(?P<rank>\d+))? pid=(?P<pid>\d+|\.\.\.)(?:, ip=[^)]*)?\)")
_VLLM_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d{2}-\d{2}) (?P<hms>\d{2}:\d{2}:\d{2})")
_FULL_DATE = re.compile(r"\b(\d{4})-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:")
_TAG_TOKENS = re.compile(r"(ATTN_CP|MOE_DP|DP|PP|TP|EP|PCP|DCP|CP)_?(\d+)")
_REGISTER = re.compile(r"Registering (\d+) cuda graph addresses")
_ASSIGNED = re.compile(r"rank (\d+) in world size (\d+) is assigned as (.*)")
_INIT_LINE = re.compile(r"world_size=(\d+) rank=(\d+) local_rank=\d+")
_PROGRESS = re.compile(r"(?P<label>Capturing (?:batches|CUDA graphs|num tokens)[^:|]*?)\s*:\s*\d+%\|[^|]*\|\s*"
                       r"(?P<done>\d+)/(?P<total>\d+)")
_STALLS = ((re.compile(r"No available shared memory broadcast block found in (\d{1,9}) ?s"), "shm_broadcast_wait"),
           (re.compile(r"[Ww]atchdog timeout \(self\.watchdog_timeout=(\d{1,9})"), "scheduler_watchdog"))
_BATCH = re.compile(r"(?:Prefill|Decode) batch[.,]")
_HTTP_OK = re.compile(r"\"(?:POST|GET|PUT) /\S{0,300} HTTP/\d(?:\.\d)?\" 200\b")
_RUNNING = re.compile(r"Avg prompt throughput: .{0,200}?Running: (\d{1,9}) reqs")
_TP_SIZE = re.compile(r"\btp_size=(\d+)|\btensor_parallel_size=(\d+)")
_PP_SIZE = re.compile(r"\bpp_size=(\d+)|\bpipeline_parallel_size=(\d+)")
_SNIFF_MARKERS = re.compile(
    r"No available shared memory broadcast block|[Ww]atchdog timeout \(self\.watchdog_timeout=|"
    r"vLLM is using nccl==|Worker ready; awaiting tasks|world_size=\d+ rank=\d+ local_rank=\d+ distributed_init|"
    r"Init torch distributed (?:begin|ends)|Load weight (?:begin|end)|Capture (?:[\w-]+ ){0,3}graph (?:begin|end)|"
    r"fired up and ready to roll|server_args=ServerArgs\(|is assigned as DP rank|Starting to load model|"
    r"Registering \d+ cuda graph addresses|Initializing a V\d LLM engine|Initializing an LLM engine|"
    r"vLLM API server|Graph capturing finished|KV Cache is allocated|Memory pool end|"
    r"\((?:VllmWorker|EngineCore|Worker|APIServer)[\w]*(?: rank=\d+)? pid=(?:\d+|\.\.\.)\)|"
    r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?: (?:DP|PP|TP|EP)\d+)+\]")
# What starts a real log line (after an optional "container | " prefix): SGLang's "[date time ...]", vLLM's
# "(Worker pid=N)" or "LEVEL MM-DD hh:mm:ss", uvicorn's "INFO:     ", a "[logger]" tag, torch's "[rankN]:".
# Phase messages are taken only from such lines, so prose that quotes them (a README) is not a log.
_LOG_PREFIX = re.compile(
    r"^(?:[\w.:/ -]{1,64} \| )?(?:\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}|\([A-Za-z]\w*(?: rank=\d+)? pid=(?:\d+|\.\.\.)|"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: \d{2}-\d{2} \d{2}:\d{2}:\d{2}|:\s)|\[[\w.-]+\] |\[rank\d+\]:)")


def sniff(path: Path, head: bytes) -> bool:
    """True when the first bytes hold an SGLang/vLLM log line: a log-prefixed line with a rank tag or start-up text."""
    for _, segment in _iter_lines(head.decode("utf-8", errors="replace")):
        line = _ANSI.sub("", segment).strip()
        if _LOG_PREFIX.match(line) and _SNIFF_MARKERS.search(line):
            return True
    return False


def read(path: Path) -> ReadResult:
    """Read one server log file. Raises ReaderError when it cannot be read or holds no server log lines."""
    path = Path(path)
    try:
        data = path.read_bytes()
        mtime_year = _dt.datetime.fromtimestamp(path.stat().st_mtime, tz=_dt.timezone.utc).year
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    return _from_text(path, data.decode("utf-8", errors="replace"), mtime_year)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (its own rank tags are read from the raw lines)."""
    try:
        year = _dt.datetime.fromtimestamp(Path(doc.path).stat().st_mtime, tz=_dt.timezone.utc).year
    except OSError:
        year = _dt.datetime.now(tz=_dt.timezone.utc).year
    return _from_text(Path(doc.path), doc.raw_text(), year)


def _from_text(path: Path, text: str, mtime_year: int) -> ReadResult:
    parser = _LogParser(str(path), mtime_year)
    for number, segment in _iter_lines(text):
        parser.line(number, segment)
    if not parser.recognised:
        raise ReaderError(path, "no SGLang/vLLM log lines (no rank tags such as '[... TP3]' or "
                                "'(VllmWorker rank=3 pid=..)', no start-up messages)")
    return parser.result()


class _Hit(NamedTuple):
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


class _LogParser:
    def __init__(self, file: str, mtime_year: int) -> None:
        self.file = file
        self.year = mtime_year
        self.recognised = False
        self.hits: list[_Hit] = []
        self.progress: dict[str, _Hit] = {}
        self.pid_rank: dict[int, tuple[int, int | None, str]] = {}
        self.tp_size: int | None = None
        self.pp_size: int | None = None
        self.skipped: list[Skipped] = []

    def line(self, number: int, raw: str) -> None:
        line = _ANSI.sub("", raw).strip()
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
        if _LOG_PREFIX.match(line) or _PROGRESS.search(line):
            self._line_kinds(number, line, message, tags, vllm_rank, pid, wall)

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
                self.progress[key] = _Hit(first.line if first else number, "stall", stall, None, waited,
                                          first.detail if first else _detail(tags, message), tags, vllm_rank, pid,
                                          first.wall_ns if first else wall)
                return
        if self._serving_progress(number, message, tags, vllm_rank, pid, wall):
            return
        reg = _REGISTER.search(message)
        if reg:
            self.recognised = True
            self.hits.append(_Hit(number, "registration", "graph_registration", None, int(reg.group(1)),
                                  _detail(tags, message), tags, vllm_rank, pid, wall))
            return
        prog = _PROGRESS.search(line)
        if prog:
            self.recognised = True
            label = re.sub(r"\s*\((?:bs=|avail_mem=)[^)]*\)", "", prog.group("label")).strip()
            done, total = int(prog.group("done")), int(prog.group("total"))
            self.progress[f"{pid} {label}"] = _Hit(number, "progress", label, None, done,
                                                   f"{done}/{total} {prog.group('label').strip()}", tags, vllm_rank,
                                                   pid, wall)
            return
        for phase in PHASES:
            if phase.pattern.search(message):
                self.recognised = True
                self.hits.append(_Hit(number, "mark", phase.name, phase.category, None, _detail(tags, message),
                                      tags, vllm_rank, pid, wall, phase.server))
                return

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
        count = (self.progress[key].value + 1) if key in self.progress and value is None else 1
        self.progress[key] = _Hit(number, "serve", what, None, value if value is not None else count,
                                  _detail(tags, message), tags, vllm_rank, pid, wall)
        return True

    # -- result

    def result(self) -> ReadResult:
        tp_size = self.tp_size or (max((h.tags["TP"] for h in self.hits if "TP" in h.tags), default=-1) + 1) or None
        world_all = tp_size * self.pp_size if tp_size and self.pp_size else (
            tp_size if tp_size and self.tp_size is not None else None)
        events: list[dict[str, Any]] = []
        obs: list[dict[str, Any]] = []
        for h in self.hits + list(self.progress.values()):
            rank, world = self._rank(h, tp_size)
            world = world if world is not None else world_all
            common = {"pid": h.pid, "rank": rank, "wall_ns": h.wall_ns, "source": SOURCE, "file": self.file,
                      "line": h.line}
            if h.what == "mark":
                events.append(dict(common, world=world, kind="mark", name=h.name, category=h.category,
                                   detail=h.detail))
                if h.name == "serving":
                    obs.append(dict(common, kind="completion", name="server_ready", detail=h.detail))
            elif h.what == "stall":
                obs.append(dict(common, kind="server_stall", name=h.name, value=h.value, detail=h.detail))
            elif h.what == "serve":
                obs.append(dict(common, kind="progress", name=h.name, value=h.value, detail=h.detail))
            elif h.what == "registration":
                obs.append(dict(common, kind="graph_registration", name="custom_all_reduce", value=h.value,
                                detail=h.detail))
            else:
                obs.append(dict(common, kind="graph_capture_progress", name=h.name, value=h.value, detail=h.detail))
        for pid, (rank, world, assigned) in sorted(self.pid_rank.items()):
            obs.append({"pid": pid, "rank": rank, "kind": "server_rank", "value": world, "detail": assigned or None,
                        "source": SOURCE, "file": self.file})
        return ReadResult(file=self.file, format=FORMAT, version=_server_kind(self.hits),
                          events=schema.table_from_rows(schema.EVENTS, events),
                          observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                          skipped=tuple(self.skipped), world_size=world_all)

    def _rank(self, h: _Hit, tp_size: int | None) -> tuple[int | None, int | None]:
        """(rank, world) of a hit, by the rules of the module docstring (numbered as there)."""
        if h.vllm_rank is not None and "TP" not in h.tags:   # 1. VllmWorker rank=R, 4. [rankR]:
            known = self.pid_rank.get(h.pid) if h.pid is not None else None
            return h.vllm_rank, known[1] if known else None
        if h.pid is not None and h.pid in self.pid_rank:      # 2. vLLM rank assignment line of that pid
            rank, world, _ = self.pid_rank[h.pid]
            return rank, world
        if "TP" in h.tags:                                     # 3. TP (and PP) tags
            tp = h.tags["TP"]
            if "PP" in h.tags and tp_size:
                return h.tags["PP"] * tp_size + tp, None
            return tp, None
        if "PP" in h.tags and not tp_size:
            return h.tags["PP"], None
        return None, None


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


def _server_kind(hits: list[_Hit]) -> str | None:
    """'sglang', 'vllm' or 'sglang+vllm' from which servers' phase messages were seen."""
    return "+".join(sorted({h.server for h in hits if h.server not in ("", "any")})) or None


def _iter_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, segment); tqdm's carriage-return updates are segments of one line."""
    for number, raw_line in enumerate(text.split("\n"), start=1):
        for segment in raw_line.split("\r"):
            yield number, segment
