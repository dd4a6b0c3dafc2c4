"""`trace attach` on an mp.spawn job started without ranktrace (issue #16): multiprocessing's own helper processes
(the resource tracker) are no ranks, and ranks read from process order are said to be inferred."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import EXAMPLE, PY, REPO, TRACE, trace_env


def _kill_tree(root: int) -> None:
    from ranktrace.tracer.launch.attach import descendants

    for pid in reversed(descendants([root])):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_attach_to_an_mp_spawn_job_counts_only_its_ranks_and_says_they_are_inferred(tmp_path: Path):
    """The resource_tracker, a child of the main process like the 4 ranks, was counted as rank 0 (5 "ranks",
    wrong culprits), and nothing said the ranks came from sibling order."""
    env = {k: v for k, v in trace_env().items() if not k.startswith("RANKTRACE")}
    job = subprocess.Popen([PY, str(EXAMPLE), "--world", "4", "--steps", "6", "--fault", "skip", "--timeout", "300",
                            "--hang-seconds", "300"], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from ranktrace.tracer.launch.attach import descendants

        end = time.monotonic() + 90
        while time.monotonic() < end:
            cmds = [open(f"/proc/{p}/cmdline", "rb").read() for p in descendants([job.pid])]
            if sum(b"spawn_main" in c for c in cmds) == 4 and any(b"resource_tracker" in c for c in cmds):
                break
            time.sleep(0.5)
        time.sleep(12)  # ranks 0-2 inside all_reduce seq 5, rank 3 in its data loader
        res = subprocess.run(TRACE + ["attach", "--json", "-o", str(tmp_path), str(job.pid)], capture_output=True,
                             text=True, env=env, cwd=REPO, timeout=180)
    finally:
        _kill_tree(job.pid)
        job.wait()
    v = json.loads(res.stdout)
    assert sorted(v["ranks"]) == ["0", "1", "2", "3"], sorted(v["ranks"])
    assert v["culprit_ranks"] == [3] and v["waiting_ranks"] == [0, 1, 2], v["summary"]
    meta = json.loads(next(tmp_path.glob("*/*/meta.json")).read_text())
    ranked = sorted(i["rank"] for i in meta["pids"].values() if i["rank"] is not None)
    assert ranked == [0, 1, 2, 3]
    helpers = [i for i in meta["pids"].values() if i.get("role") == "multiprocessing helper"]
    assert len(helpers) == 1 and helpers[0]["rank"] is None
    inferred = [f for f in v["findings"] if f["kind"] == "ranks_inferred"]
    assert inferred and "0-3" in inferred[0]["summary"], [f["kind"] for f in v["findings"]]
    assert "inferred" in res.stderr
