"""A stop that reaches every process at once (a scheduler's SIGTERM to the whole session, a terminal's Ctrl-C):
the ranks die within milliseconds, and trace run stamps the stop when its own Python handler runs, a little
later. tests/data/runs/sigterm_broadcast_race is such a run, captured when tests/test_what_people_see.py's fixture
stopped its hung job: rank 3 (the culprit, parked in next_batch) has a process_exit mark 5.8 ms before trace run's
``stopped_wall_ns``. Its exit is the stop's doing; the verdict keeps the hang-time state."""
from __future__ import annotations

import json

import pyarrow.compute as pc

from ranktrace.analyzers import api
from ranktrace.analyzers.model.build import STOP_SLACK_NS
from tests.helpers import REPO

RUN = REPO / "tests" / "data" / "runs" / "sigterm_broadcast_race"


def test_an_exit_a_few_ms_before_the_recorded_stop_belongs_to_the_stop():
    meta = json.loads(next(RUN.glob("*/meta.json")).read_text())
    stopped = meta["exit"]["stopped_wall_ns"]
    an = api.analyze([RUN], liveness=None)
    marks = an.events.filter(pc.equal(an.events["name"], "process_exit")).to_pylist()
    assert [(m["rank"], 0 < stopped - m["wall_ns"] < STOP_SLACK_NS) for m in marks] == [(3, True)]  # the race
    v = an.verdict
    assert (v.kind, list(v.culprit_ranks), list(v.waiting_ranks)) == ("missing_ranks", [3], [0, 1, 2])
    assert "rank 3 is in next_batch" in v.summary and "exited" not in v.summary
