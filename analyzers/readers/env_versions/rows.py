"""Facts → ``version`` / ``env`` OBSERVATIONS rows (one per name and value, first line that states it); every
value passes through ``tracer.redact``."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReadResult
from ranktrace.analyzers.readers.env_versions.scan import Fact
from ranktrace.tracer.formats.redact import redact_env, redact_value

__all__ = ["result"]


def result(path: str, fmt: str, source: str, facts: list[Fact]) -> ReadResult:
    seen: set[tuple[str, str, str]] = set()
    rows: list[dict[str, Any]] = []
    for f in facts:
        value = redact_env({f.name: f.value})[f.name] if f.kind == "env" else redact_value(f.value)
        key = (f.kind, f.name, value)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"rank": f.rank, "kind": f.kind, "name": f.name, "detail": value, "source": source,
                     "file": path, "line": f.line})
    torch = next((r["detail"] for r in rows if r["kind"] == "version" and r["name"] == "torch"), None)
    return ReadResult(file=path, format=fmt, version=torch,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, rows))
