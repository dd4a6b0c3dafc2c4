"""The same evidence, posted the ways people's tools post it: a file keeps its verdict whether it comes quoted in an
e-mail or a ticket (``> ``), indented as a Markdown code block, behind a log collector's time stamp
(``2024-05-01 12:00:00,123 INFO ``, kubectl's ``--timestamps``), behind ``kubectl logs --prefix``
(``[pod/trainer-0/main] ``) or journald's ``May 01 12:00:00 node python[42]: ``, or from one srun task (``0: `` in
front of every line of a node's launcher, which names no rank).

Real cases of the field corpus (tests/field), each one whose verdict the files alone give, one per family, are
re-posted with each decoration and must give the verdict the plain file gives.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from ranktrace.analyzers import api
from ranktrace.analyzers.readers.text.opener import text_of_bytes
from ranktrace.analyzers.readers.text.prefixes import split_prefixes
from tests.helpers import REPO

FIELD = REPO / "tests" / "field"

# one right-from-the-files case per family: watchdog, traceback, nccl_log, elastic, horovod, server log, py-spy,
# debug-mismatch, nccl-tests, store timeout
CASES = ["accelerate-314", "sglang-4096", "hami-2641", "rlhfv-11", "horovod-364", "vllm-17676", "msswift-pr9443",
         "nccltests-117", "yolov5-4409", "llamafactory-2424"]


def _each_line(prefix: Callable[[int], str]) -> Callable[[str], str]:
    return lambda text: "\n".join(prefix(i) + ln if ln.strip() else ln for i, ln in enumerate(text.split("\n")))


STYLES: dict[str, Callable[[str], str]] = {
    "quoted": lambda text: "\n".join("> " + ln for ln in text.split("\n")),
    "python logging": _each_line(lambda i: f"2024-05-01 12:00:{i % 60:02d},123 INFO "),
    "kubectl --timestamps": _each_line(lambda i: f"2024-05-01T12:00:{i % 60:02d}.123456789Z "),
    "kubectl --prefix": _each_line(lambda i: "[pod/trainer-0/pytorch] "),
    "journald": _each_line(lambda i: f"May 01 12:00:{i % 60:02d} gpu-node-3 python[4242]: "),
    "markdown code block": _each_line(lambda i: "    "),
}


def _gist(files: list[Path]) -> tuple:
    v = api.analyze(files, liveness=None).verdict.to_dict()
    return v["status"], v["kind"], (v["operation"] or {}).get("name"), v["culprit_ranks"]


@pytest.mark.parametrize("case", CASES)
def test_a_case_keeps_its_verdict_however_it_was_posted(case: str, tmp_path: Path):
    meta = json.loads((FIELD / case / "case.json").read_text())
    plain = _gist([FIELD / case / f for f in meta["files"]])
    assert plain[0] != "inconclusive", plain  # the files alone give a verdict
    for style, decorate in STYLES.items():
        out = tmp_path / style.replace(" ", "_")
        files = []
        for f in meta["files"]:
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            (out / f).write_text(decorate((FIELD / case / f).read_text(encoding="utf-8")), encoding="utf-8")
            files.append(out / f)
        assert _gist(files) == plain, (case, style)


def test_one_srun_task_in_front_of_every_line_names_no_rank():
    """`srun -l` around a launcher: every line says task 0, the ranks are inside (`0: [rank3]:`, or none at all).
    With several tasks, each task is a rank; a message's own ``6: [...]`` behind the task prefix stays."""
    one = text_of_bytes("node0.log", b"0: step 10 loss 1.0\n0: step 11 loss 0.9\n0: Stalled ranks:\n"
                                     b"0: 6: [horovod_allreduce.0]\n")
    assert [ln.rank for ln in one.lines] == [None, None, None, None]
    assert one.lines[3].text == "6: [horovod_allreduce.0]"
    many = text_of_bytes("job.log", b"0: step 10\n1: step 10\n2: step 9\n")
    assert [ln.rank for ln in many.lines] == [0, 1, 2]


@pytest.mark.parametrize("line, rank, message", [
    ("2024-05-01 12:00:00,123 INFO [rank3]:[E ProcessGroupNCCL.cpp:1] x", 3, "[E ProcessGroupNCCL.cpp:1] x"),
    ("2024-05-01T12:00:00.123456789Z     wait (threading.py:302)", None, "    wait (threading.py:302)"),
    ("2024-05-01 12:00:00,123 - root - WARNING - [rank1]:hello", 1, "hello"),
    ("[pod/job-worker-3/pytorch] [rank5]:Traceback (most recent call last):", 5, "Traceback (most recent call last):"),
    # a bracketed stamp is the message's own (NCCL_DEBUG_TIMESTAMP_FORMAT, SGLang): kept for its reader
    ("[2024-05-01 12:00:00] node1:12:34 [0] NCCL INFO x", None, "[2024-05-01 12:00:00] node1:12:34 [0] NCCL INFO x"),
    ("2024-05-01 12:00:00", None, "2024-05-01 12:00:00"),  # a stamp alone is no prefix of anything
    ("May 01 12:00:00 gpu-node-3 python[4242]: [rank2]:[E ProcessGroupNCCL.cpp:1] x", 2,
     "[E ProcessGroupNCCL.cpp:1] x"),
])
def test_collector_prefixes_come_off_and_the_message_indentation_stays(line: str, rank: int | None, message: str):
    prefix, rest = split_prefixes(line)
    assert (prefix.rank, rest) == (rank, message)


def test_journald_names_the_host_and_the_process():
    prefix, _ = split_prefixes("May 01 12:00:00 gpu-node-3 python[4242]: hello")
    assert (prefix.host, prefix.pid) == ("gpu-node-3", 4242)
