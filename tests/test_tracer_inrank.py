"""In-rank behaviour that must not change the job: fork, os._exit call forms (real processes, 1-rank gloo)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from analyzers.readers import ranktrace_ring
from tests.helpers import PY, REPO, SCRIPTS, trace_env


def test_forked_child_records_its_own_ops_and_os_exit_keyword_form_passes(tmp_path: Path):
    host = tmp_path / "host"
    (host / "rings").mkdir(parents=True)
    env = trace_env(RANKTRACE_DIR=str(host), PYTHONPATH=str(REPO / "tracer" / "_inject"))
    res = subprocess.run([PY, str(SCRIPTS / "fork_child_ops.py")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 11, res.stderr[-2000:]  # os._exit(status=11) went through unchanged
    assert "[ranktrace]" not in res.stderr
    rings = sorted((host / "rings").glob("*.ring"))
    assert len(rings) == 2  # the child writes its own ring
    names = {}
    for ring in rings:
        ev = ranktrace_ring.read(ring).events
        ops = [r["name"] for r in ev.to_pylist() if r["kind"] == "enter" and r["category"] == "collective"]
        names[ring.name] = ops
        marks = [r["detail"] for r in ev.to_pylist() if r["name"] == "process_exit"]
        assert marks, ring  # both processes left an exit record
    assert all(ops == ["all_reduce", "broadcast"] for ops in names.values()), names
