"""fr_text: the text torch's Flight Recorder analyzer (``torchfrtrace`` / ``fr_trace.py``) printed, read into its
claims (missing ranks, culprit ranks, mismatches per group and sequence number) so findings can cite them next to
ranktrace's own. Stages: :mod:`.scan` (lines -> claim blocks) -> :mod:`.rows` (OBSERVATIONS)."""
from __future__ import annotations

from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import (ColumnMap, ReadResult, binary_or_json, decode_text, empty_file,
                                              read_file_bytes)
from ranktrace.analyzers.readers.fr_text.rows import block_rows
from ranktrace.analyzers.readers.fr_text.scan import SNIFF, scan
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "sniff", "read", "read_doc"]

FORMAT = "fr_text"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("Not all ranks joining collective[, sequence number:] N", "value", "int seq", "null", "oldest..current"),
    ColumnMap("group info: NAME[:DESC]", "group", "str pg name", "null", "2.5"),
    ColumnMap("collective: PREFIX:OP", "name", "canonical_op()", "null", "2.5"),
    ColumnMap("missing ranks: {..}", "rank (fr_missing_ranks)", "int per rank", "-", "2.5"),
    ColumnMap("Culprit rank R; Error type: KIND, msg", "rank, detail (fr_culprit)", "int, 'KIND: msg'", "-", "2.6"),
    ColumnMap("Found errors: Error rank R, Error type: KIND", "rank, detail (fr_culprit)", "int, 'KIND: msg'", "-",
              "oldest"),
    ColumnMap("Collective sequence number: N has errors", "detail (fr_mismatch)", "mismatch kinds", "-", "2.6"),
    ColumnMap("Traceback ... <Exception>: msg", "Skipped", "analyzer crash", "-", "any"),
)


def sniff(path: Path, head: bytes) -> bool:
    """torchfrtrace text: one of its headline phrases, or a traceback through its own modules, in the first bytes."""
    if binary_or_json(head):
        return False
    return SNIFF.search(head) is not None


def read(path: Path) -> ReadResult:
    """Parse torchfrtrace output into OBSERVATIONS; never raises on an unknown line.

    Output generations handled (all seen in pytorch/pytorch history):

    * current (torch ≥ 2.6, ``EntryState.log``): ``Not all ranks joining collective, sequence number: N`` /
      ``Collective sequence number: N has errors`` / ``Input/output mismatch in the collective sequence number: N``,
      then ``key: value`` lines (``internal record id``, ``group info``, ``collective``, ``missing ranks``,
      ``expected ranks``, ``collective state``, ``error msg: Culprit rank R; Error type: KIND, ...``) and a stack;
    * 2.5 era: ``Not all ranks joining collective N at entry R`` with the same key lines;
    * oldest (print-based): ``Not all ranks joining collective for group G:D collective OP Missing ranks are {..}``,
      ``Collective R errors for group G:D collective OP`` + ``Found errors: Error rank R, Error type: ...``.

    OBSERVATIONS kinds (``value`` = the sequence number torchfrtrace printed, ``group`` = pg name, ``name`` = canonical
    op, ``line`` = line of the claim):

    * ``fr_missing_ranks`` — one row per rank that did not join (``rank`` = that rank);
    * ``fr_culprit`` — one row per ``Culprit rank`` / ``Error rank`` (``rank``; ``detail`` = "KIND: message");
    * ``fr_mismatch`` — one row per mismatch block (``detail`` = the mismatch kind, e.g. COLLECTIVE_TYPE_MISMATCH);
    * ``fr_missing_dump`` — ranks whose dump file torchfrtrace said it lacked (``rank``).

    A crash of the analyzer itself (e.g. ``KeyError: ('0', 0)`` on gloo dumps whose ``pg_config`` key is empty) becomes
    a ``Skipped`` naming the exception: its absence of findings means nothing.

    Known limits: ``-j`` (raw entry tables) and ``-v`` tabulate output are not parsed (reported as skipped lines); the
    rank space is whatever torchfrtrace used (global ranks from dump file names).
    """
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    text = decode_text(path, data, "binary data, not torchfrtrace text output")
    if not text.strip():
        return empty_file(f, FORMAT)
    return _from_text(path, text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (launcher prefixes spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)
    blocks, obs, skipped = scan(path, text)
    for b in blocks:
        obs.extend(block_rows(b, f))
    return ReadResult(file=f, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(skipped), world_size=len(blocks[0].expected) if blocks and blocks[0].expected
                      else None)
