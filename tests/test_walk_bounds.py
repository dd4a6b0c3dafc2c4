"""What a folder walk reads (issue #31): a link out of the folder given is not followed (its target was not among
the inputs: another user's file, /etc/shadow), and a rings/ subfolder — which makes a folder read as one of our host
dirs — never hides the logs a person put beside it."""
from __future__ import annotations

import shutil
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.inputs.collect import collect
from tests.helpers import REPO

FIELD = REPO / "tests" / "field"


def test_a_link_out_of_the_folder_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    case = tmp_path / "case"
    shutil.copytree(FIELD / "nccl-85", case)
    shutil.copy(case / "output.txt", outside / "private.log")  # a log the analysing user may read, not the case's
    (case / "linked.log").symlink_to(outside / "private.log")
    (case / "inner.log").symlink_to(case / "output.txt")  # a link inside the folder is fine
    got = collect([case])
    assert str(case / "linked.log") not in got.files
    assert any(s.file == str(case / "linked.log") and "not followed" in s.reason for s in got.skipped)
    v = api.analyze([case], liveness=None).verdict.to_dict()
    lines = [e for f in v["findings"] for e in f["evidence"] if e["file"] == str(case / "linked.log")]
    assert str(case / "linked.log") not in v["inputs"]
    assert all(e["line"] is None and "not followed" in e["detail"] for e in lines), lines  # only the skip is said
    direct = collect([case / "linked.log"])  # named on the command line: the user asked for it
    assert direct.files == [str(case / "linked.log")]


def test_logs_beside_a_rings_folder_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "copied-off-node"
    (folder / "rings").mkdir(parents=True)  # a folder with rings/ reads as a host dir of ours (its rings empty here)
    shutil.copy(next((FIELD / "nccl-85").glob("*.txt")), folder / "rank0.log")
    got = collect([folder])
    assert got.hosts and str(folder / "rank0.log") in got.files, (got.files, [s.reason for s in got.skipped])
