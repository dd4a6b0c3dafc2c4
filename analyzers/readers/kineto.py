"""Reader for Kineto / ``torch.profiler`` Chrome-trace JSON (``.json`` or ``.json.gz``), one file per rank.

Why: users often hold profiler traces of the job that later hung (or of its last good steps). Each trace says,
per rank, which collectives that rank issued in which order, on which process group, with which dtype and size,
and which of their NCCL kernels finished. The wait-for engine needs exactly that, in the common tables.

What comes out (reference: ``shared/reference/formats.md`` §5):

* One op per CPU-side collective call. PyTorch wraps each c10d call in a ``record_param_comms`` CPU op (args
  ``Collective name``, ``In/Out msg nelems``, ``Group size``, ``dtype``, ``Process Group Name/Description/Ranks`` or
  the older ``Process Group ID`` + ``Global rank start/stride``) and a ``nccl:<op>``/``gloo:<op>`` annotation.
  On each thread, comm events nested in another comm event are folded into the outermost one: its name comes
  from the annotation (``nccl:_all_gather_base`` → ``all_gather_into_tensor`` via ``canonical_op``; else the
  ``Collective name``), its arguments from the first ``record_param_comms`` inside. ``record_param_comms`` of
  ``Collective name == "wait"`` (``Work.wait``) is not an op. ``gpu_user_annotation`` copies are ignored.
* EVENTS rows, ``source="kineto"``: ``enter`` at the op's start, ``exit`` at its end (the call returned: on NCCL
  that means *enqueued*, DESIGN §2), and ``complete`` (``state="completed"``) at the end of the last NCCL kernel
  launched inside the op (found via the ``cuda_runtime`` launch's ``correlation``), when the trace has it.
  ``file`` = the trace, ``line`` = index of the source event in ``traceEvents`` (a record index, not a text line).
  Plus one ``identity`` row (``distributedInfo``: rank, world, backend) and one ``group`` row per ``pg_config``
  entry (name, description, backend, member ranks), both ``category="init"`` and without time.
* **seq**: 1-based order of the op among the ops of the same group (``(group, backend)``; ``group`` = PG name, or
  ``str(Process Group ID)`` on older traces, or null when the trace names no group) on this rank, counted in start
  time order across all threads of the file. p2p ops (send/recv...) have their own counters, apart from the
  collectives: per (group, src, dst) pair when the peer is known (rank 0's send to 1 and rank 1's recv from 0 share
  one sequence), else one p2p counter per group.
  Because a profiler trace covers only its recording window, seq counts from the start of *the window*, not of the
  job: it aligns ranks only when their windows cover the same steps (``backend_seq`` carries PyTorch's own ``Seq``
  arg when the trace has it; prefer it for cross-rank alignment). It also counts C++-issued collectives (DDP's
  bucket all-reduces) that ranktrace's own ``seq`` does not.

Time (three regimes, formats.md §5.2): ``baseTimeNanoseconds`` present → ``wall_ns = base + round(ts × 1000)``;
no base and ``ts`` ≥ 1e15 µs (absolute epoch µs, older traces) → ``wall_ns = round(ts × 1000)``; otherwise the
origin is unknown → ``t_ns = round(ts × 1000)`` on a trace-local clock and ``wall_ns`` null. ``displayTimeUnit``
never changes units. Cross-host comparisons rely on NTP.

Memory: the file is parsed as a stream (:class:`_JsonStream`: one ``traceEvents`` element decoded at a time, in
1 MiB reads), so only the collective candidates and the CUDA launches of one file are held, never its whole JSON.
Launches (one per kernel: millions in a big trace) are kept as flat arrays, about 20 bytes each; one JSON value
larger than 64 MiB is treated as corruption (the events before it are used). So memory grows with the number of
collectives and launches, not with the size of the file.

Bad input: unreadable file, not JSON, or JSON that is not a trace (no ``traceEvents``) → :class:`ReaderError`.
A truncated file (crashed profiler, ``.tmp`` leftovers, cut gzip) yields what was read before the cut plus a
:class:`Skipped`; unusable events are counted in one :class:`Skipped` per reason.

Known limits: ``B``/``E`` duration pairs (not written by Kineto) are ignored; group membership is not inferred when
the trace names no group; ``Src/Dst Rank`` args may be group-local ranks and are reported as given in ``peer``;
NCCL kernels that no CPU op can claim (sampled traces) are counted, not emitted; ``nbytes`` uses ``In msg nelems``
(or the annotation's ``Input Dims``) × element size.
"""
from __future__ import annotations

import ast
import bisect
import codecs
import gzip
import json
import math
import re
import zlib
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple

import numpy as np

from analyzers import schema
from analyzers.opnames import P2P_OPS, canonical_op
from analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = [
    "FORMAT",
    "sniff",
    "read",
    "FieldMap",
    "FIELD_MAP",
    "DTYPES",
    "ABSOLUTE_EPOCH_US",
]

FORMAT = "kineto"
SOURCE = "kineto"
ABSOLUTE_EPOCH_US = 1e15           # ts above this (≈ 2001-09-09) is absolute Unix-epoch µs
_CHUNK = 1 << 20
_MAX_VALUE_CHARS = 64 << 20       # one JSON value larger than this is treated as corrupt, not as "read more"
_GZIP_MAGIC = b"\x1f\x8b"
_KINETO_KEYS = ('"traceEvents"', '"schemaVersion"', '"distributedInfo"', '"deviceProperties"',
                '"baseTimeNanoseconds"')
_BACKEND_PREFIX = re.compile(r"^(nccl|gloo|xccl|ucc|mpi|hccl|rccl|cncl|mccl):(.+)$", re.IGNORECASE)


class FieldMap(NamedTuple):
    """One raw trace field and where it goes (the reader's declared mapping, style.md point 3)."""

    raw: str        # where in the trace
    column: str     # TABLE.column in analyzers.schema ('' = used only inside the reader)
    type: str
    default: Any
    since: str      # first PyTorch/Kineto generation known to write it


FIELD_MAP: tuple[FieldMap, ...] = (
    FieldMap("distributedInfo.rank", "EVENTS.rank", "int", None, "all with distributed"),
    FieldMap("distributedInfo.world_size", "EVENTS.world", "int", None, "~2023"),
    FieldMap("distributedInfo.backend", "EVENTS.backend", "str", None, "~2023"),
    FieldMap("distributedInfo.pg_config[].pg_name", "EVENTS.group (kind=group)", "str", None, "~2024"),
    FieldMap("distributedInfo.pg_config[].pg_desc | uid", "EVENTS.group_desc", "str", None, "uid: older"),
    FieldMap("distributedInfo.pg_config[].ranks", "EVENTS.group_ranks", "list[int] | str", None, "~2024"),
    FieldMap("distributedInfo.pg_config[].backend_config", "EVENTS.backend", "str 'cuda:nccl'", None, "~2024"),
    FieldMap("traceEvents[].ts", "EVENTS.wall_ns | t_ns", "µs float", None, "all"),
    FieldMap("traceEvents[].dur", "EVENTS.wall_ns (exit row)", "µs float", 0, "all"),
    FieldMap("baseTimeNanoseconds", "EVENTS.wall_ns offset", "int ns", None, "~2024"),
    FieldMap("nccl:<op> | gloo:<op> annotation name", "EVENTS.name (canonical_op), EVENTS.backend", "str", None,
             "all"),
    FieldMap("args['Collective name']", "EVENTS.name (fallback)", "str", None, "~2023"),
    FieldMap("args['Process Group Name']", "EVENTS.group", "str", None, "~2024"),
    FieldMap("args['Process Group Description']", "EVENTS.group_desc", "str", None, "~2024"),
    FieldMap("args['Process Group Ranks']", "EVENTS.group_ranks", "str '[0, 1]'", None, "~2024"),
    FieldMap("args['Process Group ID']", "EVENTS.group", "int", None, "older (2023-2024)"),
    FieldMap("args['Global rank start'/'Global rank stride'] + args['Group size']", "EVENTS.group_ranks", "int",
             None, "older"),
    FieldMap("args['dtype']", "EVENTS.dtype", "str 'Float'", None, "~2023"),
    FieldMap("args['In msg nelems'] × itemsize(dtype)", "EVENTS.nbytes", "int", None, "~2023"),
    FieldMap("annotation args['Input Dims'], args['Input type']", "EVENTS.shape, dtype, nbytes", "list", None,
             "record_shapes=True"),
    FieldMap("args['Seq']", "EVENTS.backend_seq", "int", None, "newer"),
    FieldMap("args['Src Rank'] | args['Dst Rank']", "EVENTS.peer", "int", None, "p2p, newer"),
    FieldMap("kernel args['correlation'] ↔ cuda_runtime args['correlation']", "EVENTS kind=complete", "int", None,
             "all"),
)

# element type name (Kineto dtype arg = c10 ScalarType name; annotation 'Input type' = C++ type name) → (torch
# dtype name, itemsize bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "float": ("float32", 4), "Double": ("float64", 8), "double": ("float64", 8),
    "Half": ("float16", 2), "c10::Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "c10::BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "long int": ("int64", 8), "long": ("int64", 8),
    "int64_t": ("int64", 8), "Int": ("int32", 4), "int": ("int32", 4), "Short": ("int16", 2),
    "short int": ("int16", 2), "Char": ("int8", 1), "signed char": ("int8", 1), "Byte": ("uint8", 1),
    "unsigned char": ("uint8", 1), "Bool": ("bool", 1), "bool": ("bool", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1), "c10::Float8_e5m2": ("float8_e5m2", 1),
    "ComplexFloat": ("complex64", 8), "c10::complex<float>": ("complex64", 8),
}


def sniff(path: Path, head: bytes) -> bool:
    """True when the first bytes (gunzipped if needed) look like a Kineto trace object."""
    text = _head_text(head)
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return False
    if any(k in text for k in _KINETO_KEYS):
        return True
    return stripped.startswith("[") and '"ph"' in text and '"ts"' in text and '"cat"' in text


def read(path: Path) -> ReadResult:
    """Read one trace file (one rank). Raises ReaderError when it cannot be opened or is not a trace."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if not magic:
        raise ReaderError(path, "empty file, expected a Kineto / torch.profiler trace (JSON)")
    collector = _Collector(str(path))
    try:
        raw: IO[bytes] = gzip.open(path, "rb") if magic == _GZIP_MAGIC else path.open("rb")
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e}") from e
    with raw:
        stream = _JsonStream(raw)
        try:
            for item in stream.items():
                collector.take(item)
        except _NotJson as e:
            if collector.events_seen == 0 and not collector.meta:
                raise ReaderError(path, f"not a Kineto trace: {e}") from e
            collector.skip(None, f"stopped at byte {e.offset}: {e} (rest of the file not read)")
        except _Truncated as e:
            if collector.events_seen == 0 and not collector.meta:
                raise ReaderError(path, f"not a Kineto trace: file ends before any trace content ({e})") from e
            collector.skip(None, f"truncated trace: file ends inside the JSON after {collector.events_seen} events "
                                 f"({e}); the events before the cut are used")
    if not collector.saw_trace_events:
        raise ReaderError(path, "JSON without 'traceEvents': not a Kineto / torch.profiler trace")
    return collector.result()


# ---------------------------------------------------------------------------------------------------- streaming JSON

class _Truncated(Exception):
    """The input ended inside a JSON value."""


class _NotJson(Exception):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class _JsonStream:
    """Incremental reader of one top-level JSON object (or array) that yields the ``traceEvents`` one by one.

    Items: ``("meta", key, value)`` for each top-level key other than ``traceEvents``, ``("event", index, dict)``
    for each element of ``traceEvents`` (or of a top-level array). Only the value being decoded is buffered.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.decoder = json.JSONDecoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # chars dropped from the front of buf
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.raw.read(_CHUNK)
        except (EOFError, zlib.error, OSError):  # cut gzip stream / bad CRC: treat as end of data
            chunk = b""
        if not chunk:
            self.eof = True
            self.buf += self.utf8.decode(b"", final=True)
            return False
        if self.pos > _CHUNK:
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += self.utf8.decode(chunk)
        return True

    def _peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise _Truncated(f"at char {self.consumed + self.pos}")

    def _expect(self, chars: str) -> str:
        c = self._peek()
        if c not in chars:
            raise _NotJson(f"expected {' or '.join(repr(x) for x in chars)}, found {c!r}", self.consumed + self.pos)
        self.pos += 1
        return c

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if len(self.buf) - self.pos > _MAX_VALUE_CHARS:
                    raise _NotJson(f"one JSON value runs past {_MAX_VALUE_CHARS >> 20} MiB without ending ({e.msg}): "
                                   "corrupt, or not a trace", self.consumed + e.pos) from e
                if not self._fill():
                    if e.pos >= len(self.buf) - 1 or "Unterminated" in e.msg:
                        raise _Truncated(f"at char {self.consumed + e.pos}") from e
                    raise _NotJson(f"invalid JSON ({e.msg})", self.consumed + e.pos) from e
                continue
            if end >= len(self.buf) and not self.eof and self._fill():
                continue  # a number may continue in the next chunk: decode again with more text
            self.pos = end
            return value

    def items(self) -> Iterator[tuple[Any, ...]]:
        first = self._expect("{[")
        if first == "[":
            yield from self._array_events()
            return
        if self._peek() == "}":
            return
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise _NotJson("object key is not a string", self.consumed + self.pos)
            self._expect(":")
            if key == "traceEvents" and self._peek() == "[":
                self.pos += 1
                yield ("meta", "traceEvents", None)
                yield from self._array_events()
            else:
                yield ("meta", key, self._value())
            if self._expect(",}") == "}":
                return

    def _array_events(self) -> Iterator[tuple[Any, ...]]:
        index = 0
        if self._peek() == "]":
            self.pos += 1
            return
        while True:
            yield ("event", index, self._value())
            index += 1
            if self._expect(",]") == "]":
                return


def _head_text(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 16)
        except zlib.error:
            return ""
    return head.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------------- collection

@dataclass
class _Comm:
    """A CPU-side comm event (record_param_comms or a backend annotation) on one thread."""

    index: int
    pid: Any
    tid: Any
    ts: float
    end: float
    name: str                 # raw event name
    is_annotation: bool
    args: dict[str, Any]
    children: list["_Comm"] = field(default_factory=list)


@dataclass
class _Op:
    comm: _Comm
    name: str
    raw_name: str
    backend: str | None
    args: dict[str, Any]
    nested: int
    kernel_end: float | None = None
    kernel_name: str | None = None


class _Collector:
    """Consumes stream items; keeps only what ops need; builds the tables at the end."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.meta: dict[str, Any] = {}
        self.saw_trace_events = False
        self.events_seen = 0
        self.comms: dict[tuple[Any, Any], list[_Comm]] = defaultdict(list)
        # CUDA launches, one per kernel of the trace (millions in a big one): kept as three flat arrays (20 bytes
        # a launch instead of a dict entry and a tuple); only those of NCCL kernels are looked up at the end
        self.launch_corr = array("q")
        self.launch_ts = array("d")
        self.launch_thread = array("i")
        self.threads: dict[tuple[Any, Any], int] = {}
        self.thread_keys: list[tuple[Any, Any]] = []
        self.big_corr: dict[int, tuple[Any, Any, float]] = {}   # correlation ids beyond 64 bits (never in practice)
        self.kernels: list[tuple[int, float, str]] = []  # (correlation, end µs, name) of NCCL kernels
        self.skip_counts: dict[str, int] = defaultdict(int)
        self.skipped: list[Skipped] = []

    def skip(self, line: int | None, reason: str) -> None:
        self.skipped.append(Skipped(self.file, line, reason))

    # -- stream

    def take(self, item: tuple[Any, ...]) -> None:
        if item[0] == "meta":
            if item[1] == "traceEvents":
                self.saw_trace_events = True
            else:
                self.meta[item[1]] = item[2]
            return
        _, index, ev = item
        self.saw_trace_events = True
        self.events_seen += 1
        if not isinstance(ev, dict):
            self.skip_counts["traceEvents element that is not an object"] += 1
            return
        if ev.get("ph") != "X":
            return
        name, cat = ev.get("name"), ev.get("cat")
        if not isinstance(name, str):
            return
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            if name == "record_param_comms" or _BACKEND_PREFIX.match(name):
                self.skip_counts["collective event without a numeric ts/dur"] += 1
            return
        if cat == "cpu_op" and name == "record_param_comms":
            self.comms[(ev.get("pid"), ev.get("tid"))].append(
                _Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, False, _comm_args(args)))
        elif cat in ("user_annotation", "cpu_op") and _BACKEND_PREFIX.match(name):
            self.comms[(ev.get("pid"), ev.get("tid"))].append(
                _Comm(index, ev.get("pid"), ev.get("tid"), ts, ts + dur, name, True, _annotation_args(args)))
        elif cat in ("cuda_runtime", "cuda_driver") and "Launch" in name and "correlation" in args:
            try:
                corr = int(args["correlation"])
            except (TypeError, ValueError):
                return
            thread = (ev.get("pid"), ev.get("tid"))
            try:
                hash(thread)
            except TypeError:  # pid/tid that are lists or objects: no thread to tie a kernel to
                return
            if not -(1 << 63) <= corr < 1 << 63:
                self.big_corr[corr] = (thread[0], thread[1], ts)
                return
            ti = self.threads.get(thread)
            if ti is None:
                ti = self.threads[thread] = len(self.thread_keys)
                self.thread_keys.append(thread)
            self.launch_corr.append(corr)
            self.launch_ts.append(ts)
            self.launch_thread.append(ti)
        elif cat == "kernel" and name.startswith("nccl"):
            corr = args.get("correlation")
            if isinstance(corr, int):
                self.kernels.append((corr, ts + dur, name))

    # -- result

    def result(self) -> ReadResult:
        info = self.meta.get("distributedInfo") if isinstance(self.meta.get("distributedInfo"), dict) else {}
        rank, world = _int(info.get("rank")), _int(info.get("world_size"))
        backend = info.get("backend") if isinstance(info.get("backend"), str) else None
        pgs = _pg_config(info.get("pg_config"))
        clock = _Clock(self.meta.get("baseTimeNanoseconds"))
        ops = self._ops()
        self._attach_kernels(ops)
        rows: list[dict[str, Any]] = []
        base = {"rank": rank, "world": world, "source": SOURCE, "file": self.file}
        if info:
            rows.append(dict(base, kind="identity", name="distributedInfo", category="init", backend=backend,
                             detail=f"nccl_version={info['nccl_version']}" if info.get("nccl_version") else None))
        for pg in pgs:
            rows.append(dict(base, kind="group", name=pg.name, category="init", group=pg.name, group_desc=pg.desc,
                             backend=pg.backend, group_ranks=pg.ranks,
                             detail=f"pg_size={pg.size}" if pg.size is not None else None))
        counters: dict[tuple[Any, ...], int] = defaultdict(int)
        for op in sorted(ops, key=lambda o: (o.comm.ts, o.comm.index)):
            fields = self._op_fields(op, pgs, backend)
            category = "p2p" if op.name in P2P_OPS else "collective"
            key: tuple[Any, ...] = (fields.get("group"), fields.get("backend"))
            if category == "p2p":
                # p2p never shares a counter with collectives; per (src, dst) pair when the peer is known, so rank
                # 0's send to 1 and rank 1's recv from 0 count in the same sequence
                peer = fields.get("peer")
                outgoing = op.name in ("send", "isend")
                key += ("p2p",) if peer is None else (("p2p", rank, peer) if outgoing else ("p2p", peer, rank))
            counters[key] += 1
            fields.update(seq=counters[key], name=op.name, category=category, pid=_int(op.comm.pid),
                          tid=_int(op.comm.tid), line=op.comm.index)
            detail = op.raw_name + (f" (+{op.nested} nested comm events)" if op.nested else "")
            rows.append(dict(base, kind="enter", detail=detail, **clock.stamp(op.comm.ts), **fields))
            rows.append(dict(base, kind="exit", detail=detail, **clock.stamp(op.comm.end), **fields))
            if op.kernel_end is not None:
                rows.append(dict(base, kind="complete", state="completed", detail=f"kernel {op.kernel_name}",
                                 **clock.stamp(op.kernel_end), **fields))
        for reason, count in sorted(self.skip_counts.items()):
            self.skip(None, f"{count} × {reason}")
        return ReadResult(file=self.file, format=FORMAT, version=_version(self.meta),
                          events=schema.table_from_rows(schema.EVENTS, rows), skipped=tuple(self.skipped),
                          world_size=world)

    def _ops(self) -> list[_Op]:
        """Fold nested comm events per thread into outermost ops (worked example in the module docstring)."""
        ops: list[_Op] = []
        for comms in self.comms.values():
            comms.sort(key=lambda c: (c.ts, -c.end, c.index))
            stack: list[_Comm] = []
            roots: list[_Comm] = []
            for c in comms:
                while stack and c.ts > stack[-1].end + 1e-3:
                    stack.pop()
                if stack and c.end <= stack[-1].end + 1e-3:
                    stack[-1].children.append(c)
                else:
                    roots.append(c)
                stack.append(c)
            for root in roots:
                op = _fold(root)
                if op is not None:
                    ops.append(op)
                elif root.args.get("Collective name") != "wait":  # Work.wait() is not an op: no note
                    self.skip_counts["record_param_comms without a collective name nor annotation"] += 1
        return ops

    def _launches(self, wanted: set[int]) -> dict[int, tuple[Any, Any, float]]:
        """correlation → (pid, tid, ts) of the launches in ``wanted`` (the last one when a correlation repeats)."""
        out: dict[int, tuple[Any, Any, float]] = {}
        if not wanted:
            return out
        corr = np.frombuffer(self.launch_corr, dtype=np.int64) if len(self.launch_corr) else np.zeros(0, np.int64)
        small = [c for c in wanted if -(1 << 63) <= c < 1 << 63]
        for i in np.flatnonzero(np.isin(corr, np.array(small, dtype=np.int64))).tolist():
            pid, tid = self.thread_keys[self.launch_thread[i]]
            out[int(corr[i])] = (pid, tid, self.launch_ts[i])
        out.update((c, v) for c, v in self.big_corr.items() if c in wanted)
        return out

    def _attach_kernels(self, ops: list[_Op]) -> None:
        by_thread: dict[tuple[Any, Any], list[_Op]] = defaultdict(list)
        for op in ops:
            by_thread[(op.comm.pid, op.comm.tid)].append(op)
        starts: dict[tuple[Any, Any], list[float]] = {}
        for key, lst in by_thread.items():
            lst.sort(key=lambda o: o.comm.ts)
            starts[key] = [o.comm.ts for o in lst]
        launches = self._launches({corr for corr, _, _ in self.kernels})
        orphans = 0
        for corr, end, name in self.kernels:
            launch = launches.get(corr)
            op = None
            if launch is not None:
                key = (launch[0], launch[1])
                lst = by_thread.get(key, [])
                i = bisect.bisect_right(starts.get(key, []), launch[2]) - 1
                if i >= 0 and lst[i].comm.ts <= launch[2] <= lst[i].comm.end:
                    op = lst[i]
            if op is None:
                orphans += 1
                continue
            if op.kernel_end is None or end > op.kernel_end:
                op.kernel_end, op.kernel_name = end, name
        if orphans:
            self.skip_counts["NCCL kernel not tied to a CPU-side collective (no launch inside one)"] += orphans

    def _op_fields(self, op: _Op, pgs: list["_Pg"], default_backend: str | None) -> dict[str, Any]:
        a = op.args
        out: dict[str, Any] = {}
        group = a.get("Process Group Name")
        pg_id = a.get("Process Group ID")
        pg = None
        if group is not None:
            out["group"] = str(group)
            pg = next((p for p in pgs if p.name == str(group)), None)
        elif pg_id is not None:
            out["group"] = str(pg_id)
            pg = next((p for p in pgs if p.uid == _int(pg_id)), None) or next(
                (p for p in pgs if p.name == str(pg_id)), None)
        out["group_desc"] = a.get("Process Group Description") or (pg.desc if pg else None)
        ranks = _int_list(a.get("Process Group Ranks"))
        if ranks is None and a.get("Global rank start") is not None and _int(a.get("Group size")):
            start, stride = _int(a.get("Global rank start")) or 0, _int(a.get("Global rank stride")) or 1
            ranks = [start + i * stride for i in range(_int(a.get("Group size")) or 0)]
        out["group_ranks"] = ranks if ranks is not None else (pg.ranks if pg else None)
        backend = op.backend or (pg.backend if pg else None) or default_backend
        out["backend"] = backend
        dtype_raw = a.get("dtype") or a.get("Input type")
        dtype = DTYPES.get(str(dtype_raw)) if dtype_raw is not None else None
        out["dtype"] = dtype[0] if dtype else (str(dtype_raw).lower() if dtype_raw else None)
        nelems = _int(a.get("In msg nelems"))
        if nelems is None and a.get("Input Dims") is not None:
            nelems = _numel(a["Input Dims"])
        if a.get("Input Dims") is not None:
            out["shape"] = str(a["Input Dims"])
        if nelems is not None and dtype:
            out["nbytes"] = nelems * dtype[1]
        out["backend_seq"] = _int(a.get("Seq"))
        if op.name in P2P_OPS:
            peer = a.get("Dst Rank") if op.name in ("send", "isend") else a.get("Src Rank")
            out["peer"] = _int(peer)
        return out


def _fold(root: _Comm) -> _Op | None:
    """One op from a root comm event and its nested ones; None when it is not a collective."""
    flat = [root]
    i = 0
    while i < len(flat):
        flat.extend(flat[i].children)
        i += 1
    annotations = [c for c in flat if c.is_annotation]
    annotation = annotations[0] if annotations else None
    param = next((c for c in flat if not c.is_annotation), None)
    args: dict[str, Any] = dict(annotation.args) if annotation else {}
    if param is not None:
        args.update(param.args)
    coll = args.get("Collective name")
    coll = coll if isinstance(coll, str) and coll else None
    backend = None
    if annotation is not None:
        m = _BACKEND_PREFIX.match(annotation.name)
        backend = m.group(1).lower() if m else None
    if annotation is not None and (len(annotations) == 1 or coll is None):
        raw, name = annotation.name, canonical_op(annotation.name)
    elif coll is not None and coll != "wait":
        # no annotation, or a coalesced block (several annotations under one record_param_comms): the block's name
        raw, name = f"record_param_comms {coll}", canonical_op(coll)
    else:
        return None
    used = {id(root)} | {id(c) for c in (annotation, param) if c is not None}
    return _Op(comm=root, name=name, raw_name=raw, backend=backend, args=args, nested=len(flat) - len(used))


_COMM_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
              "Process Group Description", "Process Group Ranks", "Process Group ID", "Global rank start",
              "Global rank stride", "Seq", "Src Rank", "Dst Rank", "Rank")


def _comm_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in _COMM_ARGS if k in args}


def _annotation_args(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        out["Input Dims"] = dims[0]
    types = args.get("Input type")
    if isinstance(types, list) and types and isinstance(types[0], str) and types[0]:
        out["Input type"] = types[0]
    return out


class _Pg(NamedTuple):
    name: str
    desc: str | None
    uid: int | None
    backend: str | None
    size: int | None
    ranks: list[int] | None


def _pg_config(raw: Any) -> list[_Pg]:
    if not isinstance(raw, list):
        return []
    out = []
    for pg in raw:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        cfg = str(pg.get("backend_config") or "")
        backend = cfg.rsplit(":", 1)[-1] if cfg else None   # "cuda:nccl" → nccl; "cpu:gloo,cuda:gloo" → gloo
        desc = pg.get("pg_desc")
        out.append(_Pg(str(pg["pg_name"]), str(desc) if desc is not None else None, _int(pg.get("uid")), backend,
                       _int(pg.get("pg_size")), _int_list(pg.get("ranks"))))
    return out


class _Clock:
    """Converts trace ``ts`` (µs) to (t_ns, wall_ns) for the file's time regime."""

    def __init__(self, base_ns: Any) -> None:
        self.base = _int(base_ns)

    def stamp(self, ts_us: float) -> dict[str, int | None]:
        ns = int(round(ts_us * 1000))
        if self.base is not None:
            return {"t_ns": None, "wall_ns": self.base + ns}
        if ts_us >= ABSOLUTE_EPOCH_US:
            return {"t_ns": None, "wall_ns": ns}
        return {"t_ns": ns, "wall_ns": None}


def _version(meta: dict[str, Any]) -> str | None:
    parts = []
    if meta.get("schemaVersion") is not None:
        parts.append(f"schemaVersion {meta['schemaVersion']}")
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and info.get("nccl_version"):
        parts.append(f"nccl {info['nccl_version']}")
    return ", ".join(parts) or None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _int_list(v: Any) -> list[int] | None:
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple)) and all(_int(x) is not None for x in v):
        return [int(x) for x in v]
    return None


def _numel(dims: Any) -> int | None:
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return None
