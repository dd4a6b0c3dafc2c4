"""trace analyze on real gloo jobs captured with `trace run`: every verdict kind that can happen on a CPU.

Each scenario is one real 4-rank job of examples/tp_job.py with one planted fault. Gloo's timeout (4 s) turns the
hang into a crash, so the jobs end on their own and the verdict is `crashed` + the hang's kind (DESIGN §5).
All jobs run once, up front, two at a time, and every test reads the verdict it needs.
"""
from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, PY, TRACE, run_trace, trace_env

SCENARIOS = ["none", "skip", "tp-skip", "mismatch", "recv-deadlock", "nojoin", "die"]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, subprocess.CompletedProcess[str]]]:
    base = tmp_path_factory.mktemp("scenarios")

    def one(fault: str) -> tuple[str, tuple[dict, subprocess.CompletedProcess[str]]]:
        run_dir = base / fault
        # --keep-rings: the window test below also reads each run from its rings alone
        res = run_trace(["run", "--keep-rings", "-o", str(run_dir), "--", PY, str(EXAMPLE), "--world", "4", "--steps",
                         "6", "--fault", fault, "--timeout", "5", "--hang-seconds", "30"], timeout=180)
        return fault, (json.loads((run_dir / "verdict.json").read_text()), res)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, SCENARIOS))


def brief(v: dict) -> tuple:
    op = v["operation"] or {}
    return (v["status"], v["kind"], op.get("name"), op.get("seq"), v["culprit_ranks"], v["waiting_ranks"])


def test_rank_skips_an_all_reduce(verdicts):
    v, res = verdicts["skip"]
    assert res.returncode == 1  # the job's own status (mp.spawn after gloo timed out)
    assert brief(v) == ("crashed", "missing_ranks", "all_reduce", 5, [3], [0, 1, 2])
    assert v["operation"]["group_desc"] == "default_pg" and v["operation"]["group_ranks"] == [0, 1, 2, 3]
    assert "rank 3" in v["summary"].lower()
    edges = {e["rank"]: e["waits_on"] for e in v["wait_for"]}
    assert edges == {0: [3], 1: [3], 2: [3]}
    # the verdict is printed by trace run itself, after the job's own output, with where its page is
    assert "CRASHED · missing_ranks" in res.stderr
    assert "the verdict with a timeline of every rank: " in res.stderr and "report.html" in res.stderr


def test_tp_subgroup_skip_blames_rank_2_and_its_subgroup_op(verdicts):
    v, _ = verdicts["tp-skip"]
    # rank 2 skipped its TP all_reduce on {2,3}; everyone then met in a world all_reduce. Not rank 3, not the
    # world op.
    assert brief(v) == ("crashed", "missing_ranks", "all_reduce", 4, [2], [0, 1, 3])
    assert v["operation"]["group_ranks"] == [2, 3]
    # the TP group was made without a description: torch's placeholder "undefined" is not shown as one
    assert v["operation"]["group_desc"] is None and "undefined" not in v["summary"]
    cyc = [f for f in v["findings"] if f["kind"] == "wait_cycle"]
    assert cyc and cyc[0]["ranks"] == [2, 3]


def test_broadcast_vs_all_reduce_at_the_same_seq(verdicts):
    v, _ = verdicts["mismatch"]
    assert brief(v) == ("crashed", "collective_mismatch", "all_reduce", 5, [3], [0, 1, 2])
    assert "broadcast" in v["summary"]


def test_recv_recv_deadlock_names_the_pair(verdicts):
    v, _ = verdicts["recv-deadlock"]
    assert brief(v)[:4] == ("crashed", "wait_cycle", "recv", 1)  # the cycle itself is the finding (DESIGN §5)
    assert v["culprit_ranks"] == [0, 1] and v["waiting_ranks"] == [2, 3]
    assert all(f["confidence"] <= 0.5 for f in v["findings"] if f["kind"] == "wait_cycle")  # a tie


def test_rank_never_calls_init_process_group(verdicts):
    v, _ = verdicts["nojoin"]
    assert (v["status"], v["kind"], v["operation"]["name"], v["culprit_ranks"], v["waiting_ranks"]) == (
        "crashed", "init_hang", "init_process_group", [3], [0, 1, 2])


def test_rank_exits(verdicts):
    v, _ = verdicts["die"]
    assert brief(v) == ("crashed", "rank_exited", "all_reduce", 5, [3], [0, 1, 2])
    ev = [e for f in v["findings"] if f["kind"] == "rank_exited" for e in f["evidence"]]
    # either the others' calls failed because the peer went away, or rank 3 left an exit record first
    assert any(re.search(r"Connection (closed|reset) by peer|exited first", e["detail"]) for e in ev)


def test_every_finding_cites_evidence(verdicts):
    for fault, (v, _) in verdicts.items():
        for f in v["findings"]:
            assert f["evidence"], (fault, f)
            assert all(e["source"] for e in f["evidence"])


def test_clean_job_is_no_hang_and_exit_0(verdicts):
    v, res = verdicts["none"]
    assert res.returncode == 0
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("completed", "no_hang", [])
    again = subprocess.run(TRACE + ["analyze", v["inputs"][0]], capture_output=True, text=True, env=trace_env())
    assert again.returncode == 0 and again.stdout.startswith("COMPLETED · no_hang")


def test_compare_good_and_hung_runs_names_the_divergence(verdicts):
    good, hung = (Path(verdicts[k][0]["inputs"][0]).parent for k in ("none", "skip"))
    res = subprocess.run(TRACE + ["compare", "--json", str(good), str(hung)], capture_output=True, text=True,
                         env=trace_env())
    assert res.returncode == 0, res.stderr
    c = json.loads(res.stdout)
    assert c["schema"] == "ranktrace.compare/1"
    first = {d["rank"]: d for d in c["first_divergence"]}
    # rank 3 is where B (the hung run) first departs: A went on to all_reduce seq 5, B never issued it
    assert first[3]["position"] == min(d["position"] for d in c["first_divergence"])
    assert first[3]["a"].startswith("all_reduce default_pg seq 5") and first[3]["b"] is None
    assert (first[3]["a_op"]["op"], first[3]["a_op"]["seq"]) == ("all_reduce", 5)
    assert any(f["key"] == "command" and f["status"] == "differs" for f in c["context_diff"])
    assert (c["verdict_a"]["kind"], c["verdict_b"]["kind"]) == ("no_hang", "missing_ranks")
    text = subprocess.run(TRACE + ["compare", str(good), str(hung)], capture_output=True, text=True,
                          env=trace_env()).stdout
    assert "=> rank 3: A went on to all_reduce default_pg seq 5" in text


def test_all_ranks_blocked_in_a_queue_get(tmp_path: Path):
    """Nothing collective pending, every rank waits in queue.get: only live stacks can tell."""
    import time

    run_dir = tmp_path / "r"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run_dir), "--", PY, str(EXAMPLE), "--world", "2", "--fault",
                                     "queue", "--hang-seconds", "60"], env=trace_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        v: dict = {}
        while time.monotonic() < deadline:
            time.sleep(2)
            res = subprocess.run(TRACE + ["analyze", "--json", str(run_dir)], capture_output=True, text=True,
                                 env=trace_env())
            if res.stdout.startswith("{"):
                v = json.loads(res.stdout)
                if v["kind"] == "blocked_outside_collective" and len(v["culprit_ranks"]) == 2:
                    break
        assert (v["status"], v["kind"], v["culprit_ranks"]) == ("hang", "blocked_outside_collective", [0, 1])
        assert "wait_for_request" in v["summary"]
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_window_of_one_record_per_rank_changes_no_verdict(verdicts, monkeypatch):
    """Issue #19: at scale each rank's records are read through a window (its latest ones, and every op a rule reads
    whatever its age). Cut to one record a rank, every scenario's verdict is still the one from all records."""
    from ranktrace.analyzers import api
    from ranktrace.analyzers.inputs import own_records

    import shutil

    for fault, (v, _res) in verdicts.items():
        host_dir = Path(next(i for i in v["inputs"] if Path(i).is_dir()))
        assert (host_dir / own_records.INDEX_NAME).exists()  # finalize wrote events.arrow's index
        rings_only = host_dir.parent.with_name(host_dir.parent.name + "-rings") / host_dir.name
        if not rings_only.exists():
            shutil.copytree(host_dir, rings_only, ignore=shutil.ignore_patterns("*.sock", "events*.arrow"))
        for run in (host_dir.parent, rings_only.parent):  # events.arrow (through its index), and the rings
            monkeypatch.delenv(own_records.ROWS_ENV, raising=False)
            whole = api.analyze([run], liveness=None).verdict.to_dict()
            monkeypatch.setenv(own_records.ROWS_ENV, "1")
            assert api.analyze([run], liveness=None).verdict.to_dict() == whole, (fault, run)
