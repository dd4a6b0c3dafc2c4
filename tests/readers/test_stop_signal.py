"""stop_signal reads a stop from outside in what people post: Slurm's cancel of a step at its time limit
(desitarget#628, as posted) and vLLM's own "received signal=SIGTERM" shutdown line (a served-then-stopped vLLM log
from a public repository, tests/data/false_alarm/dgxspark-vllm-int4-sigterm-enginedead)."""
from __future__ import annotations

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import stop_signal
from ranktrace.analyzers.readers.text import open_text
from tests.helpers import REPO

FA = REPO / "tests" / "data" / "false_alarm"


def test_slurm_time_limit_cancel_is_a_stop_and_blames_nobody() -> None:
    log = FA / "desitarget-628-slurm-timelimit" / "srun.log"
    (row,) = stop_signal.read_doc(open_text(log)).observations.to_pylist()
    assert (row["kind"], row["name"], row["line"]) == ("stopped", "scheduler_cancel", 3)
    assert "DUE TO TIME LIMIT" in row["detail"]
    v = api.analyze([log], liveness=None).verdict
    assert (v.status, v.kind, v.culprit_ranks) == ("stopped", "no_hang", ())


def test_vllm_says_it_received_sigterm() -> None:
    log = FA / "dgxspark-vllm-int4-sigterm-enginedead" / "vllm-int4.log"
    rows = stop_signal.read_doc(open_text(log)).observations.to_pylist()
    assert [(r["name"], r["value"]) for r in rows][:1] == [("signal", 15)]
    assert "trigger received signal=SIGTERM" in rows[0]["detail"]
