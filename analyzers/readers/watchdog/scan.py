"""The watchdog lines of a log: who wrote each (its ``[rankN]:``, PG and Ray prefixes), the timed-out ``WorkNCCL``
and the PG status counters it states; a message broken over lines is joined back."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped

__all__ = ["Ctx", "Timeout", "Status", "PREFILTER", "rank_key", "sniff_text", "with_continuation",
           "parse_line"]

PREFILTER = (b"WorkNCCL(", b"enqueued")
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
# WorkNCCL::checkAndSetException (torch 2.x): the work of this rank failed with an error NCCL reported for it:
#   "[Rank 3] Collective WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=1800000) raised the
#   following async exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5"
_ASYNC = re.compile(
    r"Collective WorkNCCL\((?P<body>(?:[^()]|\([^()]*\))*)\) raised the following async exception: ?(?P<what>.{0,300})"
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
class Ctx:
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
class Timeout:
    """A ``caught collective operation timeout: WorkNCCL(...)`` line."""

    line: int
    ctx: Ctx
    f: dict[str, str] = field(default_factory=dict)
    ran_ms: str | None = None
    error: str | None = None   # the async exception the work raised (not a timeout), as printed


@dataclass
class Status:
    """A PG status line: last enqueued / started / completed work, and what triggered it."""

    line: int
    ctx: Ctx
    enq: int
    comp: int
    started: int | None
    failed_seq: int | None
    trigger: str
    from_: str | None


def _context(text: str) -> Ctx:
    c = Ctx()
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


def rank_key(c: Ctx) -> tuple[str, int | None]:
    return ("g", c.grank) if c.grank is not None else ("pg", c.pgrank)


_SNIFF_RE = re.compile(
    rb"[Cc]aught collective operation timeout(?: for work)?:\s*WorkNCCL\(\w+=|[Ll]ast enqueued (?:\w+ )?work: -?\d+,"
    rb"|Collective WorkNCCL\(\w+=[^\n]{0,600}?\) raised the following async exception"
)


def sniff_text(data: bytes) -> bool:
    return bool(_SNIFF_RE.search(data))


def with_continuation(text: str, following: list) -> str:
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


def parse_line(text: str, ln: int, timeouts: list[Timeout], statuses: list[Status],
                skipped: list[Skipped], file: str) -> None:
    tm = _TIMEOUT.search(text)
    cm = _COUNTERS.search(text)
    am = _ASYNC.search(text) if tm is None and "async exception" in text else None
    if am is not None:
        fields = {k: m.group(1) for k, rx in _FIELDS.items() if (m := rx.search(am.group("body")))}
        if "optype" not in fields:
            skipped.append(Skipped(file, ln, "WorkNCCL without OpType: " + text[:160]))
        else:
            what = am.group("what").strip()
            timeouts.append(Timeout(ln, _context(text), fields, None, what or "(exception text not shown)"))
        if cm is None:
            return
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
            timeouts.append(Timeout(ln, ctx, fields, tm.group("ran")))
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
        statuses.append(Status(
            ln, ctx, int(cm.group("enq")), int(cm.group("comp")),
            int(cm.group("started")) if cm.group("started") else None,
            int(fm.group(1)) if fm else None, trigger,
            " ".join(dm.group(1).split()) if dm else None))
