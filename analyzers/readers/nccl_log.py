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

Speed: the file is streamed in 8 MiB chunks cut at line ends (memory for the input stays bounded however big the
log is; the output holds a compact row per COLL line). One ``re.finditer`` per chunk, whose pattern starts with the
literal ``NCCL`` so the scan runs in C, finds both the COLL records (the bulk of big logs) and the rarer lines worth
a per-line parse (Init, teardown, transports, rings, trees, bootstrap, WARN, error trail); TUNING and other INFO
lines fail a few bytes after ``INFO``. Per COLL match only integers are kept (line, identity, communicator, seq,
opCount, op, dtype, count, root — one flat ``array('q')`` per chunk) and the ``host:pid:tid [dev]`` prefix is
parsed backwards from the match once per distinct prefix; the EVENTS columns are then built with pyarrow.compute.
``bench/bench_nccl_log_parse.py`` measures it.

``detail`` of a COLL event is ``comm=<pointer>`` (it joins torch's ``ProcessGroupNCCL created ncclComm_ 0x...``
line) plus ``root=<r>`` for Broadcast / Reduce / Gather / Scatter.

Tolerated: launcher prefixes before the ``host:pid:tid`` marker (``[rank0]:``, ``[default0]:``, Ray
``(RayWorker pid=1) ``, compose ``svc_1  | ``, ``12: ``, progress bars glued in front), NCCL ≥2.26 timestamps,
WARN ``file:line (func)`` parts, two records glued on one physical line, a truncated last line, ``\\r\\n`` ends.

Known limits:

* A progress bar glued to the host name without a separator (``...-1mew0:64904:...``) makes the host ambiguous;
  it is repaired to the host of the same pid whose name it ends with. Its COLL line is matched to its
  communicator only when a clean line of that process came first (the norm: NCCL prints Init lines before ops).
* Input memory is bounded (one chunk); the result is not: about 70 bytes per COLL line while reading, then the
  EVENTS table (a 10 GB COLL log yields tens of millions of rows).
* Transport, ring, tree and bootstrap lines do not name their communicator; they are attributed to the
  communicator whose Init START the same thread printed last (topology, bootstrap) or to the last communicator of
  the process with that rank (transports, which proxy threads print). ``group`` stays null when that is unclear.
* Split communicators (2.23+) print no ``commId``; they are grouped by parent commId + color
  (``split:<parent commId>:<color>``), which formats.md marks as not verified unique.
* Timestamps (``[%F %T]`` default format only) are local time of the node; they are read as UTC.
* ``world_size`` is the largest ``nranks`` seen; for a file that only holds sub-communicators it is their size.
* RCCL / NCCLX / MSCCL variants are not covered; RCCL fields appended after ``stream`` are ignored.
"""
from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from analyzers import schema
from analyzers.opnames import canonical_op
from analyzers.readers.base import ReaderError, ReadResult, Skipped

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


@dataclass(frozen=True)
class ColumnMap:
    """One line of the declared raw → column mapping."""

    raw: str
    column: str
    type: str
    default: str
    since: str


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

_CHUNK = 8 << 20
_MAX_CARRY = 64 << 20          # a "line" longer than this is cut (binary junk without newlines)
_PREFIX_CACHE_MAX = 200_000

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
    rb"|\d+ coll channels|[\w./+-]+:\d+ (?:\([^)]*\) )?-> ))"
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
    if not head or _looks_binary(head):
        return False
    if _SNIFF_RE.search(head):
        return True
    try:
        with open(path, "rb") as f:
            more = f.read(4 << 20)
    except OSError:
        return False
    return not _looks_binary(more) and bool(_SNIFF_RE.search(more))


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


#: Integers kept per COLL match (one flat ``array("q")`` per chunk: no Python object outlives its chunk).
_META = ("line", "ii", "ci", "seq", "opc", "op", "dt", "count", "root")
_NMETA = len(_META)


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
        self.torn = 0
        self.n_marker_lines = 0
        self.batches: list[array] = []
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

    # ---- chunk loop

    def run(self, f: BinaryIO) -> None:
        line = 1
        for chunk in _iter_chunks(f):
            line = self._chunk(chunk, line)

    def _chunk(self, chunk: bytes, first_line: int) -> int:
        """Parse one chunk of whole lines; returns the number of the line after it."""
        if self.bad_utf8_line is None and not chunk.isascii():
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad_utf8_line = first_line + chunk.count(b"\n", 0, e.start)
        cur_pos, cur_line = 0, first_line
        last_rare = -1
        count = chunk.count
        rfind = chunk.rfind
        cache = self.coll_cache
        meta = array("q")
        meta_extend = meta.extend
        p2p_raw = _P2P_RAW
        op_ids = self.op_ids
        n = 0
        for m in _SCAN_RE.finditer(chunk):
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
            oi = op_ids.get(op)
            if oi is None:
                oi = op_ids[op] = len(op_ids)
            if op in p2p_raw:
                seq = self._p2p_seq(c, op, root)
            else:
                seq = c.n_coll = c.n_coll + 1
            meta_extend((cur_line, ii, ci, seq, 0 if opc == b"0" else int(opc, 16), oi, int(dt), int(cnt),
                         0 if root == b"0" else int(root)))
            n += 1
        self.n_marker_lines += n
        if n:
            self.batches.append(meta)
        if count(b": opCount ") != n:
            self._find_torn_coll(chunk, first_line)
        return cur_line + count(b"\n", cur_pos)

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
        """COLL rows → EVENTS, vectorised; also the seq basis per communicator (idx → (basis, first line, n))."""
        if not self.batches:
            return schema.empty(schema.EVENTS), {}
        flat = pa.concat_arrays([pa.Array.from_buffers(pa.int64(), len(b), [None, pa.py_buffer(b)])
                                 for b in self.batches])
        self.batches = []
        n = len(flat) // _NMETA
        base = pc.multiply(pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1), _NMETA)
        cols_i = {k: pc.take(flat, pc.add(base, i)) for i, k in enumerate(_META)}
        line_a, seq_a, opc_a = cols_i["line"], cols_i["seq"], cols_i["opc"]
        ii_a, ci_a = cols_i["ii"].cast(pa.int32()), cols_i["ci"].cast(pa.int32())
        op_idx = cols_i["op"].cast(pa.int32())
        # op name and category through the (small) table of raw names
        raw_ops = [o.decode() for o, _ in sorted(self.op_ids.items(), key=lambda kv: kv[1])]
        names = pa.array([canonical_op(r) for r in raw_ops], pa.string())
        cats = pa.array(["p2p" if r.encode() in _P2P_RAW else "collective" for r in raw_ops], pa.string())
        name_a = pc.take(names, op_idx)
        cat_a = pc.take(cats, op_idx)
        is_p2p = pc.equal(cat_a, "p2p")
        dt_a = cols_i["dt"]
        dt_known = pc.and_(pc.greater_equal(dt_a, 0), pc.less(dt_a, len(NCCL_DTYPES)))
        dt_idx = pc.if_else(dt_known, dt_a, pa.scalar(None, pa.int64()))
        dtype_a = pc.take(pa.array([NCCL_DTYPES[i][0] for i in range(len(NCCL_DTYPES))], pa.string()), dt_idx)
        size_a = pc.take(pa.array([NCCL_DTYPES[i][1] for i in range(len(NCCL_DTYPES))], pa.int64()), dt_idx)
        nbytes_a = pc.multiply(cols_i["count"], size_a)
        root_a = cols_i["root"]
        peer_a = pc.if_else(is_p2p, root_a.cast(pa.int32()), pa.scalar(None, pa.int32()))
        # detail: the comm pointer (joins torch's "ncclComm_ 0x..." log line), and the root where it matters
        detail_a = pc.take(pa.array([f"comm={c.ptr}" for c in self.all_comms], pa.string()), ci_a)
        rooted_ids = [i for i, r in enumerate(raw_ops) if r in _ROOTED_RAW]
        if rooted_ids:
            rooted = pc.is_in(op_idx, pa.array(rooted_ids, pa.int32()))
            if pc.any(rooted).as_py():
                sub = pc.binary_join_element_wise(pc.filter(detail_a, rooted), " root=",
                                                  pc.filter(root_a, rooted).cast(pa.string()), "")
                detail_a = pc.replace_with_mask(detail_a, rooted, sub)
        # per-communicator columns and the seq basis (module docstring, rules 1-3)
        comms = self.all_comms
        group_t = pa.array([c.group for c in comms], pa.string())
        rank_t = pa.array([c.rank for c in comms], pa.int32())
        basis: dict[int, tuple[str, int, int]] = {}
        opcount_comms: list[int] = []
        for c in comms:
            nrows = c.n_coll + sum(c.p2p.values())
            if not nrows or c.first_coll_line is None:
                continue
            cidx, first = c.idx, c.first_coll_line
            c = comms[cidx]
            if c.init_seen:
                basis[cidx] = ("line", first, nrows)
                continue
            sel = pc.filter(opc_a, pc.and_(pc.equal(ci_a, cidx), pc.invert(is_p2p)))
            mono = len(sel) > 0 and pc.max(sel).as_py() > 0 and (
                len(sel) < 2 or pc.all(pc.less_equal(sel.slice(0, len(sel) - 1), sel.slice(1))).as_py())
            if mono:
                basis[cidx] = ("opcount", first, nrows)
                opcount_comms.append(cidx)
                self.skipped.append(Skipped(self.file, first, f"{c.group} (pid {c.pid}): no Init line, seq = "
                                            "opCount + 1 (log starts mid-run; grouped ops share a position)"))
            else:
                basis[cidx] = ("line_from_log_start", first, nrows)
                self.skipped.append(Skipped(self.file, first, f"{c.group} (pid {c.pid}): no Init line and no "
                                            "usable opCount; seq counts COLL lines from the start of this file"))
        if opcount_comms:
            use = pc.and_(pc.is_in(ci_a, pa.array(opcount_comms, pa.int32())), pc.invert(is_p2p))
            seq_a = pc.if_else(use, pc.add(opc_a, 1), seq_a)
        idents = self.idents
        cols: dict[str, Any] = {
            "host": pc.take(pa.array([x[0] for x in idents], pa.string()), ii_a),
            "pid": pc.take(pa.array([x[1] for x in idents], pa.int64()), ii_a),
            "tid": pc.take(pa.array([x[2] for x in idents], pa.int64()), ii_a),
            "wall_ns": pc.take(pa.array([x[3] for x in idents], pa.int64()), ii_a),
            "rank": pc.take(rank_t, ci_a),
            "world": pa.nulls(n, pa.int32()) if world is None else pa.repeat(pa.scalar(world, pa.int32()), n),
            "kind": pa.repeat(pa.scalar("enter"), n),
            "name": name_a,
            "category": cat_a,
            "group": pc.take(group_t, ci_a),
            "backend": pa.repeat(pa.scalar("nccl"), n),
            "seq": seq_a,
            "backend_seq": opc_a,
            "peer": peer_a,
            "nbytes": nbytes_a,
            "dtype": dtype_a,
            "detail": detail_a,
            "source": pa.repeat(pa.scalar("nccl"), n),
            "file": pa.repeat(pa.scalar(self.file), n),
            "line": line_a,
        }
        arrays = [(cols[f.name] if cols[f.name].type == f.type else cols[f.name].cast(f.type))
                  if f.name in cols else pa.nulls(n, f.type) for f in schema.EVENTS]
        return pa.Table.from_arrays(arrays, schema=schema.EVENTS), basis


def _iter_chunks(f: BinaryIO) -> Iterator[bytes]:
    """Yield pieces of whole lines (about ``_CHUNK`` bytes); the last piece may lack its newline."""
    carry = b""
    while True:
        block = f.read(_CHUNK)
        if not block:
            break
        cut = block.rfind(b"\n")
        if cut < 0:
            carry += block
            if len(carry) >= _MAX_CARRY:
                yield carry
                carry = b""
            continue
        if carry:
            yield b"".join((carry, memoryview(block)[: cut + 1]))
        else:
            yield block if cut == len(block) - 1 else block[: cut + 1]
        carry = block[cut + 1:]
    if carry:
        yield carry


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
        if _looks_binary(head) and not _SNIFF_RE.search(head):
            raise ReaderError(path, "binary content, not an NCCL debug log")
        f.seek(0)
        r = _Reader(path)
        try:
            r.run(f)
        except OSError as e:
            raise ReaderError(path, f"read failed: {e.strerror or e}") from e
    if r.n_marker_lines == 0 and not r.versions:
        raise ReaderError(path, "no NCCL debug line (host:pid:tid [dev] NCCL INFO|WARN ...) found")
    return r.result()
