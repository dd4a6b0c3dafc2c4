"""One entry point per question (HTA style): analyze these paths -> a verdict (and the timeline behind it).

The CLI, ``trace run`` and the watchdog all call these; nothing here prints or exits.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ranktrace.analyzers import diagnose as diagnose_mod
from ranktrace.analyzers.sources import InputError, Inputs, collect
from ranktrace.analyzers.verdict import Verdict

__all__ = ["AnalysisResult", "analyze_paths", "analyze_with_timeline", "write_run_files", "exit_code", "InputError"]


@dataclass(frozen=True)
class AnalysisResult:
    verdict: Verdict
    events: pa.Table
    ops: pa.Table
    inputs: Inputs


def analyze_with_timeline(paths: list[Path]) -> AnalysisResult:
    """Read `paths`, diagnose, and keep the tables (for the Perfetto/HTML renderers). Raises InputError."""
    inputs = collect([Path(p) for p in paths])
    ctx = diagnose_mod.build_context(inputs)
    verdict = diagnose_mod.diagnose(inputs, ctx)
    return AnalysisResult(verdict, ctx.events, ctx.ops, inputs)


def analyze_paths(paths: list[Path]) -> Verdict:
    return analyze_with_timeline(paths).verdict


def write_run_files(run_dir: Path, result: AnalysisResult) -> str | None:
    """``<run>/verdict.json`` (the contract: its write errors propagate) and ``<run>/report.html`` (a page for
    people: a failure there is returned as one line and never costs the verdict)."""
    from ranktrace.analyzers.report import html_report, json_report

    _replace(run_dir / "verdict.json", json_report.render(result.verdict))
    page = run_dir / "report.html"
    try:
        _replace(page, html_report.render(result))
    except Exception as e:  # noqa: BLE001 - the page is extra; the verdict above is what must land
        page.unlink(missing_ok=True)  # never a page of an older verdict beside this one
        return f"report.html not written: {type(e).__name__}: {e}"
    return None


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a reader never sees half a file; both are rewritten on every
    silence the watchdog reports)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def exit_code(v: Verdict) -> int:
    """DESIGN §5: 0 no hang, 3 hang or crash diagnosed, 4 inconclusive (2 = usage/input error, raised earlier)."""
    if v.status in ("hang", "crashed"):
        return 3
    if v.status == "inconclusive":
        return 4
    return 0
