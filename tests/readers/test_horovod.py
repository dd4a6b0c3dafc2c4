"""analyzers/readers/horovod on stall-inspector warnings and shutdown errors as posted in public threads."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import catalogue, horovod
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import Line, LinePrefix, TextDoc, open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, rows

DATA = REPO / "tests" / "data" / "readers" / "horovod"
FIELD = REPO / "tests" / "field"


def _read(path: Path) -> horovod.ReadResult:
    doc = open_text(path)
    assert "horovod" in catalogue.scan(doc).families
    res = horovod.read_doc(doc)
    check_contract(res, "horovod", "horovod", path)
    return res


def _stated(res, kind: str) -> set[tuple[int, str | None]]:
    return {(r["rank"], r["name"]) for r in rows(res.observations, kind=kind)}


def test_declared_mapping() -> None:
    check_field_map(horovod)


def test_missing_ranks_list_v021() -> None:
    res = _read(DATA / "missing_ranks_v021.txt")
    (row,) = rows(res.observations, kind="missing_rank")       # two warnings, one statement
    assert (row["rank"], row["name"], row["line"]) == (0, "all_reduce", 7)
    assert row["detail"].startswith("by=horovod tensor=cond_1/then/_10/")


def test_stalled_ranks_behind_mpirun_prefix_and_cut() -> None:
    res = _read(DATA / "stalled_ranks_mpirun.txt")
    (row,) = rows(res.observations, kind="missing_rank")
    assert (row["rank"], row["name"], row["line"]) == (4, "all_reduce", 6)
    assert "(+2 more tensors)" in row["detail"]              # the cut 4th name is not used


def test_per_op_glog_lines_with_glued_prefixes() -> None:
    res = _read(DATA / "missing_per_op_glog.txt")
    assert _stated(res, "missing_rank") == {(1, "broadcast")}
    (row,) = rows(res.observations, kind="missing_rank")
    assert row["line"] == 1 and "(+6 more tensors)" in row["detail"]


def test_stalled_ops_missing_rank_815() -> None:
    res = _read(DATA / "stalled_ops_missing_815.txt")
    assert _stated(res, "missing_rank") == {(815, "all_reduce")}


def test_shutdown_error_types_and_printing_rank() -> None:
    res = _read(DATA / "shutdown_mpirun.txt")
    assert [(r["kind"], r["name"], r["rank"], r["line"]) for r in res.observations.to_pylist()] == [
        ("exception", "HorovodShutdown", 0, 8)]
    res = _read(DATA / "shutdown_tf_op.txt")
    got = {(r["name"], r["line"]) for r in res.observations.to_pylist()}
    assert got == {("Aborted", 1), ("AbortedError", 4)}
    assert "(2 times)" in rows(res.observations, name="Aborted")[0]["detail"]


@pytest.mark.parametrize("case,missing,ready", [
    ("horovod-2565", {(1, "all_reduce")}, set()),
    ("horovod-534", {(0, "broadcast")}, set()),
    ("horovod-364", set(), {(r, "all_reduce") for r in (0, 2, 3, 4, 6, 7)}),
    ("horovod-367", set(), {(r, "all_reduce") for r in range(1, 8)}),
    ("horovod-pr334", set(), {(r, "all_reduce") for r in (1, 2, 3, 4, 5, 7)}),
])
def test_field_cases(case: str, missing: set, ready: set) -> None:
    (path,) = [p for p in (FIELD / case).iterdir() if p.name != "case.json"]
    res = _read(path)
    assert _stated(res, "missing_rank") == missing
    assert _stated(res, "joined_rank") == ready


def test_warning_without_list_names_nobody() -> None:
    res = _read(FIELD / "horovod-2843" / "warning.log")
    assert res.observations.num_rows == 0
    assert res.skipped and res.skipped[0].line == 1


def test_shutdown_rank_mark_from_stall_inspector_source() -> None:
    # stall_inspector.cc with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: "!" after a rank past the shutdown time
    text = ("[2021-03-01 10:00:00.000000: E horovod/common/stall_inspector.cc:105] One or more tensors were submitted "
            "to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for "
            "more than 60 seconds. This may indicate ...\nMissing ranks:\n2!: [allgather.x, allgather.y]\n"
            "3: [HorovodAlltoall_z_0]\n"
            "One or more rank (marked by \"!\") is stalled for longer than 120 seconds. Will shutdown.\n")
    res = horovod.read_doc(text_of_bytes("stall.log", text.encode()))
    assert _stated(res, "missing_rank") == {(2, "all_gather"), (3, "all_to_all")}
    assert "shutdown=yes" in rows(res.observations, rank=2)[0]["detail"]
    assert rows(res.observations, kind="exception")[0]["name"] == "HorovodStallShutdown"


def test_not_horovod_and_torn_lines() -> None:
    with pytest.raises(ReaderError):
        horovod.read_doc(text_of_bytes("x.log", b"1: [a, b]\nhello\n"))
    torn = b"Missing ranks:\n1: [Horovod\n\xff\xfe garbage ]]] [ready ranks: \n[ready ranks: 3, 4\n"
    res = horovod.read_doc(text_of_bytes("t.log", torn))
    assert _stated(res, "missing_rank") == {(1, None)}
    assert _stated(res, "joined_rank") == {(3, None)}          # "4" may be cut: not used


def test_one_megabyte_line_takes_milliseconds() -> None:
    line = ("x" * 400 + " [ready ranks: 1, ") * 2000 + "t [ready ranks: 1]" + "a[" * 100_000 + "Missing ranks: 1: [" + "y," * 50_000
    doc = TextDoc("big.log", [Line(1, line, LinePrefix(), line)])
    t = time.perf_counter()
    assert "horovod" in catalogue.scan(doc).families
    res = horovod.read_doc(doc)
    assert time.perf_counter() - t < 0.5
    assert _stated(res, "joined_rank") == {(1, None)}


def test_horovodrun_rank_prefix_names_the_writer() -> None:
    # horovodrun's own "[0]<stderr>:" prefix (mpirun's is "[1,0]<stderr>:"): the stall report under it is read
    from ranktrace.analyzers.readers.text.prefixes import split_prefixes

    assert split_prefixes("[3]<stderr>:Missing ranks:")[0].rank == 3
    assert split_prefixes("[1,5]<stdout>:x")[0].rank == 5
