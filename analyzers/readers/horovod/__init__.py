"""horovod: Horovod's stall-inspector warnings and shutdown errors read into statement rows: when ranks submit
different tensors, the coordinator's "Missing ranks" list is the only explicit "who is missing" a Horovod job
gives. Stages: :mod:`.signatures` (the wordings) -> :mod:`.scan` -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult, Skipped
from ranktrace.analyzers.readers.horovod import rows, scan
from ranktrace.analyzers.readers.horovod.signatures import CATALOGUE
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "CATALOGUE", "read_doc"]

FORMAT = "horovod"
SOURCE = "horovod"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("'<rank>[!]: [<tensor>, ...]' under 'Missing ranks:'/'Stalled ranks:'", "OBSERVATIONS.rank",
              "int", "-", "0.17"),
    ColumnMap("'<tensor> [missing ranks: r, ..]'", "OBSERVATIONS.rank (missing_rank)", "int", "-", "0.13"),
    ColumnMap("'<tensor> [ready ranks: r, ..]'", "OBSERVATIONS.rank (joined_rank)", "int", "-", "0.13"),
    ColumnMap("tensor name (HorovodAllreduce_*, allreduce.*, ...)", "OBSERVATIONS.name", "op name", "null", "0.13"),
    ColumnMap("tensor names, '!' after the rank", "OBSERVATIONS.detail", "str", "by=horovod", "0.16"),
    ColumnMap("'<Type>: Horovod has been shut down'", "OBSERVATIONS.name (exception)", "str", "HorovodShutdown",
              "0.13"),
    ColumnMap("mpirun '[1,r]<stderr>:' prefix | file name", "OBSERVATIONS.rank (exception)", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "missing_rank": "rank = the rank stated missing, name = op, detail = by=horovod tensor=...",
    "joined_rank": "rank = a rank listed as ready, name = op, detail = by=horovod tensor=...",
    "exception": "name = error type (shutdown, HorovodStallShutdown, HorovodInternalError), detail = message",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The Horovod statements in `doc`. ReaderError when it holds neither a stall warning nor a Horovod error.

    Rows (``source="horovod"``, ``file``, ``line`` = the line that names the rank):

    * ``missing_rank`` — one per (rank, op) stated missing (``Missing ranks:`` / ``Stalled ranks:`` lists,
      ``[missing ranks: ..]``); ``rank`` = the missing rank, ``name`` = the op from the tensor name
      (``HorovodAllreduce_*`` / ``allreduce.*`` → ``all_reduce``, Broadcast → ``broadcast``, Allgather →
      ``all_gather``, Alltoall → ``all_to_all``; null when the name says none), ``detail`` = ``by=horovod
      tensor=<first tensor> (+N more tensors) [shutdown=yes]``.
    * ``joined_rank`` — one per (rank, op) listed in ``[ready ranks: ..]``: the ranks that did submit.
    * ``exception`` — ``name`` = the error type printed in front of ``Horovod has been shut down`` (``AbortedError``,
      ``Aborted``, ``UnknownError``, ``Unknown``; ``HorovodShutdown`` when none), one per (rank, type) with the
      repeat count; ``HorovodStallShutdown`` for ``... is stalled for longer than N seconds. Will shutdown.``;
      ``HorovodInternalError``. ``rank`` = the rank that printed it (mpirun prefix, file name), else null.

    A warning with no rank list (the header alone) gives no row: it says some op waited 60 s, not who is missing
    (often a slow step that then completes). ``seq`` is never known (``value`` null).

    Known limits: a world size is never stated, so ranks missing from a ``[ready ranks: ..]`` list are not named here;
    a rank list cut at the end of a line loses its last (possibly cut) number; a tensor name that holds no op word
    gives ``name`` null; the shutdown message wrapped inside the word ``shut`` is not found.
    """
    found = scan.scan(doc)
    if not found.statements and not found.warnings:
        raise ReaderError(doc.path, "no Horovod stall warning, rank list or shutdown error")
    res = rows.result(doc.path, FORMAT, SOURCE, found)
    if not found.statements:
        res = ReadResult(file=res.file, format=FORMAT, skipped=res.skipped + (Skipped(
            doc.path, found.warnings[0][0], "Horovod stall warning without a list of ranks or ops (cut after its "
                                             "first line?): no rank is named"),))
    return res
