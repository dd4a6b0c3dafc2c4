"""nccl_log: NCCL debug logs (``NCCL_DEBUG=INFO|WARN``, NCCL 2.18 – 2.30), often the only per-rank evidence of a
hung job: which communicators were built, which rank never finished building one, which op each rank enqueued.
Stages: :mod:`.scan` (bytes -> chunks, COLL records in bulk) -> :mod:`.interpret` (lines in order -> communicators,
``seq``, observations) -> :mod:`.tables` (Arrow tables); patterns in :mod:`.grammar`."""
from __future__ import annotations

import dataclasses
import io

from pathlib import Path

from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped
from ranktrace.analyzers.readers.nccl_log.grammar import (NCCL_DTYPES, OLD_FORMAT_RE, SNIFF_RE, looks_binary,
                                                          normalize_comm_id)
from ranktrace.analyzers.readers.nccl_log.interpret import Reader
from ranktrace.analyzers.readers.nccl_log.tables import NUL_NOTE as _NUL_NOTE, build_result
from ranktrace.analyzers.readers.text import TextDoc

__all__ = [
    "FORMAT",
    "FIELD_MAP",
    "OBSERVATION_KINDS",
    "NCCL_DTYPES",
    "sniff",
    "read", "read_doc",
    "normalize_comm_id",
]

FORMAT = "nccl_log"

#: How COLL-line fields become EVENTS columns (formats.md §1.2, §1.6).
FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("host:pid:tid prefix", "host, pid, tid", "str, int, int", "required", "2.18"),
    ColumnMap("[timestamp] prefix", "wall_ns", "int ns, local time read as UTC", "null", "2.26.2"),
    ColumnMap("<Op>", "name", "str -> canonical_op()", "required", "2.18"),
    ColumnMap("<Op> in Send/Recv/PutSignal/Signal/WaitSignal", "category", "p2p | collective", "collective", "2.18"),
    ColumnMap("comm <ptr> -> Init line commId", "group", "str 0x<hex>; comm:<ptr> without Init", "comm:<ptr>", "2.18"),
    ColumnMap("comm <ptr> -> Init line rank", "rank", "int, communicator rank", "null", "2.18"),
    ColumnMap("(line order per comm; per comm+src+dst for p2p) | opCount+1", "seq", "int, 1-based (docstring)",
              "required", "2.18"),
    ColumnMap("opCount", "backend_seq", "int from hex", "required", "2.18"),
    ColumnMap("root (Send/Recv)", "peer", "int, communicator rank", "null", "2.18"),
    ColumnMap("datatype", "dtype", "ncclDataType_t -> torch name", "null", "2.18 (fp8: 2.24)"),
    ColumnMap("count x sizeof(datatype)", "nbytes", "int", "null", "2.18"),
    ColumnMap("comm <ptr>, root (Broadcast/Reduce/Gather/Scatter)", "detail", "comm=<ptr> [root=<r>]", "", "2.18"),
    ColumnMap("(largest nranks in file)", "world", "int", "null", "2.18"),
    ColumnMap("(constant)", "kind, backend, source", "enter, nccl, nccl", "-", "-"),
)

#: Observation kinds this reader emits, and what their columns mean.
OBSERVATION_KINDS: dict[str, str] = {
    "nccl_version": "detail=version string (e.g. 2.27.7+cuda13.0); host/pid when an INFO line",
    "nccl_init_start": "group=commId, rank=comm rank, value=nranks, name=comm pointer, detail=api/cudaDev/busId/...",
    "nccl_init_complete": "same columns as nccl_init_start",
    "nccl_bootstrap": "detail=bootstrap line text (interface, timings, root errors)",
    "nccl_topology": "name=summary|ring|tree|channels, detail=line text (channel 0 only for rings/trees)",
    "nccl_transport": "name=<rank>-><peer>, detail=P2P/IPC|P2P/CUMEM|P2P/direct|SHM|NET/IB|NET/Socket|..., "
                      "value=number of channel lines, rank=printing comm rank",
    "nccl_warn": "WARN lines and INFO error trail lines (file:line -> code): name=file:line, detail=message, "
                 "value=ncclResult_t code when the trail states one",
    "nccl_destroy": "Destroy/Abort/Revoke START|COMPLETE: group=commId, rank, name=comm pointer, detail=what",
    "completion": "name=nccl_destroy per Destroy COMPLETE: group, rank, detail=the line",
    "init_failure": "name=connect|nccl_init: a set-up failure before Init COMPLETE; detail=file:line: message",
    "transport_error": "name=nccl_warn (a failure WARN after Init COMPLETE) | cuda_error (Cuda failure WARN) | "
                       "net_error (NET/IB completion error / receive size check, whenever it comes)",
    "nccl_mismatch": "NCCL's own 'Mismatched collective detected' WARN (<= 2.7): name=file:line, value=the rank it names "
                     "'at and around' (a hint, never a culprit), detail=message; a WARN without host:pid:tid counts, "
                     "for no rank",
    "nccl_seq_basis": "per communicator: group, rank, detail=line|opcount|line_from_log_start, value=COLL lines",
    "rank_space": "per non-world communicator: group=commId, rank=comm rank, detail=comm:<commId>, value=nranks",
    "nccl_setting": "what NCCL was told or decided, once per process (and communicator): name=NCCL_* variable "
                    "(ENV echo line) | network | nvls_multicast dev <d> | p2p_disabled | ring_pxn_gdr | p2p_type | "
                    "cuda_driver, detail=the value (NVL, IB, available, GPU 6 - GPU 7, PXN 0 GDR 1, 12.8, ...)",
    "nccl_tuning": "TUNING lines counted per process, op and algorithm/protocol: name=op, detail=<ALGO>/<PROTO> "
                   "bytes=<min>..<max>, value=calls; group/rank when the communicator is clear",
}


def sniff(path: Path, head: bytes) -> bool:
    """True when the content has an NCCL debug line (``host:pid:tid [dev] NCCL INFO|WARN``) or a version line.

    The head decides; when it has no NCCL line (a long program preamble before NCCL starts), up to 4 MiB more of
    the file are searched. Binary content is never an NCCL log.
    """
    text = head.lstrip(b"\0")   # a leading run of NULs: a sparse hole or a copytruncate'd log, not binary
    if not head or (text and looks_binary(text)):
        return False
    if SNIFF_RE.search(text.replace(b"\0", b"")):
        return True
    try:
        with open(path, "rb") as f:
            more = f.read(4 << 20).lstrip(b"\0")
    except OSError:
        return False
    return bool(more) and not looks_binary(more) and bool(SNIFF_RE.search(more.replace(b"\0", b"")))


def read(path: Path) -> ReadResult:
    """Read one NCCL debug log. Raises ``ReaderError`` if it cannot be opened or holds no NCCL line at all.

    What comes out:

    * EVENTS ``kind="enter"`` per COLL line (collectives and Send/Recv), ``source="nccl"``. ``group`` is the
      communicator's ``commId`` taken from the Init lines of the same process: a ``comm 0x...`` pointer is
      process-local, so ranks of one communicator are matched by commId, never by pointer. When no Init line of that
      pointer was seen, ``group="comm:<ptr>"`` and a ``Skipped`` note says so. ``rank`` is the communicator rank,
      ``peer`` (Send/Recv) is a communicator rank too: NCCL-log-only ranks are communicator-local (``rank_space``
      observations below).
    * OBSERVATIONS: ``nccl_version``, ``nccl_init_start``, ``nccl_init_complete``, ``nccl_bootstrap``,
      ``nccl_topology``, ``nccl_transport``, ``nccl_warn``, ``nccl_destroy``, ``nccl_seq_basis``, ``rank_space``,
      ``nccl_setting`` and ``nccl_tuning`` (what ``trace compare`` sets side by side; see
      ``OBSERVATION_KINDS``), and the statement rows of docs/EVIDENCE.md: ``completion`` ``nccl_destroy`` per ``Destroy
      COMPLETE``; ``init_failure`` (stage ``connect``: socket connects refused / timed out / retries exceeded;
      ``nccl_init``: bootstrap and system errors) for a failure WARN, a ``Call to connect`` retry line or a bootstrap
      error trail before that communicator's (without one: before the process's first) Init COMPLETE,
      ``transport_error`` ``nccl_warn`` for one after it; ``transport_error`` ``cuda_error`` for ``Cuda failure`` WARNs.
      One row per process and kind of failure, at its first line (``Reader._failure``).

    How ``seq`` is defined (decided per communicator, i.e. per ``(host, pid, comm pointer)`` life):

    1. The Init line of the communicator is in this file (the log covers its whole life): ``seq`` = 1-based order of
       that communicator's collective COLL lines. ``opCount`` is *not* used, because it counts kernel plans, not calls:
       ops in one ``ncclGroupStart/End`` share a value, P2P-heavy code steps by 2, and from 2.27 it stays ``0`` on
       communicators without network work — possibly on some ranks of a communicator and not on others
       (formats.md §1.6). Line order is the same on every rank of a communicator that ran the same code.
    2. No Init line (the log starts mid-run, or INIT was filtered out) and ``opCount`` is non-zero and never decreases:
       ``seq = opCount + 1``, the only position that survives a cut log head (approximate: grouped ops share it).
       Never from NCCL 2.27 on (a version line says so, or a communicator's COLL lines all say ``opCount 0``): there
       it stays 0 on communicators without network work, on some ranks and not others, so it matches no rank's
       position with another's (NVIDIA/nccl#2021).
    3. Otherwise: line order counted from the start of the file, with a ``Skipped`` note (positions are relative).

    Send/Recv lines count separately, per ``(communicator, src, dst)`` pair, so a Send on rank a and the
    matching Recv on rank b get the same ``seq``. ``backend_seq`` always carries the raw ``opCount``. The basis chosen
    is reported per communicator as an ``nccl_seq_basis`` observation.

    Speed and memory: the file is streamed in 4 MiB chunks cut at line ends, so memory for the input stays bounded
    however big the log is. In each chunk numpy finds every "NCCL" and the line ends; the lines holding exactly one
    "NCCL" that pyarrow's RE2 confirms as COLL records (the bulk of big logs) are parsed in bulk: their tokens are
    bounded by the spaces after "NCCL", numbers are read eight digits at a time, prefixes and comm pointers are
    dictionary-encoded and resolved once per distinct value. Every other line containing "NCCL" goes through the
    reference regex loop (one ``re.finditer`` of ``SCAN_RE``, whose pattern starts with the literal ``NCCL``), except
    lines such as TUNING ones that provably cannot match it. The rarer lines (Init, teardown, ...) change what a COLL
    line resolves to, so they split the COLL lines into runs processed in line order; runs shorter than
    ``_VEC_MIN_ROWS`` and chunks under ``_VEC_MIN_BYTES`` use the regex loop. Both paths give the same rows (tested).
    What a chunk leaves is one int64 row of 9 fields per COLL line in Arrow's memory pool; at the end those blocks
    become EVENTS record batches one by one (each block freed once converted), so the peak is about the EVENTS table
    plus the blocks, i.e. proportional to the output, not to the input. NUL bytes are dropped before lines are cut
    (sparse holes, ``logrotate copytruncate``; a hole is skipped with ``SEEK_DATA``) and counted in one ``Skipped``.
    ``bench/bench_nccl_log_parse.py`` measures speed and peak memory.

    ``detail`` of a COLL event is ``comm=<pointer>`` (it joins torch's ``ProcessGroupNCCL created ncclComm_ 0x...``
    line) plus ``root=<r>`` for Broadcast / Reduce / Gather / Scatter.

    Tolerated: NCCL < 2.3 lines without the word ``NCCL`` (``host:pid:tid [0] INFO ...``, read from excerpts opened by
    the shared opener), launcher prefixes before the ``host:pid:tid`` marker (``[rank0]:``, ``[default0]:``, Ray
    ``(RayWorker pid=1) ``, compose ``svc_1  | ``, ``12: ``, progress bars glued in front), NCCL ≥2.26 timestamps,
    WARN ``file:line (func)`` parts, two records glued on one physical line, a truncated last line, ``\\r\\n`` ends.

    Known limits:

    * A progress bar glued to the host name without a separator (``...-1mew0:64904:...``) makes the host ambiguous;
      it is repaired to the host of the same pid whose name it ends with. Its COLL line is matched to its
      communicator only when a clean line of that process came first (the norm: NCCL prints Init lines before ops).
    * Input memory is bounded (one chunk); the result is not: 72 bytes per COLL line while reading, then the EVENTS
      table, about 190 bytes per row (a 10 GB COLL log yields tens of millions of rows).
    * Transport, ring, tree and bootstrap lines do not name their communicator; they are attributed to the
      communicator whose Init START the same thread printed last (topology, bootstrap) or to the last communicator of
      the process with that rank (transports, which proxy threads print). ``group`` stays null when that is unclear.
    * Split communicators (2.23+) print no ``commId``; they are grouped by parent commId + color
      (``split:<parent commId>:<color>``), which formats.md marks as not verified unique.
    * Timestamps (``[%F %T]`` default format only) are local time of the node; they are read as UTC.
    * ``world_size`` is the largest ``nranks`` seen; for a file that only holds sub-communicators it is their size.
    * RCCL / NCCLX / MSCCL variants are not covered; RCCL fields appended after ``stream`` are ignored.
    * NUL bytes are dropped wherever they are (a record cut by NULs reads as if they were not there). ``sniff`` looks
      at 4 MiB past leading NULs, so a file that starts with a longer hole is only read when named explicitly. A COLL
      record with a number beyond 64 bits is a torn line; a "line" longer than 64 MiB is cut.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    with f:
        head = f.read(65536)
        if not head:
            return ReadResult(file=str(path), format=FORMAT,
                              skipped=(Skipped(str(path), None, "empty file"),))
        text = head.lstrip(b"\0")  # leading NULs (sparse hole, copytruncate) are dropped while reading
        if text and looks_binary(text) and not SNIFF_RE.search(text):
            raise ReaderError(path, "binary content, not an NCCL debug log")
        f.seek(0)
        r = Reader(path)
        try:
            r.run(f)
        except OSError as e:
            raise ReaderError(path, f"read failed: {e.strerror or e}") from e
    return _result(path, r)


def read_doc(doc: TextDoc) -> ReadResult:
    """The NCCL lines of a text input opened by the shared opener. A big plain file is streamed from disk as
    ``read`` does (the opener's copy would cost memory for nothing); an excerpt is read from the opener's lines
    (ANSI codes removed, wrapped lines joined, its NCCL-specific prefixes kept)."""
    path = Path(doc.path)
    try:
        big = path.stat().st_size > _STREAM_FROM_DISK
    except OSError:
        big = False
    if big and not path.name.endswith(".gz"):
        res = read(path)
        if any("NUL" in n.reason for n in doc.notes):  # the opener said the holes: said once
            res = dataclasses.replace(res, skipped=tuple(s for s in res.skipped if not s.reason.endswith(_NUL_NOTE)))
        return res
    text = doc.raw_text()
    if "NCCL INFO" not in text and "NCCL WARN" not in text:
        text = OLD_FORMAT_RE.sub(r"\1NCCL \2 ", text)   # NCCL < 2.3: "host:pid:tid [0] INFO ..." without "NCCL"
    r = Reader(path)
    r.run(io.BytesIO(text.encode("utf-8", errors="replace")))
    return _result(path, r)


_STREAM_FROM_DISK = 32 << 20


def _result(path: Path, r: Reader) -> ReadResult:
    if r.n_marker_lines == 0 and not r.versions:
        nuls = f" ({r.nul_bytes} NUL bytes: a sparse or zeroed file)" if r.nul_bytes else ""
        raise ReaderError(path, f"no NCCL debug line (host:pid:tid [dev] NCCL INFO|WARN ...) found{nuls}")
    return build_result(r, FORMAT)
