"""What both RAS parsers share (the ``total`` op name, RAS timestamps) and the last stage: the world size from the
communicator sizes, ``rank_space`` rows for communicators smaller than the largest, and the rows' final shape."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = ["OP_TOTAL", "ras_time", "finish"]

OP_TOTAL = "total"


def ras_time(s: str | None) -> int | None:
    """A RAS timestamp (local time of the node) as ns since the epoch, read as UTC."""
    if not s:
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return int(datetime.strptime(s.strip(), fmt).replace(tzinfo=timezone.utc).timestamp()) * 1_000_000_000
        except ValueError:
            continue
    return None


def finish(obs: list[dict[str, Any]], file: str) -> tuple[list[dict[str, Any]], int | None]:
    """(OBSERVATIONS rows, world size) from the parsers' rows: ``_size`` rows and ``_``-keys are the parsers' notes
    to this stage and are dropped."""
    sizes = [r["value"] for r in obs if r["kind"] == "_size" and r["value"]]
    obs = [r for r in obs if r["kind"] != "_size"]
    world = max(sizes) if sizes else None
    if world:
        seen: set[str] = set()
        for r in [r for r in obs if r.get("group")]:
            size = r.get("_size")
            if size and size < world and r["group"] not in seen:
                seen.add(r["group"])
                obs.append(dict(kind="rank_space", group=r["group"], detail=f"comm:{r['group']}", value=size,
                                line=r.get("line")))
    for r in obs:
        for k in [k for k in r if k.startswith("_")]:
            del r[k]
        r.setdefault("source", "ras")
        r.setdefault("file", file)
    return obs, world
