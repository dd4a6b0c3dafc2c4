"""A stream trace run was started without stays closed in the job (issue #31): before, the next file or pipe trace
run opened took the free number, and the job inherited it as its stdin or stdout (`trace run ... >&-` gave the job
a pipe where it had none)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, trace_env

PROBE = REPO / "tests" / "scripts" / "std_fds_probe.py"


def _fds(cmd: list[str], closing: str, tmp_path: Path) -> dict[int, str]:
    out = tmp_path / "fds.txt"
    line = " ".join(cmd + [str(PROBE), str(out)])
    subprocess.run(["bash", "-c", f"{line} </dev/null >{tmp_path}/o 2>{tmp_path}/e {closing}"], timeout=90,
                   env=trace_env(), check=False)
    return {int(a): b for a, b in (x.split() for x in out.read_text().split("\n") if x)}


@pytest.mark.parametrize("closing, fd", [("<&-", 0), (">&-", 1), ("2>&-", 2)])
def test_a_closed_std_fd_is_closed_in_the_job_as_without_ranktrace(tmp_path: Path, closing: str, fd: int) -> None:
    bare = _fds([PY], closing, tmp_path)
    traced = _fds(TRACE + ["run", "-o", str(tmp_path / "run"), "--", PY], closing, tmp_path)
    assert bare[fd] == "closed" and traced[fd] == "closed", (bare, traced)
