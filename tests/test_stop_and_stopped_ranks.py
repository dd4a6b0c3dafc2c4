"""Two outcomes people confuse with a hang, each from a real 2-rank gloo job under `trace run`:

* the job stopped from outside while healthy (what `scancel`, a Kubernetes eviction or `timeout` does: SIGTERM to the
  whole job) is STOPPED with nobody blamed, never CRASHED with invented culprits;
* one rank stopped with SIGSTOP (a stray Ctrl-Z, a debugger left attached) while the others wait for it is the culprit,
  named with its state, live, by the watchdog.
"""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import EXAMPLE, PY, TRACE, kill_group, trace_env


def _start(run: Path, *extra: str, steps: int = 100000) -> subprocess.Popen:
    return subprocess.Popen(TRACE + ["run", "-o", str(run), *extra, "--", PY, str(EXAMPLE), "--world", "2",
                                     "--steps", str(steps), "--timeout", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=trace_env(),
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _rank_pids(run: Path, n: int, timeout: float = 90) -> dict[int, int]:
    """The ranks' pids: each ring is named by its writer's pid and its identity records carry the rank."""
    from ranktrace.tracer.formats.ringreader import read_ring

    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = {}
        for ring in run.glob("*/rings/*.ring"):
            try:
                rc = read_ring(str(ring))
            except Exception:  # noqa: BLE001 - a ring being created: the next look reads it
                continue
            rank = next((m["rank"] for m in rc.meta if m.get("type") == "identity" and isinstance(m.get("rank"), int)),
                        None)
            if rank is not None and ring.stem.isdigit():
                pids[rank] = int(ring.stem)
        if len(pids) >= n:
            return pids
        time.sleep(0.5)
    raise AssertionError(f"ranks did not start in {timeout} s")


def test_a_healthy_job_stopped_from_outside_is_stopped_and_blames_nobody(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(run)
    try:
        _rank_pids(run, 2)
        time.sleep(6)                          # the job runs steps: healthy, in and out of all_reduce
        os.killpg(proc.pid, signal.SIGTERM)    # a scheduler's stop reaches every process of the job
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    v = json.loads((run / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("stopped", "no_hang", []), v["summary"]
    assert "stopped from outside" in v["summary"]
    assert "STOPPED · no_hang" in err and "CRASHED" not in err


def test_a_rank_stopped_with_sigstop_is_named_live_as_the_culprit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(run, "--hang-after", "5", "--on-hang", "kill")
    try:
        pids = _rank_pids(run, 2)
        time.sleep(2)
        os.kill(pids[1], signal.SIGSTOP)
        out, err = proc.communicate(timeout=150)
    finally:
        kill_group(proc)
    assert proc.returncode == 3, err[-3000:]            # --on-hang kill: the watchdog saw the hang and ended it
    v = json.loads((run / "verdict.json").read_text())
    assert v["status"] == "hang" and v["culprit_ranks"] == [1], v["summary"]
    assert v["ranks"]["1"]["state"] == "stopped", v["ranks"]["1"]
    assert v["ranks"]["1"]["blocked"] == "stopped" and "at least" in v["ranks"]["1"]["blocked_detail"]  # since when
    # since when it is stopped, whichever finding leads: the host-wait one ("is stopped ... (for 6 s at least)") when
    # rank 1 stopped inside its all_reduce, the wait-for one ("... never issued it; rank 1 is in train_step ...,
    # stopped ...: it runs nothing, for 16 s at least.") when it stopped between two
    assert re.search(r"for \d+ s at least", v["summary"]), v["summary"]
    assert "stopped" in v["summary"] and "rank 0" in v["summary"].lower()
