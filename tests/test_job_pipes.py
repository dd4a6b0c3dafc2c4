"""What the job sees of its own stdout and stderr under `trace run` is what it would see without it (issue #31):

* ``trace run ... | head -1``: the job's next write after head left gets EPIPE (Python: BrokenPipeError), as it
  does without ranktrace — before, ranktrace kept draining and the job printed on until it was killed;
* a process the job leaves behind that still prints when the job ends keeps printing to where the job's output
  went (handed to `cat`), instead of dying of SIGPIPE when trace run exits;
* ``> /dev/null``: nothing of the discarded output lands in output.log;
* output.log is bounded and its owner's alone.
"""
from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

from ranktrace.tracer.launch import output_log
from tests.helpers import PY, TRACE, trace_env

PRINTS_FOREVER = "import time\ni = 0\nwhile True:\n    print(i, flush=True); i += 1; time.sleep(0.01)\n"


def _shell(cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout, env=trace_env())


def _trace(run: Path) -> str:
    return " ".join(TRACE) + f" run -o {run} -- "


def test_a_closed_reader_gives_the_job_epipe_as_without_ranktrace(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text(PRINTS_FOREVER)
    bare = _shell(f"{PY} {script} | head -1; echo rc=${{PIPESTATUS[0]}}")
    t0 = time.monotonic()
    traced = _shell(f"{_trace(tmp_path / 'run')}{PY} {script} 2>{tmp_path}/err | head -1; echo rc=${{PIPESTATUS[0]}}")
    took = time.monotonic() - t0
    assert bare.stdout == "0\nrc=1\n"                       # BrokenPipeError: Python exits 1
    assert traced.stdout == bare.stdout, (traced.stdout, (tmp_path / "err").read_text()[-600:])
    assert "BrokenPipeError" in (tmp_path / "err").read_text()
    assert took < 40  # it ended by itself, long before the 60 s the shell allows


def test_a_process_left_behind_keeps_printing_where_the_job_printed(tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    daemon = "(for i in $(seq 1 30); do echo d$i; sleep 0.1; done) & echo main"
    got = _shell(f"{_trace(tmp_path / 'run')}sh -c '{daemon}' > {out} 2>{tmp_path}/err")
    assert got.returncode == 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "d30" not in out.read_text():
        time.sleep(0.2)
    lines = out.read_text().split()
    assert lines[0] == "main" and [x for x in lines if x.startswith("d")] == [f"d{i}" for i in range(1, 31)]


def test_discarded_output_is_not_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    got = _shell(f"{_trace(run)}{PY} -c \"print('x' * 1000000)\" > /dev/null")
    assert got.returncode == 0, got.stderr
    logs = list(run.glob("*/output.log"))
    assert all("x" * 1000 not in p.read_text() for p in logs)
    assert "/dev/null" not in got.stderr or "terminal" not in got.stderr


def test_output_log_is_bounded_and_owner_only(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    r, w = os.pipe()
    ours = open(tmp_path / "ours.txt", "w")  # our stdout a file (kept), our stderr /dev/null (left to the job)
    kept = output_log.OutputLog(host, lambda s: None, streams=(ours, open(os.devnull, "w")), cap=10_000)
    assert kept.keep == [True, False]
    proc = subprocess.Popen([PY, "-c", "import sys\nfor i in range(5000): print('line', i)"], stdout=w)
    os.close(w)

    class _P:  # the Popen shape OutputLog.start reads
        stdout, stderr = os.fdopen(r, "rb"), None

    kept.start(_P())  # type: ignore[arg-type]
    proc.wait(timeout=30)
    kept.close()
    text = (host / output_log.FILE_NAME).read_text()
    assert len(text) < 10_000 + 200 and text.startswith("line 0\n") and "stops here" in text.splitlines()[-1]
    assert stat.S_IMODE((host / output_log.FILE_NAME).stat().st_mode) == 0o600
    assert (tmp_path / "ours.txt").read_text().count("\n") == 5000  # everything passed through, past the cap too
