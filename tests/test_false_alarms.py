"""No alarm on a healthy or finished run (issue #25, invariant 2 and 3): `trace analyze` on every case of the
false-alarm corpus (tests/data/false_alarm/<case>/, each with case.json: where it comes from, its truth —
completed / no_hang / idle / stopped — and what in the files establishes it).

For every case: the verdict is neither hang nor crashed, and it names no culprit rank. A case that nothing in it is
recognised in (`trace analyze` exits 2) is not an alarm. The corpus and its scoring are bench/false_alarm_score.py's
(per case and per split, with "right" counts); this test only asserts the two must-nots.
"""
from __future__ import annotations

import sys

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from false_alarm_score import CORPUS, SPLITS, case_paths, load_cases  # noqa: E402

CASES = load_cases(CORPUS)

#: held-out cases (nobody tunes the analyzer on them) that still alarm: each is a known miss, said in the closing
#: notes with the holdout score; strict, so the day one passes this list must shrink
HOLDOUT_MISSES = {
    "own2-pyspy-dump-then-finished-torchrun-w3": "a py-spy dump and the run's console, which ends in 'done: all steps "
                                                 "finished': that line is not read as completion, and the two files "
                                                 "carry no common clock to put the progress after the dump",
}


def _param(case: dict) -> object:
    why = HOLDOUT_MISSES.get(case["id"])
    if why is None:
        return case
    assert case.get("split", "").startswith("holdout"), f"{case['id']}: only held-out cases may be known misses"
    return pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=f"holdout, known miss: {why}"))


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 45, f"{len(CASES)} cases in {CORPUS}"
    for case in CASES:
        assert case["truth"] in ("completed", "no_hang", "idle", "stopped"), case["id"]
        assert case.get("split") in SPLITS, case["id"]
        assert case.get("url") or case.get("source"), case["id"]
        assert case.get("why"), case["id"]


@pytest.mark.parametrize("case", [_param(c) for c in CASES], ids=[c["id"] for c in CASES])
def test_no_alarm_and_no_culprit_on_a_healthy_or_finished_run(case: dict) -> None:
    paths = case_paths(case)
    missing = [str(p) for p in paths if not p.exists()]
    assert not missing, f"case files missing (CI lays ../shared beside the clone): {missing}"
    try:
        v = api.analyze(paths, liveness=None).verdict.to_dict()
    except api.InputError:  # nothing recognised: exit 2, not an alarm
        return
    said = f"{v['status']}/{v['kind']}/{(v.get('operation') or {}).get('name')} culprits {v.get('culprit_ranks')}"
    assert v["status"] not in ("hang", "crashed"), f"{case['truth']} run read as {said}: {case['why']}"
    assert not v.get("culprit_ranks"), f"{case['truth']} run names culprits: {said}"
