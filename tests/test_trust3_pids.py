"""#31, bullet 3: the guardian and `--on-hang kill` signal a pid from a ring's name only when the process running
under it now is the ring's writer (its start time, recorded in the ring, or for an old ring: started before the
ring was made). A reused pid (an unrelated `sleep` that got a dead writer's pid) is never signalled."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.launch import guardian, pidident
from ranktrace.tracer.rank.recorder import Recorder
from tests.helpers import PY, REPO, trace_env

WRITER = ("import sys, os, time\nfrom ranktrace.tracer.rank.recorder import Recorder\n"
          "Recorder(sys.argv[1] + '/rings/%d.ring' % os.getpid(), slots=16)\n"
          "print('ready', flush=True); time.sleep(60)")
NO_GROUP = 2**31 - 1  # the job's process group is gone: its processes are found through their rings alone


def _boot_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _ticks(pid: int) -> int:
    st = pidident.stat(pid)
    assert st is not None
    return st.start_ticks


def _fake_ring(path: Path, pid: int, *, start_ticks: int | None, made_ago_s: float = 0.0) -> None:
    """A ring whose header names `pid`: written by a process that had this pid once (start time `start_ticks`), or
    an old-format ring without the start time (zeros where it would be), made `made_ago_s` ago."""
    Recorder(str(path), slots=16).close()
    with open(path, "r+b") as f:
        head = bytearray(f.read(rf.IDENT_OFFSET + rf.IDENT.size))
        fields = list(rf.HEADER.unpack_from(head, 0))
        fields[2], fields[3] = pid, time.monotonic_ns() - int(made_ago_s * 1e9)
        rf.HEADER.pack_into(head, 0, *fields)
        if start_ticks is None:
            head[rf.IDENT_OFFSET:rf.IDENT_OFFSET + rf.IDENT.size] = bytes(rf.IDENT.size)
        else:
            rf.IDENT.pack_into(head, rf.IDENT_OFFSET, rf.IDENT_MAGIC, start_ticks)
        f.seek(0)
        f.write(head)


@pytest.fixture
def run_with_strangers(tmp_path: Path):
    """A host dir with one real ring writer (alive, in a session of its own) and two rings whose pids now belong to
    unrelated `sleep`s: one ring records another start time than the sleep's, the other (old format) was made
    before the sleep started. All of them started after the run did (the old check let all three through)."""
    started_s = _boot_s() - 30.0
    host = tmp_path / "host-0"
    (host / "rings").mkdir(parents=True)
    (host / "meta.json").write_text(json.dumps({"schema": "ranktrace.meta/1", "exit": None}))
    writer = subprocess.Popen([PY, "-c", WRITER, str(host)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=trace_env(), start_new_session=True)
    reused = subprocess.Popen(["sleep", "60"], start_new_session=True)
    old_reused = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        _fake_ring(host / "rings" / f"{reused.pid}.ring", reused.pid, start_ticks=_ticks(reused.pid) - 250)
        _fake_ring(host / "rings" / f"{old_reused.pid}-1.ring", old_reused.pid, start_ticks=None, made_ago_s=20.0)
        yield host, started_s, writer, (reused, old_reused)
    finally:
        for p in (writer, reused, old_reused):
            p.kill()
            p.wait()


def test_the_ring_records_its_writers_start_time(tmp_path: Path):
    ring = tmp_path / "r.ring"
    rec = Recorder(str(ring), slots=16)
    w = pidident.ring_writer(ring)
    rec.close()
    assert w is not None and w.pid == os.getpid() and w.start_ticks == _ticks(os.getpid())
    assert pidident.writer_matches(os.getpid(), w)
    # an old ring (zeros where the start time goes) still reads, with the start time unknown
    _fake_ring(ring.with_name("old.ring"), os.getpid(), start_ticks=None, made_ago_s=0.0)
    old = pidident.ring_writer(ring.with_name("old.ring"))
    assert old is not None and old.start_ticks is None and pidident.writer_matches(os.getpid(), old)
    from ranktrace.tracer.formats.ringreader import RingView

    with RingView(str(ring.with_name("old.ring"))) as v:
        assert v.contents.pid == os.getpid()
    # a symlink named like a ring is no ring
    (tmp_path / "123.ring").symlink_to(ring)
    assert pidident.ring_writer(tmp_path / "123.ring") is None


def test_the_guardian_never_signals_a_reused_pid(run_with_strangers):
    host, started_s, writer, strangers = run_with_strangers
    targets = guardian.job_processes(NO_GROUP, host, started_s)
    assert targets == [writer.pid]
    t0 = time.monotonic()
    guardian._end_job(NO_GROUP, host, started_s)  # trace run is lost: the guardian ends the job
    assert writer.wait(timeout=10) == -signal.SIGTERM and time.monotonic() - t0 < guardian.GRACE_S
    for s in strangers:
        assert s.poll() is None, "an unrelated process with a ring's pid was signalled"
    lost = json.loads((host / "meta.json").read_text())["launcher_lost"]
    assert lost["ended_pids"] == [writer.pid]


def test_on_hang_kill_never_signals_a_reused_pid(run_with_strangers):
    from ranktrace.tracer.launch.launcher import _Job

    host, started_s, writer, strangers = run_with_strangers
    job = _Job.__new__(_Job)  # the --on-hang kill path as the wait loop runs it
    job.pgid, job.host_dir, job.started_s, job.guardian = NO_GROUP, host, started_s, None
    assert job.job_pids() == [writer.pid]
    job.end_job(signal.SIGTERM)
    assert writer.wait(timeout=10) == -signal.SIGTERM
    for s in strangers:
        assert s.poll() is None, "an unrelated process with a ring's pid was signalled"


def test_a_checked_target_is_held_by_a_pidfd():
    p = subprocess.Popen(["sleep", "60"])
    try:
        t = pidident.target(p.pid, lambda st: True)
        assert t is not None and t.alive()
        if hasattr(os, "pidfd_open"):
            assert t.pidfd is not None
        assert pidident.target(p.pid, lambda st: False) is None  # a refused identity is never held
        assert t.signal(signal.SIGKILL) and p.wait(timeout=5) == -signal.SIGKILL
        assert not t.alive() and not t.signal(signal.SIGKILL)
        t.close()
    finally:
        p.kill()
        p.wait()


def test_the_guardian_script_loads_its_identity_check_without_the_package(tmp_path: Path):
    """It runs as `python -I -S guardian.py`: no site, no ranktrace package on the path."""
    code = ("import runpy; m = runpy.run_path(%r, run_name='g'); "
            "print(m['pidident'].stat(1) is not None, m['job_processes'](-1, None, 0.0))"
            % str(REPO / "tracer" / "launch" / "guardian.py"))
    out = subprocess.run([PY, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "[]"]
