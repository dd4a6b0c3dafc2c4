"""watchdog: PyTorch ProcessGroupNCCL watchdog / timeout lines from any log, read into the timed-out work per rank
(EVENTS) and each process group's last enqueued / completed counters (OBSERVATIONS): often the only evidence of
which rank the others wait for. Stages: :mod:`.scan` (lines -> timeouts, statuses) -> :mod:`.rows`."""
from __future__ import annotations

from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped, binary_content, without_nuls
from ranktrace.analyzers.readers.text import TextDoc, canonical_prefix
from ranktrace.analyzers.readers.watchdog.rows import OPTYPE_NAMES, build
from ranktrace.analyzers.readers.watchdog.scan import (PREFILTER, Status, Timeout, parse_line, sniff_text,
                                                       with_continuation)

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "OPTYPE_NAMES", "sniff", "read", "read_doc"]

FORMAT = "watchdog"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("[rankN]: prefix | [Rank N]", "rank", "int: global if prefixed, else PG rank", "null", "torch 1.x"),
    ColumnMap("WorkNCCL OpType", "name", "str -> OPTYPE_NAMES / canonical_op()", "required", "torch 1.x"),
    ColumnMap("WorkNCCL OpType in SEND/RECV", "category", "p2p | collective", "collective", "torch 1.x"),
    ColumnMap("WorkNCCL SeqNum", "seq, backend_seq", "int", "null", "torch 1.10"),
    ColumnMap("[PG ID i PG GUID g(desc) ...] | [PG n (desc) ...]", "group", "str: g, else n", "null", "torch 2.1"),
    ColumnMap("PG prefix (desc)", "group_desc", "str", "null", "torch 2.2"),
    ColumnMap("NumelIn / NumelOut | TensorShape", "shape", "[in] or [in]->[out]", "null", "torch 2.1"),
    ColumnMap("Timeout(ms), ran for, NumelIn/Out, PG ID, glog time", "detail", "k=v text", "", "torch 1.x"),
    ColumnMap("last started work >= SeqNum", "state", "started | scheduled", "scheduled", "torch 2.5"),
    ColumnMap("(Worker pid=N, ip=A) Ray prefix", "pid, host", "int, str", "null", "-"),
    ColumnMap("(constant)", "kind, backend, source", "enter, nccl, watchdog", "-", "-"),
    ColumnMap("last enqueued / [started] / completed work", "OBSERVATIONS.value OBSERVATIONS.detail",
              "watchdog_pg_status: completed; enqueued=N completed=M ...", "-", "torch 2.1"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "watchdog_pg_status": "group=PG, rank, value=last completed, name=trigger, "
                          "detail='enqueued=N completed=M [started=S] [failed_seq=F] trigger=T [from=...]'",
    "rank_space": "rank known only inside its PG: group=PG, rank=PG rank, detail=global (default_pg) | pg:<name>",
}


def sniff(path: Path, head: bytes) -> bool:
    """True when the head, or the last MiB of the file (watchdog lines come at the end of a log), has a watchdog
    timeout or PG-status line of ProcessGroupNCCL."""
    if not head or binary_content(head):
        return False
    if sniff_text(without_nuls(head)[0]):
        return True
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
    except OSError:
        return False
    return not binary_content(tail) and sniff_text(without_nuls(tail)[0])


def read(path: Path) -> ReadResult:
    """Read one log file's watchdog lines. Raises ``ReaderError`` if it cannot be opened or has none at all.

    Three generations are understood (message texts from ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``):

    1. torch ≤ 2.0: ``[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout:
       WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800406 milliseconds before timing out.``
       — no ``[rankN]:`` prefix, no PG prefix, sometimes ``TensorShape=[...]`` and no ``SeqNum`` (oldest).
    2. torch 2.1 – 2.4: ``[rank0]:[E ProcessGroupNCCL.cpp:523] [Rank 0] Watchdog caught ... WorkNCCL(SeqNum=..,
       OpType=.., NumelIn=.., NumelOut=.., Timeout(ms)=..)`` plus ``[PG 0 (default_pg) Rank 1] Exception (either an
       error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL
       work: 6462.`` and ``[PG 0 Rank 2] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed ...``.
    3. torch ≥ 2.5: ``[PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 2635
       PG status: last enqueued work: 2635, last completed work: 2634`` and, on ranks told to dump by another rank,
       ``Received a dump signal due to a collective timeout from rank 7 ... Last enqueued NCCL work: 56116, last
       completed NCCL work: 56116.`` (the ranks that did *not* time out — often the interesting ones).

    What comes out:

    * EVENTS ``kind="enter"`` per timed-out work (deduplicated: the same work is repeated in the exception text),
      ``source="watchdog"``, ``state="scheduled"`` (or ``"started"`` when a "last started" counter covers it; never
      ``completed``), ``name=canonical op``, ``seq = backend_seq = SeqNum`` (for SEND/RECV the per-PG p2p counter,
      ``category="p2p"``), ``group`` = PG name (the GUID, else the old ``PG <n>`` number; FR's
      ``process_group[0]``), ``group_desc`` (``default_pg``, ...), ``shape`` = ``[NumelIn]`` (``[in]->[out]`` when
      they differ; flattened element counts, not real shapes) or the old ``TensorShape``, ``nbytes`` null,
      ``error`` = the timeout text.
    * OBSERVATIONS ``watchdog_pg_status`` per distinct (rank, PG, counters): ``value`` = last completed,
      ``detail`` = ``enqueued=N completed=M`` (+ ``started=``, ``failed_seq=``, ``trigger=``, ``from=``),
      ``name`` = trigger (``failure`` | ``exception`` | ``timeout`` | ``dump_signal`` | ``status``).
    * OBSERVATIONS ``rank_space`` when a rank is only known as a PG rank (no ``[rankN]:`` prefix): ``detail`` is
      ``global`` for ``default_pg`` (its ranks are global ranks) and ``pg:<name>`` otherwise.

    Ranks: ``[rankN]:`` (torchrun's prefix) is the global rank; ``[Rank N]`` and ``[PG ... Rank N]`` are ranks
    inside the process group. ``rank`` is the global rank when the prefix is there, else the PG rank.

    Known limits:

    * The timeout line carries only ``[Rank N]``; its PG comes from the status line of the same rank with the same
      failed sequence number (or from a repeat of the text that carries a PG prefix). Without one (generation 1),
      ``group`` is null and a ``Skipped`` note says so.
    * glog timestamps have no year (``E1218 20:27:21.426``): they go into ``detail``, ``wall_ns`` stays null.
    * Ray's ``(Worker pid=N, ip=A)`` prefix gives ``pid`` and ``host`` (the IP); otherwise both are null.
    * Desync-debug reports (``TORCH_NCCL_DESYNC_DEBUG``) and Flight Recorder dump notices are not parsed.
    """
    path = Path(path)
    file = str(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    timeouts: list[Timeout] = []
    statuses: list[Status] = []
    skipped: list[Skipped] = []
    bad_utf8: int | None = None
    with f:
        head = f.read(65536)
        if not head:
            return ReadResult(file=file, format=FORMAT, skipped=(Skipped(file, None, "empty file"),))
        if binary_content(head):
            raise ReaderError(path, "binary content, not a text log with watchdog lines")
        f.seek(0)
        try:
            for ln, raw in enumerate(f, start=1):
                if PREFILTER[0] not in raw and PREFILTER[1] not in raw:
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("utf-8", "replace")
                    if bad_utf8 is None:
                        bad_utf8 = ln
                parse_line(text.rstrip("\r\n"), ln, timeouts, statuses, skipped, file)
        except OSError as e:
            raise ReaderError(path, f"read failed: {e.strerror or e}") from e
    if not timeouts and not statuses:
        raise ReaderError(path, "no ProcessGroupNCCL watchdog timeout or PG status line found")
    if bad_utf8 is not None:
        skipped.append(Skipped(file, bad_utf8, "bytes that are not UTF-8 (mixed encodings); decoded with "
                                               "replacement characters"))
    return _result(file, timeouts, statuses, skipped)


def read_doc(doc: TextDoc) -> ReadResult:
    """The watchdog lines of a text input opened by the shared opener; each line's launcher prefix (rank, Ray pid
    and ip) is given back in the one spelling the scan reads."""
    timeouts: list[Timeout] = []
    statuses: list[Status] = []
    skipped: list[Skipped] = []
    lines = doc.lines
    for i, ln in enumerate(lines):
        text = ln.text
        if "operation timeout" in text and "WorkNCCL(" not in text:
            text = with_continuation(text, lines[i + 1:i + 4])
        if "WorkNCCL(" not in text and "enqueued" not in text:
            continue
        parse_line(canonical_prefix(ln.prefix, with_pid=True) + text, ln.no, timeouts, statuses, skipped, doc.path)
    if not timeouts and not statuses:
        raise ReaderError(doc.path, "no ProcessGroupNCCL watchdog timeout or PG status line found")
    return _result(doc.path, timeouts, statuses, skipped)


def _result(file: str, timeouts: list[Timeout], statuses: list[Status], skipped: list[Skipped]) -> ReadResult:
    events, obs = build(file, timeouts, statuses, skipped)
    return ReadResult(file=file, format=FORMAT, events=schema.table_from_rows(schema.EVENTS, events),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped))
