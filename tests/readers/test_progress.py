"""analyzers/readers/progress on the progress bars and step counters of the field corpus and inline lines."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import catalogue, progress
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import Line, LinePrefix, TextDoc, open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map

FIELD = REPO / "tests" / "field"


def _read(path: Path) -> progress.ReadResult:
    doc = open_text(path)
    assert "progress" in catalogue.scan(doc).families
    res = progress.read_doc(doc)
    check_contract(res, "progress", "progress", path)
    assert set(res.observations.column("kind").to_pylist()) <= {"progress", "completion"}
    return res


def _got(res) -> list[tuple]:
    return [(r["rank"], r["name"], r["value"], r["line"]) for r in res.observations.to_pylist()
            if r["kind"] == "progress"]


@pytest.mark.parametrize("rel, expected", [
    # torchtitan's last lines: "Training completed", then "Process group destroyed"
    ("torchtitan-pr3393/train.log", [(0, "training_done", 9), (0, "exit_ok", 11)]),
    # torch's exit warning: the process ended without destroy_process_group, i.e. it ended
    ("dmlcloud-61/warning.txt", [(0, "exit_ok", 1)]),
])
def test_a_job_saying_it_ended_is_read_as_completion(rel: str, expected: list[tuple]) -> None:
    res = progress.read_doc(open_text(FIELD / rel))
    assert [(r["rank"], r["name"], r["line"]) for r in res.observations.to_pylist()
            if r["kind"] == "completion"] == expected


def test_an_ending_followed_by_more_output_is_not_completion(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 10/10\nTraining completed\n" + "".join(f"eval batch {i}\n" for i in range(8)))
    res = progress.read_doc(open_text(log))
    assert "completion" not in res.observations.column("kind").to_pylist()


def test_declared_mapping() -> None:
    check_field_map(progress)


@pytest.mark.parametrize("rel,expected", [
    # one rank still tokenizing (9 %, 4 h left) while the others' watchdogs fire: the furthest bar is kept
    ("llamafactory-2424/log.txt", [(None, "tokenizer", 280000, 1)]),
    ("nanotron-204/log.txt", [(None, "dataset_map", 726000, 1)]),          # [default0]: is a local rank
    ("horovod-364/output.txt", [(None, "train_epoch", 366, 1)]),
    ("torchtitan-pr3393/train.log", [(0, "step", 50, 5)]),
    ("returnn-1484/log.txt", [(None, "step", 178, 13)]),
    ("sglang-pr-11275/hang.log", [(None, "cuda_graph_capture", 0, 3)]),
    ("vllm-9920/stall.log", [(None, "prompts", 0, 6)]),
])
def test_field_progress(rel: str, expected: list[tuple]) -> None:
    assert _got(_read(FIELD / rel)) == expected


def test_tokenizer_detail_says_how_far() -> None:
    (row,) = _read(FIELD / "llamafactory-2424" / "log.txt").observations.to_pylist()
    assert row["detail"].startswith("280000/2969526 Running tokenizer on dataset:   9%")


def test_ranked_bars_and_counters() -> None:
    text = ("[rank0]:Loading checkpoint shards:  50%|█████     | 1/2 [00:05<00:05,  5.2s/it]\n"
            "[rank1]:Loading checkpoint shards: 100%|██████████| 2/2 [00:09<00:00,  4.6s/it]\n"
            "[rank0]: iteration      100/  500000 | consumed samples: 800 | elapsed time per iteration (ms): 512.3\n"
            "[rank0]:Epoch 3/10, step 120/1000, loss 2.31\n"
            "# nThread 1 nGpus 2 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5\n")
    res = progress.read_doc(text_of_bytes("t.log", text.encode()))
    assert _got(res) == [(0, "load", 1, 1), (1, "load", 2, 2), (0, "epoch", 3, 4), (0, "step", 120, 4)]


def test_no_progress() -> None:
    with pytest.raises(ReaderError):
        progress.read_doc(text_of_bytes("x.log", b"50% done\nsteps: many\nstep: 2(factor)\n"))


def test_one_megabyte_line_takes_milliseconds() -> None:
    line = "step 7 " + "a: 1%|" + "█" * 300_000 + "| 1/2 " + "step " * 100_000 + "9%|x" * 50_000
    doc = TextDoc("big.log", [Line(1, line, LinePrefix(), "")])
    t = time.perf_counter()
    catalogue.scan(doc)
    res = progress.read_doc(doc)
    assert time.perf_counter() - t < 0.5
    assert _got(res) == [(None, "step", 7, 1)]
