"""Typed records -> rows: EVENTS ``group`` / ``enter`` / ``complete`` (seq, peer, dtype and size, call site) and
OBSERVATIONS ``fr_pg_status`` / ``fr_dump``."""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

from ranktrace.tracer.formats.opnames import P2P_OPS, canonical_op
from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.flight_recorder.records import FrEntry, PgConfig, text, to_int

__all__ = ["world_size", "group_rows", "entry_rows", "status_rows", "dump_row"]

# c10::toString(ScalarType) -> (torch dtype name, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "Byte": ("uint8", 1), "Char": ("int8", 1), "Short": ("int16", 2), "Int": ("int32", 4), "Long": ("int64", 8),
    "Half": ("float16", 2), "Float": ("float32", 4), "Double": ("float64", 8), "ComplexHalf": ("complex32", 4),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16), "Bool": ("bool", 1),
    "QInt8": ("qint8", 1), "QUInt8": ("quint8", 1), "QInt32": ("qint32", 4), "BFloat16": ("bfloat16", 2),
    "Float8_e5m2": ("float8_e5m2", 1), "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1), "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "Float8_e8m0fnu": ("float8_e8m0fnu", 1), "Float4_e2m1fn_x2": ("float4_e2m1fn_x2", 1),
    "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8),
}

_SEND = re.compile(r"\bsend\s+(\d+)\s*->\s*(\d+)")
_RECV = re.compile(r"\brecv\s+(\d+)\s*<-\s*(\d+)")


# --------------------------------------------------------------------------------------------- rows

def world_size(configs: dict[str, PgConfig]) -> int | None:
    for pc in configs.values():
        if pc.desc == "default_pg" and pc.ranks:
            return len(pc.ranks)
    pc0 = configs.get("0")
    return len(pc0.ranks) if pc0 and pc0.ranks else None


def _backend(profiling_name: str) -> str | None:
    head, sep, _ = profiling_name.partition(":")
    return head.strip().lower() if sep and head.strip() else None


def _dtype(dtypes: tuple[str, ...] | None) -> str | None:
    if not dtypes:
        return None
    names = []
    for d in dtypes:
        n = _DTYPES.get(d, (d.lower(), 0))[0]
        if n not in names:
            names.append(n)
    return ",".join(names)


def _nbytes(sizes: tuple[tuple[int, ...], ...] | None, dtypes: tuple[str, ...] | None) -> int | None:
    if not sizes or not dtypes:
        return None
    if len(dtypes) == 1:
        dtypes = dtypes * len(sizes)
    if len(dtypes) != len(sizes) or any(d not in _DTYPES for d in dtypes):
        return None
    return sum(math.prod(s) * _DTYPES[d][1] for s, d in zip(sizes, dtypes))


def _shape(sizes: tuple[tuple[int, ...], ...] | None) -> str | None:
    if sizes is None:
        return None
    if len(sizes) == 1:
        return str(list(sizes[0]))[:_MAX_SHAPE]
    out = str([list(s) for s in sizes[:64]])
    if len(sizes) > 64 or len(out) > _MAX_SHAPE:
        out = out[:_MAX_SHAPE].rstrip("]") + f", ...] ({len(sizes)} tensors)"
    return out


_MAX_SHAPE = 2000


def _callsite(frames: tuple[tuple[str, str, int], ...]) -> str | None:
    for _name, filename, line in frames:
        norm = filename.replace("\\", "/")
        if "/torch/" in norm or norm.startswith("torch/"):
            continue
        return f"{filename}:{line}"
    return None


def _peer(e: FrEntry, name: str, pc: PgConfig | None) -> int | None:
    """Global rank of the other side of a p2p entry (profiling names carry group-local ranks)."""
    if name in ("send", "isend"):
        m = _SEND.search(e.profiling_name)
        local = int(m.group(2)) if m else None
    elif name in ("recv", "irecv"):
        m = _RECV.search(e.profiling_name)
        local = int(m.group(2)) if m else None
    else:
        return None
    if local is None:
        return None
    if pc is not None and pc.ranks:
        return pc.ranks[local] if 0 <= local < len(pc.ranks) else None
    if e.group_desc == "default_pg":
        return local
    return None


def group_rows(configs: dict[str, PgConfig], rank: int | None, world: int | None, f: str) -> list[dict[str, Any]]:
    return [
        {"rank": rank, "world": world, "kind": "group", "name": pc.desc or name, "category": "init", "group": name,
         "group_desc": pc.desc, "group_ranks": list(pc.ranks) if pc.ranks else None, "source": "fr", "file": f,
         "line": None, "detail": "from pg_config"}
        for name, pc in configs.items()
    ]


def entry_rows(entries: Iterable[FrEntry], configs: dict[str, PgConfig], rank: int | None, world: int | None,
                f: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    memo: dict[tuple[str, int, int], Any] = {}  # entries share their sizes / dtypes / frames tuples: computed once

    def once(kind: str, a: Any, b: Any, fn: Any) -> Any:
        key = (kind, id(a), id(b))
        if key not in memo:
            memo[key] = fn()
        return memo[key]

    for e in entries:
        name = canonical_op(e.profiling_name)
        p2p = bool(e.is_p2p) or name in P2P_OPS
        seq = e.p2p_seq_id if p2p else e.collective_seq_id
        pc = configs.get(e.group) if e.group is not None else None
        detail = [f"record_id={e.record_id}", f"op_id={e.op_id}", f"timeout_ms={e.timeout_ms}"]
        if e.retired is not None:
            detail.append(f"retired={e.retired}")
        if e.duration_ms is not None:
            detail.append(f"duration_ms={e.duration_ms:g}")
        if e.thread_name:
            detail.append(f"thread={e.thread_name}")
        if p2p or " " in e.profiling_name:
            detail.append(f"profiling_name={e.profiling_name!r}")
        row = {
            "rank": rank, "world": world, "kind": "enter", "name": name, "category": "p2p" if p2p else "collective",
            "group": e.group, "group_desc": e.group_desc, "backend": _backend(e.profiling_name),
            "group_ranks": list(pc.ranks) if pc and pc.ranks else None, "seq": seq, "backend_seq": seq,
            "peer": _peer(e, name, pc) if p2p else None, "wall_ns": e.time_created_ns,
            "nbytes": once("n", e.input_sizes, e.input_dtypes, lambda: _nbytes(e.input_sizes, e.input_dtypes)),
            "dtype": once("d", e.input_dtypes, None, lambda: _dtype(e.input_dtypes)),
            "shape": once("s", e.input_sizes, None, lambda: _shape(e.input_sizes)),
            "callsite": once("c", e.frames, None, lambda: _callsite(e.frames)), "state": e.state,
            "detail": " ".join(detail), "source": "fr", "file": f, "line": e.index,
        }
        rows.append(row)
        # gloo never moves an entry past "scheduled" (torch 2.13), but retires it once the work is done
        if e.state == "completed" or (row["backend"] == "gloo" and e.retired is True):
            rows.append({**row, "kind": "complete", "wall_ns": e.time_completed_ns})
    return rows


def status_rows(raw: Any, entries: list[FrEntry], rank: int | None, f: str,
                 skipped: list[Skipped]) -> list[dict[str, Any]]:
    if not isinstance(raw, dict):
        return []
    names: dict[int, tuple[str | None, str | None]] = {}
    for e in entries:
        if e.pg_id is not None:
            names.setdefault(e.pg_id, (e.group, e.group_desc))
    rows = []
    for key, st in raw.items():
        if not isinstance(st, dict):
            skipped.append(Skipped(f, None, f"pg_status[{key!r}] is not a dict"))
            continue
        enq, sta, com = (to_int(st.get(k)) for k in
                         ("last_enqueued_collective", "last_started_collective", "last_completed_collective"))
        pg_id = to_int(key)
        group, desc = names.get(pg_id, (text(key), None)) if pg_id is not None else (text(key), None)
        rows.append({
            "rank": rank, "kind": "fr_pg_status", "name": desc, "group": group, "value": com,
            "detail": f"enqueued={enq} started={sta} completed={com} pg_id={text(key, 200)}",
            "source": "fr", "file": f, "line": None,
        })
    return rows


def dump_row(raw: dict[str, Any], entries: list[FrEntry], encoding: str, rank: int | None,
              f: str, total: int | None = None) -> dict[str, Any]:
    rec = [e.record_id for e in entries if e.record_id is not None]
    lib = raw.get("comm_lib_version", raw.get("nccl_version"))
    lib_text = repr(lib[:200]) if isinstance(lib, str) else text(lib, 200)  # a shared container: never expanded
    counted = f" entries_in_dump={total}" if total is not None and total != len(entries) else ""
    return {
        "rank": rank, "kind": "fr_dump", "name": text(raw.get("version"), 40), "value": len(entries),
        "detail": (f"encoding={encoding} entries={len(entries)}{counted} first_record_id={min(rec) if rec else None} "
                   f"last_record_id={max(rec) if rec else None} comm_lib_version={lib_text}"),
        "source": "fr", "file": f, "line": None,
    }
