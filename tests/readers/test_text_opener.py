"""The shared opener's join of terminal-wrapped lines: real wraps joined, fixed-width records left alone."""
from __future__ import annotations

from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO

FIELD = REPO / "tests" / "field"


def test_fixed_width_table_rows_stay_rows() -> None:
    doc = open_text(FIELD / "tinygrad-ogkm-45-b" / "p2p_disabled.log")
    assert [ln.no for ln in doc.lines] == list(range(1, 13))


def test_same_length_log_records_stay_records() -> None:
    for path in (FIELD / "sglang-4417" / "startup.log", FIELD / "basicsr-737" / "log.txt",
                 FIELD / "pytorch-53395" / "nvidia-smi.txt"):
        doc = open_text(path)
        assert len(doc.lines) == sum(1 for s in path.read_text().splitlines() if s.strip()), path


def test_terminal_wrap_is_joined() -> None:
    long_lines = [
        "[rank0]:[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out",
        "[rank1]:[E ProcessGroupNCCL.cpp:1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600015 milliseconds before timing out",
    ]
    wrapped = [s[i:i + 80] for s in long_lines for i in range(0, len(s), 80)]
    doc = text_of_bytes("w.log", ("\n".join(wrapped) + "\n").encode())
    assert [ln.text for ln in doc.lines] == [s.split("]:", 1)[1] for s in long_lines]
    assert [ln.rank for ln in doc.lines] == [0, 1]


def test_lost_newlines_split_at_repeated_srun_prefix() -> None:
    # a paste that lost its newlines keeps each line's srun -l task prefix mid-line
    doc = open_text(FIELD / "awsomedistai-192" / "srun_output.txt")
    texts = [ln.text for ln in doc.lines]
    assert texts[0].startswith('File "') and texts[0].endswith("in broadcast")
    assert texts[1] == "work = default_pg.broadcast([tensor], opts)"
    assert all(ln.rank == 10 for ln in doc.lines[1:])
    # a label before a number ("GPU 0: ") is no task prefix, however often it recurs
    one = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1) GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-2) GPU 0: again here"
    assert len(text_of_bytes("g.txt", one.encode()).lines) == 1
