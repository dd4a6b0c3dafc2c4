"""A hang the watchdog reported live stays a hang when trace run is SIGKILLed afterwards (issue #31): meta.json
records the live report (hang_reported), so the analysis of the cut trace says the trace is incomplete *and* names
the hang — before, it re-analyzed as "not shown to hang"."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import EXAMPLE, PY, TRACE, host_dir, run_trace, trace_env


def test_a_hang_reported_live_survives_trace_run_being_killed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run), "--hang-after", "4", "--on-hang", "report", "--", PY,
                                     str(EXAMPLE), "--world", "2", "--fault", "skip", "--timeout", "300"],
                            env=trace_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        said = None
        while time.monotonic() < deadline and said is None:
            time.sleep(0.5)
            try:
                said = json.loads((host_dir(run) / "meta.json").read_text()).get("hang_reported")
            except (OSError, ValueError, AssertionError):
                pass
        assert said is not None and said["culprit_ranks"] == [1], said
        proc.send_signal(signal.SIGKILL)  # trace run dies; its guardian ends the job
        proc.wait(timeout=30)
        time.sleep(6)  # the guardian's SIGTERM, then SIGKILL after 5 s
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    got = run_trace(["analyze", str(run), "--json"], timeout=120)
    v = json.loads(got.stdout)
    # rank 1 (it skipped an all_reduce) may end on its own before or after the live report: either kind blames it
    assert v["status"] == "hang" and v["culprit_ranks"] == [1], v["summary"]
    assert v["kind"] in ("missing_ranks", "rank_exited") and said["kind"] in ("missing_ranks", "rank_exited")
    cut = next(f for f in v["findings"] if f["kind"] == "trace_incomplete")
    assert "reported the hang" in cut["summary"]
