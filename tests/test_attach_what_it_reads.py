"""`trace attach` says what it could and could not read (issue #27): on the shell's own pid it never dumps itself,
on a process that is not Python it says so in one line (exit 2, nothing made), and beside a Python process it
names what it left out. Real processes: bash, sleep, a sleeping python."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.helpers import PY, REPO, TRACE, kill_group, trace_env


def _attach(pid: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(TRACE + ["attach", "-o", str(tmp_path / "traces"), str(pid)], capture_output=True,
                          text=True, env=trace_env(), cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)


def test_the_shells_own_pid_is_not_dumped_as_the_job(tmp_path: Path):
    cmd = " ".join(TRACE) + f" attach -o {tmp_path / 'traces'} $$; echo rc=$?"  # two commands: bash forks for each
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=120)
    assert "rc=2" in res.stdout, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("[ranktrace] nothing to read: no Python process among pid(s) ")
    assert "bash " in line and "the only Python one is this trace attach" in line
    assert not (tmp_path / "traces").exists()   # nothing made


def test_a_process_that_is_not_python_is_named_and_nothing_is_made(tmp_path: Path):
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        res = _attach(proc.pid, tmp_path)
    finally:
        kill_group(proc)
        proc.wait()
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        f"[ranktrace] nothing to read: no Python process among pid(s) {proc.pid} and their descendants (sleep "
        f"{proc.pid}: not Python). trace attach reads Python stacks (py-spy) and /proc of a job's Python processes; "
        f"nothing was captured"]
    assert not (tmp_path / "traces").exists()


def test_beside_a_python_process_what_is_left_out_is_said(tmp_path: Path):
    shell = subprocess.Popen(["bash", "-c", f"{PY} -c 'import time; time.sleep(60)' & wait"], start_new_session=True)
    try:
        time.sleep(1.0)
        res = _attach(shell.pid, tmp_path)
    finally:
        kill_group(shell)
        shell.wait()
    lines = res.stderr.strip().splitlines()
    assert f"[ranktrace] not read: 1 process(es) that are not Python (bash {shell.pid}); their stacks and ranks are " \
           f"not in the verdict" in lines, lines
    assert lines[-1].startswith("[ranktrace] attached to 1 process(es); evidence in "), lines
