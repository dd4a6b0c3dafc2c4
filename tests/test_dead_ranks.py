"""Dead ranks in a verdict (issue #16): a rank whose process ended is "exited", with its exit code named, never
"running" with a stack sampled long before (the watchdog's start-up samples: an 80-line importlib tree)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import PY, SCRIPTS, run_trace, trace_env


def test_dead_ranks_are_exited_with_their_exit_code_and_no_stale_stack(tmp_path: Path):
    run_dir = tmp_path / "run"
    res = run_trace(["run", "-o", str(run_dir), "--hang-after", "60", "--", PY, str(SCRIPTS / "dead_rank_job.py")],
                    env=trace_env(RANKTRACE_STACK_EVERY="1"), timeout=240)
    assert res.returncode == 1, res.stderr[-3000:]
    v = json.loads((run_dir / "verdict.json").read_text())
    ranks = v["ranks"]
    assert sorted(ranks) == ["0", "1", "2", "3"]
    for r, s in ranks.items():
        # a sample taken before a rank's last record is history (the watchdog's start-up samples: importlib); one
        # taken while ranks 0-2 sat in their all_reduce, before they were torn down, is where they were
        shown = " ".join(s["stack"])
        assert "importlib" not in shown and "<frozen" not in shown, (r, s["stack"])
        assert not shown or (r != "3" and "all_reduce" in shown), (r, s["stack"])
    assert ranks["3"]["state"] == "exited" and "exit code 7" in (ranks["3"].get("exit") or ""), ranks["3"]
    # mp.spawn's parent ended ranks 0-2 with SIGTERM inside their all_reduce once rank 3 was gone: no exit record
    for r in "012":
        assert ranks[r]["state"] in ("exited", "in_collective") and ranks[r]["state"] != "running", ranks[r]
        assert "no exit record" in (ranks[r].get("exit") or "") or "exit code" in (ranks[r].get("exit") or "")
    assert "exit code 7" in v["summary"], v["summary"]
    assert "importlib" not in v.get("stack_tree", "")
