"""The RAS answers a burst saved (``dumps/<t>/ras.json|txt``: two a moment apart): did any launched-op count move
between them (NCCL still issues work: not hung)?"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from ranktrace.tracer.formats import schema

__all__ = ["ras_summary", "ras_progress"]

_SNAP = re.compile(r"snapshot=(\d+)")


def ras_summary(path: Path) -> dict[str, Any]:
    """Compare consecutive RAS answers in one file (tracer.ras saves two): counts per comm, moved, missing, dead.

    ``moved`` is True when any launched-op count grew between the first and the last answer, False when counts
    were comparable and none grew, None when there is nothing to compare (one answer, or no counts printed).
    """
    from ranktrace.analyzers.readers import nccl_ras

    obs = nccl_ras.read(Path(path)).observations.to_pylist()
    counts: dict[int, dict[tuple[Any, Any, Any], int]] = {}
    for o in obs:
        if o["kind"] != "ras_op_count" or o["value"] is None:
            continue
        m = _SNAP.search(o["detail"] or "")
        snap = int(m.group(1)) if m else 1
        key = (o["group"], o["rank"], o["name"])
        cur = counts.setdefault(snap, {})
        cur[key] = max(cur.get(key, o["value"]), o["value"])
    snaps = sorted(counts)
    comms: dict[str, dict[str, Any]] = {}
    for snap in snaps:
        for (g, r, name), v in counts[snap].items():
            c = comms.setdefault(g, {"moved": None, "counts": {}, "changes": []})
            c["counts"].setdefault(str(snap), {})[f"{'r' + str(r) if r is not None else 'unlisted'} {name}"] = v
    if len(snaps) >= 2:
        first, last = counts[snaps[0]], counts[snaps[-1]]
        for key, v2 in last.items():
            if key in first:
                c = comms[key[0]]
                grew = v2 > first[key]
                c["moved"] = bool(c["moved"]) or grew
                if grew:
                    r = f"rank {key[1]}" if key[1] is not None else "unlisted ranks"
                    c["changes"].append(f"{r} {key[2]} {first[key]}->{v2}")
    flags = [c["moved"] for c in comms.values() if c["moved"] is not None]
    last_snap = max((int(m.group(1)) for o in obs if (m := _SNAP.search(o["detail"] or ""))), default=1)

    def rows(kind: str) -> list[dict[str, Any]]:
        out = []
        for o in obs:
            m = _SNAP.search(o["detail"] or "")
            if o["kind"] == kind and (m is None or int(m.group(1)) == last_snap):
                out.append({k: o[k] for k in ("group", "rank", "pid", "host") if o.get(k) is not None})
        return out

    return {"snapshots": len(snaps), "moved": (any(flags) if flags else None), "comms": comms,
            "missing": rows("ras_missing_rank"), "dead": rows("ras_dead_rank") + rows("ras_dead_process")}


def ras_progress(path: Path, host: str | None = None) -> pa.Table:
    """``ras_progress`` observations (one per communicator with comparable counts) from a saved RAS pair."""
    s = ras_summary(path)
    obs = []
    for g, c in s["comms"].items():
        if c["moved"] is None:
            continue
        detail = ("counts moved: " + ", ".join(c["changes"][:8])) if c["moved"] else \
            f"no launched-op count moved across {s['snapshots']} RAS answers"
        obs.append({"host": host, "kind": "ras_progress", "group": g, "value": 1 if c["moved"] else 0,
                    "detail": detail, "source": "ras", "file": str(path)})
    return schema.table_from_rows(schema.OBSERVATIONS, obs)
