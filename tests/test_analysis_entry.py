"""The one analysis entry point and what it promises: typed results the renderers take, liveness as an input
(an offline analysis never consults this machine's process table), the import directions, `--version`."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from ranktrace.analyzers import api
from ranktrace.analyzers.model.values import Analysis, Comparison, JobStatus, Liveness, OpenSpan
from ranktrace.analyzers.verdict import RankState, Verdict
from tests.helpers import PY, REPO, trace_env

ANALYZERS = REPO / "analyzers"
SCEN = REPO / "tests" / "data" / "scenarios"
MODEL = ("ranktrace.analyzers.model.values", "ranktrace.analyzers.verdict")


def _within(module: str, allowed: typing.Iterable[str]) -> bool:
    """`module` is one of `allowed` or a name inside one (``from ranktrace.analyzers.model.values import Analysis``)."""
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _imports(path: Path, *, skip_type_checking: bool = False) -> set[str]:
    """Every module `path` imports (``from a import b`` gives ``a`` and ``a.b``; relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(("ranktrace",) + path.relative_to(REPO).parent.parts)
    package = package.replace("ranktrace.ranktrace", "ranktrace")
    skipped: set[int] = set()
    if skip_type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                skipped.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return out


# --- the renderers take the model and import nothing else ------------------------------------------------------

RENDERERS = ["html_report", "perfetto_report", "text_report", "json_report", "compare_text", "compare_html"]


def test_renderers_take_the_model_types_not_any():
    from ranktrace.analyzers.report import (compare_html, compare_text, html_report, json_report, perfetto_report,
                                            text_report)

    takes = {m.__name__.rsplit(".", 1)[1]: next(iter(v for k, v in typing.get_type_hints(m.render).items()
                                                     if k != "return"))
             for m in (html_report, perfetto_report, text_report, json_report, compare_text, compare_html)}
    assert takes == {"html_report": Analysis, "perfetto_report": Analysis, "text_report": Verdict,
                     "json_report": Verdict, "compare_text": Comparison, "compare_html": Comparison}


def test_report_modules_import_only_the_model():
    """report/* import, of ranktrace, only model/values.py, verdict.py and each other; values.py only verdict.py (a
    type name for Skipped sits under TYPE_CHECKING); verdict.py nothing."""
    for f in sorted((ANALYZERS / "report").glob("*.py")):
        ours = {m for m in _imports(f) if m.startswith("ranktrace")}
        wrong = {m for m in ours if not _within(m, MODEL + ("ranktrace.analyzers.report",))
                 and m != "ranktrace.analyzers"}
        assert not wrong, (f.name, wrong)
    model = {m for m in _imports(ANALYZERS / "model" / "values.py", skip_type_checking=True) if m.startswith("ranktrace")}
    assert all(_within(m, ("ranktrace.analyzers.verdict",)) for m in model), model
    assert not {m for m in _imports(ANALYZERS / "verdict.py") if m.startswith("ranktrace")}


def test_loading_the_renderers_loads_no_stage_of_the_analysis():
    """The same at run time, transitively: importing every renderer loads no reader, source, diagnose, timeline,
    wait-for engine or api."""
    code = ("import sys\n"
            + "".join(f"import ranktrace.analyzers.report.{m}\n" for m in RENDERERS)
            + "print('\\n'.join(m for m in sys.modules if m.startswith('ranktrace.')))")
    loaded = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=trace_env(), cwd=REPO,
                            check=True).stdout.split()
    stages = [m for m in loaded if not (_within(m, MODEL + ("ranktrace.analyzers.report",))
                                        or m in ("ranktrace", "ranktrace.analyzers", "ranktrace.analyzers.model"))]
    assert stages == [], stages


# --- liveness is an input ------------------------------------------------------------------------------------

def test_analyzers_never_import_the_host_side_of_the_tracer():
    for f in sorted(ANALYZERS.rglob("*.py")):
        bad = {m for m in _imports(f) if m.startswith(("ranktrace.tracer.launch", "ranktrace.tracer.watch"))}
        assert not bad, (str(f.relative_to(REPO)), bad)


def test_the_watchdog_reaches_the_analysis_through_the_api():
    """Its one full analysis is api.refresh_run; no timeline, reader or diagnose module of its own."""
    ours = {m for m in _imports(REPO / "tracer" / "watch" / "monitor.py") if m.startswith("ranktrace.analyzers")}
    allowed = ("ranktrace.analyzers.api", "ranktrace.analyzers.model.hoststate", "ranktrace.analyzers.model.values",
               "ranktrace.analyzers.report.text_report", "ranktrace.analyzers.verdict")
    wrong = {m for m in ours if not _within(m, allowed) and m not in (
        "ranktrace.analyzers", "ranktrace.analyzers.model", "ranktrace.analyzers.report")}
    assert not wrong, wrong


@pytest.fixture
def attached_run(tmp_path: Path):
    """A `trace attach`-style run dir of this machine with no exit status, whose one rank (a sleeping process
    started before the attach) is alive here."""
    from ranktrace.tracer.launch import hostinfo

    proc = subprocess.Popen(["sleep", "120"])
    time.sleep(0.2)
    run = tmp_path / "run"
    host = run / hostinfo.host_key()
    host.mkdir(parents=True)
    (host / "meta.json").write_text(json.dumps({
        "schema": "ranktrace.meta/1", "hostname": os.uname().nodename, "exit": None, "attached": True,
        "start_wall_ns": time.time_ns(), "pids": {str(proc.pid): {"rank": 0, "world": 1}}}))
    try:
        yield run, proc
    finally:
        proc.kill()
        proc.wait()


def test_an_offline_analysis_never_calls_a_job_alive_or_gone(attached_run):
    run, proc = attached_run
    offline = api.analyze([run], liveness=None)
    assert offline.liveness is None and offline.job.state == "unknown" and offline.job.live_pids == ()
    (note,) = [f for f in offline.verdict.findings if f.kind == "job_state_unknown"]
    assert "job state unknown" in note.summary and note.evidence
    assert "job state unknown" in offline.verdict.summary
    assert offline.verdict.ranks[0].state == "unknown"  # not "exited": nobody looked
    # the capture side's answer for the same dir, on this machine: alive
    from ranktrace.tracer.watch import live

    here = api.analyze([run], liveness=live.liveness([run]))
    assert here.job.state == "running" and here.job.live_pids == (proc.pid,)
    assert not [f for f in here.verdict.findings if f.kind == "job_state_unknown"]
    # a Liveness that did not look at this host dir (another machine's answer) is no answer either
    elsewhere = api.analyze([run], liveness=Liveness(host="elsewhere", checked_at=time.time()))
    assert elsewhere.job.state == "unknown"
    # and once the process is gone, the capture side says so and the verdict follows
    proc.kill()
    proc.wait()
    gone = api.analyze([run], liveness=live.liveness([run]))
    assert gone.job.state == "gone" and gone.verdict.ranks[0].state == "exited"
    assert "none of its processes is alive" in gone.verdict.summary


def test_an_offline_analysis_loads_nothing_that_could_look(attached_run):
    """Run alone, `analyze(liveness=None)` loads no module of the capture side: no process table is read."""
    run, _proc = attached_run
    code = ("import sys\nfrom pathlib import Path\nfrom ranktrace.analyzers import api\n"
            f"a = api.analyze([Path({str(run)!r})], liveness=None)\n"
            "print(a.job.state)\n"
            "print(' '.join(m for m in sys.modules if m.startswith(('ranktrace.tracer.watch', "
            "'ranktrace.tracer.launch'))))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=trace_env(), cwd=REPO, check=True)
    assert out.stdout.split("\n")[:2] == ["unknown", ""], out.stdout


# --- one entry point, one refresh ---------------------------------------------------------------------------

def test_refresh_run_writes_both_files_from_one_analysis(tmp_path: Path):
    run = tmp_path / "scenario"
    shutil.copytree(SCEN / "nsys_open_range", run)
    refreshed = api.refresh_run(run, None)
    assert refreshed.problem is None and isinstance(refreshed.analysis, Analysis)
    saved = Verdict.from_dict(json.loads((run / "verdict.json").read_text()))
    assert saved == refreshed.analysis.verdict
    assert (run / "report.html").read_text().startswith("<!doctype html>")


def test_the_watchdog_line_says_who_is_inside_what_from_the_analysis():
    from ranktrace.tracer.formats import schema
    from ranktrace.analyzers.model.timeline import OPS
    from ranktrace.tracer.watch.monitor import inside_line

    def span(rank: int, name: str, seq: int | None, t: int) -> OpenSpan:
        return OpenSpan(rank=rank, pid=100 + rank, tid=1, name=name, category="collective", group="0", seq=seq,
                        t_ns=t, callsite=None, capturing=False, graph_id=None, source="events", file=None, line=None,
                        detail=None)

    verdict = Verdict(status="hang", kind="missing_ranks", summary="x", unobserved_ranks=(4,),
                      ranks={r: RankState() for r in range(5)})
    spans = (span(0, "barrier", None, 1), span(0, "all_reduce", 5, 2), span(1, "all_reduce", 5, 2),
             span(2, "all_reduce", 5, 3))
    analysis = Analysis(verdict=verdict, events=schema.empty(schema.EVENTS), ops=schema.empty(OPS),
                        stacks=schema.empty(schema.STACKS), observations=schema.empty(schema.OBSERVATIONS),
                        open_spans=spans, open_rows=(), job=JobStatus(True, False, None, None), liveness=None)
    assert inside_line(analysis) == "ranks 0-2 in all_reduce group 0 seq 5; rank 3 outside any traced op"


# --- python -m ranktrace, --version ----------------------------------------------------------------------------

def test_python_m_ranktrace_version():
    res = subprocess.run([PY, "-m", "ranktrace", "--version"], capture_output=True, text=True, env=trace_env(),
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ranktrace ") and lines[-1].startswith("python 3.")
    try:
        import torch
    except ImportError:
        assert lines[1].startswith("torch: not importable")
    else:
        assert lines[1] == f"torch {torch.__version__}"
        assert lines[2] == "NCCL: not in this torch build" if not torch.version.cuda else lines[2].startswith("NCCL")
    same = subprocess.run([PY, "-m", "ranktrace.cli", "--version"], capture_output=True, text=True,
                          env=trace_env(), cwd=REPO, timeout=120)
    assert same.stdout == res.stdout  # `trace --version` and `ranktrace --version` are this command


def test_only_version_imports_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom ranktrace.cli import main\n"
            f"r = CliRunner().invoke(main, ['analyze', '--json', {str(SCEN / 'nsys_open_range')!r}])\n"
            "assert r.output.startswith('{'), r.output\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
