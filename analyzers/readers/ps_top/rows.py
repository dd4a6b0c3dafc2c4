"""Processes → ``process`` OBSERVATIONS rows: state, cpu %, pid and the redacted command, with the rank the command
names."""
from __future__ import annotations

import shlex
from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.ps_top.scan import Proc
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.tracer.formats.redact import redact_argv

__all__ = ["result", "redact_command", "state_name"]

_CMD_CHARS = 2000


def state_name(p: Proc) -> str | None:
    """``defunct`` for a zombie (``Z`` or ``<defunct>``), else the first letter of the state column, else None."""
    if (p.state or "")[:1] == "Z" or (p.cmd and "<defunct>" in p.cmd):
        return "defunct"
    return p.state[:1] if p.state else None


def redact_command(cmd: str) -> str:
    """The command line with secret-named options and secret-shaped values replaced (tracer.redact)."""
    cmd = cmd[:_CMD_CHARS]
    try:
        argv = shlex.split(cmd)
    except ValueError:          # an unbalanced quote in a cut line
        argv = cmd.split()
    return " ".join(redact_argv(argv))


def result(path: str, fmt: str, source: str, procs: list[Proc], skipped: list[Skipped]) -> ReadResult:
    last: dict[tuple[str, int], Proc] = {}
    for p in procs:                      # several snapshots (top -b, ps twice): the last state of each process
        last[(p.listing, p.pid)] = p
    rows: list[dict[str, Any]] = []
    for p in sorted(last.values(), key=lambda p: p.line):
        cmd = redact_command(p.cmd) if p.cmd else None
        detail = f"pid={p.pid}" + (f" ppid={p.ppid}" if p.ppid is not None else "") + \
                 (f" {p.extra}" if p.extra else "") + f" by={p.listing}" + (f" cmd={cmd}" if cmd else "")
        rows.append({"pid": p.pid, "rank": rank_from_name(cmd) if cmd else None, "kind": "process",
                     "name": state_name(p), "value": round(p.cpu) if p.cpu is not None else None,
                     "detail": detail, "source": source, "file": path, "line": p.line})
    return ReadResult(file=path, format=fmt, observations=schema.table_from_rows(schema.OBSERVATIONS, rows),
                      skipped=tuple(skipped))
