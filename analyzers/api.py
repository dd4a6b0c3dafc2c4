"""The one way into the analysis: paths, and what the capture side saw alive, in; an ``Analysis`` out, by four
stages — inputs (find and read the files), model (built once), diagnose (the rules), arbitrate (one ordering by
the evidence). Every command and the watchdog call it; nothing here prints, exits or looks at the process table."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ranktrace.analyzers.diagnose import diagnose
from ranktrace.analyzers.model.build import build_model
from ranktrace.analyzers.model.values import Analysis, Liveness
from ranktrace.analyzers.inputs.collect import InputError, Rereader, collect
from ranktrace.analyzers.verdict import Verdict

__all__ = ["Analysis", "Liveness", "Refreshed", "analyze", "refresh_run", "write_run_files", "exit_code",
           "InputError"]


WHOLE = 1 << 62  # records kept per rank when every record counts (trace compare's sequences)


def analyze(paths: list[Path], *, liveness: Liveness | None, whole: bool = False) -> Analysis:
    """Read `paths` (trace dirs, folders or files of logs and dumps), diagnose, and keep the tables behind it.

    `liveness`: which of the traced processes the capture side saw alive (``tracer.watch.live.liveness``), or
    None when nobody looked — an offline analysis, where an unfinished run's state is "unknown", never "gone".
    `whole`: every record of our own traces, not the window of each rank's latest ones a verdict needs (trace
    compare reads each rank's whole op sequence). Raises InputError when nothing at all could be used.
    """
    inputs = collect([Path(p) for p in paths], rows=WHOLE if whole else None)
    model = build_model(inputs, liveness, Rereader(inputs))
    verdict = diagnose(model)
    seen = model.inputs  # clock-aligned, and widened where the window left out an op the graph compares
    return Analysis(
        verdict=verdict, events=model.events, ops=model.ops, stacks=seen.stacks, observations=seen.observations,
        open_spans=tuple(model.open_spans), open_rows=tuple(int(i) for i in model.open_rows), job=model.job,
        liveness=liveness, hosts=tuple(seen.hosts), files=tuple(seen.files), skipped=tuple(seen.skipped),
        windowed=seen.windowed,
    )


@dataclass(frozen=True)
class Refreshed:
    """A run re-analyzed and its files rewritten; `problem`: one line when a file could not be written."""

    analysis: Analysis
    problem: str | None = None


def refresh_run(run_dir: Path, liveness: Liveness | None) -> Refreshed:
    """Analyze a run directory and (re)write ``<run>/verdict.json`` and ``<run>/report.html`` beside it.

    Analysis errors propagate (InputError, or a bug of ours). A file that cannot be written (disk full, the run
    dir removed) never costs the verdict: it comes back as ``problem`` beside the analysis.
    """
    analysis = analyze([run_dir], liveness=liveness)
    try:
        problem = write_run_files(run_dir, analysis)
    except OSError as e:
        problem = f"verdict.json not written: {e}"
    return Refreshed(analysis, problem)


def write_run_files(run_dir: Path, analysis: Analysis) -> str | None:
    """``<run>/verdict.json`` (the contract: its write errors propagate) and ``<run>/report.html`` (a page for
    people: a failure there is returned as one line and never costs the verdict)."""
    from ranktrace.analyzers.report import html_report, json_report

    _replace(run_dir / "verdict.json", json_report.render(analysis.verdict))
    page = run_dir / "report.html"
    try:
        _replace(page, html_report.render(analysis))
    except Exception as e:  # noqa: BLE001 - the page is extra; the verdict above is what must land
        page.unlink(missing_ok=True)  # never a page of an older verdict beside this one
        return f"report.html not written: {type(e).__name__}: {e}"
    return None


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a reader never sees half a file; both are rewritten on every
    silence the watchdog reports)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode("utf-8", "backslashreplace")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, 0o600)  # a name planted before us (a symlink) is never written through
        except FileExistsError:
            tmp.unlink()  # unlinks the name itself, never what a symlink points at
            fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def exit_code(v: Verdict) -> int:
    """0 no hang, 3 hang or crash diagnosed (also a job interrupted while hung), 4 inconclusive (2 = usage/input
    error, raised earlier)."""
    if v.status in ("hang", "crashed"):
        return 3
    if v.status == "interrupted":
        return 0 if v.kind in ("no_hang", "unknown") else 3
    if v.status == "inconclusive":
        return 4
    return 0
