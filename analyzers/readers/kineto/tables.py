"""Ops -> the reader's result: EVENTS rows (``identity``, ``group``, ``enter``/``exit``/``complete`` per op) with the
per-group and p2p ``seq`` counters and the trace's time regime."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.opnames import P2P_OPS
from ranktrace.analyzers.readers.base import ReadResult
from ranktrace.analyzers.readers.kineto.collect import Collector
from ranktrace.analyzers.readers.kineto.ops import attach_kernels, fold_ops, op_fields, pg_config, to_int
from ranktrace.analyzers.readers.kineto import collect

__all__ = ["ABSOLUTE_EPOCH_US", "build_result"]

SOURCE = "kineto"
ABSOLUTE_EPOCH_US = 1e15           # ts above this (≈ 2001-09-09) is absolute Unix-epoch µs


def build_result(collector: Collector, fmt: str) -> ReadResult:
    """The reader's result for one collected trace: identity, group and per-op rows, plus the skip notes."""
    info = (cast("dict[str, Any]", collector.meta.get("distributedInfo"))
            if isinstance(collector.meta.get("distributedInfo"), dict) else {})
    rank, world = to_int(info.get("rank")), to_int(info.get("world_size"))
    backend = info.get("backend") if isinstance(info.get("backend"), str) else None
    pgs = pg_config(info.get("pg_config"))
    clock = _Clock(collector.meta.get("baseTimeNanoseconds"))
    ops = fold_ops(collector)
    attach_kernels(collector, ops)
    rows: list[dict[str, Any]] = []
    base = {"rank": rank, "world": world, "source": SOURCE, "file": collector.file}
    if info:
        rows.append(dict(base, kind="identity", name="distributedInfo", category="init", backend=backend,
                         detail=f"nccl_version={info['nccl_version']}" if info.get("nccl_version") else None))
    for pg in pgs:
        rows.append(dict(base, kind="group", name=pg.name, category="init", group=pg.name, group_desc=pg.desc,
                         backend=pg.backend, group_ranks=pg.ranks,
                         detail=f"pg_size={pg.size}" if pg.size is not None else None))
    counters: dict[tuple[Any, ...], int] = defaultdict(int)
    middles = _middles(collector, pgs, backend, rank)
    jumped: set[tuple[Any, ...]] = set()
    for op in sorted(ops, key=lambda o: (o.comm.ts, o.comm.index)):
        fields = op_fields(op, pgs, backend)
        category = "p2p" if op.name in P2P_OPS else "collective"
        key: tuple[Any, ...] = (fields.get("group"), fields.get("backend"))
        if category == "p2p":
            # p2p never shares a counter with collectives; per (src, dst) pair when the peer is known, so rank
            # 0's send to 1 and rank 1's recv from 0 count in the same sequence
            peer = fields.get("peer")
            outgoing = op.name in ("send", "isend")
            key += ("p2p",) if peer is None else (("p2p", rank, peer) if outgoing else ("p2p", peer, rank))
        if op.tail and key not in jumped:   # the ops the window only counted come before its group's tail
            jumped.add(key)
            counters[key] += middles.get(key, 0)
        counters[key] += 1
        fields.update(seq=counters[key], name=op.name, category=category, pid=to_int(op.comm.pid),
                      tid=to_int(op.comm.tid), line=op.comm.index)
        detail = op.raw_name + (f" (+{op.nested} nested comm events)" if op.nested else "")
        rows.append(dict(base, kind="enter", detail=detail, **clock.stamp(op.comm.ts), **fields))
        rows.append(dict(base, kind="exit", detail=detail, **clock.stamp(op.comm.end), **fields))
        if op.kernel_end is not None:
            rows.append(dict(base, kind="complete", state="completed", detail=f"kernel {op.kernel_name}",
                             **clock.stamp(op.kernel_end), **fields))
    if collector.window.summarised:
        collector.skip(None, _bound_note(collector, middles))
    for reason, count in sorted(collector.skip_counts.items()):
        collector.skip(None, f"{count} × {reason}")
    return ReadResult(file=collector.file, format=fmt, version=_version(collector.meta),
                      events=schema.table_from_rows(schema.EVENTS, rows), skipped=tuple(collector.skipped),
                      world_size=world)


def _final_key(op_key: tuple[Any, ...], pgs: list[Any], backend: str | None, rank: int | None) -> tuple[Any, ...]:
    """The seq counter's key (as in build_result) of a window key (ops.window_key)."""
    name, pg_id, op_backend = op_key[:3]
    group = name if name is not None else pg_id
    pg = next((p for p in pgs if p.name == name), None) if name is not None else (
        next((p for p in pgs if p.uid == to_int(pg_id)), None) or next((p for p in pgs if p.name == pg_id), None)
        if pg_id is not None else None)
    key: tuple[Any, ...] = (group, op_backend or (pg.backend if pg else None) or backend)
    if len(op_key) > 3:
        _p2p, outgoing, peer = op_key[3:]
        key += ("p2p",) if peer is None else (("p2p", rank, peer) if outgoing else ("p2p", peer, rank))
    return key


def _middles(collector: Collector, pgs: list[Any], backend: str | None, rank: int | None) -> dict[tuple[Any, ...], int]:
    """Per seq counter key, the ops the window only counted (collect.Window)."""
    out: dict[tuple[Any, ...], int] = defaultdict(int)
    for op_key, _head, _tail, middle in collector.window.kept():
        if middle:
            out[_final_key(tuple(op_key), pgs, backend, rank)] += middle  # type: ignore[arg-type]
    return out


def _bound_note(collector: Collector, middles: dict[tuple[Any, ...], int]) -> str:
    """The one line saying which collectives were only counted."""
    w, b = collector.window, collect
    total = sum(k.count for k in w.groups.values()) + w.uncounted_keys
    groups = ", ".join(f"{_key_text(k)}: {n:,}" for k, n in sorted(middles.items(), key=lambda kv: -kv[1])[:3])
    more = f" and {len(middles) - 3} more" if len(middles) > 3 else ""
    past = (f"; {w.uncounted_keys:,} ops of groups past the first {b.MAX_KEYS:,} only counted"
            if w.uncounted_keys else "")
    return (f"{total:,} collectives: the first {b.HEAD:,} and last {b.TAIL:,} of each group are kept, "
            f"{w.summarised:,} in between only counted ({groups}{more}){past}; their seq still counts them (the bound: "
            f"{b.HEAD + b.TAIL:,} ops per group per trace, {b.SMALL_TAIL} past the first {b.MAX_GROUPS} groups)")


def _key_text(key: tuple[Any, ...]) -> str:
    """``group 0``, ``group 1 p2p 0->1``: a seq counter's key as the note says it."""
    text = f"group {key[0]}" if key[0] is not None else "no group"
    if key[2:3] == ("p2p",):
        text += f" p2p {key[3]}->{key[4]}" if len(key) == 5 else " p2p"
    return text


class _Clock:
    """Converts trace ``ts`` (µs) to (t_ns, wall_ns) for the file's time regime."""

    def __init__(self, base_ns: Any) -> None:
        self.base = to_int(base_ns)

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
