"""lock_wait: the `filelock` library's debug log read into one ``lock_wait`` row per lock file: who tried to take it,
and whether anyone got it. Processes that keep asking for a lock nobody takes are blocked outside any collective,
on the host (a stale lock left by a killed start, a slow network home directory).
Stages: :mod:`.signatures` -> :func:`read_doc`."""
from __future__ import annotations

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.lock_wait import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "read_doc"]

FORMAT = "lock_wait"
SOURCE = "lock_wait"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("'Attempting to acquire lock <id> on <path>'", "OBSERVATIONS.kind=lock_wait name=<path>", "str", "-",
              "filelock 3"),
    ColumnMap("'Lock <id> acquired on <path>' / 'not acquired ..., waiting' / 'Timeout on acquiring'",
              "OBSERVATIONS.value (waiters never acquired), detail", "int", "-", "filelock 3"),
    ColumnMap("launcher prefix | file name", "OBSERVATIONS.rank", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "lock_wait": "name = the lock file, value = how many lock objects asked for it and never got it, detail = "
                 "attempts / acquired / timeouts and the last line",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """One row per lock file (per rank when lines name one). ReaderError when no filelock line is in `doc`."""
    per: dict[tuple, dict] = {}
    for ln in doc.lines:
        m = sig.LOCK.search(ln.text[:4000])
        if not m:
            continue
        rank = ln.prefix.rank if ln.prefix.rank is not None else doc.name_rank
        st = per.setdefault((rank, m.group("path")), {"asked": set(), "got": set(), "timeouts": 0, "released": set(),
                                                        "line": ln.no, "last": ""})
        lock_id, what, how = m.group("id"), m.group("what"), m.group("how")
        if what == "Attempting to acquire" or how == "not acquired":
            st["asked"].add(lock_id)
        elif how == "acquired":
            st["got"].add(lock_id)
        elif how == "released" or what == "Attempting to release":
            st["released"].add(lock_id)
        elif what == "Timeout on acquiring":
            st["timeouts"] += 1
            st["asked"].add(lock_id)
        st["line"], st["last"] = ln.no, ln.text.strip()[:300]
    if not per:
        raise ReaderError(doc.path, "no filelock line")
    rows = []
    for (rank, path), st in per.items():
        waiting = st["asked"] - st["got"]
        rows.append({"rank": rank, "kind": "lock_wait", "name": path, "value": len(waiting),
                     "detail": f"asked={len(st['asked'])} acquired={len(st['got'])} released={len(st['released'])} "
                               f"timeouts={st['timeouts']} last: {st['last']}",
                     "source": SOURCE, "file": doc.path, "line": st["line"]})
    return ReadResult(file=doc.path, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, rows))
