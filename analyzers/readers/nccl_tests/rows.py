"""Runs → rows: ``completion`` / ``progress`` / data-error ``exception`` OBSERVATIONS and the EVENTS ``enter`` rows
of the op that was running where the output stops (``nccl_tests.read_doc`` says when)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.opnames import P2P_OPS
from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.nccl_tests import signatures as sig
from ranktrace.analyzers.readers.nccl_tests.scan import RankLine, Row, Run

__all__ = ["result"]


def result(path: str, fmt: str, source: str, runs: list[Run], skipped: list[Skipped]) -> ReadResult:
    events: list[dict[str, Any]] = []
    obs: list[dict[str, Any]] = []
    notes = list(skipped)
    for run in runs:
        base = {"source": source, "file": path}
        full = [r for r in run.rows if r.stop == "full"]
        last = run.rows[-1] if run.rows else None
        for line, what, message in run.failures[:1]:   # the test stops at its first failed call
            obs.append(dict(base, kind="exception", name=f"NcclTests{what.capitalize()}Failure", line=line,
                            detail=f"by=nccl_tests Test {what} failure {message}"))
        for r in full:
            wrong = _wrong(r, run.has_root)
            if wrong:
                obs.append(dict(base, kind="exception", name="NcclTestsWrongData", line=r.line,
                                detail=f"by=nccl_tests {wrong} at size {r.size}: {_text(r)}"))
                break
        if run.oob is not None:
            line, count, ok = run.oob
            bw = f"; Avg bus bandwidth : {run.avg_bw[1]}" if run.avg_bw else ""
            if ok:
                obs.append(dict(base, kind="completion", name="nccl_tests_ok", line=line,
                                detail=f"Out of bounds values : {count} OK{bw}"))
            else:
                obs.append(dict(base, kind="exception", name="NcclTestsWrongData", line=line,
                                detail=f"by=nccl_tests Out of bounds values : {count} FAILED{bw}"))
            continue
        if full:
            obs.append(dict(base, kind="progress", name="nccl_tests_size", value=full[-1].size, line=full[-1].line,
                            detail=_text(full[-1])))
        if last is not None and last.stop == "cut":
            notes.append(Skipped(path, last.line, "nccl-tests output cut inside a row's field (an excerpt cut by "
                                                  "the paste): not where the test stopped"))
        running = _running(run, last)
        if running is not None:
            events.extend(_enter_rows(run, base, *running))
        elif run.failed_in_op is not None and run.failures:
            # the failure trail runs through the op's own test source (``all_reduce.cu:103``): the call that failed
            # was that op's, after communicator init
            line, what, message = run.failures[0]
            for row in _enter_rows(run, base, line, None, f"the test failed inside its op (trail line "
                                                         f"{run.failed_in_op})"):
                events.append(dict(row, error=f"Test {what} failure {message}"))
    world = max((len(r.ranks) for r in runs), default=0) or None
    version = next((r.version for r in runs if r.version), None)
    return ReadResult(file=path, format=fmt, version=version,
                      events=schema.table_from_rows(schema.EVENTS, events),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(notes), world_size=world)


def _running(run: Run, last: Row | None) -> tuple[int, int | None, str] | None:
    """(line, size, what) of the op the output stops in, or None when it does not show one."""
    if last is None:
        if run.header_line is None:
            return None          # stops before the table: communicator init (NCCL's own lines say more)
        return run.header_line, run.max_bytes, "the output stops after the table header: warm-up not finished"
    if last.stop == "oop":
        return last.line, last.size, "the output stops after this row's size columns: out-of-place op running"
    if last.stop == "ip":
        return last.line, last.size, "the output stops after this row's out-of-place result: in-place op running"
    return None


def _enter_rows(run: Run, base: dict[str, Any], line: int, size: int | None, what: str) -> list[dict[str, Any]]:
    op, how = _op(run)
    category = "p2p" if op in P2P_OPS else "collective"
    detail = f"{what}; size {size} bytes; op {how}" if size is not None else f"{what}; op {how}"
    ranks: Sequence[RankLine | None] = run.ranks or [None]
    world = len(run.ranks) or None
    out = []
    for r in ranks:
        out.append(dict(base, kind="enter", name=op, category=category, backend="nccl", nbytes=size, line=line,
                        rank=r.rank if r else None, pid=r.pid if r else None, host=r.host if r else None,
                        world=world, detail=detail))
    return out


def _op(run: Run) -> tuple[str | None, str]:
    if run.binary:
        return sig.op_of_binary(run.binary), f"from the binary {run.binary}_perf (line {run.binary_line})"
    for r in run.rows:
        cols = _columns(r, run.has_root)
        if cols is not None:
            op, why = sig.op_of_columns(*cols)
            return op, f"inferred from the table columns {why} (line {r.line})"
    return None, "not stated (no command line, no result row)"


def _columns(r: Row, has_root: bool | None) -> tuple[str, str | None] | None:
    if len(r.fields) < 4 or not r.fields[3][:1].isalpha():
        return None
    root = r.fields[4] if (has_root or (has_root is None and len(r.fields) in (5, 9, 13))) and len(r.fields) > 4 \
        else None
    return r.fields[3], root


def _wrong(r: Row, has_root: bool | None) -> str | None:
    base = 5 if has_root or (has_root is None and len(r.fields) == 13) else 4
    parts = []
    for name, i in (("out-of-place", base + 3), ("in-place", base + 7)):
        v = r.fields[i] if i < len(r.fields) else ""
        if v.isdigit() and int(v) > 0:   # a count of wrong elements; 1.x/2.x 'error' columns hold 1e-06 (max error)
            parts.append(f"#wrong {v} ({name})")
    return ", ".join(parts) or None


def _text(r: Row) -> str:
    return " ".join(r.fields)[:300]
