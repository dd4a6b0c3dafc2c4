"""analyzers/readers/mpi_launcher on Open MPI's own end-of-job lines: the texts of its help files as printed in
public threads (horovod/horovod#469, #1421, open-mpi/ompi#6379) and what a user reads from the verdict."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import catalogue, mpi_launcher
from ranktrace.analyzers.readers.text import open_text
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map

FIELD = REPO / "tests" / "field"


def _rows(path: Path) -> list[tuple]:
    doc = open_text(path)
    assert "mpi_launcher" in catalogue.scan(doc).families
    res = mpi_launcher.read_doc(doc)
    check_contract(res, "mpi_launcher", "mpi_launcher", path)
    return [(r["rank"], r["name"], r["value"], r["pid"], r["line"]) for r in res.observations.to_pylist()]


def test_declared_mapping() -> None:
    check_field_map(mpi_launcher)


def test_a_rank_killed_by_a_signal_is_that_rank_and_that_signal() -> None:
    assert _rows(FIELD / "horovod-469" / "mpirun.txt") == [(7, "signal", 9, None, 7)]  # "PID 0": not a pid


def test_the_first_process_to_exit_non_zero_is_read_from_its_process_name_block() -> None:
    assert _rows(FIELD / "horovod-1421" / "mpirun.txt") == [(0, "exit", 1, None, 5)]


def test_mpi_abort_and_an_improper_exit(tmp_path: Path) -> None:
    """MPI_ABORT names a rank of its communicator: the job's rank only for MPI_COMM_WORLD."""
    f = tmp_path / "job.log"
    f.write_text("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\n"
                 "with errorcode 1.\n"
                 "MPI_ABORT was invoked on rank 0 in communicator MPI COMMUNICATOR 4 SPLIT FROM 0\n"
                 "with errorcode 2.\n"
                 "mpirun has exited due to process rank 5 with PID 4242 on\n"
                 "node gpu07 exiting improperly. There are three reasons this could occur:\n")
    assert _rows(f) == [(3, "exit", 1, None, 1), (None, "exit", 2, None, 3), (5, "exit", None, 4242, 5)]


def test_the_verdict_names_the_killed_rank_and_how() -> None:
    v = api.analyze([FIELD / "horovod-469" / "mpirun.txt"], liveness=None).verdict
    assert (v.status, v.kind, list(v.culprit_ranks)) == ("crashed", "rank_exited", [7]), v.summary
    assert "killed by signal 9" in v.summary


def test_a_healthy_mpirun_log_is_not_read(tmp_path: Path) -> None:
    """mpirun's own start-up chatter and a deprecation warning say nothing about a rank ending."""
    f = tmp_path / "ok.log"
    f.write_text("WARNING: A deprecated MPI_Info key was used.\n  Deprecated key:   env\n"
                 "[1,0]<stdout>:epoch 1 done\n")
    assert "mpi_launcher" not in catalogue.scan(open_text(f)).families
