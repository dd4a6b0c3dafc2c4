"""Read one NCCL debug log (``NCCL_DEBUG=INFO|WARN``, NCCL 2.18 – 2.30) into EVENTS and OBSERVATIONS.

Why: the NCCL log is often the only per-rank evidence a user has of a hung job. Its Init lines say which
communicators were built and which rank never finished building one; its COLL lines (``NCCL_DEBUG_SUBSYS=COLL``)
say which op each rank *enqueued* at each position, so ranks that stopped early or called another op stand out
(formats.md §1; DESIGN §2: an enqueued op is not a finished op).

What comes out:

* EVENTS ``kind="enter"`` per COLL line (collectives and Send/Recv), ``source="nccl"``. ``group`` is the
  communicator's ``commId`` taken from the Init lines of the same process: a ``comm 0x...`` pointer is process-local,
  so ranks of one communicator are matched by commId, never by pointer. When no Init line of that pointer was seen,
  ``group="comm:<ptr>"`` and a ``Skipped`` note says so. ``rank`` is the communicator rank, ``peer`` (Send/Recv) is
  a communicator rank too: NCCL-log-only ranks are communicator-local (``rank_space`` observations below).
* OBSERVATIONS: ``nccl_version``, ``nccl_init_start``, ``nccl_init_complete``, ``nccl_bootstrap``,
  ``nccl_topology``, ``nccl_transport``, ``nccl_warn``, ``nccl_destroy``, ``nccl_seq_basis`` and ``rank_space``
  (see ``OBSERVATION_KINDS``).

How ``seq`` is defined (decided per communicator, i.e. per ``(host, pid, comm pointer)`` life):

1. The Init line of the communicator is in this file (the log covers its whole life): ``seq`` = 1-based order of
   that communicator's collective COLL lines. ``opCount`` is *not* used, because it counts kernel plans, not calls:
   ops in one ``ncclGroupStart/End`` share a value, P2P-heavy code steps by 2, and from 2.27 it stays ``0`` on
   communicators without network work — possibly on some ranks of a communicator and not on others
   (formats.md §1.6). Line order is the same on every rank of a communicator that ran the same code.
2. No Init line (the log starts mid-run, or INIT was filtered out) and ``opCount`` is non-zero and never decreases:
   ``seq = opCount + 1``, the only position that survives a cut log head (approximate: grouped ops share it).
3. Otherwise: line order counted from the start of the file, with a ``Skipped`` note (positions are relative).

Send/Recv lines count separately, per ``(communicator, src, dst)`` pair (DESIGN §3), so a Send on rank a and the
matching Recv on rank b get the same ``seq``. ``backend_seq`` always carries the raw ``opCount``. The basis chosen
is reported per communicator as an ``nccl_seq_basis`` observation.

Speed and memory: the file is streamed in 4 MiB chunks cut at line ends, so memory for the input stays bounded
however big the log is. In each chunk numpy finds every "NCCL" and the line ends; the lines holding exactly one
"NCCL" that pyarrow's RE2 confirms as COLL records (the bulk of big logs) are parsed in bulk: their tokens are
bounded by the spaces after "NCCL", numbers are read eight digits at a time, prefixes and comm pointers are
dictionary-encoded and resolved once per distinct value. Every other line containing "NCCL" goes through the
reference regex loop (one ``re.finditer`` of ``_SCAN_RE``, whose pattern starts with the literal ``NCCL``), except
lines such as TUNING ones that provably cannot match it. The rarer lines (Init, teardown, ...) change what a COLL line
resolves to, so they split the COLL lines into runs processed in line order; runs shorter than ``_VEC_MIN_ROWS``
and chunks under ``_VEC_MIN_BYTES`` use the regex loop. Both paths give the same rows (tested). What a chunk
leaves is one int64 row of 9 fields per COLL line in Arrow's memory pool; at the end those blocks become EVENTS
record batches one by one (each block freed once converted), so the peak is about the EVENTS table plus the
blocks, i.e. proportional to the output, not to the input. NUL bytes are dropped before lines are cut (sparse
holes, ``logrotate copytruncate``; a hole is skipped with ``SEEK_DATA``) and counted in one ``Skipped``.
``bench/bench_nccl_log_parse.py`` measures speed and peak memory.

``detail`` of a COLL event is ``comm=<pointer>`` (it joins torch's ``ProcessGroupNCCL created ncclComm_ 0x...``
line) plus ``root=<r>`` for Broadcast / Reduce / Gather / Scatter.

Tolerated: launcher prefixes before the ``host:pid:tid`` marker (``[rank0]:``, ``[default0]:``, Ray
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
from __future__ import annotations

import errno
import io
import os
import re
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analyzers import schema
from analyzers.opnames import canonical_op
from analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped

__all__ = [
    "FORMAT",
    "COLUMN_MAP",
    "ColumnMap",
    "OBSERVATION_KINDS",
    "NCCL_DTYPES",
    "sniff",
    "read",
    "normalize_comm_id",
]

FORMAT = "nccl_log"


#: How COLL-line fields become EVENTS columns (formats.md §1.2, §1.6).
COLUMN_MAP: tuple[ColumnMap, ...] = (
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
    "nccl_seq_basis": "per communicator: group, rank, detail=line|opcount|line_from_log_start, value=COLL lines",
    "rank_space": "per non-world communicator: group=commId, rank=comm rank, detail=comm:<commId>, value=nranks",
}

#: ncclDataType_t -> (torch dtype name, bytes per element), formats.md §1.6.
NCCL_DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8_e4m3fn", 1),
    11: ("float8_e5m2", 1),
}

_P2P_RAW = frozenset({b"Send", b"Recv", b"PutSignal", b"Signal", b"WaitSignal"})
_ROOTED_RAW = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})

_CHUNK = 4 << 20
_MAX_CARRY = 64 << 20          # a "line" longer than this is cut (binary junk without newlines)
_PREFIX_CACHE_MAX = 200_000
_BATCH_ROWS = 1 << 16       # small blocks are merged up to this many rows per record batch of the result

# COLL lines: the pattern starts with a literal so `finditer` skips ahead in C.
_COLL_RE = re.compile(
    rb"NCCL INFO (\w+): opCount ([0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (\d+) datatype (\d+) "
    rb"op \d+ root (-?\d+) comm (0x[0-9a-fA-F]+) \[nranks=\d+\]"
)
# One scan per chunk finds COLL records (groups 1-6) and the rarer lines worth a per-line parse (Init, teardown,
# transports, rings, trees, bootstrap, WARN, error trail, bare version line; no group set). It starts with the
# literal "NCCL" so sre's prefix search runs in C; TUNING and other INFO lines fail a few bytes after "INFO ".
_SCAN_RE = re.compile(
    _COLL_RE.pattern[:5] + b"(?:" + _COLL_RE.pattern[5:] + rb"|WARN |version \d|INFO (?:NCCL version"
    rb"|(?:\[Rank \d+\] )?(?:\w+ )?comm 0x|Channel (?:00/|\d+(?:/\d+)? : \d+\[)|Trees \[0\]|Bootstrap|bootstrap"
    rb"|\d+ coll channels|[\w./+-]+:\d+ (?:\([^)\n]*\) )?-> ))"
)
_NRANKS_RE = re.compile(rb"\[nranks=(\d+)\]")
# The part of a line before "NCCL INFO" of a COLL line, parsed from its end.
_COLL_PREFIX_RE = re.compile(
    rb"(?:\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\] )?([^\s:\[\]|()<>]+):(\d+):(\d+)(?: \[(\d+)\])? \Z"
)
# Any NCCL line (formats.md §1.2 tolerant pattern, never anchored at column 0).
_MARKER_RE = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\] )?"
    r"(?P<host>[^\s:\[\]|()<>]+):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?"
    r"(?:(?P<elapsed>\d+\.\d+) )?"
    r"(?:(?P<file>[\w./+-]+):(?P<fline>\d+) (?:\((?P<func>[^)]*)\) )?)?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT) "
)
_BARE_VERSION_RE = re.compile(r"(?:^|\s|\])NCCL version (?P<v>\d+\.\d+\.\d+\S*)")

_INIT_RE = re.compile(r"- Init (START|COMPLETE)\s*$")
_FIELD_RES: dict[str, re.Pattern[str]] = {
    "comm": re.compile(r"\bcomm (0x[0-9a-fA-F]+)"),
    "rank": re.compile(r"\brank (-?\d+)"),
    "nranks": re.compile(r"\bnranks (\d+)", re.IGNORECASE),
    "cudaDev": re.compile(r"\bcudaDev (-?\d+)"),
    "nvmlDev": re.compile(r"\bnvmlDev (-?\d+)"),
    "busId": re.compile(r"\bbusId ([0-9a-fA-Fx]+)"),
    "commId": re.compile(r"\bcommId (0x[0-9a-fA-F]+)"),
    "parent": re.compile(r"\bparent (0x[0-9a-fA-F]+|\(nil\))"),
    "color": re.compile(r"\bcolor (-?\d+)"),
    "key": re.compile(r"\bkey (-?\d+)"),
}
_API_RE = re.compile(r"^(?:\[Rank \d+\] )?(nccl\w+) comm ")
_SUMMARY_RE = re.compile(
    r"^comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)(?: MNNVL (\d+))?"
)
_TEARDOWN_RE = re.compile(
    r"comm (0x[0-9a-fA-F]+) rank (-?\d+) n[Rr]anks (\d+).*- (Destroy|Abort|Revoke) (START|COMPLETE)"
)
_TRANSPORT_RE = re.compile(
    r"^Channel (\d+)(?:/(\d+))? : (\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[[0-9a-fA-Fx]+\]"
    r"(?: \[(send|receive)\])? via (.+?)\s*$"
)
_RING_RE = re.compile(r"^Channel 00/(\d+) :((?: +\d+)+)")
_TRAIL_RE = re.compile(
    r"^(?P<file>[\w./+-]+):(?P<line>\d+) (?:\((?P<func>[^)]*)\) )?-> (?P<code>\d+)(?P<rest>.*)$"
)


def normalize_comm_id(raw: str) -> str:
    """One spelling of a communicator hash: ``0x`` + lower-case hex without leading zeros.

    NCCL's Init lines print ``commId 0x%llx``; RAS text prints ``%016lx`` and RAS JSON ``"0x..."``.

    >>> normalize_comm_id("0x54FE282D32A87D85"), normalize_comm_id("027a079b828ff1a75")
    ('0x54fe282d32a87d85', '0x27a079b828ff1a75')
    """
    s = raw.strip().lower()
    try:
        return f"0x{int(s, 16):x}"
    except ValueError:
        return s


# --------------------------------------------------------------------------------------------------- sniffing

_SNIFF_RE = re.compile(
    rb"[^\s:\[\]|()<>]+:\d+:\d+ (?:\[\d+\] )?(?:\S+ )?(?:\([^)]*\) )?NCCL (?:INFO|WARN|TRACE|CALL) |"
    rb"(?:^|\n)NCCL version \d+\.\d+\.\d+"
)


def _looks_binary(data: bytes) -> bool:
    if not data:
        return False
    sample = data[:65536]
    if sample.count(b"\x00") > 0:
        return True
    ctrl = sum(sample.count(bytes([c])) for c in range(1, 32) if c not in (9, 10, 13, 27))
    return ctrl > len(sample) // 20


def sniff(path: Path, head: bytes) -> bool:
    """True when the content has an NCCL debug line (``host:pid:tid [dev] NCCL INFO|WARN``) or a version line.

    The head decides; when it has no NCCL line (a long program preamble before NCCL starts), up to 4 MiB more of
    the file are searched. Binary content is never an NCCL log.
    """
    text = head.lstrip(b"\0")   # a leading run of NULs: a sparse hole or a copytruncate'd log, not binary
    if not head or (text and _looks_binary(text)):
        return False
    if _SNIFF_RE.search(text):
        return True
    try:
        with open(path, "rb") as f:
            more = f.read(4 << 20).lstrip(b"\0")
    except OSError:
        return False
    return bool(more) and not _looks_binary(more) and bool(_SNIFF_RE.search(more))


# --------------------------------------------------------------------------------------------------- reading

@dataclass(slots=True)
class _Comm:
    """One communicator life inside one process (``(host, pid, comm pointer)`` until destroyed)."""

    idx: int
    host: str
    pid: int
    ptr: str
    group: str
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    init_seen: bool = False
    started: bool = False
    init_line: int | None = None
    info: dict[str, str] = field(default_factory=dict)
    n_coll: int = 0
    first_coll_line: int | None = None
    p2p: dict[tuple[int | None, int], int] = field(default_factory=dict)


#: Integers kept per COLL row (one ``(rows, 9)`` int64 block per chunk: no Python object outlives its chunk).
_META = ("line", "ii", "ci", "seq", "opc", "op", "dt", "count", "root")
_NMETA = len(_META)
_I63 = (1 << 63) - 1

# ---- vectorised COLL parsing (numpy over the bytes of one chunk; see _fast_rows)

_VEC_MIN_BYTES = 32 << 10     # smaller chunks go through the regex loop only
_VEC_MIN_ROWS = 48            # a run of fewer COLL lines between two rarer lines is not worth the numpy set-up
_MAX_PREFIX = 512             # longer text before "NCCL INFO" (glued garbage): the line goes to the regex loop
_TAIL = 1024                  # bytes a numpy-parsed COLL record may span after "NCCL" (tokens are capped below)


#: ``_COLL_RE`` in RE2 syntax with the classes spelled out (bytes-pattern ``\w``, ``\S``, ``\d`` are ASCII), run by
#: pyarrow over the lines of a chunk. It may only reject more than ``_COLL_RE`` (RE2 reads invalid UTF-8 bytes one
#: at a time, so ``[^ \t...]`` never swallows a space), and a line it rejects goes to the regex loop.
_COLL_RE2 = (r"NCCL INFO [0-9A-Za-z_]+: opCount [0-9a-fA-F]+ sendbuff [^ \t\n\r\x0b\x0c]+ "
             r"recvbuff [^ \t\n\r\x0b\x0c]+ count [0-9]+ datatype [0-9]+ op [0-9]+ root -?[0-9]+ "
             r"comm 0x[0-9a-fA-F]+ \[nranks=[0-9]+\]")
_U64 = np.uint64
#: keep the last k bytes of a little-endian 8-byte word (k = 0..8)
_KEEP = np.array([0] + [((1 << (8 * k)) - 1) << (8 * (8 - k)) for k in range(1, 9)], dtype=np.uint64)
_ZEROS8 = _U64(0x3030303030303030)


def _word(text: bytes) -> np.uint64:
    return _U64(int.from_bytes(text.ljust(8, b"\0"), "little"))


_MASK6 = _U64((1 << 48) - 1)
_INFO6 = _word(b" INFO ")
_OPCOUNT8 = _word(b"opCount ")
_BOOT8 = _word(b"Bootstra")
_BOOT8_LOWER = _word(b"bootstra")


def _block(rows: int) -> np.ndarray:
    """An uninitialised (rows, _NMETA) int64 block in Arrow's memory pool: once a block has become EVENTS rows and
    is dropped, the pool reuses its memory for the next rows (numpy's heap would keep it to itself)."""
    return np.frombuffer(pa.allocate_buffer(rows * _NMETA * 8), dtype=np.int64).reshape(rows, _NMETA)


def _rows(buf: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """Bytes ``buf[start + k]`` for k < width as a (rows, width) matrix (one row copy per start).

    Callers keep ``0 <= start`` and ``start + width <= buf.size``.
    """
    view = np.lib.stride_tricks.as_strided(buf, shape=(buf.size - width + 1, width), strides=(1, 1),
                                           writeable=False)
    return view[start]


def _swar8(word: np.ndarray, hexa: bool) -> np.ndarray:
    """Eight ASCII digits per uint64 (first digit in the lowest byte) → their value (SWAR, no per-digit loop)."""
    if hexa:
        x = (word & _U64(0x0F0F0F0F0F0F0F0F)) + _U64(9) * ((word >> _U64(6)) & _U64(0x0101010101010101))
        m1, m2, m3 = _U64(16), _U64(256), _U64(65536)
    else:
        x = word - _ZEROS8
        m1, m2, m3 = _U64(10), _U64(100), _U64(10000)
    x = (x * m1 + (x >> _U64(8))) & _U64(0x00FF00FF00FF00FF)
    x = (x * m2 + (x >> _U64(16))) & _U64(0x0000FFFF0000FFFF)
    return (x * m3 + (x >> _U64(32))) & _U64(0x00000000FFFFFFFF)


def _words(chunk: bytes) -> np.ndarray:
    """``w[i]`` = the 8 bytes from offset i as a little-endian uint64 (an unaligned, overlapping view: no copy)."""
    return np.ndarray((len(chunk) - 7,), dtype="<u8", buffer=chunk, strides=(1,))


def _digits(words: np.ndarray, s: np.ndarray, e: np.ndarray, hexa: bool) -> np.ndarray:
    """Value of the 1..16 (validated) digits ``chunk[s:e]``; needs ``e >= 16``."""
    ln = e - s
    lo_n = np.minimum(ln, 8)
    hi_n = np.clip(ln - 8, 0, 8)
    keep = _KEEP[lo_n]
    lo = (words[e - 8] & keep) | (_ZEROS8 & ~keep)
    val = _swar8(lo, hexa).astype(np.int64)
    if hi_n.any():
        keep = _KEEP[hi_n]
        hi = _swar8((words[e - 16] & keep) | (_ZEROS8 & ~keep), hexa).astype(np.int64)
        val += hi << 32 if hexa else hi * 10**8
    return val


def _tokens(buf: np.ndarray, s: np.ndarray, e: np.ndarray) -> pa.Array:
    """The byte strings ``buf[s:e]`` as one Arrow binary array (gathered, so they can be hashed in C)."""
    ln = e - s
    offs = np.zeros(s.size + 1, dtype=np.int64)
    np.cumsum(ln, out=offs[1:])
    width = max(8, (int(ln.max()) + 7) & ~7) if ln.size else 8
    data = _rows(buf, s, width)[np.arange(width) < ln[:, None]]
    return pa.Array.from_buffers(pa.large_binary(), s.size, [None, pa.py_buffer(offs), pa.py_buffer(data)])


def _encode(arr: pa.Array) -> tuple[np.ndarray, list[bytes]]:
    """Dictionary-encode: (index per row, distinct values in order of first appearance)."""
    enc = arr.dictionary_encode()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


@dataclass
class _Fast:
    """COLL lines of one chunk parsed with numpy (exactly those ``_COLL_RE`` would match, see ``_fast_rows``)."""

    line: np.ndarray          # 0-based line number inside the chunk
    anchor: np.ndarray        # byte offset of "NCCL INFO"
    opc: np.ndarray
    count: np.ndarray
    dt: np.ndarray
    root: np.ndarray
    pre: np.ndarray           # index into pre_vals: the text from the line start to "NCCL INFO"
    pre_vals: list[bytes]
    comm: np.ndarray          # index into comm_vals
    comm_vals: list[bytes]
    op: np.ndarray            # index into op_vals (raw op name, without the colon)
    op_vals: list[bytes]


def _inert(buf: np.ndarray, words: np.ndarray, sp: np.ndarray, nl: np.ndarray, nccl: np.ndarray,
           nccl_line: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Occurrences of "NCCL" (among ``which``, each the only one on its line) that provably start no match of
    ``_SCAN_RE``: ``NCCL INFO <token>: <next>`` where <token> (no space) ends with the colon, <next> is not
    ``opCount`` and <token> does not start with ``Bootstrap``/``bootstrap``. TUNING lines (``AllReduce: 4096 Bytes
    -> Algo ...``) are the bulk of them. Every other alternative of ``_SCAN_RE`` needs a space, a digit or a
    different word right after "INFO " or after the colon."""
    out = np.zeros(nccl.size, dtype=bool)
    idx = np.flatnonzero(which & (nccl + 40 <= buf.size))
    if not idx.size or not sp.size:
        return out
    a = nccl[idx]
    line_end = np.where(nccl_line[idx] < nl.size, nl[np.minimum(nccl_line[idx], max(nl.size - 1, 0))]
                        if nl.size else buf.size, buf.size)
    j = np.minimum(np.searchsorted(sp, a + 10), sp.size - 1)
    e2 = sp[j]
    ok = ((words[a + 4] & _MASK6) == _INFO6) & (e2 >= a + 11) & (e2 < line_end) & (e2 + 9 <= buf.size - 8)
    e2 = np.where(ok, e2, a + 11)
    ok &= (buf[e2 - 1] == 58) & (words[e2 + 1] != _OPCOUNT8)
    tok = words[a + 10]
    ok &= (tok != _BOOT8) & (tok != _BOOT8_LOWER)
    out[idx] = ok
    return out


def _fast_rows(chunk: bytes, buf: np.ndarray, words: np.ndarray, sp: np.ndarray, nl: np.ndarray,
               nccl: np.ndarray, nccl_line: np.ndarray, single: np.ndarray) -> _Fast | None:
    """The COLL records among lines holding exactly one "NCCL", with their fields, parsed in bulk.

    RE2 (pyarrow) checks each line against ``_COLL_RE2``; on a line with one "NCCL" a match starts there, where
    ``_COLL_RE`` would match too, and since its tokens are single-space separated, their bounds are the spaces
    after "NCCL". Numbers are read eight digits at a time. Lines with longer numbers or prefixes, or too close
    to the end of the chunk, are not taken: they go through the regex loop, so the result never changes.
    """
    size = buf.size
    a = nccl[single]
    li = nccl_line[single]
    keep = a + _TAIL <= size        # so that no window below reads past the chunk
    a, li = a[keep], li[keep]
    if not a.size:
        return None
    offsets = np.empty(nl.size + 2, dtype=np.int32 if size < 1 << 31 else np.int64)
    offsets[0] = 0
    offsets[1:-1] = nl + 1
    offsets[-1] = size
    n_lines = nl.size + 1
    lines = pa.Array.from_buffers(pa.binary() if offsets.dtype == np.int32 else pa.large_binary(), n_lines,
                                  [None, pa.py_buffer(offsets), pa.py_buffer(chunk)])
    try:
        matched = pc.match_substring_regex(lines, _COLL_RE2).to_numpy(zero_copy_only=False)
    except pa.ArrowNotImplementedError:  # a pyarrow built without RE2: the regex loop does it all
        return None
    keep = matched[li]
    a, li = a[keep], li[keep]
    if not a.size:
        return None
    b = sp[np.searchsorted(sp, a + 4)[:, None] + np.arange(19)]   # b[:, k]: the space after token k
    s = b[:, :-1] + 1                                               # s[:, k - 1]: start of token k (k = 1..18)
    line_start = offsets[li].astype(np.int64)
    ln = b[:, 1:] - s                                               # ln[:, k - 1]: length of token k
    root_s = s[:, 15] + (buf[s[:, 15]] == 45)                        # "-"
    keep = ((ln[:, 3] <= 15) & (ln[:, 9] <= 16) & (ln[:, 11] <= 16) & (b[:, 16] - root_s <= 16)
            & (ln[:, 17] <= 66) & (ln[:, 1] <= 65) & (a - line_start <= _MAX_PREFIX) & (b[:, 18] + 80 <= a + _TAIL))
    if not keep.all():
        a, li, b, s, line_start, root_s = a[keep], li[keep], b[keep], s[keep], line_start[keep], root_s[keep]
        if not a.size:
            return None
    opc = _digits(words, s[:, 3], b[:, 4], True)
    count = _digits(words, s[:, 9], b[:, 10], False)
    dt = _digits(words, s[:, 11], b[:, 12], False)
    root = _digits(words, root_s, b[:, 16], False)
    root = np.where(root_s > s[:, 15], -root, root)
    pre, pre_vals = _encode(_tokens(buf, line_start, a))
    comm, comm_vals = _encode(_tokens(buf, s[:, 17], b[:, 18]))
    op, op_vals = _encode(_tokens(buf, s[:, 1], b[:, 2] - 1))
    return _Fast(line=li, anchor=a, opc=opc, count=count, dt=dt, root=root, pre=pre, pre_vals=pre_vals, comm=comm,
                 comm_vals=comm_vals, op=op, op_vals=op_vals)


class _Reader:
    """State of one read; see the module docstring for the rules."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)
        self.skipped: list[Skipped] = []
        self.obs: list[dict[str, Any]] = []
        self.init_obs: list[tuple[dict[str, Any], _Comm]] = []
        self.comms: dict[tuple[str, int, str], _Comm] = {}
        self.all_comms: list[_Comm] = []
        self.tid_comm: dict[tuple[str, int, int], _Comm] = {}
        self.transport: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.hosts_by_pid: dict[int, list[str]] = {}
        self.idents: list[tuple[str, int, int, int | None]] = []
        self.ident_idx: dict[tuple[str, int, int, int | None], int] = {}
        # (text before " NCCL INFO", comm pointer) -> (ident index, communicator); cleared when comms change
        self.coll_cache: dict[tuple[bytes, bytes], tuple[int, _Comm, int]] = {}
        self.versions: dict[str, int] = {}
        self.fallback_noted: set[tuple[str, int, str]] = set()
        self.bad_utf8_line: int | None = None
        self.nul_bytes = 0
        self.nul_line: int | None = None
        self.torn = 0
        self.n_marker_lines = 0
        self.batches: list[np.ndarray] = []     # (rows, _NMETA) int64 blocks, one per chunk
        self.op_ids: dict[bytes, int] = {}

    # ---- helpers

    def _host(self, host: str, pid: int) -> str:
        known = self.hosts_by_pid.get(pid)
        if known is None:
            self.hosts_by_pid[pid] = [host]
            return host
        if host in known:
            return host
        for h in known:
            if host.endswith(h):
                return h
        known.append(host)
        return host

    def _torn(self, line: int, reason: str) -> None:
        self.torn += 1
        if self.torn <= 50:
            self.skipped.append(Skipped(self.file, line, reason))

    def _new_comm(self, host: str, pid: int, ptr: str) -> _Comm:
        c = _Comm(idx=len(self.all_comms), host=host, pid=pid, ptr=ptr, group=f"comm:{ptr}")
        self.comms[(host, pid, ptr)] = c
        self.all_comms.append(c)
        self.coll_cache.clear()
        return c

    def _p2p_by_op(self) -> np.ndarray:
        """Per op id: is it a p2p op (Send/Recv/...)?"""
        flags = np.zeros(len(self.op_ids), dtype=bool)
        for op, oi in self.op_ids.items():
            flags[oi] = op in _P2P_RAW
        return flags

    # ---- chunk loop

    def run(self, f: BinaryIO) -> None:
        line = 1
        for chunk, nuls in _iter_chunks(f):
            if nuls:
                self.nul_bytes += nuls
                if self.nul_line is None:
                    self.nul_line = line
            if chunk:
                line = self._chunk(chunk, line)

    def _chunk(self, chunk: bytes, first_line: int) -> int:
        """Parse one chunk of whole lines; returns the number of the line after it."""
        if self.bad_utf8_line is None and not chunk.isascii():
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad_utf8_line = first_line + chunk.count(b"\n", 0, e.start)
        blocks: list[np.ndarray] = []
        if len(chunk) < _VEC_MIN_BYTES:
            n = self._scan_range(chunk, 0, len(chunk), first_line, blocks)
            newlines = chunk.count(b"\n")
        else:
            n, newlines = self._vector_chunk(chunk, first_line, blocks)
        self.n_marker_lines += n
        if len(blocks) == 1:
            self.batches.append(blocks[0])
        elif blocks:
            merged = _block(sum(len(b) for b in blocks))
            np.concatenate(blocks, out=merged)
            self.batches.append(merged)
        if chunk.count(b": opCount ") != n:
            self._find_torn_coll(chunk, first_line)
        return first_line + newlines

    def _scan_range(self, chunk: bytes, start: int, end: int, first_line: int, blocks: list[np.ndarray]) -> int:
        """The regex loop over whole lines ``chunk[start:end]`` (``first_line`` = number of the line at start).

        One ``finditer`` finds COLL records and the rarer lines; returns the number of COLL rows it added.
        """
        cur_pos, cur_line = start, first_line
        last_rare = -1
        count = chunk.count
        rfind = chunk.rfind
        cache = self.coll_cache
        meta = array("q")
        meta_extend = meta.extend
        p2p_raw = _P2P_RAW
        op_ids = self.op_ids
        n = 0
        for m in _SCAN_RE.finditer(chunk, start, end):
            s = m.start()
            ls = rfind(b"\n", 0, s) + 1
            if ls != cur_pos:
                cur_line += count(b"\n", cur_pos, ls)
                cur_pos = ls
            op, opc, cnt, dt, root, comm = m.groups()
            if op is None:  # a rarer line: parsed whole, once
                if ls != last_rare:
                    last_rare = ls
                    self._rare_line(chunk, ls, cur_line)
                continue
            key = (chunk[ls:s], comm)
            hit = cache.get(key)
            if hit is None:
                nr = _NRANKS_RE.search(chunk, s)
                hit = self._resolve(key[0], comm, nr.group(1) if nr else b"0", cur_line)
                if hit is None:
                    self._torn(cur_line, "COLL record without a host:pid:tid prefix (torn line)")
                    continue
                if len(cache) > _PREFIX_CACHE_MAX:
                    cache.clear()
                cache[key] = hit
                if hit[1].first_coll_line is None:
                    hit[1].first_coll_line = cur_line
            ii, c, ci = hit
            opc_v = 0 if opc == b"0" else int(opc, 16)
            dt_v, cnt_v = int(dt), int(cnt)
            root_v = 0 if root == b"0" else int(root)
            if opc_v > _I63 or dt_v > _I63 or cnt_v > _I63 or not -_I63 <= root_v <= _I63:
                self._torn(cur_line, "COLL record with a number beyond 64 bits (garbled line): "
                           + chunk[ls:s + 120].decode("utf-8", "replace"))
                continue
            oi = op_ids.get(op)
            if oi is None:
                oi = op_ids[op] = len(op_ids)
            if op in p2p_raw:
                seq = self._p2p_seq(c, op, root)
            else:
                seq = c.n_coll = c.n_coll + 1
            meta_extend((cur_line, ii, ci, seq, opc_v, oi, dt_v, cnt_v, root_v))
            n += 1
        if n:
            blk = _block(n)
            blk.reshape(-1)[:] = np.frombuffer(meta, dtype=np.int64)
            blocks.append(blk)
        return n

    def _vector_chunk(self, chunk: bytes, first_line: int, blocks: list[np.ndarray]) -> tuple[int, int]:
        """Parse a chunk (returns COLL rows, newlines): COLL lines in bulk with numpy, the rest (and short runs)
        with the regex loop, in line order.

        Lines are processed in file order: the rarer lines (Init, teardown, ...) change the communicator state a
        COLL line is resolved against, so they split the COLL lines into runs, each handled at once.
        """
        buf = np.frombuffer(chunk, dtype=np.uint8)
        size = buf.size
        nl = np.flatnonzero(buf == 10)
        n_lines = nl.size + (0 if chunk.endswith(b"\n") else 1)
        nccl = np.flatnonzero(buf[: size - 3] == 78)             # "NCCL"
        nccl = nccl[(buf[nccl + 1] == 67) & (buf[nccl + 2] == 67) & (buf[nccl + 3] == 76)]
        if not nccl.size:
            return 0, nl.size
        nccl_line = np.searchsorted(nl, nccl)
        single = np.ones(nccl.size, dtype=bool)
        single[1:] &= nccl_line[1:] != nccl_line[:-1]
        single[:-1] &= nccl_line[:-1] != nccl_line[1:]
        sp = np.flatnonzero(buf == 32)
        words = _words(chunk)
        fast = _fast_rows(chunk, buf, words, sp, nl, nccl, nccl_line, single)

        def line_start(k: int) -> int:
            return 0 if k == 0 else int(nl[k - 1]) + 1

        def line_end(k: int) -> int:
            return int(nl[k]) if k < nl.size else size

        if fast is None:
            return self._scan_range(chunk, 0, size, first_line, blocks), nl.size
        # lines with "NCCL" that are not validated COLL lines: the regex decides which of them matter, except
        # for lines that provably cannot match (below)
        other = ~np.isin(nccl_line, fast.line, assume_unique=False)
        inert = _inert(buf, words, sp, nl, nccl, nccl_line, single & other)
        check = nccl_line[other & ~inert]
        check = check[np.concatenate(([True], check[1:] != check[:-1]))] if check.size else check
        search = _SCAN_RE.search
        special = [k for k in check.tolist() if search(chunk, line_start(k), line_end(k)) is not None]
        cuts = np.searchsorted(fast.line, np.asarray(special, dtype=np.int64))
        bounds = np.concatenate(([0], cuts, [fast.line.size]))
        sizes = np.diff(bounds)
        n = 0
        pos = 0  # next line not yet processed
        for g in np.flatnonzero(sizes >= _VEC_MIN_ROWS).tolist():
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            first, last = int(fast.line[lo]), int(fast.line[hi - 1])
            if pos < first:
                n += self._scan_range(chunk, line_start(pos), line_start(first), first_line + pos, blocks)
            got = self._vector_run(chunk, first_line, fast, lo, hi, blocks)
            if got is None:  # a prefix the resolver refuses: the regex loop names the torn lines
                got = self._scan_range(chunk, line_start(first), line_start(last + 1), first_line + first, blocks)
            n += got
            pos = last + 1
        if pos < n_lines:
            n += self._scan_range(chunk, line_start(pos), size, first_line + pos, blocks)
        return n, nl.size

    def _vector_run(self, chunk: bytes, first_line: int, fast: _Fast, lo: int, hi: int,
                    blocks: list[np.ndarray]) -> int | None:
        """COLL rows ``lo:hi`` of ``fast`` (no rarer line between them) → one block; None if one is unresolvable."""
        rows = hi - lo
        pre, comm, op = fast.pre[lo:hi], fast.comm[lo:hi], fast.op[lo:hi]
        keys = pre * len(fast.comm_vals) + comm
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        ii_u = np.empty(uniq.size, dtype=np.int64)
        ci_u = np.empty(uniq.size, dtype=np.int64)
        cache = self.coll_cache
        for u in np.argsort(first, kind="stable").tolist():
            f = lo + int(first[u])
            key = (fast.pre_vals[fast.pre[f]], fast.comm_vals[fast.comm[f]])
            hit = cache.get(key)
            if hit is None:
                line = first_line + int(fast.line[f])
                nr = _NRANKS_RE.search(chunk, int(fast.anchor[f]))
                hit = self._resolve(key[0], key[1], nr.group(1) if nr else b"0", line)
                if hit is None:
                    return None
                if len(cache) > _PREFIX_CACHE_MAX:
                    cache.clear()
                cache[key] = hit
                if hit[1].first_coll_line is None:
                    hit[1].first_coll_line = line
            ii_u[u], ci_u[u] = hit[0], hit[2]
        inv = inv.reshape(-1)
        ii, ci = ii_u[inv], ci_u[inv]
        # op ids in order of first appearance, as the regex loop assigns them
        op_u, op_first = np.unique(op, return_index=True)
        op_map = np.zeros(len(fast.op_vals), dtype=np.int64)
        for k in op_u[np.argsort(op_first, kind="stable")].tolist():
            raw = fast.op_vals[k]
            oi = self.op_ids.get(raw)
            if oi is None:
                oi = self.op_ids[raw] = len(self.op_ids)
            op_map[k] = oi
        oi_a = op_map[op]
        is_p2p = self._p2p_by_op()[oi_a]
        root = fast.root[lo:hi]
        seq = np.empty(rows, dtype=np.int64)
        comms = self.all_comms
        # collectives: line order per communicator
        idx = np.flatnonzero(~is_p2p)
        if idx.size:
            order = idx[np.argsort(ci[idx], kind="stable")]
            sc = ci[order]
            starts = np.flatnonzero(np.concatenate(([True], sc[1:] != sc[:-1])))
            counts = np.diff(np.append(starts, sc.size))
            base = np.empty(starts.size, dtype=np.int64)
            for i, (c_idx, cnt) in enumerate(zip(sc[starts].tolist(), counts.tolist())):
                c = comms[c_idx]
                base[i] = c.n_coll
                c.n_coll += cnt
            seq[order] = np.repeat(base - starts, counts) + np.arange(sc.size) + 1
        # p2p: per (communicator, src, dst)
        idx = np.flatnonzero(is_p2p)
        if idx.size:
            none = -(1 << 62)
            rank = np.array([none if c.rank is None else c.rank for c in comms], dtype=np.int64)[ci[idx]]
            recv_ops = np.zeros(len(self.op_ids), dtype=bool)
            for raw in (b"Recv", b"WaitSignal"):
                if raw in self.op_ids:
                    recv_ops[self.op_ids[raw]] = True
            recv = recv_ops[oi_a[idx]]
            peer = root[idx]
            src = np.where(recv, peer, rank)
            dst = np.where(recv, rank, peer)
            cidx = ci[idx]
            o = np.lexsort((np.arange(idx.size), dst, src, cidx))
            order = idx[o]
            k_ci, k_src, k_dst = cidx[o], src[o], dst[o]
            change = np.concatenate(([True], (k_ci[1:] != k_ci[:-1]) | (k_src[1:] != k_src[:-1])
                                     | (k_dst[1:] != k_dst[:-1])))
            starts = np.flatnonzero(change)
            counts = np.diff(np.append(starts, order.size))
            base = np.empty(starts.size, dtype=np.int64)
            for i, (c_idx, a_, b_, cnt) in enumerate(zip(k_ci[starts].tolist(), k_src[starts].tolist(),
                                                         k_dst[starts].tolist(), counts.tolist())):
                pair = (None if a_ == none else a_, None if b_ == none else b_)
                c = comms[c_idx]
                had = c.p2p.get(pair, 0)
                base[i] = had
                c.p2p[pair] = had + cnt
            seq[order] = np.repeat(base - starts, counts) + np.arange(order.size) + 1
        block = _block(rows)
        block[:, 0] = fast.line[lo:hi] + first_line
        block[:, 1] = ii
        block[:, 2] = ci
        block[:, 3] = seq
        block[:, 4] = fast.opc[lo:hi]
        block[:, 5] = oi_a
        block[:, 6] = fast.dt[lo:hi]
        block[:, 7] = fast.count[lo:hi]
        block[:, 8] = root
        blocks.append(block)
        return rows

    def _find_torn_coll(self, chunk: bytes, first_line: int) -> None:
        """Slow path, only for chunks where some ``: opCount `` text did not parse: name those lines."""
        for ln, raw in enumerate(chunk.split(b"\n"), start=first_line):
            n = raw.count(b": opCount ")
            if n and len(_COLL_RE.findall(raw)) < n:
                self._torn(ln, "COLL record cut or interleaved (torn line): "
                           + raw.decode("utf-8", "replace")[:160])

    def _resolve(self, pre: bytes, comm_b: bytes, nranks_b: bytes, line: int) -> tuple[int, _Comm, int] | None:
        """Identity (host, pid, tid, time) and communicator of a COLL line, from the text before " NCCL INFO"."""
        m = _COLL_PREFIX_RE.search(pre)
        if m is None:
            return None
        ts, host_b, pid_b, tid_b, _dev = m.groups()
        pid = int(pid_b)
        host = self._host(host_b.decode("utf-8", "replace"), pid)
        ident = (host, pid, int(tid_b), _parse_ts(ts.decode()) if ts else None)
        ii = self.ident_idx.get(ident)
        if ii is None:
            ii = self.ident_idx[ident] = len(self.idents)
            self.idents.append(ident)
        ptr = comm_b.decode()
        c = self.comms.get((host, pid, ptr))
        if c is None:
            c = self._new_comm(host, pid, ptr)
            c.nranks = int(nranks_b)
            key = (host, pid, ptr)
            if key not in self.fallback_noted:
                self.fallback_noted.add(key)
                self.skipped.append(Skipped(
                    self.file, line,
                    f"no Init line for comm {ptr} of pid {pid} on {host}: its ops are grouped as comm:{ptr} "
                    f"and cannot be matched with other ranks' ops (enable NCCL_DEBUG_SUBSYS=INIT)"))
        return ii, c, c.idx

    @staticmethod
    def _p2p_seq(c: _Comm, op: bytes, root: bytes) -> int:
        peer = int(root)
        pair = (peer, c.rank) if op in (b"Recv", b"WaitSignal") else (c.rank, peer)
        seq = c.p2p.get(pair, 0) + 1
        c.p2p[pair] = seq
        return seq

    # ---- keyword lines

    def _rare_line(self, chunk: bytes, ls: int, line: int) -> None:
        le = chunk.find(b"\n", ls)
        raw = chunk[ls:] if le == -1 else chunk[ls:le]
        text = raw.decode("utf-8", "replace").rstrip("\r")
        marks = list(_MARKER_RE.finditer(text))
        if not marks:
            vm = _BARE_VERSION_RE.search(text)
            if vm:
                self._version(vm.group("v"), None, None, None, line)
            elif "NCCL" in text and ("NCCL INFO" in text or "NCCL WARN" in text):
                self._torn(line, "NCCL record without a host:pid:tid prefix (torn line): " + text[:160])
            return
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            msg = text[m.end():end]
            if i + 1 < len(marks) and not msg.strip():
                continue
            self.n_marker_lines += 1
            self._record(m, msg.rstrip(), line, glued=len(marks) > 1 and i + 1 < len(marks))

    def _version(self, v: str, host: str | None, pid: int | None, tid: int | None, line: int) -> None:
        if v not in self.versions:
            self.versions[v] = line
        self.obs.append(dict(host=host, pid=pid, tid=tid, kind="nccl_version", detail=v, line=line))

    def _record(self, m: re.Match[str], msg: str, line: int, glued: bool) -> None:
        pid = int(m.group("pid"))
        host = self._host(m.group("host"), pid)
        tid = int(m.group("tid"))
        ts = m.group("ts")
        wall = _parse_ts(ts) if ts else None
        level = m.group("level")
        base = dict(host=host, pid=pid, tid=tid, wall_ns=wall, line=line)
        if level == "WARN":
            where = f"{m.group('file')}:{m.group('fline')}" if m.group("file") else None
            c = self.tid_comm.get((host, pid, tid))
            self.obs.append(dict(base, kind="nccl_warn", name=where, detail=msg.strip(),
                                 group=c.group if c else None, rank=c.rank if c else None))
            return
        if msg.startswith("NCCL version "):
            self._version(msg.split()[2], host, pid, tid, line)
            return
        if ": opCount " in msg:
            return  # COLL: handled by the fast path
        im = _INIT_RE.search(msg)
        if im:
            self._init(base, msg, im.group(1), line)
            return
        tm = _TEARDOWN_RE.search(msg)
        if tm:
            ptr, what = tm.group(1), f"{tm.group(4)} {tm.group(5)}"
            c = self.comms.get((host, pid, ptr))
            self.obs.append(dict(base, kind="nccl_destroy", name=ptr, detail=what,
                                 group=c.group if c else f"comm:{ptr}", rank=int(tm.group(2)),
                                 value=int(tm.group(3))))
            if c is not None and tm.group(5) == "COMPLETE":
                self.comms.pop((host, pid, ptr), None)
                self.coll_cache.clear()
            return
        sm = _SUMMARY_RE.match(msg)
        if sm:
            c = self.comms.get((host, pid, sm.group(1)))
            if c is not None:
                c.info.update(nNodes=sm.group(4), localRanks=sm.group(5), localRank=sm.group(6))
                if sm.group(7) is not None:
                    c.info["MNNVL"] = sm.group(7)
            self.obs.append(dict(base, kind="nccl_topology", name="summary", detail=msg,
                                 group=c.group if c else f"comm:{sm.group(1)}", rank=int(sm.group(2)),
                                 value=int(sm.group(3))))
            return
        xm = _TRANSPORT_RE.match(msg)
        if xm:
            self._transport(base, xm)
            return
        c = self.tid_comm.get((host, pid, tid))
        grp = c.group if c else None
        rank = c.rank if c else None
        rm = _RING_RE.match(msg)
        if rm:
            self.obs.append(dict(base, kind="nccl_topology", name="ring", group=grp, rank=rank,
                                 detail=f"channels={int(rm.group(1))} ring0={' '.join(rm.group(2).split())}"))
            return
        if msg.startswith("Trees [0] "):
            first = msg[len("Trees [0] "):].split(" [", 1)[0]
            self.obs.append(dict(base, kind="nccl_topology", name="tree", group=grp, rank=rank,
                                 detail=f"tree0={first}"))
            return
        if "coll channels" in msg:
            self.obs.append(dict(base, kind="nccl_topology", name="channels", group=grp, rank=rank, detail=msg))
            return
        if msg.startswith(("Bootstrap", "bootstrap")):
            self.obs.append(dict(base, kind="nccl_bootstrap", group=grp, rank=rank, detail=msg))
            return
        em = _TRAIL_RE.match(msg)
        if em:
            self.obs.append(dict(base, kind="nccl_warn", name=f"{em.group('file')}:{em.group('line')}",
                                 detail=msg, value=int(em.group("code")), group=grp, rank=rank))
            return
        if glued and ("Init" in msg or " via " in msg):
            self._torn(line, "NCCL record cut by another record (torn line): " + msg[:160])

    def _init(self, base: dict[str, Any], msg: str, what: str, line: int) -> None:
        host, pid, tid = base["host"], base["pid"], base["tid"]
        f: dict[str, str] = {}
        for k, rx in _FIELD_RES.items():
            mm = rx.search(msg)
            if mm:
                f[k] = mm.group(1)
        ptr = f.get("comm")
        if ptr is None or "rank" not in f:
            self.skipped.append(Skipped(self.file, line, "unrecognised Init line: " + msg[:160]))
            return
        key = (host, pid, ptr)
        c = self.comms.get(key)
        if c is None or (what == "START" and c.started):  # a second START: the pointer was reused
            c = self._new_comm(host, pid, ptr)
        self.coll_cache.clear()
        if not c.init_seen:
            c.init_seen = True
            c.init_line = line
        if what == "START":
            c.started = True
        c.rank = int(f["rank"])
        if "nranks" in f:
            c.nranks = int(f["nranks"])
        if "commId" in f:
            c.comm_id = normalize_comm_id(f["commId"])
            c.group = c.comm_id
        elif "parent" in f and c.comm_id is None:
            parent = self.comms.get((host, pid, f["parent"]))
            pid_key = parent.group if parent is not None else f"comm:{f['parent']}"
            c.group = f"split:{pid_key}:{f.get('color', '?')}"
        am = _API_RE.match(msg)
        if am:
            c.info["api"] = am.group(1)
        for k in ("cudaDev", "nvmlDev", "busId", "parent", "color", "key"):
            if k in f:
                c.info[k] = f[k]
        self.tid_comm[(host, pid, tid)] = c
        row = dict(base, kind="nccl_init_start" if what == "START" else "nccl_init_complete", name=ptr,
                   rank=c.rank, value=c.nranks)
        self.obs.append(row)
        self.init_obs.append((row, c))

    def _transport(self, base: dict[str, Any], xm: re.Match[str]) -> None:
        src, dst, tag, tail = int(xm.group(3)), int(xm.group(4)), xm.group(5), xm.group(6)
        parts = tail.split("/")
        if parts[0] == "P2P" and len(parts) > 1:
            kind = "P2P/" + parts[1].split()[0]
        elif parts[0] == "NET" and len(parts) > 1:
            kind = "NET/" + parts[1]
        else:
            kind = parts[0].split()[0]
        me = dst if tag == "receive" else src
        host, pid = base["host"], base["pid"]
        comm = None
        for c in reversed(self.all_comms):
            if c.host == host and c.pid == pid and c.rank == me:
                comm = c
                break
        grp = comm.group if comm else None
        key = (host, pid, grp, src, dst, kind)
        row = self.transport.get(key)
        if row is None:
            row = dict(base, kind="nccl_transport", name=f"{src}->{dst}", detail=kind, group=grp, rank=me, value=0)
            self.transport[key] = row
            self.obs.append(row)
        row["value"] += 1

    # ---- results

    def result(self) -> ReadResult:
        sizes = [c.nranks for c in self.all_comms if c.nranks]
        world = max(sizes) if sizes else None
        for row, c in self.init_obs:
            row["group"] = c.group
            row["detail"] = " ".join(f"{k}={v}" for k, v in
                                     ([("nranks", c.nranks)] + sorted(c.info.items())) if v is not None)
        self._repair_hosts()
        events, basis = self._events(world)
        for c in self.all_comms:
            if c.idx in basis:
                b, first_line, n = basis[c.idx]
                self.obs.append(dict(host=c.host, pid=c.pid, kind="nccl_seq_basis", name=c.ptr, group=c.group,
                                     rank=c.rank, detail=b, value=n, line=first_line))
            if world is not None and c.nranks is not None and c.nranks < world:
                self.obs.append(dict(host=c.host, pid=c.pid, kind="rank_space", name=c.ptr, group=c.group,
                                     rank=c.rank, detail=f"comm:{c.group}", value=c.nranks, line=c.init_line))
        if len(self.versions) > 1:
            vs = sorted(self.versions.items(), key=lambda kv: kv[1])
            self.skipped.append(Skipped(self.file, vs[1][1],
                                        "mixed NCCL versions in one file: "
                                        + ", ".join(f"{v} (first at line {ln})" for v, ln in vs)
                                        + "; version reported as the first one"))
        if self.bad_utf8_line is not None:
            self.skipped.append(Skipped(self.file, self.bad_utf8_line,
                                        "bytes that are not UTF-8 (mixed encodings) from this line on; "
                                        "decoded with replacement characters"))
        if self.nul_bytes:
            self.skipped.append(Skipped(self.file, self.nul_line,
                                        f"{self.nul_bytes} NUL bytes ignored, the first near this line (a sparse "
                                        "hole, or the file was truncated while being written)"))
        if self.torn > 50:
            self.skipped.append(Skipped(self.file, None, f"{self.torn} torn lines in all (first 50 listed)"))
        for r in self.obs:
            r.setdefault("source", "nccl")
            r.setdefault("file", self.file)
        obs = schema.table_from_rows(schema.OBSERVATIONS, self.obs)
        version = min(self.versions.items(), key=lambda kv: kv[1])[0] if self.versions else None
        return ReadResult(file=self.file, format=FORMAT, version=version, events=events, observations=obs,
                          skipped=tuple(self.skipped), world_size=world)

    def _repair_hosts(self) -> None:
        """A host first seen with garbage glued in front is renamed to the clean host of the same pid."""
        fix: dict[tuple[str, int], str] = {}
        for pid, hosts in self.hosts_by_pid.items():
            for h in hosts:
                for g in hosts:
                    if h != g and h.endswith(g):
                        fix[(h, pid)] = g
        if not fix:
            return
        for r in self.obs:
            k = (r.get("host"), r.get("pid"))
            if k in fix:
                r["host"] = fix[k]  # type: ignore[index]
        self.idents = [(fix.get((h, p), h), p, t, w) for h, p, t, w in self.idents]
        for c in self.all_comms:
            c.host = fix.get((c.host, c.pid), c.host)

    def _events(self, world: int | None) -> tuple[pa.Table, dict[int, tuple[str, int, int]]]:
        """COLL rows → EVENTS, vectorised; also the seq basis per communicator (idx → (basis, first line, n)).

        The table is built block by block from the integer rows (each block freed once converted), so the memory
        peak is the EVENTS table plus one block, not the table plus all rows.
        """
        if not self.batches:
            return schema.empty(schema.EVENTS), {}
        comms = self.all_comms
        p2p_by_op = self._p2p_by_op()
        # seq basis per communicator (module docstring, rules 1-3); opCount statistics only for those without Init
        no_init = np.array([not c.init_seen for c in comms], dtype=bool)
        stats: dict[int, tuple[int, int, bool]] = {}
        if no_init.any():
            parts = []
            for blk in self.batches:
                m = no_init[blk[:, 2]] & ~p2p_by_op[blk[:, 5]]
                if m.any():
                    parts.append(blk[m][:, [2, 4]])
            if parts:
                sub = np.concatenate(parts)
                order = np.argsort(sub[:, 0], kind="stable")
                ci_s, opc_s = sub[order, 0], sub[order, 1]
                starts = np.flatnonzero(np.concatenate(([True], ci_s[1:] != ci_s[:-1])))
                maxes = np.maximum.reduceat(opc_s, starts)
                drops = np.flatnonzero((opc_s[1:] < opc_s[:-1]) & (ci_s[1:] == ci_s[:-1]))
                bad = set(ci_s[drops + 1].tolist())
                counts = np.diff(np.append(starts, ci_s.size))
                for c_idx, n_c, mx in zip(ci_s[starts].tolist(), counts.tolist(), maxes.tolist()):
                    stats[c_idx] = (n_c, mx, c_idx not in bad)
        basis: dict[int, tuple[str, int, int]] = {}
        use_opcount = np.zeros(len(comms), dtype=bool)
        for c in comms:
            nrows = c.n_coll + sum(c.p2p.values())
            if not nrows or c.first_coll_line is None:
                continue
            cidx, first = c.idx, c.first_coll_line
            if c.init_seen:
                basis[cidx] = ("line", first, nrows)
                continue
            n_c, mx, nondecreasing = stats.get(cidx, (0, 0, True))
            if n_c > 0 and mx > 0 and nondecreasing:
                basis[cidx] = ("opcount", first, nrows)
                use_opcount[cidx] = True
                self.skipped.append(Skipped(self.file, first, f"{c.group} (pid {c.pid}): no Init line, seq = "
                                            "opCount + 1 (log starts mid-run; grouped ops share a position)"))
            else:
                basis[cidx] = ("line_from_log_start", first, nrows)
                self.skipped.append(Skipped(self.file, first, f"{c.group} (pid {c.pid}): no Init line and no "
                                            "usable opCount; seq counts COLL lines from the start of this file"))
        # small lookup tables, indexed by op id / comm index / identity index / NCCL datatype
        raw_ops = [o.decode() for o, _ in sorted(self.op_ids.items(), key=lambda kv: kv[1])]
        look = {
            "name": pa.array([canonical_op(r) for r in raw_ops], pa.string()),
            "category": pa.array(["p2p" if r.encode() in _P2P_RAW else "collective" for r in raw_ops], pa.string()),
            "group": pa.array([c.group for c in comms], pa.string()),
            "rank": pa.array([c.rank for c in comms], pa.int32()),
            "detail": pa.array([f"comm={c.ptr}" for c in comms], pa.string()),
            "host": pa.array([x[0] for x in self.idents], pa.string()),
            "pid": pa.array([x[1] for x in self.idents], pa.int64()),
            "tid": pa.array([x[2] for x in self.idents], pa.int64()),
            "wall_ns": pa.array([x[3] for x in self.idents], pa.int64()),
            "dtype": pa.array([NCCL_DTYPES[i][0] for i in range(len(NCCL_DTYPES))], pa.string()),
        }
        dt_size = np.array([NCCL_DTYPES[i][1] for i in range(len(NCCL_DTYPES))], dtype=np.int64)
        rooted_op = np.array([r in _ROOTED_RAW for r in raw_ops], dtype=bool)
        batches = []
        while self.batches:
            blocks = [self.batches.pop(0)]
            rows = len(blocks[0])
            while self.batches and rows + len(self.batches[0]) <= _BATCH_ROWS:
                rows += len(self.batches[0])
                blocks.append(self.batches.pop(0))
            if len(blocks) == 1:
                blk = blocks[0]
            else:
                blk = _block(rows)
                np.concatenate(blocks, out=blk)
            del blocks
            batches.append(self._event_batch(blk, world, look, dt_size, rooted_op, p2p_by_op, use_opcount))
            del blk
        return pa.Table.from_batches(batches, schema=schema.EVENTS), basis

    def _event_batch(self, blk: np.ndarray, world: int | None, look: dict[str, pa.Array], dt_size: np.ndarray,
                     rooted_op: np.ndarray, p2p_by_op: np.ndarray, use_opcount: np.ndarray) -> pa.RecordBatch:
        n = len(blk)
        line, ii, ci, seq, opc, oi, dt, cnt, root = (np.ascontiguousarray(blk[:, k]) for k in range(_NMETA))
        is_p2p = p2p_by_op[oi]
        if use_opcount.any():
            seq = np.where(use_opcount[ci] & ~is_p2p, opc + 1, seq)
        dt_bad = (dt < 0) | (dt >= dt_size.size)
        dt_idx = pa.array(np.where(dt_bad, 0, dt), mask=dt_bad)
        nbytes = pa.array(cnt * dt_size[np.where(dt_bad, 0, dt)], mask=dt_bad)
        peer_bad = ~is_p2p | (root < -(1 << 31)) | (root >= 1 << 31)
        peer = pa.array(np.where(peer_bad, 0, root).astype(np.int32), mask=peer_bad)
        ci_a, ii_a, oi_a = pa.array(ci), pa.array(ii), pa.array(oi)
        detail = look["detail"].take(ci_a)
        rooted = rooted_op[oi]
        if rooted.any():
            mask = pa.array(rooted)
            sub = pc.binary_join_element_wise(pc.filter(detail, mask), " root=",
                                              pa.array(root[rooted]).cast(pa.string()), "")
            detail = pc.replace_with_mask(detail, mask, sub)
        nccl = pa.repeat(pa.scalar("nccl"), n)
        nulls: dict[pa.DataType, pa.Array] = {}
        cols: dict[str, Any] = {
            "host": look["host"].take(ii_a),
            "pid": look["pid"].take(ii_a),
            "tid": look["tid"].take(ii_a),
            "wall_ns": look["wall_ns"].take(ii_a),
            "rank": look["rank"].take(ci_a),
            "world": pa.nulls(n, pa.int32()) if world is None else pa.repeat(pa.scalar(world, pa.int32()), n),
            "kind": pa.repeat(pa.scalar("enter"), n),
            "name": look["name"].take(oi_a),
            "category": look["category"].take(oi_a),
            "group": look["group"].take(ci_a),
            "backend": nccl,
            "seq": pa.array(seq),
            "backend_seq": pa.array(opc),
            "peer": peer,
            "nbytes": nbytes,
            "dtype": look["dtype"].take(dt_idx),
            "detail": detail,
            "source": nccl,
            "file": pa.repeat(pa.scalar(self.file), n),
            "line": pa.array(line),
        }
        arrays = []
        for f in schema.EVENTS:
            col = cols.get(f.name)
            if col is None:   # one all-null array per type, shared by the columns of that type
                col = nulls.get(f.type)
                if col is None:
                    col = nulls[f.type] = pa.nulls(n, f.type)
            elif col.type != f.type:
                col = col.cast(f.type)
            arrays.append(col)
        return pa.RecordBatch.from_arrays(arrays, schema=schema.EVENTS)


def _iter_chunks(f: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """Yield (pieces of whole lines of about ``_CHUNK`` bytes, NUL bytes dropped since the previous piece).

    NUL bytes are not text: they come from sparse holes or from a file truncated while its writer kept its offset
    (``logrotate copytruncate``), so they are dropped before lines are cut (a hole never fills the line buffer).
    The last piece may lack its newline; a "line" longer than ``_MAX_CARRY`` is cut.
    """
    carry: list[bytes] = []
    carry_len = 0
    nuls = 0
    while True:
        block = f.read(_CHUNK)
        if not block:
            break
        if b"\0" in block:
            k = block.count(b"\0")
            nuls += k
            if k == len(block):
                nuls += _skip_hole(f)
                continue
            block = block.translate(None, b"\0")
        cut = block.rfind(b"\n")
        if cut < 0:
            carry.append(block)
            carry_len += len(block)
            if carry_len >= _MAX_CARRY:
                yield b"".join(carry), nuls
                carry, carry_len, nuls = [], 0, 0
            continue
        if carry:
            carry.append(memoryview(block)[: cut + 1])
            piece = b"".join(carry)
        else:
            piece = block if cut == len(block) - 1 else block[: cut + 1]
        yield piece, nuls
        nuls = 0
        tail = block[cut + 1:]
        carry, carry_len = ([tail], len(tail)) if tail else ([], 0)
    if carry or nuls:
        yield b"".join(carry), nuls


def _skip_hole(f: BinaryIO) -> int:
    """After a block of NULs, jump over the rest of a sparse hole (``SEEK_DATA``); returns the bytes skipped.

    Reading a hole returns NULs anyway; skipping it just saves the time. Not available everywhere (then 0).
    """
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return 0
    try:
        here = f.tell()
        end = os.fstat(f.fileno()).st_size
        try:
            nxt = os.lseek(f.fileno(), here, seek_data)
        except OSError as e:
            if e.errno != errno.ENXIO:   # ENXIO: only a hole up to the end of the file
                return 0
            nxt = end
        nxt = min(max(nxt, here), end)
        f.seek(nxt)
        return nxt - here
    except (OSError, ValueError, io.UnsupportedOperation):
        return 0


_TS_CACHE: dict[str, int | None] = {}


def _parse_ts(ts: str) -> int | None:
    """``[%F %T]`` (optionally with a fraction) → ns since the epoch, read as UTC (formats.md §1.1)."""
    got = _TS_CACHE.get(ts)
    if got is not None or ts in _TS_CACHE:
        return got
    frac = 0
    base = ts
    for sep in (".", ","):
        if sep in ts:
            base, fs = ts.split(sep, 1)
            frac = int((fs + "000000000")[:9]) if fs.isdigit() else 0
            break
    try:
        dt = datetime.strptime(base.replace("T", " "), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        val: int | None = int(dt.timestamp()) * 1_000_000_000 + frac
    except ValueError:
        val = None
    if len(_TS_CACHE) < 100_000:
        _TS_CACHE[ts] = val
    return val


def read(path: Path) -> ReadResult:
    """Read one NCCL debug log. Raises ``ReaderError`` if it cannot be opened or holds no NCCL line at all."""
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
        if text and _looks_binary(text) and not _SNIFF_RE.search(text):
            raise ReaderError(path, "binary content, not an NCCL debug log")
        f.seek(0)
        r = _Reader(path)
        try:
            r.run(f)
        except OSError as e:
            raise ReaderError(path, f"read failed: {e.strerror or e}") from e
    if r.n_marker_lines == 0 and not r.versions:
        nuls = f" ({r.nul_bytes} NUL bytes: a sparse or zeroed file)" if r.nul_bytes else ""
        raise ReaderError(path, f"no NCCL debug line (host:pid:tid [dev] NCCL INFO|WARN ...) found{nuls}")
    return r.result()
