"""nccl_tests: nccl-tests output (``all_reduce_perf`` & co., as pasted) read into rows that say how far the test
got: a finished summary, the last complete row, wrong data, or the op running where the output stops.
Stages: :mod:`.signatures` (the lines, what their order means) -> :mod:`.scan` (runs) -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.nccl_tests import rows, scan
from ranktrace.analyzers.readers.nccl_tests.signatures import CATALOGUE
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "CATALOGUE", "read_doc"]

FORMAT = "nccl_tests"
SOURCE = "nccl_tests"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("'<bin>_perf' in the command / 'Collective test starting: <bin>_perf'", "EVENTS.name", "op name",
              "columns", "2.0 / 2.14"),
    ColumnMap("row columns redop + root", "EVENTS.name (when no binary)", "op name", "null", "2.0"),
    ColumnMap("'#  Rank N [Group g] Pid P on H device D'", "EVENTS.rank, EVENTS.pid, EVENTS.host", "int, int, str",
              "null", "1.x ('uses device')"),
    ColumnMap("'# nThread .. maxBytes M'", "EVENTS.nbytes (warm-up)", "int", "null", "2.0"),
    ColumnMap("row size column", "EVENTS.nbytes, OBSERVATIONS.value (progress)", "int", "-", "1.x"),
    ColumnMap("row '#wrong' columns", "OBSERVATIONS exception detail", "str", "-", "1.x ('res', 'error')"),
    ColumnMap("'# Out of bounds values : N OK|FAILED'", "OBSERVATIONS completion | exception", "-", "-", "2.0"),
    ColumnMap("'# Avg bus bandwidth : X'", "OBSERVATIONS.detail (completion)", "str", "-", "2.0"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "completion": "name = nccl_tests_ok, detail = the summary",
    "progress": "name = nccl_tests_size, value = size of the last complete row, detail = the row",
    "exception": "name = NcclTestsWrongData (#wrong > 0, Out of bounds FAILED) | NcclTestsNcclFailure | "
                 "NcclTestsCudaFailure ('Test NCCL failure file:line ...'), detail = where",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The nccl-tests runs in `doc`. ReaderError when it holds no nccl-tests header, table or summary.

    Rows (``source="nccl_tests"``, ``file``, ``line``):

    * OBSERVATIONS ``completion`` ``nccl_tests_ok`` — ``# Out of bounds values : 0 OK`` (the run finished its table;
      ``detail`` adds the average bus bandwidth).
    * OBSERVATIONS ``progress`` ``nccl_tests_size`` — when no summary is there: ``value`` = the size (bytes) of the last
      complete row, ``detail`` = that row.
    * OBSERVATIONS ``exception`` ``NcclTestsWrongData`` — a row with ``#wrong`` > 0, or ``Out of bounds values : N
      FAILED``: the data NCCL delivered was wrong (``detail`` says where); ``NcclTestsNcclFailure`` /
      ``NcclTestsCudaFailure`` — the test's own ``Test NCCL failure common.cu:958 '<error>'`` line (the test exits).
    * EVENTS ``kind="enter"`` — the op that was running where the output stops: after the table header with no row
      (the warm-up at ``maxBytes`` never finished: ``nbytes`` = maxBytes), or after a row's size columns / its
      out-of-place part (``nbytes`` = that size). One per rank of the device list (``rank``, ``pid``, ``host``; one
      row with ``rank`` null when the list is not pasted), ``name`` = the op of the binary when the command line or
      the ``Collective test starting`` banner is posted (``all_reduce_perf`` → ``all_reduce``, ``sendrecv_perf`` →
      ``send`` ...), else inferred from the columns (``redop`` sum + ``root`` -1 → ``all_reduce``); ``detail`` says
      which and why, and what stopped.

    Not written: rows that stop inside a field (``  131072``, ``2147483648     53``) — that is a paste cut, not where
    the test stopped (a ``Skipped`` note says so); complete rows with nothing after them give ``progress`` only (the
    next size may be running, or the paste ends there); output that stops before the table header is communicator
    init, which the NCCL lines around it describe (nccl_log family).

    ``world_size`` = the number of ranks in the device list. ``version`` = nccl-tests' own version (2.14+ banner).
    Known limits: several runs in one paste are told apart by their banners / parameter lines only; rccl-tests output
    is read the same way (same table).
    """
    runs, skipped = scan.scan(doc)
    runs = [r for r in runs if r.started or r.ranks or r.max_bytes is not None]
    if not runs:
        raise ReaderError(doc.path, "no nccl-tests header, device list, result row or summary")
    return rows.result(doc.path, FORMAT, SOURCE, runs, skipped)
