"""One ring's contents (ringformat) as an EVENTS table, vectorised: op slots arrive as numpy columns, string ids
become dictionary indices (decoded at the end, or kept encoded for events.arrow), the rare meta-region events
(init, phases, graph captures) are merged in as rows, and identity and group records are joined onto every row.

Here, beside the formats, because both wings convert rings: the analysis reads them (readers/ranktrace_ring) and
finalize writes events.arrow from them (issue #28: the capture side reaches the analysis only through formats)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.ringreader import RingContents
from ranktrace.tracer.formats.schema import RING_WRAPPED

__all__ = ["ENCODED", "ring_to_events", "identity_of", "roles_text"]

_ROLE_ORDER = ("dp", "pp", "attn_cp", "moe_dp", "pcp", "tp", "dcp", "ep", "rank", "local_rank")


def roles_text(roles: dict[str, Any]) -> str:
    """{'dp': 1, 'tp': 3, 'ep': 3} -> 'DP1 TP3 EP3' (SGLang's own spelling of a scheduler's ranks)."""
    keys = [k for k in _ROLE_ORDER if k in roles] + sorted(k for k in roles if k not in _ROLE_ORDER)
    return " ".join(f"{k.upper()}{roles[k]}" for k in keys if k not in ("rank", "local_rank")) or \
        " ".join(f"{k}={roles[k]}" for k in keys)

# EVENTS with every string column dictionary-encoded (what events.arrow holds since issue #19)
ENCODED = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f
                     for f in schema.EVENTS], metadata=schema.EVENTS.metadata)


def identity_of(rc: RingContents) -> dict[str, Any]:
    """Best identity of the ring's process: the last identity record that knew the rank wins."""
    ident: dict[str, Any] = {"rank": None, "world": None}
    for m in rc.meta:
        if m.get("type") == "identity":
            if m.get("rank") is not None or ident["rank"] is None:
                ident.update({k: v for k, v in m.items() if v is not None or k not in ident})
    return ident


def _groups(rc: RingContents) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in rc.meta if m.get("type") == "group" and m.get("name") is not None}


def _dict(ids: np.ndarray, values: list[Any], missing: np.ndarray | None = None) -> pa.Array:
    """A dictionary-encoded string column: `ids` index `values` (one entry per string id), null where `missing`."""
    return pa.DictionaryArray.from_arrays(pa.array(ids.astype(np.int32, copy=False), pa.int32(), mask=missing),
                                          pa.array(values, pa.string()))


def ring_to_events(rc: RingContents, host: str, file: str, *, encoded: bool = False) -> pa.Table:
    """All events of one ring as an EVENTS table (slots and meta-region events, in time order).

    String columns are built as dictionaries over the ring's own string table (the slots carry ids) and decoded at
    the end, or kept encoded (`encoded`: dictionary<int32, string> columns, for writing events.arrow). A group's
    member list (``group_ranks``) is carried by the last row of that group in the ring and by its meta-region rows,
    not by every op: a 1,024-rank group would otherwise put 4 KiB on every record. The analysis reads a group's
    members from its last row that has them, which this keeps."""
    ident = identity_of(rc)
    rank, world = ident.get("rank"), ident.get("world")
    groups = _groups(rc)
    n = rc.num_slots
    arr = rc.columns() if n else {}
    max_id = max(rc.strings) if rc.strings else 0
    strings = [rc.strings.get(i, "?") for i in range(max_id + 1)]

    def ids(col: str) -> tuple[np.ndarray, np.ndarray | None]:
        """String ids as dictionary indices: 0 (no string) is null; ids past the table clamp to its last entry."""
        raw = arr[col]
        none = raw == 0
        return (raw if int(raw.max()) <= max_id else np.minimum(raw, max_id).astype(raw.dtype),
                none if none.any() else None)

    def s(col: str) -> pa.Array:
        if not arr[col].any():  # e.g. no op failed: no error strings
            return pa.nulls(n, pa.dictionary(pa.int32(), pa.string()))
        idx, none = ids(col)
        return _dict(idx, strings, none)

    def opt(col: str, none: int, typ: pa.DataType) -> pa.Array:
        v = arr[col]
        return pa.array(v, typ, mask=(v == none))

    def const(value: Any, typ: pa.DataType) -> pa.Array:
        return pa.repeat(pa.scalar(value, typ), n)

    def const_str(value: str) -> pa.Array:
        return _dict(np.zeros(n, dtype=np.int32), [value])

    cols: dict[str, Any] = {}
    if n:
        group_idx, no_group = ids("group")
        # group records joined per string id (the string table is small; the slots only carry ids)
        by_id = [groups.get(g) or {} for g in strings]

        def per_group(key: str) -> pa.Array:
            values = [g.get(key) for g in by_id]
            absent = np.array([v is None for v in values], dtype=bool)[group_idx]
            if no_group is not None:
                absent |= no_group
            return _dict(group_idx, ["" if v is None else v for v in values], absent if absent.any() else None)

        # members on each group's last row only (and the meta rows below)
        member_lists = [g.get("ranks") for g in by_id]
        last_row = np.full(max_id + 1, -1, dtype=np.int64)
        np.maximum.at(last_row, group_idx, np.arange(n))
        carriers = last_row[(last_row >= 0) & np.array([m is not None for m in member_lists], dtype=bool)]
        members = np.full(n, -1, dtype=np.int64)
        members[carriers] = group_idx[carriers]
        has = members >= 0
        cols = {
            "host": const_str(host),
            "pid": const(rc.pid, pa.int64()),
            "tid": pa.array(arr["tid"].astype(np.int64)),
            "rank": const(rank, pa.int32()),
            "world": const(world, pa.int32()),
            "t_ns": pa.array(arr["t_ns"]),
            "wall_ns": pa.array(arr["t_ns"] - rc.mono0_ns + rc.wall0_ns),
            "kind": _dict(arr["kind"], list(rf.KINDS + ("unknown",) * (256 - len(rf.KINDS)))),
            "name": s("name"),
            "category": _dict(arr["category"], list(rf.CATEGORIES + ("user",) * (256 - len(rf.CATEGORIES)))),
            "group": _dict(group_idx, strings, no_group),
            "group_desc": per_group("desc"),
            "backend": per_group("backend"),
            "group_ranks": pa.array(member_lists, pa.list_(pa.int32())).take(
                pa.array(np.where(has, members, 0), mask=~has)) if has.any() else pa.nulls(n, pa.list_(pa.int32())),
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
            "source": const_str("events"),
            "file": const_str(file),
            "line": pa.array(arr["commit"].astype(np.int64) - 1),
        }
        slot_table = pa.table({name: cols.get(name, pa.nulls(n, ENCODED.field(name).type))
                               for name in ENCODED.names}, schema=ENCODED)
    else:
        slot_table = ENCODED.empty_table()
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
    roles = ident.get("roles")
    if isinstance(roles, dict) and roles:  # what the framework calls this process (a profile's identity targets)
        meta_rows.append({
            "host": host, "pid": rc.pid, "rank": rank, "world": world, "kind": "identity", "name": "roles",
            "detail": roles_text(roles), "source": "events", "file": file, "line": -(len(rc.meta) + 2),
        })
    if rc.lost_ops and n:
        # The wrap lost this rank's oldest ops: from here on, "no record of op k" is not "never issued op k" for a
        # channel with no record left (analyzers.waitfor reads this mark).
        first = int(arr["t_ns"].min()) if rc.oldest_t_ns is None else rc.oldest_t_ns
        meta_rows.append({
            "host": host, "pid": rc.pid, "rank": rank, "world": world, "t_ns": first,
            "wall_ns": first - rc.mono0_ns + rc.wall0_ns, "kind": "mark", "name": RING_WRAPPED,
            "detail": f"{rc.lost_ops} older op record(s) overwritten by the ring wrap before this time",
            "source": "events", "file": file, "line": -(len(rc.meta) + 1),
        })
    meta_table = schema.table_from_rows(schema.EVENTS, meta_rows).cast(ENCODED)
    table = _in_time_order(slot_table, arr.get("t_ns"), meta_table)
    return table if encoded else table.cast(schema.EVENTS)


_MAX_MERGE_PIECES = 64


def _in_time_order(slot_table: pa.Table, slot_t: Any, meta_table: pa.Table) -> pa.Table:
    """Slots and meta rows in one table, stably sorted by t_ns (nulls last) — as ``sort_by("t_ns")`` of
    ``concat([slots, meta])`` would give, without copying a million slots to place a few meta rows.

    Slots are in commit order, which is time order for one thread; then the meta rows are merged in as slices
    (zero-copy). Otherwise (several threads interleaved, or very many meta rows) the whole table is sorted."""
    if slot_table.num_rows and slot_t is not None and (slot_t.size < 2 or bool(np.all(slot_t[1:] >= slot_t[:-1]))):
        meta = meta_table.sort_by([("t_ns", "ascending")]) if meta_table.num_rows else meta_table
        mt = meta["t_ns"].to_pylist()
        pos = [len(slot_t) if t is None else int(np.searchsorted(slot_t, t, side="right")) for t in mt]
        if len(set(pos)) * 2 + 1 <= _MAX_MERGE_PIECES:
            pieces, prev, i = [], 0, 0
            while i < len(pos):
                j = i
                while j < len(pos) and pos[j] == pos[i]:
                    j += 1
                if pos[i] > prev:
                    pieces.append(slot_table.slice(prev, pos[i] - prev))
                pieces.append(meta.slice(i, j - i))
                prev, i = pos[i], j
            if prev < slot_table.num_rows or not pieces:
                pieces.append(slot_table.slice(prev))
            return pa.concat_tables(pieces)
    table = pa.concat_tables([slot_table, meta_table])
    return table.sort_by([("t_ns", "ascending")]) if table.num_rows else table
