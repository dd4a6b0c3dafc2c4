"""Statements → OBSERVATIONS rows (one per rank and op, first line that says it), and the ``ReadResult``."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReadResult
from ranktrace.analyzers.readers.horovod.scan import Scan
from ranktrace.analyzers.readers.horovod.signatures import op_of_tensor

__all__ = ["result"]

_KIND = {"missing": "missing_rank", "ready": "joined_rank"}


def result(path: str, fmt: str, source: str, found: Scan) -> ReadResult:
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, int | None, str | None], dict[str, Any]] = {}
    tensors: dict[tuple[str, int | None, str | None], set[str]] = {}
    for st in found.statements:
        base = {"source": source, "file": path, "line": st.line, "rank": st.rank}
        if st.what in _KIND:
            op = op_of_tensor(st.tensor or "")
            key = (st.what, st.rank, op)
            names = tensors.setdefault(key, set())
            if st.tensor:
                names.add(st.tensor)
            if key in seen:
                if st.shutdown_rank:
                    seen[key]["_shutdown"] = True
                continue
            row = dict(base, kind=_KIND[st.what], name=op, _tensor=st.tensor, _shutdown=st.shutdown_rank)
            seen[key] = row
            rows.append(row)
        elif st.what == "shutdown":
            key = ("shutdown", st.rank, st.text)
            if key in seen:
                seen[key]["_count"] += 1
                continue
            row = dict(base, kind="exception", name=st.text, _count=1,
                       detail="Horovod has been shut down (an op was called after a rank failed or finished)")
            seen[key] = row
            rows.append(row)
        elif st.what == "stall_shutdown":
            key = ("stall_shutdown", st.rank, None)
            if key not in seen:
                seen[key] = row = dict(base, kind="exception", name="HorovodStallShutdown", detail=st.text)
                rows.append(row)
        else:
            rows.append(dict(base, kind="exception", name="HorovodInternalError", detail=st.text))
    for r in rows:
        tensor = r.pop("_tensor", None)
        shutdown = r.pop("_shutdown", False)
        count = r.pop("_count", 1)
        if r["kind"] in ("missing_rank", "joined_rank"):
            key = ("missing" if r["kind"] == "missing_rank" else "ready", r["rank"], r["name"])
            n = len(tensors.get(key, ()))
            r["detail"] = "by=horovod" + (f" tensor={tensor}" if tensor else "") + \
                          (f" (+{n - 1} more tensors)" if n > 1 else "") + (" shutdown=yes" if shutdown else "")
        elif count > 1:
            r["detail"] += f" ({count} times)"
    return ReadResult(file=path, format=fmt, version=None,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, rows),
                      skipped=tuple(found.skipped))
