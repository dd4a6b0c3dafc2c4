"""--on-hang kill says what its signal reached, never "terminating the job" over nothing (issue #31: with /proc
unreadable, the job was not ended and the line said it was). Where /proc lists none of the job's processes
(hidepid), the job's own process group — trace run's unreaped child's — is signalled instead."""
from __future__ import annotations

import signal
import subprocess
import sys

from ranktrace.tracer.launch import launcher
from ranktrace.tracer.watch.statusline import StatusLine


def _job_of(proc: subprocess.Popen[bytes], said: list[str]) -> "launcher._Job":
    return launcher._Job(proc.pid, None, StatusLine(sys.stderr, enabled=False), said.append)


def test_the_kill_reaches_the_job_and_says_how_many() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    said: list[str] = []
    try:
        sent = _job_of(proc, said).end_job(signal.SIGTERM)
        assert sent >= 1
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert launcher._Job._said(sent, "SIGTERM").startswith("SIGTERM sent to 1 process of the job")
    finally:
        proc.kill()


def test_with_no_process_visible_the_group_is_signalled_and_it_is_said(monkeypatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    monkeypatch.setattr(launcher, "job_targets", lambda *a, **k: [])  # what /proc mounted hidepid=2 shows
    try:
        sent = _job_of(proc, []).end_job(signal.SIGTERM)
        assert sent == -1 and proc.wait(timeout=10) == -signal.SIGTERM
        assert "process group" in launcher._Job._said(sent, "SIGTERM")
    finally:
        proc.kill()


def test_a_kill_that_reached_nothing_is_never_said_to_have_ended_the_job() -> None:
    line = launcher._Job._said(0, "SIGKILL")
    assert "not ended" in line and "sent to" not in line
