"""A full disk never reaches the job (issue #16): rings reserve their space when they are made, a ring that cannot be
reserved turns tracing off in that process with one line, and `trace run` survives the full disk to the end.

The real-ENOSPC checks need a small filesystem: a size-limited tmpfs mounted in a private mount namespace
(``unshare -m`` as root, ``unshare -rm`` in a user namespace otherwise); they skip, saying why, where neither works.
"""
from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, SCRIPTS, TRACE, trace_env

FILL_JOB = SCRIPTS / "fill_disk_job.py"


def _unshare_prefix() -> list[str] | None:
    """How to run a command in a private mount namespace where it may mount a tmpfs, or None."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    for prefix in ([exe, "-m"], [exe, "-rm"]):
        try:
            ok = subprocess.run(prefix + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True,
                                timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return prefix
    return None


_PREFIX = _unshare_prefix()
needs_small_fs = pytest.mark.skipif(
    _PREFIX is None, reason="no size-limited filesystem here: `unshare -m` / `unshare -rm` + tmpfs mount refused "
                            "(not root and no user namespaces); the injected-failure tests still run")


def _on_small_fs(tmp_path: Path, size_mb: int, command: list[str], timeout: float = 180) -> tuple[int, str, str, Path]:
    """Run `command` (where the word FS stands for the small filesystem's mount point) with a `size_mb` tmpfs mounted
    at FS; the filesystem's contents are copied to tmp_path/"fs" before it goes. Returns (rc, stdout, stderr, copy)."""
    fs = tmp_path / "mnt"
    fs.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    cmd = " ".join(shlex.quote(str(fs) + a[2:] if a == "FS" or a.startswith("FS/") else a) for a in command)
    script = (f"mount -t tmpfs -o size={size_mb}m tmpfs {shlex.quote(str(fs))} || exit 99\n"
              f"{cmd} >{out}/stdout 2>{out}/stderr; echo $? >{out}/rc\n"
              f"cp -a {shlex.quote(str(fs))}/. {shlex.quote(str(tmp_path / 'fs'))}/ 2>/dev/null; true\n")
    (tmp_path / "fs").mkdir()
    assert _PREFIX is not None
    res = subprocess.run(_PREFIX + ["sh", "-c", script], env=trace_env(), cwd=REPO, timeout=timeout,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert res.returncode != 99, res.stderr
    rc = int((out / "rc").read_text().strip())
    return rc, (out / "stdout").read_text(), (out / "stderr").read_text(), tmp_path / "fs"


# --- the reservation itself (no special filesystem needed) ---------------------------------------------------------

def test_a_ring_reserves_its_whole_size_when_it_is_made(tmp_path: Path):
    from ranktrace.tracer.rank.recorder import Recorder

    rec = Recorder(str(tmp_path / "r.ring"), slots=4096)
    st = os.stat(tmp_path / "r.ring")
    assert st.st_blocks * 512 >= st.st_size  # allocated, not a sparse file whose pages fault on a full disk
    rec.close()


def test_a_ring_that_cannot_be_reserved_is_not_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from ranktrace.tracer.rank import recorder

    def no_space(fd: int, off: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(recorder.os, "posix_fallocate", no_space)
    with pytest.raises(OSError) as e:
        recorder.Recorder(str(tmp_path / "r.ring"), slots=64)
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither the ring nor its temporary name is left behind


INJECTED_ENOSPC = """
import errno, os
def _no_space(fd, off, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
os.posix_fallocate = _no_space   # every ring reservation of this process fails, as on a full disk
import torch, torch.distributed as dist
dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:0')
t = torch.ones(2)
for _ in range(2000):
    dist.all_reduce(t)
print('sum', t.sum().item())
dist.destroy_process_group()
"""


def test_injected_reservation_failure_turns_tracing_off_with_one_line(tmp_path: Path):
    run_dir = tmp_path / "run"
    res = subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(run_dir), "--", PY, "-c",
                                  INJECTED_ENOSPC], capture_output=True, text=True, env=trace_env(), timeout=120,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sum 2.0" in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if "tracing off" in ln or "tracing disabled" in ln]
    assert len(lines) == 1 and "No space left" in lines[0], res.stderr[-3000:]


# --- a real full disk ---------------------------------------------------------------------------------------------

@needs_small_fs
def test_disk_filled_mid_run_never_reaches_the_job(tmp_path: Path):
    """The job fills the filesystem its trace lives on, then runs 3000 more collectives: without the reservation
    the next ring page faulted with SIGBUS inside all_reduce (traced exit 1, untraced 0) and `trace run` died of
    SIGBUS in finalize (exit 135, no report)."""
    rc, out, err, fs = _on_small_fs(tmp_path, 96, TRACE + ["run", "--no-monitor", "-o", "FS/run", "--", PY,
                                                         str(FILL_JOB), "FS", "middle"])
    assert "disk full: 28" in out, err[-3000:]
    assert rc == 0, err[-4000:]
    assert "rank 0 ok" in out and "rank 1 ok" in out
    assert "Bus error" not in err and "SIGBUS" not in err
    last = [ln for ln in err.splitlines() if ln.startswith("[ranktrace]")][-1]
    assert "exit code 0 is the job's" in last


@needs_small_fs
def test_disk_full_before_the_rings_are_made_turns_tracing_off_per_process(tmp_path: Path):
    rc, out, err, fs = _on_small_fs(tmp_path, 96, TRACE + ["run", "--no-monitor", "-o", "FS/run", "--", PY,
                                                         str(FILL_JOB), "FS", "start"])
    assert rc == 0, err[-4000:]
    assert "rank 0 ok" in out and "rank 1 ok" in out
    off = [ln for ln in err.splitlines() if "tracing off" in ln or "tracing disabled" in ln]
    assert 1 <= len(off) <= 3, err[-3000:]  # one line per process that tried to make a ring
    assert all(ln.count("\n") == 0 for ln in off)
    assert [ln for ln in err.splitlines() if ln.startswith("[ranktrace]")][-1].count("exit code 0 is the job's")


@needs_small_fs
def test_analyze_of_rings_on_a_full_tmpfs_does_not_die(tmp_path: Path):
    """A ring read through a mapping on a full tmpfs faults (SIGBUS) on its holes: rings are read with read()."""
    from ranktrace.tracer.rank.recorder import Recorder

    code = ("import sys, os\n"
            "sys.path.insert(0, %r)\n"
            "from ranktrace.tracer.rank.recorder import Recorder\n"
            "fs = sys.argv[1]\n"
            "os.makedirs(fs + '/h/rings')\n"
            "fd = os.open(fs + '/h/rings/1.ring', os.O_RDWR | os.O_CREAT)\n"  # a sparse ring of an older version
            "import mmap, struct\n" % str(REPO))
    code += ("r = Recorder(fs + '/h/rings/2.ring', slots=256)\n"
             "r.op('enter', 'collective', r.intern('all_reduce'), tid=1, seq=1)\n"
             "r.close()\n"
             "data = open(fs + '/h/rings/2.ring', 'rb').read()\n"
             "os.write(fd, data[:8192]); os.ftruncate(fd, len(data)); os.close(fd)\n"
             "try:\n"
             "    with open(fs + '/fill', 'wb') as f:\n"
             "        while True: f.write(b'x' * (1 << 20)); f.flush()\n"
             "except OSError: pass\n"
             "from ranktrace.tracer.formats.ringreader import read_ring\n"
             "for n in ('1', '2'):\n"
             "    rc = read_ring(fs + '/h/rings/' + n + '.ring')\n"
             "    print('read', n, rc.num_slots, flush=True)\n")
    del Recorder
    rc, out, err, _fs = _on_small_fs(tmp_path, 8, [sys.executable, "-c", code, "FS"])
    assert rc == 0, err[-3000:]
    assert "read 1" in out and "read 2 1" in out
