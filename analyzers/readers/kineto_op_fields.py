"""Column values of a Kineto op: group, ranks, backend, dtype, size, seq and peer from its args and ``pg_config``.

Why separate: it maps loosely typed profiler args (strings, floats, older and newer arg names) onto ``EVENTS``
columns, with the small coercion helpers it needs; it neither reads the trace nor builds rows.
"""
from __future__ import annotations

import ast
import math
from typing import Any, NamedTuple

from ranktrace.analyzers.opnames import P2P_OPS
from ranktrace.analyzers.readers.kineto_comms import _Op
from ranktrace.analyzers.readers.kineto_field_map import DTYPES


def op_fields(op: _Op, pgs: list["_Pg"], default_backend: str | None) -> dict[str, Any]:
    """EVENTS column values of one op (group, ranks, backend, dtype, shape, nbytes, backend_seq, peer)."""
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
