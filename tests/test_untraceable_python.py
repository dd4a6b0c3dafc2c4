"""A Python started so that ranktrace cannot load into it (``python -I``, ``-E``, ``-S``: ranktrace enters through
PYTHONPATH's sitecustomize) is said to be untraced, before the job starts and in the verdict; the job itself runs
exactly as given. Before (issue #31): such a run said ``COMPLETED · no_hang`` — "every collective that was issued
completed" — having recorded nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ranktrace.tracer.launch.envplan import untraceable_reason
from tests.helpers import PY, run_trace

JOB = "import torch.distributed; print('job ran', flush=True)"


@pytest.mark.parametrize("command, flags", [
    (["python", "-I", "-c", "x"], "-I"), (["python3", "-u", "-E", "x.py"], "-E"), (["python3.11", "-IS", "t.py"],
                                                                                   "-I -S"),
    (["python", "-W", "ignore", "-E", "x.py"], "-E"), (["python", "-Wignore", "-E", "x.py"], "-E"),
])
def test_options_that_keep_ranktrace_out_are_named(command: list[str], flags: str) -> None:
    why = untraceable_reason(command)
    assert why is not None and why.startswith(f"python {flags}:") and "will not be traced" in why


@pytest.mark.parametrize("command", [
    ["python", "train.py", "-I"], ["python", "-c", "-I"], ["python", "-m", "torch.distributed.run", "-E", "x.py"],
    ["torchrun", "-I"], ["python", "-u", "-s", "x.py"], [],
])
def test_a_python_that_reads_pythonpath_is_not_flagged(command: list[str]) -> None:
    assert untraceable_reason(command) is None


def test_an_isolated_python_run_says_it_was_not_traced(tmp_path: Path) -> None:
    run = tmp_path / "run"
    got = run_trace(["run", "-o", str(run), "--", PY, "-I", "-c", JOB], timeout=90)
    assert got.returncode == 0 and "job ran" in got.stdout, got.stderr
    assert "ranks will not be traced" in got.stderr.split("COMPLETED")[0], got.stderr  # said before the verdict
    v = json.loads((run / "verdict.json").read_text())
    assert v["status"] == "completed" and "no process of it was traced" in v["summary"], v["summary"]
    assert "every collective that was issued completed" not in got.stderr


def test_a_traced_run_claims_no_such_thing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    got = run_trace(["run", "-o", str(run), "--", PY, "-c", JOB], timeout=90)
    assert got.returncode == 0 and "job ran" in got.stdout
    v = json.loads((run / "verdict.json").read_text())
    assert "not traced" not in v["summary"] and "will not be traced" not in got.stderr
