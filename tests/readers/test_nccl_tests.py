"""analyzers/readers/nccl_tests on nccl-tests output as posted: finished runs, tables that stop, cut pastes."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import catalogue, nccl_tests
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import Line, LinePrefix, TextDoc, open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, rows

DATA = REPO / "tests" / "data" / "readers" / "nccl_tests"
FIELD = REPO / "tests" / "field"


def _read(path: Path) -> nccl_tests.ReadResult:
    doc = open_text(path)
    assert "nccl_tests" in catalogue.scan(doc).families
    res = nccl_tests.read_doc(doc)
    check_contract(res, "nccl_tests", "nccl_tests", path)
    return res


def _field(case: str) -> Path:
    (path,) = [p for p in (FIELD / case).iterdir() if p.name != "case.json"]
    return path


def _kinds(res) -> list[tuple[str, str | None]]:
    return [(r["kind"], r["name"]) for r in res.observations.to_pylist()]


def test_declared_mapping() -> None:
    check_field_map(nccl_tests)


def test_finished_run_is_a_completion() -> None:
    res = _read(DATA / "alltoall_summary.txt")
    assert _kinds(res) == [("completion", "nccl_tests_ok")]
    (row,) = res.observations.to_pylist()
    assert row["line"] == 12 and "Avg bus bandwidth : 0" in row["detail"]
    assert res.events.num_rows == 0 and res.world_size == 1


def test_rccl_tail_with_summary() -> None:
    res = _read(DATA / "rccl_concluded.txt")
    assert _kinds(res) == [("completion", "nccl_tests_ok")]
    assert res.events.num_rows == 0


def test_table_cut_by_the_paste_is_progress_not_a_stall() -> None:
    res = _read(DATA / "mpirun_tagged_cut.txt")
    (row,) = rows(res.observations, kind="progress")
    assert (row["name"], row["value"], row["line"]) == ("nccl_tests_size", 32, 6)
    assert res.events.num_rows == 0
    assert any(s.line == 7 and "cut inside" in s.reason for s in res.skipped)


def test_old_error_column_is_not_wrong_data() -> None:
    res = _read(DATA / "old_error_column.txt")
    assert _kinds(res) == [("progress", "nccl_tests_size")]
    assert res.observations.to_pylist()[0]["value"] == 131072


def test_header_then_nccl_init_gives_no_op() -> None:
    doc = open_text(DATA / "header_then_init.txt")
    assert {"nccl_tests", "nccl_log"} <= set(catalogue.scan(doc).families)
    res = nccl_tests.read_doc(doc)
    assert res.events.num_rows == 0 and res.observations.num_rows == 0 and res.world_size == 2


@pytest.mark.parametrize("case", ["nccltests-117", "nccltests-117-b"])
def test_header_without_rows_is_the_warm_up_op(case: str) -> None:
    res = _read(_field(case))
    ev = res.events.to_pylist()
    assert [(e["rank"], e["name"], e["kind"], e["nbytes"], e["line"]) for e in ev] == [
        (0, "all_reduce", "enter", 134217728, 9), (1, "all_reduce", "enter", 134217728, 9)]
    assert ev[0]["pid"] in (4479, 871210) and "binary all_reduce_perf (line 1)" in ev[0]["detail"]
    assert "warm-up" in ev[0]["detail"]


def test_old_format_header_only_names_no_op() -> None:
    res = _read(_field("nccl-104"))
    ev = res.events.to_pylist()
    assert [e["rank"] for e in ev] == list(range(8))
    assert {e["name"] for e in ev} == {None} and "not stated" in ev[0]["detail"]


@pytest.mark.parametrize("case,size", [("dgxspark-playbooks-103", 65536), ("tinygrad-ogkm-36", 1073741824),
                                       ("nccl-1453", 536870912), ("tinygrad-ogkm-45-b", 2048),
                                       ("rccl-pr-2075", 2048)])
def test_field_tables_cut_by_the_paste(case: str, size: int) -> None:
    res = _read(_field(case))
    assert rows(res.observations, kind="progress")[0]["value"] == size
    assert res.events.num_rows == 0


ROWS = ("# nThread 1 nGpus 2 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
        "#  Rank  0 Group  0 Pid   7 on h device  0 [0x01] GPU\n#  Rank  1 Group  0 Pid   8 on h device  1 [0x02] GPU\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87    0.00    0.00      0\n")


def test_row_stopped_after_its_size_columns_is_the_running_op() -> None:
    # common.cu prints a row's size columns, runs out-of-place, prints, runs in-place, prints
    doc = text_of_bytes("stop.txt", (ROWS + "          16             4     float     sum      -1\n").encode())
    res = nccl_tests.read_doc(doc)
    ev = res.events.to_pylist()
    assert [(e["rank"], e["name"], e["nbytes"], e["line"]) for e in ev] == [(0, "all_reduce", 16, 6),
                                                                            (1, "all_reduce", 16, 6)]
    assert "inferred from the table columns redop=sum root=-1" in ev[0]["detail"]
    assert rows(res.observations, kind="progress")[0]["value"] == 8
    doc = text_of_bytes("stop.txt", (ROWS + "          16             4     float     sum      -1    12.88    0.00"
                                            "    0.00      0\n").encode())
    assert "in-place op running" in nccl_tests.read_doc(doc).events.to_pylist()[0]["detail"]


def test_wrong_elements_are_a_data_error() -> None:
    doc = text_of_bytes("w.txt", (ROWS + "          16             4     float     sum      -1    12.88    0.00"
                                         "    0.00      3    12.83    0.00    0.00      0\n"
                                         "# Out of bounds values : 3 FAILED\n").encode())
    res = nccl_tests.read_doc(doc)
    assert _kinds(res) == [("exception", "NcclTestsWrongData"), ("exception", "NcclTestsWrongData")]
    assert "#wrong 3 (out-of-place) at size 16" in res.observations.to_pylist()[0]["detail"]


def test_the_tests_own_failure_line() -> None:
    # nccl-tests#166's wording (common.h: "<host>: Test NCCL failure <file>:<line> '<error> / <last error>'")
    doc = text_of_bytes("f.txt", (ROWS + "ubuntu: Test NCCL failure common.cu:958 'internal error - please report "
                                         "this issue to the NCCL developers / '\n").encode())
    res = nccl_tests.read_doc(doc)
    (row,) = rows(res.observations, kind="exception")
    assert (row["name"], row["line"]) == ("NcclTestsNcclFailure", 6)
    assert "common.cu:958 'internal error" in row["detail"]


def test_not_nccl_tests() -> None:
    with pytest.raises(ReaderError):
        nccl_tests.read_doc(text_of_bytes("x.txt", b"12 34 hello\nfoo\n"))


def test_one_megabyte_line_takes_milliseconds() -> None:
    line = "  8  2  float  sum  -1 " + "1.0 " * 250_000 + "all_reduce_perf" + "x" * 10_000
    doc = TextDoc("big.txt", [Line(1, "# Using devices", LinePrefix(), ""), Line(2, line, LinePrefix(), "")])
    t = time.perf_counter()
    catalogue.scan(doc)
    nccl_tests.read_doc(doc)
    assert time.perf_counter() - t < 0.5


def test_failure_trail_through_the_op_source_names_the_failed_op() -> None:
    # "Test failure all_reduce.cu:103" under "Test NCCL failure common.cu:343": the call failed inside all_reduce
    res = _read(FIELD / "nccltests-24" / "error.txt")
    (ev,) = [e for e in rows(res.events) if e["kind"] == "enter"]
    assert ev["name"] == "all_reduce" and "unhandled cuda error" in ev["error"]
    # a failure with no trail through an op's source (set-up in common.cu) names no op, and a lone failure line
    # is still read
    res = _read(FIELD / "nccltests-102" / "after_hang.txt")
    assert not [e for e in rows(res.events) if e["kind"] == "enter"]
    assert [o["name"] for o in rows(res.observations)] == ["NcclTestsNcclFailure"]
