"""faulthandler: Python ``faulthandler`` dumps (``register(signal, all_threads=True)``, ``dump_traceback_later``,
fatal signals) read into STACKS: where every Python thread of a rank is, without ptrace. Two files: the line walk
(:mod:`.scan`) and this entry point; the rows are the shared stack records."""
from __future__ import annotations

from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import (ColumnMap, ReadResult, ReaderError, Skipped, binary_or_json,
                                              read_text_file)
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.common.stacks import stacks_table
from ranktrace.analyzers.readers.faulthandler.scan import SNIFF, scan
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "sniff", "read", "read_doc"]

FORMAT = "faulthandler"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap('File "F", line N in FUNC', "frames", '"FUNC (F:N)", innermost first', "[]", "3.3"),
    ColumnMap("Current thread / Thread 0x.. [name]", "thread_name", "str; <current> for the current thread", "null",
              "3.3"),
    ColumnMap("[rankN]: prefix | file name", "rank", "int", "null", "-"),
    ColumnMap("(dump index in file)", "snapshot", "<file name>#k", "-", "-"),
    ColumnMap("(line of the thread header)", "line", "int", "-", "-"),
    ColumnMap("Fatal Python error: X", "OBSERVATIONS.kind=py_fatal_error detail", "str", "-", "3.3"),
)


def sniff(path: Path, head: bytes) -> bool:
    """A faulthandler thread header (``... (most recent call first):``) in the first bytes."""
    if binary_or_json(head):
        return False
    return bool(SNIFF.search(head.decode("utf-8", errors="replace")))


def read(path: Path) -> ReadResult:
    """Read every faulthandler dump in one file into STACKS (and fatal errors into OBSERVATIONS).

    Accepted text::

        Fatal Python error: Segmentation fault                  (optional; also "Timeout (0:00:10)!")
        Thread 0x00007f... (most recent call first):
          File "x.py", line 12 in func
        Current thread 0x00007f... (most recent call first):
          File "<string>", line 1 in <module>
        Stack (most recent call first):                          (single-thread dumps)

    Also: ``[rankN]:`` launcher prefixes, thread names between the id and the parenthesis (newer Pythons), two frame
    lines glued together by interleaved writes (``... in f  File "y.py", line 3 in g``), ``<no Python frame>``,
    several dumps appended to one file (each becomes its own ``snapshot``: a new dump starts at a ``Fatal Python
    error`` / ``Timeout`` line, or when a thread id repeats).

    Columns: ``frames`` innermost first (faulthandler's order already) as ``"func (file:line)"``; ``thread_state``
    ``unknown``; ``thread_name`` ``"<current>"`` for the current thread unless a name is printed; ``tid`` null
    (faulthandler prints the pthread id, not the OS thread id); ``native`` False; ``snapshot`` ``<file name>#k``.
    A ``Fatal Python error: X`` line also yields an OBSERVATIONS row ``py_fatal_error`` (detail = X).

    Known limits: faulthandler prints bare function names and full paths while py-spy prints qualified names and
    short paths, so the same frame is spelled differently by the two readers; no pid is printed (null unless the
    lead knows it); rank comes from a launcher prefix, else from the file name.
    """
    return read_text_file(path, FORMAT, "binary data, not a faulthandler dump", _from_text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (launcher prefixes spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)
    threads, obs, skipped, outside = scan(path, text)
    if not threads:
        raise ReaderError(path, "no faulthandler thread dump found")
    if outside:
        skipped.append(Skipped(f, None, f"{outside} line(s) outside faulthandler dumps ignored"))
    file_rank = rank_from_name(path.name)
    for t in threads:
        if t.rank is None:
            t.rank = file_rank
    for o in obs:
        if o["rank"] is None:
            o["rank"] = file_rank
    return ReadResult(file=f, format=FORMAT, stacks=stacks_table(threads),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped))
