"""progress: progress bars and step counters read into ``progress`` rows, the last visible progress per rank and
thing counted: a rank still tokenizing or loading shards while its peers wait is busy, not stuck.
Stages: :mod:`.signatures` -> :mod:`.scan` -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.progress import rows, scan
from ranktrace.analyzers.readers.progress.signatures import CATALOGUE
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "CATALOGUE", "read_doc"]

FORMAT = "progress"
SOURCE = "progress"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("tqdm '<label>: N%|..| done/total'", "OBSERVATIONS.name (label), OBSERVATIONS.value (done)", "str, int",
              "-", "tqdm 4"),
    ColumnMap("'step N[/M]', 'iteration N/M', 'Epoch N/M'", "OBSERVATIONS.name (step|epoch), OBSERVATIONS.value",
              "int", "-", "-"),
    ColumnMap("the line", "OBSERVATIONS.detail", "str", "-", "-"),
    ColumnMap("launcher prefix | file name", "OBSERVATIONS.rank", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "progress": "name = what is counted, value = the last count, detail = done/total and the line",
    "completion": "name = training_done ('Training completed' among a rank's last lines) | exit_ok (torch's "
                  "'process group has NOT been destroyed' exit warning, 'Process group destroyed')",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The last progress of each (rank, what) in `doc`. ReaderError when it holds no progress line.

    Rows (``source="progress"``, ``file``, ``line`` = the last line of that progress): one per (rank, what):
    ``name`` = what is counted (``tokenizer``, ``load``, ``cuda_graph_capture``, ``prompts``, ``dataset_map``, a bar's
    own label in snake case, ``step``, ``epoch``), ``value`` = the last count, ``detail`` = ``done/total`` and the line.
    ``rank`` = the launcher prefix (``[rank3]:``, ``[default3]:`` is local and gives null) or the file name; bars with
    no prefix from several ranks fold into one ``rank`` null row holding the furthest of them.

    Known limits: interleaved bars of different ranks without prefixes cannot be told apart; a counter without a
    word in front (``120/1000``) is not read; percentages alone (``50%``) are not read.
    """
    found = scan.scan(doc)
    ends = scan.endings(doc)
    if not found and not ends:
        raise ReaderError(doc.path, "no progress bar or step counter")
    return rows.result(doc.path, FORMAT, SOURCE, found, ends)
