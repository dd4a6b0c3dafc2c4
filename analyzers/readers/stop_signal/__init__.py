"""stop_signal: lines that say the job is being stopped from outside (a scheduler's cancel, a terminating signal a
process says it received), read into ``stopped`` rows. A stop is an outcome of its own: what ends after it is the
stop's doing, never a crash or a hang by itself (analyzers.diagnose.arbitrate).
Stages: :mod:`.signatures` -> :func:`read_doc`."""
from __future__ import annotations

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.stop_signal import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "read_doc"]

FORMAT = "stop_signal"
SOURCE = "stop_signal"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("'*** STEP|JOB <id> ON <node> CANCELLED AT <time>[ DUE TO TIME LIMIT] ***'",
              "OBSERVATIONS.kind=stopped name=scheduler_cancel detail", "str", "-", "Slurm 17+"),
    ColumnMap("'received signal=SIGTERM', 'Received SIGINT', 'caught signal 15', 'SIGTERM received.'",
              "OBSERVATIONS.kind=stopped name=signal value=N", "int", "-", "vLLM 0.11+, uvicorn, Ray, SGLang 0.4+"),
    ColumnMap("launcher prefix | file name", "OBSERVATIONS.rank", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "stopped": "scheduler_cancel (Slurm's CANCELLED AT) | signal (value = the signal's number): the job is being "
               "stopped from outside; detail = the line",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """One ``stopped`` row per distinct statement (kind, signal) and rank: the first line that says it.
    ReaderError when no line holds one."""
    rows = []
    seen: set[tuple] = set()
    for ln in doc.lines:
        text = ln.text[:4000]
        rank = ln.prefix.rank if ln.prefix.rank is not None else doc.name_rank
        m = sig.SLURM.search(text)
        if m:
            key = ("cancel", rank)
            if key not in seen:
                seen.add(key)
                rows.append({"rank": rank, "kind": "stopped", "name": "scheduler_cancel", "value": None,
                             "detail": m.group(0)[:300], "source": SOURCE, "file": doc.path, "line": ln.no})
            continue
        m = sig.SIGNAL.search(text) or sig.SIGNAL_FIRST.search(text)
        if not m:
            continue
        s = m.group("sig")
        if s.isdigit() and not m.groupdict().get("word"):
            continue  # a number is a signal only after the word ("received signal 15"; "received 2 requests" is not)
        num = int(s) if s.isdigit() else sig.NUMBERS[s]
        key = ("signal", num, rank)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"rank": rank, "kind": "stopped", "name": "signal", "value": num, "detail": text.strip()[:300],
                     "source": SOURCE, "file": doc.path, "line": ln.no})
    if not rows:
        raise ReaderError(doc.path, "no stop statement")
    return ReadResult(file=doc.path, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, rows))
