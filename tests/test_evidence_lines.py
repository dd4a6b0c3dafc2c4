"""Evidence is never cut silently and never loses the culprit's lines (issue #27).

tests/data/verdicts/tp_job_world8_skip.json is the verdict.json of a real run (`trace run --hang-after 5 --on-hang
kill -- python examples/tp_job.py --world 8 --fault skip --timeout 300`, run folder renamed): rank 7 skips seq 5;
its missing_ranks finding has one line per waiting rank (0-6) and then rank 7's stack and last op — the two lines
a cut at six dropped.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from ranktrace.analyzers.report.evidence import LIMIT, evidence_lines
from ranktrace.analyzers.report.text_report import render
from ranktrace.analyzers.verdict import Evidence, Verdict

VERDICT = Path(__file__).parent / "data" / "verdicts" / "tp_job_world8_skip.json"


def _verdict() -> Verdict:
    return Verdict.from_dict(json.loads(VERDICT.read_text()))


def _evidence_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("evidence:")
    end = lines.index("next steps:")
    return lines[start + 1:end]


def test_at_8_ranks_the_culprits_stack_and_last_op_are_shown_and_the_waiting_ranks_said_once():
    v = _verdict()
    assert v.culprit_ranks == (7,) and len(v.findings[0].evidence) == 9
    block = _evidence_block(render(v, width=None))
    assert block[0].startswith("- [missing_ranks] ranks 0-6 are waiting in all_reduce")
    assert re.fullmatch(r"    ranks 0-6: all_reduce group=0 seq=5 at .*tp_job\.py:\d+ train_step: issued, not "
                        r"completed; waits on rank 7 \[events rings/\d+\.ring:\d+ and 6 more\]", block[1]), block[1]
    assert block[2].startswith("    rank 7: blocked outside communication: thread MainThread in Condition.wait")
    assert "next_batch (tp_job.py:" in block[2] and "[pyspy " in block[2]
    assert block[3].startswith("    rank 7: its last op on group 0 was all_reduce seq 4")
    assert not any("more evidence line" in ln for ln in block)   # nothing left out: nothing said
    # at 80 columns every line fits (rich wraps; nothing runs past the terminal)
    assert max(len(ln) for ln in render(v, width=80).splitlines()) <= 80


def test_past_the_limit_the_count_left_out_is_said_and_the_culprits_lines_stay():
    v = _verdict()
    f = v.findings[0]
    waiting = [e for e in f.evidence if e.rank != 7]
    culprit = [e for e in f.evidence if e.rank == 7]
    # each waiting rank says something of its own (as at different seqs): no line merges with another
    distinct = tuple(replace(e, detail=f"{e.detail} (as rank {e.rank} saw it)") for e in waiting)
    many = replace(v, findings=(replace(f, evidence=distinct + tuple(culprit)),) + v.findings[1:])
    shown, left = evidence_lines(many.findings[0], many.culprit_ranks)
    assert len(shown) == LIMIT and left == 9 - LIMIT
    assert [ln.ranks for ln in shown][-2:] == [(7,), (7,)]           # the culprit's two lines, never the cut ones
    assert [ln.ranks[0] for ln in shown[:-2]] == [0, 1, 2, 3]         # then the others in the finding's order
    block = _evidence_block(render(many, width=None))
    assert block[-1] == "    ... and 3 more evidence lines (verdict.json has every one)"
    assert sum(ln.startswith("    rank 7: ") for ln in block) == 2


def test_a_culprit_with_more_lines_than_the_limit_keeps_them_all():
    v = _verdict()
    f = v.findings[0]
    lots = tuple(Evidence(source="pyspy", file=f"dump{i}.json", line=1, detail=f"thread T{i} in wait", rank=7)
                 for i in range(LIMIT + 2))
    shown, left = evidence_lines(replace(f, evidence=f.evidence + lots), v.culprit_ranks)
    assert sum(7 in ln.ranks for ln in shown) == 2 + LIMIT + 2 and left == 1  # only the waiting ranks' line goes
