"""traceback: Python tracebacks (and the C++ backtraces torch attaches to its exceptions) wherever a log, a ticket
or a pytest report holds them: where a rank was when it died, inside which op, called from which line. Stages:
:mod:`.signatures` -> :mod:`.scan` (lines -> records) -> :mod:`.frames` (what the frames say) -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError
from ranktrace.analyzers.readers.common.stacks import stacks_table
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.traceback.rows import build
from ranktrace.analyzers.readers.traceback.scan import scan
from ranktrace.analyzers.readers.traceback.signatures import SIGNATURE

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "SIGNATURE", "read_doc"]

FORMAT = "traceback"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap('File "F", line N, in FUNC', "STACKS.frames", '"FUNC (short F:N)" innermost first', "[]", "py3.6"),
    ColumnMap("rich box: │ F:N in FUNC │ (FUNC may wrap to the next box line), │ ❱ N │ code │", "STACKS.frames",
              "the same frame and code", "[]", "rich 10"),
    ColumnMap("ExcType: message (last line)", "OBSERVATIONS.kind=exception name=ExcType (no module) detail",
              "str", "no row when cut", "py3.6"),
    ColumnMap("KeyboardInterrupt", "STACKS.thread_state=interrupted", "str", "exception", "py3.6"),
    ColumnMap("innermost distributed_c10d.py frame FUNC | framework wrapper | cut: code line dist.OP(",
              "EVENTS.kind=enter name category; OBSERVATIONS.group", "canonical op", "null", "torch 1.8"),
    ColumnMap("innermost application frame outside the op", "EVENTS.callsite", '"func (file:line)"', "null", "-"),
    ColumnMap("init op frames + _create_c10d_store / _store_based_barrier / next_rendezvous ...",
              "OBSERVATIONS.kind=init_failure name=stage", "str", "-", "torch 1.8"),
    ColumnMap("[rankN]: prefix | -- Process N terminated ... | file name | [N] is setting up ..",
              "STACKS.rank EVENTS.rank OBSERVATIONS.rank", "int", "null", "-"),
    ColumnMap("Exception raised from F at L (most recent call first): frame #i: SYM + 0x.. (0x.. in LIB)",
              "STACKS.frames native=True", '"SYM (LIB)" innermost first', "[]", "torch 1.8"),
    ColumnMap("C++ frames through broadcastUniqueNCCLID / getNCCLComm / TCPStore::TCPStore / SocketConnectOp",
              "OBSERVATIONS.kind=init_failure name=nccl_unique_id|nccl_init|store|connect", "str", "-", "torch 1.8"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "exception": "the exception that ended (or interrupted) a rank; group = the op it was raised in",
    "init_failure": "a traceback raised in process-group set-up, at the stage its frames name",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The tracebacks of a text input. ReaderError when it holds none.

    The traceback a rank printed when it died (or when someone pressed Ctrl-C) says where that rank was: inside
    which torch.distributed op, called from which line of the application, with which error. Torch's own wrappers
    (torchrun's ``[rank3]:`` prefix, torch.multiprocessing's "-- Process 3 terminated with the following error:",
    pytest's ``E`` column) and chained exceptions are read as they are really posted, cut at the top or the bottom.

    Known limits:

    * Two writers without launcher prefixes that print at once interleave into one traceback (their frames mix).
    * Exception groups (``+ Exception Group Traceback``), tracebacks inside JSON strings (torchelastic's error file
      ``py_callstack``) and rich / IPython-formatted tracebacks are not read.
    * The op comes from the innermost ``distributed_c10d.py`` frame, a known framework wrapper, or — for a traceback
      cut before its end — the code line of its innermost frame; other wrappers leave ``group`` null.
    """
    found = scan(doc)
    events, stacks, obs = build(found.records, doc.path, FORMAT)
    if not stacks:
        raise ReaderError(doc.path, "no Python traceback or C++ backtrace found")
    return ReadResult(file=doc.path, format=FORMAT, events=schema.table_from_rows(schema.EVENTS, events),
                      stacks=stacks_table(stacks),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(found.skipped))
