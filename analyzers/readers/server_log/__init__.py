"""server_log: SGLang and vLLM server logs, read as which start-up phase each rank reached (distributed init, weight
loading, CUDA-graph capture, serving): a server that hangs while starting leaves no op records, but its log says
how far every rank got. Stages: :mod:`.scan` (lines -> hits) -> :mod:`.rows` (ranks resolved, rows)."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.server_log.rows import build
from ranktrace.analyzers.readers.server_log.scan import (ANSI, LOG_PREFIX, PHASE_NAMES, PHASES, SNIFF_MARKERS,
                                                         LogParser, iter_lines)
from ranktrace.analyzers.readers.text import TextDoc

__all__ = [
    "FORMAT",
    "sniff",
    "read", "read_doc",
    "FIELD_MAP",
    "PHASES",
    "PHASE_NAMES",
    "OBSERVATION_KINDS",
]

FORMAT = "server_log"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("SGLang '[YYYY-MM-DD HH:MM:SS' / vLLM 'LEVEL MM-DD HH:MM:SS'", "EVENTS.wall_ns", "local time", "null",
              "all"),
    ColumnMap("SGLang tag ' TP<n>'", "EVENTS.rank", "int", "null", "all (prefix only when tp_size > 1)"),
    ColumnMap("SGLang tag ' PP<n>' + tp_size", "EVENTS.rank (pp*tp_size+tp)", "int", "null", "pp_size > 1"),
    ColumnMap("SGLang tags ' DP<n>', ' EP<n>', ' ATTN_CP<n>', ' MOE_DP<n>'", "EVENTS.detail", "str", "null", "varies"),
    ColumnMap("vLLM '(VllmWorker rank=R pid=P)'", "EVENTS.rank, EVENTS.pid", "int", "null", "V1 multiproc ~0.8"),
    ColumnMap("vLLM '(Worker_TP<n> pid=P)', '(Worker_PP<p>_TP<n> pid=P)', '(EngineCore_DP<d> pid=P)'",
              "EVENTS.rank, EVENTS.pid, EVENTS.detail", "int", "null", "~0.10"),
    ColumnMap("vLLM 'rank R in world size W is assigned as ...'", "EVENTS.rank/world (per pid)", "int", "null", "~0.7"),
    ColumnMap("torch '[rankR]:'", "EVENTS.rank", "int", "null", "torch ≥ 2.1"),
    ColumnMap("phase message (PHASES)", "EVENTS.name/category", "str", "null", "see PHASES"),
    ColumnMap("'Registering N cuda graph addresses'", "OBSERVATIONS graph_registration value", "int", "null", "all"),
    ColumnMap("tqdm 'Capturing ...: P%|...| d/t'", "OBSERVATIONS graph_capture_progress value/detail", "int", "null",
              "all"),
    ColumnMap("SGLang server_args 'tp_size=' 'pp_size=' / vLLM 'tensor_parallel_size='", "world (derived)", "int",
              "null", "all"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "completion": "name = server_ready (the server says it serves: fired up, Uvicorn running, startup complete, "
                  "vLLM API server starting), detail = the line",
    "server_stall": "name = shm_broadcast_wait | scheduler_watchdog | engine_start_wait (vLLM's API server waiting for "
                    "its engine core), value = seconds, detail = the line",
    "progress": "name = batches (SGLang Prefill/Decode batch lines) | requests (HTTP 200 responses) | "
                "running_requests (vLLM metrics 'Running: N reqs'); value = count seen (batches, requests) or the "
                "last value; line = the last such line",
    "graph_registration": "rank (null when the line has no rank tag), value = N from 'Registering N cuda graph "
                          "addresses', detail = the line",
    "graph_capture_progress": "name = bar label, value = batches done, detail = 'done/total label' (last state)",
    "server_rank": "pid, rank, value = world size (vLLM rank assignment line), detail = the DP/PP/TP ranks",
    "version": "name = vllm, detail = the release ('vLLM API server version 0.5.4')",
    "rank_exit / exception / transport_error": "a server's statement that a process died, raised or failed a CUDA "
                                              "check (statements.py), with or without a log prefix",
}


def sniff(path: Path, head: bytes) -> bool:
    """True when the first bytes hold an SGLang/vLLM log line: a log-prefixed line with a rank tag or start-up text."""
    for _, segment in iter_lines(head.decode("utf-8", errors="replace")):
        line = ANSI.sub("", segment).strip()
        if LOG_PREFIX.match(line) and SNIFF_MARKERS.search(line):
            return True
    return False


def read(path: Path) -> ReadResult:
    """Read one server log file. Raises ReaderError when it cannot be read or holds no server log lines.

    Message texts are the real ones printed by the servers (verified in ``sgl-project/sglang``
    ``python/sglang/srt/model_executor/model_runner.py``, ``mem_cache/memory_pool.py``, ``managers/scheduler.py``
    and in vLLM ``distributed/parallel_state.py``, ``worker/model_runner.py``, ``v1/worker/gpu_model_runner.py``,
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
    parser = LogParser(str(path), mtime_year)
    for number, segment in iter_lines(text):
        parser.line(number, segment)
    if not parser.recognised:
        raise ReaderError(path, "no SGLang/vLLM log lines (no rank tags such as '[... TP3]' or "
                                "'(VllmWorker rank=3 pid=..)', no start-up messages)")
    events, obs, version, world = build(parser)
    return ReadResult(file=parser.file, format=FORMAT, version=version,
                      events=schema.table_from_rows(schema.EVENTS, events),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(parser.skipped), world_size=world)
