"""The in-rank agent never closes the job's own file in a forked child (issue #31): after os.closerange and a new
file opened on the number the agent's socket had, the child's write to that file succeeds."""
from __future__ import annotations

from pathlib import Path

from tests.helpers import PY, REPO, run_trace

SCRIPT = REPO / "tests" / "scripts" / "closerange_fork.py"


def test_a_child_forked_after_closerange_keeps_the_jobs_file(tmp_path: Path) -> None:
    out = tmp_path / "job-file.txt"
    got = run_trace(["run", "-o", str(tmp_path / "run"), "--", PY, str(SCRIPT), str(out)], timeout=90)
    assert "no agent socket" not in got.stdout, got.stdout  # the check ran against a real agent
    assert got.returncode == 0 and "child wrote" in got.stdout, (got.stdout, got.stderr[-1500:])
    assert out.read_text() == "child wrote\n"
