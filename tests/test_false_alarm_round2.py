"""Round 2 of the false alarms (issue #25): what later progress, completion and a Ctrl-C may overrule, and what not.

The healthy side is tests/test_false_alarms.py over the corpus (holdout2 included). This file holds the other side,
real runs of real hangs in tests/data/false_alarm_counterparts/<case>/ (case.json: the command, truth "hang", why):
two py-spy dumps of a hang with every rank where it was, faulthandler's timeout dumps of a hang with no progress
after them, then stopped by `timeout`, by a Ctrl-C, or captured while it lasted. Each must stay a hang. And on the
very files the fixes are about, the same stacks without what came after them must be a hang again: it is the
progress or the completion after a stack that clears it, never the stack being seen twice or the job stopped.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO

DATA = REPO / "tests" / "data"
COUNTERPARTS = DATA / "false_alarm_counterparts"
CORPUS = DATA / "false_alarm"
CASES = sorted(p.parent for p in COUNTERPARTS.glob("*/case.json"))


def _verdict(paths: list[Path]) -> dict:
    return api.analyze(paths, liveness=None).verdict.to_dict()


def _said(v: dict) -> str:
    return f"{v['status']}/{v['kind']} culprits {v.get('culprit_ranks')}: {v['summary'][:160]}"


def test_the_counterparts_are_there() -> None:
    assert len(CASES) >= 5
    for d in CASES:
        case = json.loads((d / "case.json").read_text())
        assert case["truth"] == "hang" and case.get("source") and case.get("why"), d.name


@pytest.mark.parametrize("case_dir", CASES, ids=[d.name for d in CASES])
def test_a_real_hang_stays_a_hang(case_dir: Path) -> None:
    """Stacks of a hang with nothing moving after them are a hang, whether the job was then stopped or not."""
    case = json.loads((case_dir / "case.json").read_text())
    v = _verdict([case_dir / f for f in case["files"]])
    assert v["status"] == "hang", f"{case_dir.name}: {_said(v)} ({case['why']})"


def _finding_kinds(v: dict) -> set[str]:
    return {f["kind"] for f in v.get("findings", ())}


def _lines(p: Path) -> list[str]:
    return p.read_text().splitlines(keepends=True)


def test_dumps_of_a_healthy_job_without_what_followed_are_a_hang(tmp_path: Path) -> None:
    """Four ranks dumped twice by faulthandler, every one in all_reduce both times: a healthy job (the step lines
    after the dumps say so: no hang, the finding says why), but the same console cut right after the second dump is a hang."""
    src = CORPUS / "own2-fh-usr1-torchrun-w4-nosleep" / "console.txt"
    whole = _verdict([src])
    assert whole["status"] not in ("hang", "crashed") and not whole["culprit_ranks"], _said(whole)
    assert "progress_after_dump" in _finding_kinds(whole), _said(whole)
    lines = _lines(src)
    last_dump = max(i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "') and "job.py" in ln)
    cut = tmp_path / "console.txt"
    cut.write_text("".join(lines[:last_dump + 1]))
    v = _verdict([cut])
    assert v["status"] == "hang", f"the dumps with nothing after them: {_said(v)}"


def test_a_timer_dump_then_progress_is_no_hang_but_without_the_progress_it_is(tmp_path: Path) -> None:
    """faulthandler's 'Timeout (0:00:05)!' (dump_traceback_later) mid-run, then progress to the end: no hang (the
    finding says the output went on after the dump; 'done: all steps finished' is not a line the readers know); the
    same console up to the dump only: a hang."""
    src = CORPUS / "own2-fh-once-torchrun-w2-finished" / "console.txt"
    whole = _verdict([src])
    assert whole["status"] not in ("hang", "crashed") and not whole["culprit_ranks"], _said(whole)
    assert "progress_after_dump" in _finding_kinds(whole), _said(whole)
    lines = _lines(src)
    last_dump = max(i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "'))
    cut = tmp_path / "console.txt"
    cut.write_text("".join(lines[:last_dump + 1]))
    v = _verdict([cut])
    assert v["status"] == "hang", _said(v)


def test_two_py_spy_dumps_count_only_when_something_moved(tmp_path: Path) -> None:
    """Two py-spy dumps of a healthy job whose local step counters advance (58 -> 95/96) are no hang; the first dump
    given twice (the same frames and the same step in both: nothing moved) is read as the hang it looks like."""
    case = CORPUS / "own-pyspy-two-dumps-progress"
    v = _verdict([case / "pyspy_dump_1.txt", case / "pyspy_dump_2.txt"])
    assert v["status"] not in ("hang", "crashed") and not v["culprit_ranks"], _said(v)
    a, b = tmp_path / "pyspy_dump_1.txt", tmp_path / "pyspy_dump_2.txt"
    shutil.copy(case / "pyspy_dump_1.txt", a)
    shutil.copy(case / "pyspy_dump_1.txt", b)
    v = _verdict([a, b])
    assert v["status"] == "hang", f"the same dump twice: {_said(v)}"


def test_a_launchers_ctrl_c_is_a_stop_but_not_after_a_hang_was_dumped(tmp_path: Path) -> None:
    """Only the spawn launcher's KeyboardInterrupt traceback: interrupted, nobody blamed. The same traceback after
    faulthandler's dumps of a hang (no progress between): the hang stays."""
    ctrl_c = CORPUS / "own-tpjob-plain-ctrlc-console" / "console.txt"
    v = _verdict([ctrl_c])
    assert v["status"] == "interrupted" and not v["culprit_ranks"], _said(v)
    hung = COUNTERPARTS / "tp-fh-later-hang-w2-console-only" / "console.txt"
    both = tmp_path / "console.txt"
    both.write_text(hung.read_text() + ctrl_c.read_text())
    v = _verdict([both])
    assert v["status"] == "hang", f"a hang dumped, then a Ctrl-C: {_said(v)}"


def test_a_stop_after_a_dump_and_progress_is_a_clean_stop() -> None:
    """A faulthandler dump mid-run, step lines after it, then `timeout`'s SIGTERM: stopped, nobody blamed; the
    counterpart with no step line between the dump and the SIGTERM is the hang (test_a_real_hang_stays_a_hang)."""
    v = _verdict([CORPUS / "own2-fh-usr1-torchrun-w2-then-timeout" / "console.txt"])
    assert v["status"] == "stopped" and not v["culprit_ranks"], _said(v)
    v = _verdict([COUNTERPARTS / "tp-fh-later-hang-then-timeout-w2" / "console.txt"])
    assert v["status"] == "hang", _said(v)


def test_dumps_of_a_hang_name_where_the_job_is_not_its_helpers() -> None:
    """Two py-spy dumps of a whole session: the launcher waiting in spawn's join and multiprocessing's resource
    tracker are in every dump, but they are never what the ranks wait for. The stalled rank's place (the data
    loader) is what the verdict points at; ranks in different collectives are said to be so."""
    skip = COUNTERPARTS / "tp-pyspy-two-dumps-skip-w3"
    v = _verdict([skip / "pyspy_dump_1.txt", skip / "pyspy_dump_2.txt"])
    assert v["status"] == "hang" and "next_batch" in v["summary"], _said(v)
    assert "resource_tracker" not in v["summary"] and "spawn.py" not in v["summary"], _said(v)
    mismatch = COUNTERPARTS / "tp-pyspy-two-dumps-mismatch-w2"
    v = _verdict([mismatch / "pyspy_dump_1.txt", mismatch / "pyspy_dump_2.txt"])
    assert v["status"] == "hang" and v["kind"] == "collective_mismatch", _said(v)
    assert "broadcast" in v["summary"] and "all_reduce" in v["summary"], _said(v)
