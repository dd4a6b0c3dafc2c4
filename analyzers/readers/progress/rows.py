"""Progress statements → ``progress`` OBSERVATIONS rows."""
from __future__ import annotations

from collections.abc import Sequence

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReadResult
from ranktrace.analyzers.readers.progress.scan import Ending, Progress

__all__ = ["result"]


def result(path: str, fmt: str, source: str, found: list[Progress], ends: Sequence[Ending] = ()) -> ReadResult:
    ended = [{"rank": e.rank, "kind": "completion", "name": e.what, "detail": e.text[:300], "source": source,
              "file": path, "line": e.line} for e in ends]
    rows = ended + [{"rank": p.rank, "kind": "progress", "name": p.what, "value": p.value,
             "detail": (f"{p.value}/{p.total} " if p.total is not None else f"{p.value} ") + p.text[:300],
             "source": source, "file": path, "line": p.line} for p in found]
    return ReadResult(file=path, format=fmt, observations=schema.table_from_rows(schema.OBSERVATIONS, rows))
