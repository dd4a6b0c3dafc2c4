"""Chrome trace-event JSON for ui.perfetto.dev: a process per rank, a track per thread, flows joining the same
(group, seq) across ranks, calls that never returned drawn to the end. Takes an ``Analysis``. Format:
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU"""
from __future__ import annotations

import json
from typing import Any

from ranktrace.analyzers.model import Analysis
from ranktrace.analyzers.report.spans import Span, pair_spans

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".json"
BINARY = False


def render(result: Analysis) -> str:
    ss = pair_spans(result.events)
    out: list[dict[str, Any]] = []
    if not ss.ranks:
        return json.dumps({"traceEvents": out, "displayTimeUnit": "ns"})
    for r in ss.ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    first_of: dict[tuple, tuple[int, int, float]] = {}
    us = lambda t: (t - ss.t0) / 1000.0  # noqa: E731
    for m in ss.marks:
        out.append({"ph": "i", "name": m.name, "pid": m.rank, "tid": m.tid or 0, "ts": us(m.t), "s": "p"})
    for sp in ss.spans:
        if sp.open:  # never returned: draw to the end, and say so
            sl = _slice(sp, us(sp.start), us(ss.t_end) + 1.0)
            sl["name"] += " (open)"
            sl["args"]["open"] = True
        else:
            sl = _slice(sp, us(sp.start), us(sp.end))
        out.append(sl)
    flow_id = 0
    for sl in sorted((e for e in out if e.get("ph") == "X" and e["args"].get("seq") is not None),
                     key=lambda e: e["ts"]):
        k = (sl["args"].get("group"), sl["args"]["seq"], sl["cat"])
        if k in first_of:
            pid, tid, ts0 = first_of[k]
            if pid != sl["pid"]:
                flow_id += 1
                out.append({"ph": "s", "id": flow_id, "name": "same op", "cat": "flow", "pid": pid, "tid": tid,
                            "ts": ts0})
                out.append({"ph": "f", "bp": "e", "id": flow_id, "name": "same op", "cat": "flow", "pid": sl["pid"],
                            "tid": sl["tid"], "ts": sl["ts"]})
        else:
            first_of[k] = (sl["pid"], sl["tid"], sl["ts"])
    return json.dumps({"traceEvents": out, "displayTimeUnit": "ns",
                       "metadata": {"verdict": result.verdict.summary}})


def _slice(sp: Span, ts: float, end: float) -> dict[str, Any]:
    args: dict[str, Any] = {"group": sp.group, "seq": sp.seq, "callsite": sp.callsite}
    if sp.peer is not None:
        args["peer"] = sp.peer
    if sp.capturing:
        args["capturing"] = True
    if sp.error:
        args["error"] = sp.error
    return {"ph": "X", "name": sp.name, "cat": sp.category or "op", "pid": sp.rank, "tid": sp.tid or 0,
            "ts": ts, "dur": max(end - ts, 0.001), "args": args}
