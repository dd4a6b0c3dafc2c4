"""Two files that disagree about one rank are said to disagree, naming both (issue #25, bad input): a person
posting two py-spy dumps of "rank 3" — one inside all_reduce, one in its data loader — learns that the inputs
conflict (dumps of different moments, or two processes given the same rank) instead of one silently winning."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers import api

_DUMP = """Process 101: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 101 (idle): "MainThread"
{frames}
"""
_IN_ALL_REDUCE = ("    all_reduce (torch/distributed/distributed_c10d.py:3252)\n    train_step (train.py:88)\n"
                  "    main (train.py:120)")
_IN_LOADER = "    get (queue.py:180)\n    next_batch (train.py:40)\n    main (train.py:118)"


def test_two_dumps_of_one_rank_that_disagree_are_both_named(tmp_path: Path) -> None:
    a, b = tmp_path / "rank3_dump_a.txt", tmp_path / "rank3_dump_b.txt"
    a.write_text(_DUMP.format(frames=_IN_ALL_REDUCE))
    b.write_text(_DUMP.format(frames=_IN_LOADER))
    v = api.analyze([a, b], liveness=None).verdict
    (f,) = [f for f in v.findings if f.kind == "inputs_disagree"]
    assert f.ranks == (3,) and str(a) in f.summary and str(b) in f.summary
    assert "train_step (train.py:88)" in f.summary and "next_batch (train.py:40)" in f.summary
    assert {e.file for e in f.evidence} == {str(a), str(b)}


def test_dumps_that_agree_say_nothing_of_the_kind(tmp_path: Path) -> None:
    a, b = tmp_path / "rank3_dump_a.txt", tmp_path / "rank3_dump_b.txt"
    a.write_text(_DUMP.format(frames=_IN_ALL_REDUCE))
    b.write_text(_DUMP.format(frames=_IN_ALL_REDUCE))
    v = api.analyze([a, b], liveness=None).verdict
    assert not [f for f in v.findings if f.kind == "inputs_disagree"]
