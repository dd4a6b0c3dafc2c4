"""Read PyTorch ProcessGroupNCCL watchdog / timeout lines from any log (stderr, Slurm output, Ray logs).

Why: when a collective hangs, the NCCL watchdog of every rank that issued it eventually prints which work timed
out (``WorkNCCL(SeqNum=43, OpType=ALLREDUCE, ...)``) and how far its process group got ("last enqueued / last
completed work"). Those two lines per rank are often the only evidence a user has: a rank that timed out on an
*earlier* ``SeqNum``, or whose "last enqueued" is lower, is the one the others wait for (formats.md §3.7).

Three generations are understood (message texts from ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``):

1. torch ≤ 2.0: ``[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout:
   WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800406 milliseconds before timing out.``
   — no ``[rankN]:`` prefix, no PG prefix, sometimes ``TensorShape=[...]`` and no ``SeqNum`` (oldest).
2. torch 2.1 – 2.4: ``[rank0]:[E ProcessGroupNCCL.cpp:523] [Rank 0] Watchdog caught ... WorkNCCL(SeqNum=..,
   OpType=.., NumelIn=.., NumelOut=.., Timeout(ms)=..)`` plus ``[PG 0 (default_pg) Rank 1] Exception (either an
   error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work:
   6462.`` and ``[PG 0 Rank 2] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed ...``.
3. torch ≥ 2.5: ``[PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 2635
   PG status: last enqueued work: 2635, last completed work: 2634`` and, on ranks told to dump by another rank,
   ``Received a dump signal due to a collective timeout from rank 7 ... Last enqueued NCCL work: 56116, last
   completed NCCL work: 56116.`` (the ranks that did *not* time out — often the interesting ones).

What comes out:

* EVENTS ``kind="enter"`` per timed-out work (deduplicated: the same work is repeated in the exception text),
  ``source="watchdog"``, ``state="scheduled"`` (or ``"started"`` when a "last started" counter covers it; never
  ``completed``), ``name=canonical op``, ``seq = backend_seq = SeqNum`` (for SEND/RECV the per-PG p2p counter,
  ``category="p2p"``), ``group`` = PG name (the GUID, else the old ``PG <n>`` number; FR's ``process_group[0]``),
  ``group_desc`` (``default_pg``, ...), ``shape`` = ``[NumelIn]`` (``[in]->[out]`` when they differ; flattened
  element counts, not real shapes) or the old ``TensorShape``, ``nbytes`` null, ``error`` = the timeout text.
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
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranktrace.analyzers import schema
from ranktrace.analyzers.opnames import canonical_op
from ranktrace.analyzers.readers.text import TextDoc, canonical_prefix
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped, has_nul_bytes

__all__ = ["FORMAT", "COLUMN_MAP", "ColumnMap", "OBSERVATION_KINDS", "OPTYPE_NAMES", "sniff", "read", "read_doc"]

FORMAT = "watchdog"


#: How watchdog line fields become EVENTS columns.
COLUMN_MAP: tuple[ColumnMap, ...] = (
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
)

OBSERVATION_KINDS: dict[str, str] = {
    "watchdog_pg_status": "group=PG, rank, value=last completed, name=trigger, "
                          "detail='enqueued=N completed=M [started=S] [failed_seq=F] trigger=T [from=...]'",
    "rank_space": "rank known only inside its PG: group=PG, rank=PG rank, detail=global (default_pg) | pg:<name>",
}

#: torch ``opTypeToString`` spellings that ``canonical_op`` does not map by itself.
OPTYPE_NAMES: dict[str, str] = {
    "_ALLGATHER_BASE": "all_gather_into_tensor",
    "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
    "ALLTOALL_BASE": "all_to_all_single",
    "ALLTOALL": "all_to_all",
    "ALLGATHER_COALESCED": "all_gather_coalesced",
    "ALLREDUCE_COALESCED": "all_reduce_coalesced",
    "_ALLREDUCE_SPARSE": "all_reduce",
    "RECVANYSOURCE": "recv",
    "COALESCED": "coalesced",
}
_P2P_TYPES = frozenset({"SEND", "RECV", "RECVANYSOURCE"})

_PREFILTER = (b"WorkNCCL(", b"enqueued")
_GRANK = re.compile(r"\[rank(\d+)\]:")
_RAY = re.compile(r"\(([\w.:-]+) pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\)")
_GLOG = re.compile(r"\[?([EWIF])(\d{4})? ?(\d\d:\d\d:\d\d(?:\.\d+)?)? ?(?:\d+ )?ProcessGroupNCCL\.cpp:(\d+)\]")
_PG_NEW = re.compile(r"\[PG ID (\d+) PG GUID ([^\s(\]]+)(?:\(([^)]*)\))? Rank (\d+)\]")
_PG_OLD = re.compile(r"\[PG (\d+)(?: \(([^)]*)\))? Rank (\d+)\]")
_PG_RANK = re.compile(r"\[Rank (\d+)\]")
_TIMEOUT = re.compile(
    r"[Cc]aught collective operation timeout(?: for work)?:\s*WorkNCCL\((?P<body>(?:[^()]|\([^()]*\))*)\)"
    r"(?: ran for (?P<ran>\d+) (?:milliseconds|ms))?"
)
_FIELDS = {
    "seq": re.compile(r"\bSeqNum=(\d+)"),
    "optype": re.compile(r"\bOpType=(\w+)"),
    "numel_in": re.compile(r"\bNumelIn=(\d+)"),
    "numel_out": re.compile(r"\bNumelOut=(\d+)"),
    "timeout_ms": re.compile(r"\bTimeout\(ms\)=(\d+)"),
    "shape": re.compile(r"\bTensorShape=(\[[^\]]*\])"),
}
_COUNTERS = re.compile(
    r"[Ll]ast enqueued (?:\w+ )?work: (?P<enq>-?\d+),(?: last started (?:\w+ )?work: (?P<started>-?\d+)"
    r"(?: \([^)]*\))?,)? last completed (?:\w+ )?work: (?P<comp>-?\d+)"
)
_FAILED_SEQ = re.compile(r"(?:work sequence id|detected by watchdog at work|Timeout at NCCL work): (-?\d+)")
_DUMP_FROM = re.compile(r"Received a dump signal (?:due to a collective timeout )?from\s+(this local rank|rank\s*\d+)")


@dataclass
class _Ctx:
    """What the prefixes of one line say about who wrote it."""

    grank: int | None = None
    pgrank: int | None = None
    pg: str | None = None
    pg_desc: str | None = None
    pg_id: str | None = None
    pid: int | None = None
    host: str | None = None
    log_time: str | None = None


@dataclass
class _Timeout:
    line: int
    ctx: _Ctx
    f: dict[str, str] = field(default_factory=dict)
    ran_ms: str | None = None


@dataclass
class _Status:
    line: int
    ctx: _Ctx
    enq: int
    comp: int
    started: int | None
    failed_seq: int | None
    trigger: str
    from_: str | None


def _context(text: str) -> _Ctx:
    c = _Ctx()
    m = _GRANK.search(text)
    if m:
        c.grank = int(m.group(1))
    m = _RAY.search(text)
    if m:
        c.pid = int(m.group(2))
        c.host = m.group(3)
    m = _GLOG.search(text)
    if m and (m.group(2) or m.group(3)):
        c.log_time = f"{m.group(1)}{m.group(2) or ''} {m.group(3) or ''}".strip()
    m = _PG_NEW.search(text)
    if m:
        c.pg_id, c.pg, c.pg_desc, c.pgrank = m.group(1), m.group(2), m.group(3), int(m.group(4))
        return c
    m = _PG_OLD.search(text)
    if m:
        c.pg_id, c.pg, c.pg_desc, c.pgrank = m.group(1), m.group(1), m.group(2), int(m.group(3))
        return c
    m = _PG_RANK.search(text)
    if m:
        c.pgrank = int(m.group(1))
    return c


def _rank_key(c: _Ctx) -> tuple[str, int | None]:
    return ("g", c.grank) if c.grank is not None else ("pg", c.pgrank)


def sniff(path: Path, head: bytes) -> bool:
    """True when the head, or the last MiB of the file (watchdog lines come at the end of a log), has a watchdog
    timeout or PG-status line of ProcessGroupNCCL."""
    if not head or has_nul_bytes(head):
        return False
    if _sniff_text(head):
        return True
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
    except OSError:
        return False
    return not has_nul_bytes(tail) and _sniff_text(tail)


_SNIFF_RE = re.compile(
    rb"[Cc]aught collective operation timeout(?: for work)?:\s*WorkNCCL\(\w+=|[Ll]ast enqueued (?:\w+ )?work: -?\d+,"
)


def _sniff_text(data: bytes) -> bool:
    return bool(_SNIFF_RE.search(data))


def read(path: Path) -> ReadResult:
    """Read one log file's watchdog lines. Raises ``ReaderError`` if it cannot be opened or has none at all."""
    path = Path(path)
    file = str(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    timeouts: list[_Timeout] = []
    statuses: list[_Status] = []
    skipped: list[Skipped] = []
    bad_utf8: int | None = None
    with f:
        head = f.read(65536)
        if not head:
            return ReadResult(file=file, format=FORMAT, skipped=(Skipped(file, None, "empty file"),))
        if has_nul_bytes(head):
            raise ReaderError(path, "binary content, not a text log with watchdog lines")
        f.seek(0)
        try:
            for ln, raw in enumerate(f, start=1):
                if _PREFILTER[0] not in raw and _PREFILTER[1] not in raw:
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("utf-8", "replace")
                    if bad_utf8 is None:
                        bad_utf8 = ln
                _parse_line(text.rstrip("\r\n"), ln, timeouts, statuses, skipped, file)
        except OSError as e:
            raise ReaderError(path, f"read failed: {e.strerror or e}") from e
    if not timeouts and not statuses:
        raise ReaderError(path, "no ProcessGroupNCCL watchdog timeout or PG status line found")
    if bad_utf8 is not None:
        skipped.append(Skipped(file, bad_utf8, "bytes that are not UTF-8 (mixed encodings); decoded with "
                                               "replacement characters"))
    return _build(file, timeouts, statuses, skipped)


def read_doc(doc: TextDoc) -> ReadResult:
    """The watchdog lines of a text input opened by the shared opener; each line's launcher prefix (rank, Ray pid
    and ip) is given back in the one spelling ``_context`` reads."""
    timeouts: list[_Timeout] = []
    statuses: list[_Status] = []
    skipped: list[Skipped] = []
    lines = doc.lines
    for i, ln in enumerate(lines):
        text = ln.text
        if "operation timeout" in text and "WorkNCCL(" not in text:
            text = _with_continuation(text, lines[i + 1:i + 4])
        if "WorkNCCL(" not in text and "enqueued" not in text:
            continue
        _parse_line(canonical_prefix(ln.prefix, with_pid=True) + text, ln.no, timeouts, statuses, skipped, doc.path)
    if not timeouts and not statuses:
        raise ReaderError(doc.path, "no ProcessGroupNCCL watchdog timeout or PG status line found")
    return _build(doc.path, timeouts, statuses, skipped)


def _with_continuation(text: str, following: list) -> str:
    """A timeout message broken over lines by the person who pasted it (``... operation timeout:`` then an indented
    ``WorkNCCL(..., OpType=ALLREDUCE, ...)`` and ``ran for N milliseconds``): its indented continuation joined back."""
    for nxt in following:
        body = nxt.text
        if not body[:1].isspace() and not body.startswith(("WorkNCCL(", "ran for")):
            break
        text = text.rstrip() + " " + body.strip()
        if "ran for" in body:
            break
    return text


def _parse_line(text: str, ln: int, timeouts: list[_Timeout], statuses: list[_Status],
                skipped: list[Skipped], file: str) -> None:
    tm = _TIMEOUT.search(text)
    cm = _COUNTERS.search(text)
    if tm is None and cm is None:
        if "WorkNCCL(" in text and "timeout" in text.lower():
            skipped.append(Skipped(file, ln, "watchdog timeout line cut or not understood: " + text[:160]))
        return
    ctx = _context(text)
    if tm is not None:
        fields = {k: m.group(1) for k, rx in _FIELDS.items() if (m := rx.search(tm.group("body")))}
        if "optype" not in fields:
            skipped.append(Skipped(file, ln, "WorkNCCL without OpType: " + text[:160]))
        else:
            timeouts.append(_Timeout(ln, ctx, fields, tm.group("ran")))
    if cm is not None:
        fm = _FAILED_SEQ.search(text)
        dm = _DUMP_FROM.search(text)
        if "failure detected by watchdog" in text:
            trigger = "failure"
        elif "Exception (either an error or timeout)" in text:
            trigger = "exception"
        elif "Timeout at NCCL work" in text:
            trigger = "timeout"
        elif dm is not None or "dump signal" in text:
            trigger = "dump_signal"
        else:
            trigger = "status"
        statuses.append(_Status(
            ln, ctx, int(cm.group("enq")), int(cm.group("comp")),
            int(cm.group("started")) if cm.group("started") else None,
            int(fm.group(1)) if fm else None, trigger,
            " ".join(dm.group(1).split()) if dm else None))


def _op_name(optype: str) -> str:
    return OPTYPE_NAMES.get(optype) or canonical_op(optype)


def _build(file: str, timeouts: list[_Timeout], statuses: list[_Status], skipped: list[Skipped]) -> ReadResult:
    # 1. PG of each timeout: from its own line, a repeat of it with a PG prefix, or the status line of the same
    #    rank whose failed sequence number is this SeqNum.
    for t in timeouts:
        if t.ctx.pg is not None:
            continue
        key, seq = _rank_key(t.ctx), t.f.get("seq")
        cands = [o.ctx for o in timeouts if o.ctx.pg is not None and _rank_key(o.ctx) == key
                 and o.f.get("seq") == seq and o.f.get("optype") == t.f.get("optype")]
        if not cands and seq is not None:
            cands = [s.ctx for s in statuses if s.ctx.pg is not None and _rank_key(s.ctx) == key
                     and s.failed_seq == int(seq)]
        if not cands and seq is not None and t.ctx.grank is not None:
            cands = [s.ctx for s in statuses if s.ctx.pg is not None and s.ctx.grank == t.ctx.grank
                     and s.ctx.pgrank == t.ctx.pgrank and s.failed_seq == int(seq)]
        if not cands:
            # the file names one process group only: a timeout that does not state its PG is in that one
            pgs = {(o.ctx.pg, o.ctx.pg_desc, o.ctx.pg_id) for o in [*timeouts, *statuses] if o.ctx.pg is not None}
            if len(pgs) == 1:
                pg, desc, pg_id = pgs.pop()
                t.ctx.pg, t.ctx.pg_desc, t.ctx.pg_id = pg, desc, pg_id
                continue
        if cands:
            src = cands[0]
            t.ctx.pg, t.ctx.pg_desc, t.ctx.pg_id = src.pg, src.pg_desc, src.pg_id
            if t.ctx.pgrank is None:
                t.ctx.pgrank = src.pgrank
    # 2. one event per (rank, PG, SeqNum, OpType): the exception text repeats the timeout line
    seen: set[tuple[Any, ...]] = set()
    events: list[dict[str, Any]] = []
    obs: list[dict[str, Any]] = []
    space_seen: set[tuple[Any, ...]] = set()
    no_pg_noted = False
    for t in timeouts:
        c = t.ctx
        k = (_rank_key(c), c.pg, t.f.get("seq"), t.f["optype"])
        if k in seen:
            continue
        seen.add(k)
        optype = t.f["optype"]
        seq = int(t.f["seq"]) if "seq" in t.f else None
        started = max((s.started for s in statuses if s.started is not None and _rank_key(s.ctx) == _rank_key(c)
                       and s.ctx.pg == c.pg), default=None)
        state = "started" if seq is not None and started is not None and started >= seq else "scheduled"
        nin, nout = t.f.get("numel_in"), t.f.get("numel_out")
        if "shape" in t.f:
            shape: str | None = t.f["shape"]
        elif nin is not None:
            shape = f"[{nin}]" if nin == nout or nout is None else f"[{nin}]->[{nout}]"
        else:
            shape = None
        parts = [f"{k2}={t.f[k2]}" for k2 in ("timeout_ms", "numel_in", "numel_out") if k2 in t.f]
        if t.ran_ms:
            parts.append(f"ran_ms={t.ran_ms}")
        if c.pg_id is not None:
            parts.append(f"pg_id={c.pg_id}")
        if c.grank is not None and c.pgrank is not None:
            parts.append(f"pg_rank={c.pgrank}")
        if c.log_time:
            parts.append(f"log_time={c.log_time}")
        rank = c.grank if c.grank is not None else c.pgrank
        events.append(dict(
            host=c.host, pid=c.pid, rank=rank, kind="enter", name=_op_name(optype),
            category="p2p" if optype in _P2P_TYPES else "collective", group=c.pg, group_desc=c.pg_desc,
            backend="nccl", seq=seq, backend_seq=seq, shape=shape, state=state,
            error=f"watchdog timeout: WorkNCCL(OpType={optype}) ran for {t.ran_ms or '?'} ms "
                  f"(timeout {t.f.get('timeout_ms', '?')} ms)",
            detail=" ".join(parts), source="watchdog", file=file, line=t.line))
        if seq is None:
            skipped.append(Skipped(file, t.line, "timeout without SeqNum (torch < 1.10): cannot align with "
                                                 "other ranks"))
        if c.pg is None and not no_pg_noted:
            no_pg_noted = True
            skipped.append(Skipped(file, t.line, "process group of the timed-out work is not stated (no PG "
                                                 "status line with its sequence number): group left null"))
        _rank_space(obs, space_seen, c, file, t.line)
    # 3. PG status observations, one per distinct (rank, PG, counters)
    st_seen: set[tuple[Any, ...]] = set()
    for s in statuses:
        c = s.ctx
        k = (_rank_key(c), c.pg, s.enq, s.comp, s.started, s.failed_seq)
        if k in st_seen:
            continue
        st_seen.add(k)
        detail = f"enqueued={s.enq} completed={s.comp}"
        if s.started is not None:
            detail += f" started={s.started}"
        if s.failed_seq is not None:
            detail += f" failed_seq={s.failed_seq}"
        detail += f" trigger={s.trigger}"
        if s.from_:
            detail += f" from={s.from_.replace(' ', '')}"
        if c.log_time:
            detail += f" log_time={c.log_time}"
        obs.append(dict(host=c.host, pid=c.pid, rank=c.grank if c.grank is not None else c.pgrank,
                        kind="watchdog_pg_status", name=s.trigger, group=c.pg, detail=detail, value=s.comp,
                        source="watchdog", file=file, line=s.line))
        _rank_space(obs, space_seen, c, file, s.line)
    return ReadResult(file=file, format=FORMAT, events=schema.table_from_rows(schema.EVENTS, events),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped))


def _rank_space(obs: list[dict[str, Any]], seen: set[tuple[Any, ...]], c: _Ctx, file: str, line: int) -> None:
    """A rank known only as a PG rank: say in which space it lives."""
    if c.grank is not None or c.pgrank is None:
        return
    k = (c.pg, c.pgrank)
    if k in seen:
        return
    seen.add(k)
    space = "global" if c.pg_desc == "default_pg" else f"pg:{c.pg if c.pg is not None else 'unknown'}"
    obs.append(dict(host=c.host, pid=c.pid, rank=c.pgrank, kind="rank_space", group=c.pg, detail=space,
                    source="watchdog", file=file, line=line))
