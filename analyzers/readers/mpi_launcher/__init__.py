"""mpi_launcher: Open MPI's launcher saying how a process of the job ended (killed by signal N, the first to exit
non-zero, MPI_ABORT), read into ``rank_exit`` rows with the MPI_COMM_WORLD rank it names (the job's global rank under
Horovod / TensorRT-LLM / DeepSpeed's mpirun launch). Who failed first is then the rank_exit rule's to say.
Stages: :mod:`.signatures` -> :func:`read_doc`."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.mpi_launcher import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "read_doc"]

FORMAT = "mpi_launcher"
SOURCE = "mpi_launcher"
#: how far below "detected that one or more processes exited" its Process name / Exit code lines may sit
_BLOCK_LINES = 8

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("'mpirun noticed that process rank N with PID P on node H exited on signal S (Name).'",
              "OBSERVATIONS.kind=rank_exit name=signal rank=N value=S pid=P host=H", "int", "-", "Open MPI 1.6-5.x"),
    ColumnMap("'mpirun detected that one or more processes exited with non-zero status' + 'Process name: [[J,1],N]'"
              " + 'Exit code: E'", "OBSERVATIONS.kind=rank_exit name=exit rank=N value=E", "int", "-",
              "Open MPI 1.6-5.x"),
    ColumnMap("'mpirun has exited due to process rank N with PID P on node H exiting improperly'",
              "OBSERVATIONS.kind=rank_exit name=exit rank=N", "int", "-", "Open MPI 1.6-4.x"),
    ColumnMap("'MPI_ABORT was invoked on rank N in communicator C with errorcode E'",
              "OBSERVATIONS.kind=rank_exit name=exit value=E rank=N (MPI_COMM_WORLD only)", "int", "-",
              "Open MPI 1.6-5.x"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "rank_exit": "signal (value = the signal's number) | exit (value = the exit code, when stated): how the launcher "
                 "saw a rank end; detail = the launcher's line",
}


def _pid(text: str) -> int | None:
    return int(text) if text.isdigit() and text != "0" else None  # "PID 0" / "PID xxxxxx": not known


def read_doc(doc: TextDoc) -> ReadResult:
    """One ``rank_exit`` row per launcher statement (first line of each), ranks as stated. ReaderError when none."""
    rows: list[dict[str, Any]] = []
    lines = doc.lines
    for i, ln in enumerate(lines):
        text = ln.text[:4000]
        row: dict[str, Any] | None = None
        if m := sig.NOTICED.search(text):
            row = {"rank": int(m.group("rank")), "name": "signal", "value": int(m.group("sig")),
                   "pid": _pid(m.group("pid")), "host": m.group("node")}
        elif m := sig.IMPROPER.search(text):
            row = {"rank": int(m.group("rank")), "name": "exit", "value": None, "pid": _pid(m.group("pid"))}
        elif sig.DETECTED.search(text):
            rank = code = None
            for nxt in lines[i + 1:i + 1 + _BLOCK_LINES]:
                if rank is None and (p := sig.PROCESS_NAME.search(nxt.text[:400])):
                    rank = int(p.group("rank"))
                elif rank is not None and (c := sig.EXIT_CODE.search(nxt.text[:400])):
                    code = int(c.group("code"))
                    break
            row = {"rank": rank, "name": "exit", "value": code}
        elif m := sig.ABORT.search(text):
            code = m.group("code")
            if code is None and i + 1 < len(lines) and (c := sig.ERRORCODE.search(lines[i + 1].text[:400])):
                code = c.group("code")
            world = m.group("comm").rstrip(".,") == "MPI_COMM_WORLD"
            row = {"rank": int(m.group("rank")) if world else None, "name": "exit",
                   "value": int(code) if code is not None else None}
        if row is None:
            continue
        rows.append({"kind": "rank_exit", "detail": text.strip()[:300], "source": SOURCE, "file": doc.path,
                     "line": ln.no, **row})
    if not rows:
        raise ReaderError(doc.path, "no launcher statement")
    return ReadResult(file=doc.path, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, rows))
