"""nccl_ras: NCCL RAS client output (``ncclras``, ``echo status | nc localhost 28028``; text or JSON, NCCL ≥ 2.24)
read into OBSERVATIONS: per communicator how many ops each rank launched, which ranks did not answer, which
processes are dead. Stages: :mod:`.scan_text` / :mod:`.scan_json` (output -> rows) -> :mod:`.rows` (world size)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped, binary_content, without_nuls
from ranktrace.analyzers.readers.nccl_ras.rows import finish
from ranktrace.analyzers.readers.nccl_ras.scan_json import scan_json
from ranktrace.analyzers.readers.nccl_ras.scan_text import scan_text
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "sniff", "read", "read_doc"]

FORMAT = "nccl_ras"


#: How RAS fields become OBSERVATIONS columns.
FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("#g-c (hash) | communicators[].hash", "group", "str 0x<hex>", "required", "2.24"),
    ColumnMap("Rank N | ranks[].rank | missing_ranks[].rank", "rank", "int, communicator rank", "null", "2.24"),
    ColumnMap("launched up to operation V | collective_counts", "value", "int", "null", "2.24 (JSON 2.28.7)"),
    ColumnMap("different <Op> operation counts | collective_counts key", "name", "canonical op | total",
              "total", "2.26"),
    ColumnMap("managed by process P on node H | pid, host", "pid, host", "int, str", "null", "2.24"),
    ColumnMap("status{init_state,...} | ranks have status X", "name (ras_rank_status)", "str", "null", "2.24"),
    ColumnMap("timestamp (JSON, monitor)", "wall_ns", "ns, local time read as UTC", "null", "2.28.7"),
    ColumnMap("(query index in file)", "detail snapshot=<n>", "int", "1", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "ras_op_count": "group=comm hash, rank, name=total|<op>, value=ops launched, detail=snapshot, listed/inferred",
    "ras_missing_rank": "group, rank, pid/host when printed; detail=unresponsive/considered_dead",
    "ras_dead_rank": "group, rank of a process RAS considers dead",
    "ras_missing_process": "pid, host, detail=GPUs of a process RAS got no data from",
    "ras_dead_process": "pid, host, detail=GPUs of a process RAS considers dead",
    "ras_rank_status": "group, rank, name=RUNNING|INIT|FINALIZE|ABORT|NOCOMM|UNKNOWN, value=init_state (JSON)",
    "ras_mismatch": "group, name=what differs, detail=value groups 'VALUExCOUNT ...'",
    "ras_error": "group, detail=the ERROR block text",
    "ras_comm_status": "name=#<group>, value=ranks per comm, detail=comms/nodes/status/errors",
    "ras_event": "monitor event: name=event, detail=peer/details",
    "rank_space": "communicator smaller than the largest: group, detail=comm:<hash>, value=size",
}


def sniff(path: Path, head: bytes) -> bool:
    """True for RAS text (``Job summary`` / ``Communicators...`` / ``#0-0 (hash) MISMATCH`` / monitor banner) or
    RAS JSON (``"communicators"`` with ``"collective_counts"``/``"missing_ranks"``, or a monitor event)."""
    if not head or binary_content(head):
        return False
    head = without_nuls(head)[0]
    h = head.lstrip()
    if h.startswith(b"{") or h.startswith(b"["):
        return (b'"communicators"' in head and (b'"ranks"' in head or b'"hash"' in head)) or (
            b'"event"' in head and b'"group"' in head and b'"peer"' in head)
    return bool(
        (b"Job summary" in head and b"Communicators" in head)
        or re.search(rb"(?m)^#\d+-\d+ \([0-9a-f]{8,16}\) (?:MISMATCH|INCOMPLETE|ERROR)", head)
        or b"RAS Monitor Mode" in head
        or re.search(rb"PEER_DEAD: Process \d+ on node", head))


def read(path: Path) -> ReadResult:
    """Read one file of RAS output. Raises ``ReaderError`` if it cannot be opened or holds no RAS output.

    RAS is the cheapest live view of a hung NCCL job (formats.md §1.10; NCCL
    ``docs/userguide/source/troubleshooting/ras.rst``; output code in ``src/ras/client_support.cc``).

    What comes out (OBSERVATIONS only, ``source="ras"``; ``group`` is the communicator hash spelled like NCCL's Init
    lines, ``0x`` + lower-case hex, see ``nccl_log.normalize_comm_id``; ``rank`` is the communicator rank):

    * ``ras_op_count`` — ``value`` = operations launched by that rank; ``name`` = ``total`` (2.24/2.25 text, and the
      sum over types in JSON) or the canonical op (``all_reduce``, ... : 2.26+ per-type counts).
    * ``ras_missing_rank`` / ``ras_dead_rank`` — a rank RAS got no data from / whose process RAS declared dead.
    * ``ras_missing_process`` / ``ras_dead_process`` — the same per process (``pid``, ``host``; no rank).
    * ``ras_rank_status`` — ``name`` = RUNNING | INIT | FINALIZE | ABORT | NOCOMM | UNKNOWN per rank.
    * ``ras_mismatch`` — one per ``#g-c (hash) MISMATCH`` reason; ``detail`` lists the value groups
      (``6650x26 6649x6``). ``ras_error`` — ``#g-c (hash) ERROR`` blocks. ``ras_comm_status`` — the summary table
      rows (``name`` = ``#<group>``, ``value`` = ranks per communicator).
    * ``ras_event`` — monitor-mode events other than PEER_DEAD; ``rank_space`` for communicators smaller than the
      largest one (their ranks are communicator-local).

    Text output lists rank numbers only for *outlier* groups (at most 25 % of the ranks and at most 10 of them;
    < 50 % in verbose mode) — and the outliers may be the ranks that are **ahead**, not behind: the listed ranks are
    tagged ``listed`` and every count is kept, so the analyzer compares values rather than trusting "who is listed".
    When exactly one value group of a communicator is unlisted and the communicator size is known from the summary
    table, its ranks are inferred (all ranks minus the listed ones, tagged ``inferred``); otherwise the group is kept
    as one row with ``rank`` null and ``detail`` ``ranks=N unlisted``.

    Several queries in one file (repeated ``ncclras`` runs, monitor streams, concatenated JSON documents) are kept
    apart with ``snapshot=<n>`` in ``detail``: a count that does not move between snapshots is the hang signal.

    Known limits: the text format changes between releases (the docs say so; JSON is preferred); pre-2.26 text has a
    single "collective operation counts" mismatch per communicator; monitor-mode text events other than PEER_DEAD
    are kept as ``ras_event`` only; JSON/monitor timestamps are local time of the node, read as UTC.
    """
    path = Path(path)
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if not data.strip():
        return ReadResult(file=file, format=FORMAT, skipped=(Skipped(file, None, "empty file"),))
    if binary_content(data):
        raise ReaderError(path, "binary content, not NCCL RAS output")
    skipped: list[Skipped] = []
    data, nuls = without_nuls(data)
    if nuls:
        skipped.append(Skipped(file, None, f"{nuls} NUL byte(s) dropped (a hole left by a crash or a copy)"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", "replace")
        skipped.append(Skipped(file, data.count(b"\n", 0, e.start) + 1,
                               "bytes that are not UTF-8 (mixed encodings); decoded with replacement characters"))
    return _from_text(path, text, skipped)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (its notes are the opener's)."""
    return _from_text(Path(doc.path), doc.canonical_text(), [])


def _from_text(path: Path, text: str, skipped: list[Skipped]) -> ReadResult:
    file = str(path)
    obs: list[dict[str, Any]] = []
    version: str | None = None
    if text.lstrip().startswith(("{", "[")):
        version = scan_json(text, file, obs, skipped)
    else:
        scan_text(text, file, obs, skipped)
    if not obs:
        raise ReaderError(path, "no NCCL RAS communicator, rank or process information found")
    obs, world = finish(obs, file)
    return ReadResult(file=file, format=FORMAT, version=version,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped),
                      world_size=world)
