"""#31, bullet 2: `trace bisect`'s GPU lock cannot be hijacked. Another local user who makes
<tmp>/ranktrace-bisect-<uid>/ first and plants gpu-all.lock -> a root-only file must not make us wipe that file or
write our pid into it: the folder must be ours alone (else one clear line), a lock file is never followed through a
symlink nor truncated before it is locked, and our pid goes only into a plain file we own."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from ranktrace.tracer.launch.bisect import runner
from tests.helpers import TRACE, trace_env

OTHER_UID = 65534  # nobody: stands for another local user


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "root-only" / "secret"
    v.parent.mkdir(mode=0o700)
    v.write_text("precious\n")
    v.chmod(0o600)
    return v


def _as_other_user(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)


@pytest.fixture
def tmpdir_here(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(mode=0o1777)
    os.chmod(tmp_path / "tmp", 0o1777)
    return tmp_path / "tmp"


def test_a_lock_folder_another_user_made_first_is_refused(tmp_path: Path, tmpdir_here: Path):
    victim = _victim(tmp_path)
    planted = tmpdir_here / f"ranktrace-bisect-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / "gpu-all.lock").symlink_to(victim)
    _as_other_user(planted / "gpu-all.lock")
    _as_other_user(planted)
    with pytest.raises(runner.LockDirUnsafe) as e:
        with runner.gpu_lock({}):
            pass
    assert str(planted) in str(e.value) and "not ours alone" in str(e.value)
    assert victim.read_text() == "precious\n"


def test_a_symlinked_lock_folder_is_refused(tmp_path: Path, tmpdir_here: Path):
    victim = _victim(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "gpu-all.lock").symlink_to(victim)
    (tmpdir_here / f"ranktrace-bisect-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(runner.LockDirUnsafe):
        with runner.gpu_lock({}):
            pass
    assert victim.read_text() == "precious\n"


def test_a_lock_file_symlink_or_hard_link_is_never_written_through(tmp_path: Path):
    """A shared lock folder ($RANKTRACE_LOCK_DIR, sticky and open to all, as an admin might set for every user)."""
    victim = _victim(tmp_path)
    shared = tmp_path / "shared-locks"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "gpu-all.lock").symlink_to(victim)
    with pytest.raises(runner.LockDirUnsafe) as e:
        with runner.gpu_lock({"RANKTRACE_LOCK_DIR": str(shared)}):
            pass
    assert "gpu-all.lock" in str(e.value) and "not followed" in str(e.value)
    assert victim.read_text() == "precious\n"
    (shared / "gpu-all.lock").unlink()
    os.link(victim, shared / "gpu-all.lock")  # a hard link to someone's file: locked, never truncated nor written
    with runner.gpu_lock({"RANKTRACE_LOCK_DIR": str(shared)}) as key:
        assert key == "all"
    assert victim.read_text() == "precious\n"


def test_the_lock_still_keeps_two_bisects_apart(tmp_path: Path, tmpdir_here: Path):
    with runner.gpu_lock({}) as key:
        lock = tmpdir_here / f"ranktrace-bisect-{os.getuid()}" / "gpu-all.lock"
        assert key == "all" and lock.read_text() == str(os.getpid())
        assert (lock.parent.stat().st_mode & 0o777) == 0o700
        with pytest.raises(runner.GpuBusy) as e:
            with runner.gpu_lock({}):
                pass
        assert f"pid {os.getpid()}" in str(e.value)


def test_trace_bisect_says_why_in_one_line(tmp_path: Path):
    victim = _victim(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    planted = tmp / f"ranktrace-bisect-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / "gpu-all.lock").symlink_to(victim)
    _as_other_user(planted)
    env = trace_env(TMPDIR=str(tmp))
    env.pop("RANKTRACE_LOCK_DIR", None)
    res = subprocess.run(TRACE + ["bisect", "--", "python", "-c", "pass"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode != 0
    assert "not ours alone" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert victim.read_text() == "precious\n"
