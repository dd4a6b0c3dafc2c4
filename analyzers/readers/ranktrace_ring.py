"""Reader for ranktrace's own ring files (``<run>/<host>/rings/*.ring``): live, hung, killed or finished ranks.

Converts one ring into the common EVENTS table, vectorised: the op slots arrive as one numpy structured array
(tracer.ringformat), string ids map through one ``take``, and the rare meta-region events (init, phases, graph
captures) are appended as rows. Identity (rank, world) and group records (desc, backend, members) are joined onto
every row so that the analyzer never has to look them up again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from analyzers import schema
from analyzers.readers.base import ReaderError, ReadResult, Skipped
from tracer import ringformat as rf

__all__ = ["FORMAT", "sniff", "read", "ring_to_events", "identity_of"]

FORMAT = "ranktrace_ring"


def sniff(path: Path, head: bytes) -> bool:
    return head.startswith(rf.MAGIC)


def identity_of(rc: rf.RingContents) -> dict[str, Any]:
    """Best identity of the ring's process: the last identity record that knew the rank wins."""
    ident: dict[str, Any] = {"rank": None, "world": None}
    for m in rc.meta:
        if m.get("type") == "identity":
            if m.get("rank") is not None or ident["rank"] is None:
                ident.update({k: v for k, v in m.items() if v is not None or k not in ident})
    return ident


def _groups(rc: rf.RingContents) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in rc.meta if m.get("type") == "group" and m.get("name") is not None}


def ring_to_events(rc: rf.RingContents, host: str, file: str) -> pa.Table:
    """All events of one ring as an EVENTS table (slots and meta-region events, in time order)."""
    ident = identity_of(rc)
    rank, world = ident.get("rank"), ident.get("world")
    groups = _groups(rc)
    arr = rc.slots
    n = 0 if arr is None else len(arr)
    max_id = max(rc.strings) if rc.strings else 0
    strings = [rc.strings.get(i, "?") for i in range(max_id + 1)]
    str_arr = pa.array(strings, pa.string())

    def s(col: str) -> pa.Array:
        ids = np.minimum(arr[col].astype(np.int64), max_id)
        out = str_arr.take(pa.array(ids))
        return pa.compute.if_else(pa.array(arr[col] == 0), pa.scalar(None, pa.string()), out)

    def opt(col: str, none: int, typ: pa.DataType) -> pa.Array:
        v = arr[col]
        return pa.array(v, typ, mask=(v == none))

    cols: dict[str, Any] = {}
    if n:
        import pyarrow.compute  # noqa: F401  (binds pa.compute)

        kinds = pa.array(np.array(rf.KINDS + ("unknown",) * (256 - len(rf.KINDS)), dtype=object)[arr["kind"]], pa.string())
        cats = pa.array(np.array(rf.CATEGORIES + ("user",) * (256 - len(rf.CATEGORIES)), dtype=object)[arr["category"]],
                        pa.string())
        group_names = s("group")
        gdesc = {k: v.get("desc") for k, v in groups.items()}
        gback = {k: v.get("backend") for k, v in groups.items()}
        granks = {k: v.get("ranks") for k, v in groups.items()}
        uniq = [g for g in set(group_names.to_pylist()) if g is not None]
        lookup = pa.array(uniq, pa.string())
        idx = pa.compute.index_in(group_names, value_set=lookup)
        cols = {
            "host": pa.repeat(host, n) if hasattr(pa, "repeat") else pa.array([host] * n),
            "pid": pa.array(np.full(n, rc.pid, dtype=np.int64)),
            "tid": pa.array(arr["tid"].astype(np.int64)),
            "rank": pa.array([rank] * n, pa.int32()),
            "world": pa.array([world] * n, pa.int32()),
            "t_ns": pa.array(arr["t_ns"]),
            "wall_ns": pa.array(arr["t_ns"] - rc.mono0_ns + rc.wall0_ns),
            "kind": kinds,
            "name": s("name"),
            "category": cats,
            "group": group_names,
            "group_desc": pa.array([gdesc.get(g) for g in uniq], pa.string()).take(idx),
            "backend": pa.array([gback.get(g) for g in uniq], pa.string()).take(idx),
            "group_ranks": pa.array([granks.get(g) for g in uniq], pa.list_(pa.int32())).take(idx),
            "seq": opt("seq", rf.NONE_I64, pa.int64()),
            "backend_seq": opt("backend_seq", rf.NONE_I64, pa.int64()),
            "peer": opt("peer", rf.NONE_I32, pa.int32()),
            "capturing": pa.array((arr["flags"] & rf.FLAG_CAPTURING) != 0),
            "graph_id": opt("graph_id", rf.NONE_I32, pa.int64()),
            "nbytes": opt("nbytes", rf.NONE_I64, pa.int64()),
            "dtype": s("dtype"),
            "shape": s("shape"),
            "callsite": s("callsite"),
            "span_id": pa.array(arr["span_id"]),
            "parent_span_id": pa.array(arr["parent_span_id"], mask=(arr["parent_span_id"] == 0)),
            "error": s("error"),
            "async_op": pa.array((arr["flags"] & rf.FLAG_ASYNC) != 0),
            "source": pa.array(["events"] * n, pa.string()),
            "file": pa.array([file] * n, pa.string()),
            "line": pa.array(arr["commit"].astype(np.int64) - 1),
        }
        slot_table = pa.table({name: cols.get(name, pa.nulls(n, schema.EVENTS.field(name).type))
                               for name in schema.EVENTS.names}, schema=schema.EVENTS)
    else:
        slot_table = schema.empty(schema.EVENTS)
    meta_rows = []
    for i, m in enumerate(rc.meta):
        if m.get("type") != "event":
            continue
        g = m.get("group")
        ginfo = groups.get(g, {}) if g else {}
        detail = {k: v for k, v in m.items() if k in ("backend", "ranks", "world", "rank")}
        if m.get("detail"):
            detail["detail"] = m["detail"]
        meta_rows.append(
            {
                "host": host, "pid": rc.pid, "tid": m.get("tid"), "rank": rank, "world": world,
                "t_ns": m.get("t_ns"), "wall_ns": (m["t_ns"] - rc.mono0_ns + rc.wall0_ns) if m.get("t_ns") else None,
                "kind": m.get("kind"), "name": m.get("name"), "category": m.get("category"), "group": g,
                "group_desc": ginfo.get("desc"), "backend": ginfo.get("backend") or m.get("backend"),
                "group_ranks": ginfo.get("ranks"), "seq": m.get("seq"), "capturing": m.get("capturing"),
                "graph_id": m.get("graph_id"), "callsite": m.get("callsite"), "span_id": m.get("span_id"),
                "parent_span_id": m.get("parent_span_id"), "error": m.get("error"),
                "detail": ", ".join(f"{k}={v}" for k, v in detail.items()) or None,
                "source": "events", "file": file, "line": -(i + 1),  # negative: meta-region record index
            }
        )
    table = pa.concat_tables([slot_table, schema.table_from_rows(schema.EVENTS, meta_rows)])
    return table.sort_by([("t_ns", "ascending")]) if table.num_rows else table


def read(path: Path, host: str | None = None) -> ReadResult:
    """Read one ring file into EVENTS (plus a Skipped note for torn records or ops lost to the wrap)."""
    try:
        rc = rf.read_ring(str(path))
    except (rf.RingError, OSError) as e:
        raise ReaderError(path, str(e)) from e
    host = host or rc.host
    skipped: list[Skipped] = []
    if rc.torn_meta:
        skipped.append(Skipped(str(path), None, f"{rc.torn_meta} meta record(s) cut mid-write (process killed?)"))
    if rc.lost_ops:
        skipped.append(Skipped(str(path), None, f"{rc.lost_ops} older op record(s) overwritten by the ring wrap"))
    if rc.meta_full:
        skipped.append(Skipped(str(path), None, "meta region full: later strings recorded as '?'"))
    ident = identity_of(rc)
    return ReadResult(
        file=str(path), format=FORMAT, version=str(rf.VERSION), events=ring_to_events(rc, host, str(path)),
        skipped=tuple(skipped), world_size=ident.get("world"),
    )
