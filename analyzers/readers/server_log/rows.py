"""Hits to rows: each hit's rank and world by the rank rules (see ``read``), ``mark`` events for phases, and the
observations (``completion``, ``server_stall``, ``progress``, graph registration and capture, ``server_rank``)."""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.readers.server_log.scan import SOURCE, Hit, LogParser

__all__ = ["build"]


def build(p: LogParser) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None, int | None]:
    """(EVENTS rows, OBSERVATIONS rows, server kind, world size) of a parsed log."""
    tp_size = p.tp_size or (max((h.tags["TP"] for h in p.hits if "TP" in h.tags), default=-1) + 1) or None
    world_all = tp_size * p.pp_size if tp_size and p.pp_size else (
        tp_size if tp_size and p.tp_size is not None else None)
    events: list[dict[str, Any]] = []
    obs: list[dict[str, Any]] = []
    for h in p.hits + list(p.progress.values()):
        rank, world = _rank(p, h, tp_size)
        world = world if world is not None else world_all
        common = {"pid": h.pid, "rank": rank, "wall_ns": h.wall_ns, "source": SOURCE, "file": p.file,
                  "line": h.line}
        if h.what == "mark":
            events.append(dict(common, world=world, kind="mark", name=h.name, category=h.category,
                               detail=h.detail))
            if h.name == "serving":
                obs.append(dict(common, kind="completion", name="server_ready", detail=h.detail))
            elif h.name == "cuda_graph_capture_error":   # the worker raises it: a crash, inside capture
                obs.append(dict(common, kind="exception", name="CudaGraphCaptureError", detail=h.detail))
        elif h.what == "version":
            obs.append(dict(common, kind="version", name=h.name, detail=h.detail))
        elif h.what == "statement":
            obs.append(dict(common, kind=h.category, name=h.name, value=h.value, host=h.host,
                            detail=_after_watchdog(p, h) + h.detail))
        elif h.what == "stall":
            obs.append(dict(common, kind="server_stall", name=h.name, value=h.value, detail=h.detail))
        elif h.what == "serve":
            obs.append(dict(common, kind="progress", name=h.name, value=h.value, detail=h.detail))
        elif h.what == "registration":
            obs.append(dict(common, kind="graph_registration", name="custom_all_reduce", value=h.value,
                            detail=h.detail))
        else:
            obs.append(dict(common, kind="graph_capture_progress", name=h.name, value=h.value, detail=h.detail))
    for pid, (rank, world, assigned) in sorted(p.pid_rank.items()):
        obs.append({"pid": pid, "rank": rank, "kind": "server_rank", "value": world, "detail": assigned or None,
                    "source": SOURCE, "file": p.file})
    return events, obs, server_kind(p.hits), world_all

def _after_watchdog(p: LogParser, h: Hit) -> str:
    """A Ray worker whose own NCCL watchdog caught a timeout or error earlier in the file (its pid's lines) died of that
    watchdog's abort: said in the detail, so the death is read as the timeout's consequence, not a cause of its own.

    SGLang's scheduler watchdog ends its process through the same SIGQUIT a failure sends: a child-failed line after
    a watchdog timeout of the same file is that timeout's consequence (said in the detail, so no rule reads it as a
    cause of its own)."""
    if "The actor is dead because" in h.detail or "A worker died or was killed" in h.detail:
        at = p.watchdog_ended.get(h.pid) if h.pid is not None else None
        return f"after its own NCCL watchdog caught a timeout or error (line {at}): " if at is not None and \
            at < h.line else ""
    if h.name != "exit" or "sigquit" not in h.detail:
        return ""
    fired = [s for s in p.progress.values() if s.what == "stall" and s.name == "scheduler_watchdog" and s.line < h.line]
    return f"after the scheduler watchdog timeout of line {min(s.line for s in fired)}: " if fired else ""


def _rank(p: LogParser, h: Hit, tp_size: int | None) -> tuple[int | None, int | None]:
    """(rank, world) of a hit, by the rules of the module docstring (numbered as there)."""
    if h.vllm_rank is not None and "TP" not in h.tags:   # 1. VllmWorker rank=R, 4. [rankR]:
        known = p.pid_rank.get(h.pid) if h.pid is not None else None
        return h.vllm_rank, known[1] if known else None
    if h.pid is not None and h.pid in p.pid_rank:      # 2. vLLM rank assignment line of that pid
        rank, world, _ = p.pid_rank[h.pid]
        return rank, world
    if "TP" in h.tags:                                     # 3. TP (and PP) tags
        tp = h.tags["TP"]
        if "PP" in h.tags and tp_size:
            return h.tags["PP"] * tp_size + tp, None
        return tp, None
    if "PP" in h.tags and not tp_size:
        return h.tags["PP"], None
    return None, None


def server_kind(hits: list[Hit]) -> str | None:
    """'sglang', 'vllm' or 'sglang+vllm' from which servers' phase messages were seen."""
    return "+".join(sorted({h.server for h in hits if h.server not in ("", "any")})) or None
