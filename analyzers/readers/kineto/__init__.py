"""kineto: Kineto / ``torch.profiler`` Chrome-trace JSON (``.json``, ``.json.gz``), one file per rank, read into
EVENTS: which collectives each rank issued in which order, on which group, and which of their NCCL kernels finished.
Stages: :mod:`.stream` (streaming JSON) -> :mod:`.collect` (keep what matters) -> :mod:`.ops` (comm events -> ops)
(a bounded number of ops per group: collect.Window) -> :mod:`.tables` (rows, seq, time)."""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.kineto.collect import Collector
from ranktrace.analyzers.readers.kineto.ops import DTYPES
from ranktrace.analyzers.readers.kineto.stream import Capped, Gunzip, JsonStream, NotJson, Truncated
from ranktrace.analyzers.readers.kineto.tables import ABSOLUTE_EPOCH_US, build_result

__all__ = [
    "FORMAT",
    "sniff",
    "read",
    "FIELD_MAP",
    "DTYPES",
    "ABSOLUTE_EPOCH_US",
]

FORMAT = "kineto"
_GZIP_MAGIC = b"\x1f\x8b"
_KINETO_KEYS = ('"traceEvents"', '"schemaVersion"', '"distributedInfo"', '"deviceProperties"',
                '"baseTimeNanoseconds"')

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("distributedInfo.rank", "EVENTS.rank", "int", "null", "all with distributed"),
    ColumnMap("distributedInfo.world_size", "EVENTS.world", "int", "null", "~2023"),
    ColumnMap("distributedInfo.backend", "EVENTS.backend", "str", "null", "~2023"),
    ColumnMap("distributedInfo.pg_config[].pg_name", "EVENTS.group (kind=group)", "str", "null", "~2024"),
    ColumnMap("distributedInfo.pg_config[].pg_desc | uid", "EVENTS.group_desc", "str", "null", "uid: older"),
    ColumnMap("distributedInfo.pg_config[].ranks", "EVENTS.group_ranks", "list[int] | str", "null", "~2024"),
    ColumnMap("distributedInfo.pg_config[].backend_config", "EVENTS.backend", "str 'cuda:nccl'", "null", "~2024"),
    ColumnMap("traceEvents[].ts", "EVENTS.wall_ns | t_ns", "µs float", "null", "all"),
    ColumnMap("traceEvents[].dur", "EVENTS.wall_ns (exit row)", "µs float", "0", "all"),
    ColumnMap("baseTimeNanoseconds", "EVENTS.wall_ns offset", "int ns", "null", "~2024"),
    ColumnMap("nccl:<op> | gloo:<op> annotation name", "EVENTS.name (canonical_op), EVENTS.backend", "str", "null",
              "all"),
    ColumnMap("args['Collective name']", "EVENTS.name (fallback)", "str", "null", "~2023"),
    ColumnMap("args['Process Group Name']", "EVENTS.group", "str", "null", "~2024"),
    ColumnMap("args['Process Group Description']", "EVENTS.group_desc", "str", "null", "~2024"),
    ColumnMap("args['Process Group Ranks']", "EVENTS.group_ranks", "str '[0, 1]'", "null", "~2024"),
    ColumnMap("args['Process Group ID']", "EVENTS.group", "int", "null", "older (2023-2024)"),
    ColumnMap("args['Global rank start'/'Global rank stride'] + args['Group size']", "EVENTS.group_ranks", "int",
              "null", "older"),
    ColumnMap("args['dtype']", "EVENTS.dtype", "str 'Float'", "null", "~2023"),
    ColumnMap("args['In msg nelems'] × itemsize(dtype)", "EVENTS.nbytes", "int", "null", "~2023"),
    ColumnMap("annotation args['Input Dims'], args['Input type']", "EVENTS.shape, dtype, nbytes", "list", "null",
              "record_shapes=True"),
    ColumnMap("args['Seq']", "EVENTS.backend_seq", "int", "null", "newer"),
    ColumnMap("args['Src Rank'] | args['Dst Rank']", "EVENTS.peer", "int", "null", "p2p, newer"),
    ColumnMap("kernel args['correlation'] ↔ cuda_runtime args['correlation']", "EVENTS kind=complete", "int", "null",
              "all"),
)


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
    """Read one trace file (one rank). Raises ReaderError when it cannot be opened or is not a trace.

    What comes out (reference: ``shared/reference/formats.md`` §5):

    * One op per CPU-side collective call. PyTorch wraps each c10d call in a ``record_param_comms`` CPU op (args
      ``Collective name``, ``In/Out msg nelems``, ``Group size``, ``dtype``, ``Process Group Name/Description/Ranks`` or
      the older ``Process Group ID`` + ``Global rank start/stride``) and a ``nccl:<op>``/``gloo:<op>`` annotation.
      On each thread, comm events nested in another comm event are folded into the outermost one: its name comes
      from the annotation (``nccl:_all_gather_base`` → ``all_gather_into_tensor`` via ``canonical_op``; else the
      ``Collective name``), its arguments from the first ``record_param_comms`` inside. ``record_param_comms`` of
      ``Collective name == "wait"`` (``Work.wait``) is not an op. ``gpu_user_annotation`` copies are ignored.
    * EVENTS rows, ``source="kineto"``: ``enter`` at the op's start, ``exit`` at its end (the call returned: on NCCL
      that means *enqueued*), and ``complete`` (``state="completed"``) at the end of the last NCCL kernel
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

    Memory: the file is parsed as a stream (:class:`.stream.JsonStream`: one ``traceEvents`` element decoded at a time,
    in 1 MiB reads), so only the collective candidates and the CUDA launches of one file are held, never its whole JSON.
    Launches (one per kernel: millions in a big trace) and NCCL kernels are kept as flat arrays, about 20 bytes each;
    one JSON value larger than 64 MiB is treated as corruption (the events before it are used). Comm events are
    folded into ops as they come, and each group keeps its first ``collect.HEAD`` and last ``collect.TAIL`` ops, the
    ones between only counted (one Skipped line says how many, per group; the seq of a kept op counts them all). So
    memory is bounded in the number of collectives and grows by ~40 bytes per launch and kernel.
    A plain (not gzip) trace is read up to ``MAX_PLAIN_BYTES`` (1 GiB), a gzip one up to 64x its size (256 MiB to
    4 GiB decompressed); past that one Skipped line names the bound and the events before it are used.

    Bad input: unreadable file, not JSON, or JSON that is not a trace (no ``traceEvents``) → :class:`ReaderError`.
    A truncated file (crashed profiler, ``.tmp`` leftovers, cut gzip) yields what was read before the cut plus a
    :class:`Skipped`; unusable events are counted in one :class:`Skipped` per reason.

    Known limits: ``B``/``E`` duration pairs (not written by Kineto) are ignored; group membership is not inferred when
    the trace names no group; ``Src/Dst Rank`` args may be group-local ranks and are reported as given in ``peer``;
    NCCL kernels that no CPU op can claim (sampled traces) are counted, not emitted; ``nbytes`` uses ``In msg nelems``
    (or the annotation's ``Input Dims``) × element size.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if not magic:
        raise ReaderError(path, "empty file, expected a Kineto / torch.profiler trace (JSON)")
    collector = Collector(str(path))
    try:
        raw: Any = path.open("rb")
        if magic == _GZIP_MAGIC:
            raw = Gunzip(raw, _gunzip_cap(path))
        else:
            raw = Capped(raw, MAX_PLAIN_BYTES, os.fstat(raw.fileno()).st_size)
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e}") from e
    with raw:
        stream = JsonStream(raw)
        try:
            for item in stream.items():
                collector.take(item)
        except NotJson as e:
            if collector.events_seen == 0 and not collector.meta:
                raise ReaderError(path, f"not a Kineto trace: {e}") from e
            collector.skip(None, f"stopped at byte {e.offset}: {e} (rest of the file not read)")
        except Truncated as e:
            capped = isinstance(raw, Capped) and raw.capped
            if collector.events_seen == 0 and not collector.meta:
                raise ReaderError(path, f"not a Kineto trace: file ends before any trace content ({e})" if not capped
                                  else f"no trace content in its first {_size(raw.cap)} (the bound for a plain "
                                       "trace): not read further") from e
            if not capped:  # a file cut at the byte bound is said by _stream_notes
                collector.skip(None, f"truncated trace: file ends inside the JSON after {collector.events_seen} "
                                     f"events ({e}); the events before the cut are used")
        _stream_notes(raw, stream, collector)
    if not collector.saw_trace_events:
        if isinstance(raw, Capped) and raw.capped:
            raise ReaderError(path, f"no 'traceEvents' in its first {_size(raw.cap)} (the bound for a plain trace): "
                                    "not read further")
        raise ReaderError(path, "JSON without 'traceEvents': not a Kineto / torch.profiler trace")
    return build_result(collector, FORMAT)


_MAX_GUNZIP = 4 << 30
#: The bytes of a plain (not gzip) trace read, as of a text input from disk: decoding and folding cost ~90 s a GiB,
#: so past this the rest is not read (its first events are still used: metadata and process groups come first).
MAX_PLAIN_BYTES = 1 << 30


def _gunzip_cap(path: Path) -> int:
    """What a .gz trace may inflate to: 64x its size (a trace's JSON packs 5-20x; a bomb of blank space ~1000x),
    at least 256 MiB, at most 4 GiB."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return max(256 << 20, min(_MAX_GUNZIP, 64 * size))


def _stream_notes(raw: Any, stream: JsonStream, collector: Collector) -> None:
    if stream.nuls:
        collector.skip(None, f"{stream.nuls} NUL byte(s) dropped (a hole left by a crash or a copy)")
    if isinstance(raw, Capped) and raw.capped:
        collector.skip(None, f"read up to {_size(raw.cap)} of its {_size(raw.size)} (the bound for a plain trace, "
                             f"{collector.events_seen:,} events read): the rest is not read")
    if isinstance(raw, Gunzip):
        if raw.cut:
            collector.skip(None, "gzip stream cut short: everything before the cut is used")
        if raw.capped:
            collector.skip(None, f"read up to {raw.cap >> 20} MiB of decompressed data (a gzip bomb, or a trace "
                                 "far larger than its file): the rest is not read")
        if raw.damaged:
            collector.skip(None, f"gzip data damaged ({raw.damaged}): everything before it is used")


def _size(n: int) -> str:
    return f"{n >> 20:,} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _head_text(head: bytes) -> str:
    if head.startswith(_GZIP_MAGIC):
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 16)
        except zlib.error:
            return ""
    return head.decode("utf-8", errors="replace")
