"""The run folder is its owner's alone however it is named (issue #31): a run joined by a run id (Slurm's job id,
--run-id) is 0700 at umask 000 like any other, and `-o` into another user's folder — even an empty one, which that
user can read, swap or fill with links while the job writes stacks and command lines into it — is refused before
anything starts (exit 2)."""
from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, TRACE, trace_env

JOB = [PY, "-c", "print('job ran')"]


def _run(args: list[str], umask: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(TRACE + args, capture_output=True, text=True, timeout=90, env=trace_env(),
                          stdin=subprocess.DEVNULL, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def test_a_run_id_folder_is_owner_only_at_umask_000(tmp_path: Path) -> None:
    run = tmp_path / "r"
    got = _run(["run", "--run-id", "job-4242", "-o", str(run), "--"] + JOB, umask=0)
    assert got.returncode == 0, got.stderr
    for p in [run, *run.iterdir()]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode & 0o077 == 0, (p.name, oct(mode))


def _other_user() -> str | None:
    for name in ("nobody", "rtother"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root (chown)")
@pytest.mark.parametrize("run_id", [None, "job-77"])
def test_another_users_empty_folder_is_refused(tmp_path: Path, run_id: str | None) -> None:
    other = _other_user()
    if other is None:
        pytest.skip("no second local user (nobody) on this machine")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, pwd.getpwnam(other).pw_uid, -1)
    got = _run(["run", *(["--run-id", run_id] if run_id else []), "-o", str(theirs), "--"] + JOB)
    assert got.returncode == 2 and "belongs to another user" in got.stderr, got.stderr
    assert "job ran" not in got.stdout and list(theirs.iterdir()) == []  # nothing started, nothing written


def test_a_symlink_given_as_the_output_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    got = _run(["run", "-o", str(link), "--"] + JOB)
    assert got.returncode == 2 and "symbolic link" in got.stderr, got.stderr
    assert list(real.iterdir()) == []
