"""torchelastic's event records (``torchrun --event-log-handler console``, or a handler that writes them to a file):
one JSON object per line, ``torchelastic.worker.status.<STATE>``, written by the agent when a run ends. A worker's
FAILED record names its global rank, exit code and pid; SUCCEEDED says the group finished. The agent's own records
(source AGENT) say nothing about a worker: the agent records SUCCEEDED for its own call even when a worker failed.

The runs here are real torchrun runs of torch 2.13; the cut three-record file is from pytorch/pytorch#60716."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import catalogue, torch_elastic
from ranktrace.analyzers.readers.text import open_text
from tests.readers.shared_reader_checks import REPO, check_contract, rows

THREAD_FILE = REPO / "tests" / "data" / "false_alarm" / "pytorch-60716-succeeded" / "events.jsonl"

JOB = """
import os, sys, time
if int(os.environ["RANK"]) == 1 and sys.argv[1] == "fail":
    time.sleep(1)
    sys.exit(3)
time.sleep(30 if sys.argv[1] == "fail" else 0.2)
"""


def _torchrun_events(tmp_path: Path, mode: str) -> tuple[Path, str]:
    """A real 2-worker torchrun with the console event handler; returns (a file of its event lines, its console)."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKTRACE", "PYTHONPATH"))}
    got = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "--event-log-handler", "console", str(job), mode], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    console = got.stdout + got.stderr
    events = [ln for ln in console.splitlines() if ln.startswith('{"name": "torchelastic.worker.status.')]
    assert events, console[-2000:]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(events) + "\n")
    return path, console


def _rows(path: Path) -> list[dict]:
    doc = open_text(path)
    assert "torch_elastic" in catalogue.scan(doc).families
    res = torch_elastic.read_doc(doc)
    check_contract(res, "torch_elastic", "torch_elastic", path)
    return rows(res.observations)


def test_a_failed_worker_record_names_its_rank_code_and_pid(tmp_path: Path) -> None:
    path, console = _torchrun_events(tmp_path, "fail")
    exits = {r["rank"]: r for r in _rows(path) if r["kind"] == "rank_exit"}
    assert set(exits) == {0, 1}
    assert (exits[1]["name"], exits[1]["value"]) == ("exit", 3)
    assert f"pid={exits[1]['pid']}" in console or f"(pid: {exits[1]['pid']})" in console
    assert (exits[0]["name"], exits[0]["value"]) == ("signal", 15)    # the agent's SIGTERM after rank 1 failed
    # the agent's own SUCCEEDED record (its call returned) is not the job's completion
    assert not [r for r in _rows(path) if r["kind"] == "completion"]


def test_the_events_alone_blame_the_worker_that_failed(tmp_path: Path) -> None:
    path, _ = _torchrun_events(tmp_path, "fail")
    v = api.analyze([path], liveness=None).verdict.to_dict()
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("crashed", "rank_exited", [1])


def test_a_finished_run_s_records_are_completion(tmp_path: Path) -> None:
    path, _ = _torchrun_events(tmp_path, "ok")
    assert [r["kind"] for r in _rows(path) if r["kind"] == "completion"] == ["completion"]
    v = api.analyze([path], liveness=None).verdict.to_dict()
    assert (v["status"], v["culprit_ranks"]) == ("completed", [])
    assert "none is pending" in v["summary"]


def test_the_threads_cut_records_of_a_64_worker_run_read_as_finished() -> None:
    # pytorch/pytorch#60716: three SUCCEEDED worker records as posted, the third cut mid-record
    v = api.analyze([THREAD_FILE], liveness=None).verdict.to_dict()
    assert (v["status"], v["culprit_ranks"]) == ("completed", [])
