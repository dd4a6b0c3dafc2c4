"""rank_from_name / rank_from_prefix: the names users' files and processes really carry."""
from __future__ import annotations

import pytest

from ranktrace.analyzers.readers.common.ranks import rank_from_name, rank_from_prefix, split_rank_prefix


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("fr_gloo_rank3.json", 3),
        ("nccl_trace_rank_3", 3),
        ("rank3", 3),
        ("rank_3", 3),
        ("rank-12.txt", 12),
        ("[rank3]:", 3),
        ("Rank 5", 5),
        ("RANK=7", 7),
        ("gdb_bt_rank1.txt", 1),
        ("tp1", 1),
        ("scheduler_TP3", 3),
        ("sglang::scheduler_TP3", 3),
        ("sglang::scheduler_PP0_TP2", 2),
        ("pyspy_rank3_tp1.txt", 3),  # an explicit rank wins over TP
    ],
)
def test_rank_found(name: str, rank: int) -> None:
    assert rank_from_name(name) == rank


@pytest.mark.parametrize(
    "name",
    [
        "TP1-3",                      # a range of TP ranks, not one rank
        "sglang::scheduler_TP1-3",
        "rank0-3.log",                # a range
        "rank0_to_rank3.log",         # two different explicit ranks
        "sglang::scheduler_PP1_TP2",  # TP rank inside pipeline stage 1: global rank needs the TP size
        "scheduler_DP1_TP0",
        "pyspy_dump_pid5922.txt",     # a pid, not a rank
        "trace_3",                    # bare trailing numbers are the FR reader's rule, not a general one
        "local_rank2.log",            # node-local
        "crank7",
        "http2_server.log",
        "",
    ],
)
def test_rank_absent_or_ambiguous(name: str) -> None:
    assert rank_from_name(name) is None


@pytest.mark.parametrize(
    ("line", "rank", "rest"),
    [
        ("[rank3]:Thread 5 (idle)", 3, "Thread 5 (idle)"),
        ("[rank12]:    all_reduce (x.py:1)", 12, "    all_reduce (x.py:1)"),
        ("[1,3]<stdout>:hello", 3, "hello"),
        ("[0,15]<stderr>:  File \"a.py\", line 1 in f", 15, "  File \"a.py\", line 1 in f"),
        ("[default2]:hello", None, "hello"),  # torchrun <2.x: local rank only
        ("Thread 5 (idle)", None, "Thread 5 (idle)"),
        ("rank3: not a prefix", None, "rank3: not a prefix"),
    ],
)
def test_prefix(line: str, rank: int | None, rest: str) -> None:
    assert split_rank_prefix(line) == (rank, rest)
    assert rank_from_prefix(line) == rank
