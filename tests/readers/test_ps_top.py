"""analyzers/readers/ps_top on process listings as posted: ps, top, forests, pstree, nvidia-smi processes."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import catalogue, ps_top
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import Line, LinePrefix, TextDoc, open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map

DATA = REPO / "tests" / "data" / "readers" / "ps_top"
FIELD = REPO / "tests" / "field"


def _read(path: Path) -> ps_top.ReadResult:
    doc = open_text(path)
    assert "ps_top" in catalogue.scan(doc).families
    res = ps_top.read_doc(doc)
    check_contract(res, "ps_top", "ps_top", path)
    assert set(res.observations.column("kind").to_pylist()) == {"process"}
    return res


def _procs(res) -> dict[int, dict]:
    return {r["pid"]: r for r in res.observations.to_pylist()}


def test_declared_mapping() -> None:
    check_field_map(ps_top)


def test_ps_aufx_states_cpu_forest_and_zombies() -> None:
    p = _procs(_read(DATA / "ps_aufx_defunct.txt"))
    assert sorted(p) == [774690, 1607844, 1607845, 1639337, 1639339, 1639341]
    assert (p[1607845]["name"], p[1607845]["value"], p[1607845]["line"]) == ("S", 38, 7)
    assert p[1639339]["name"] == "defunct" and p[1639341]["name"] == "defunct"
    assert "ppid=1607844" in p[1607845]["detail"]
    assert "ppid=1607845" in p[1639337]["detail"] and "ppid=1607845" in p[1639339]["detail"]   # siblings
    assert p[1607845]["detail"].endswith("cmd=/opt/venvs/classifier-training-repo/bin/python /usr/bin/classifier-train")


def test_top_zombie_spinning() -> None:
    (row,) = _read(DATA / "top_zombie.txt").observations.to_pylist()
    assert (row["pid"], row["name"], row["value"], row["line"]) == (32503, "defunct", 100, 5)
    assert "by=top cmd=fairseq-train" in row["detail"]


def test_ps_ef_without_header() -> None:
    p = _procs(_read(DATA / "ps_ef_headerless.txt"))
    assert len(p) == 5 and {r["name"] for r in p.values()} == {"defunct"}
    assert "ppid=502717" in p[2011967]["detail"]


def test_field_forest_three_defunct_workers() -> None:
    p = _procs(_read(FIELD / "returnn-1484" / "ps_tree.txt"))
    workers = [6472, 6473, 6474, 6475]
    assert [p[w]["name"] for w in workers] == ["defunct", None, "defunct", "defunct"]
    assert all("ppid=6454" in p[w]["detail"] for w in workers)


def test_field_sglang_orphans_and_gpu_listing() -> None:
    (row,) = _read(FIELD / "sglang-23627" / "ps.txt").observations.to_pylist()
    assert (row["pid"], row["rank"]) == (2505781, 0) and "ppid=1" in row["detail"]
    p = _procs(_read(FIELD / "sglang-23627" / "nvidia-smi.txt"))
    assert sorted(p) == [2505781, 2505782, 2505783, 2505784]
    assert "gpu=3 mem=100804MiB" in p[2505784]["detail"]
    assert "cmd=sglang::scheduler_DP3_TP3_EP3" in p[2505784]["detail"]


def test_nvidia_smi_process_table_and_rank_from_title() -> None:
    text = (
        "| Processes:                                                                              |\n"
        "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |\n"
        "|        ID   ID                                                             Usage      |\n"
        "|=========================================================================================|\n"
        "|    0   N/A  N/A    412501      C   sglang::scheduler_TP0                     75360MiB |\n"
        "|    3   N/A  N/A    412504      C   sglang::scheduler_TP3                     75358MiB |\n"
        "|    1     4511      C   python                                     10119MiB |\n")
    res = ps_top.read_doc(text_of_bytes("smi.txt", text.encode()))
    p = _procs(res)
    assert (p[412504]["rank"], p[412504]["name"], p[412504]["line"]) == (3, None, 6)
    assert "gpu=3 type=C mem=75358MiB by=nvidia-smi" in p[412504]["detail"]
    assert 4511 in p


def test_pstree_and_secrets_never_reach_a_row() -> None:
    text = ("systemd(1)---bash(2001)---torchrun(2002)-+-python(2003)\n"
            "                                         `-python(2004)\n"
            "USER  PID  %CPU  STAT  COMMAND\n"
            "me    77   99.0  R     python serve.py --api-key sk-abcdefghijklmnopqrstuv --rank 2 HF_TOKEN=hf_x\n")
    res = ps_top.read_doc(text_of_bytes("p.txt", text.encode()))
    p = _procs(res)
    assert {1, 2001, 2002, 2003} <= set(p)
    assert "sk-abcdefghijklmnopqrstuv" not in p[77]["detail"] and "hf_x" not in p[77]["detail"]
    assert "--api-key <redacted>" in p[77]["detail"] and p[77]["rank"] == 2 and p[77]["name"] == "R"


def test_not_a_listing_and_torn_rows() -> None:
    with pytest.raises(ReaderError):
        ps_top.read_doc(text_of_bytes("x.txt", b"hello\nPID is 12\n"))
    res = ps_top.read_doc(text_of_bytes("t.txt", b"USER PID %CPU STAT COMMAND\nme 12 x\nme\nme 13 1.0 S py\n"))
    assert sorted(_procs(res)) == [12, 13]
    assert [s.line for s in res.skipped] == [3]


def test_one_megabyte_line_takes_milliseconds() -> None:
    line = "root 1 0.0 0.0 1 1 ? S 10:00 0:00 " + "a(1)-" * 200_000
    doc = TextDoc("big.txt", [Line(1, line, LinePrefix(), ""), Line(2, "x" * 1_000_000, LinePrefix(), "")])
    t = time.perf_counter()
    catalogue.scan(doc)
    ps_top.read_doc(doc)
    assert time.perf_counter() - t < 0.5
