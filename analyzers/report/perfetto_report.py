"""Chrome trace-event JSON (opens in ui.perfetto.dev): a process per rank, a track per thread, flow arrows that
join the same (group, seq) across ranks, and open slices (ops that never returned) drawn to the end of the trace.

Trace-event format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".json"
BINARY = False


def render(result: Any) -> str:
    ev = result.events
    ev = ev.filter(pc.and_(pc.is_valid(ev["rank"]), pc.is_valid(ev["t_ns"])))
    out: list[dict[str, Any]] = []
    if ev.num_rows == 0:
        return json.dumps({"traceEvents": out, "displayTimeUnit": "ns"})
    t0 = pc.min(ev["t_ns"]).as_py()
    t_end = pc.max(ev["t_ns"]).as_py()
    rows = ev.select(["rank", "pid", "tid", "t_ns", "kind", "name", "category", "group", "seq", "span_id", "callsite",
                      "error", "capturing", "peer", "file", "detail"]).to_pylist()
    ranks = sorted({r["rank"] for r in rows})
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    opened: dict[tuple, dict[str, Any]] = {}
    first_of: dict[tuple, tuple[int, int, float]] = {}
    for r in rows:
        key = _span_key(r)
        ts = (r["t_ns"] - t0) / 1000.0
        if r["kind"] == "enter":
            opened[key] = r
        elif r["kind"] in ("exit", "error", "complete") and key in opened:
            s = opened.pop(key)
            out.append(_slice(s, (s["t_ns"] - t0) / 1000.0, ts, r.get("error")))
        elif r["kind"] == "mark":
            out.append({"ph": "i", "name": r["name"], "pid": r["rank"], "tid": r["tid"] or 0, "ts": ts, "s": "p"})
    for s in opened.values():  # never returned: draw to the end, and say so
        sl = _slice(s, (s["t_ns"] - t0) / 1000.0, (t_end - t0) / 1000.0 + 1.0, None)
        sl["name"] += " (open)"
        sl["args"]["open"] = True
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


def _span_key(r: dict[str, Any]) -> tuple:
    """Our events pair by span id within a process (ring file); readers' rows (nsys, Kineto) by what they are:
    the same rank, thread, op, group and seq, and the same kind of record (the first word of detail: an NVTX
    range closes an NVTX range, a kernel completion closes a kernel)."""
    if r["span_id"]:
        return ("span", r["file"], r["pid"], r["span_id"])
    return ("op", r["rank"], r["tid"], r["name"], r["group"], r["seq"], (r["detail"] or "").split(" ", 1)[0])


def _slice(s: dict[str, Any], ts: float, end: float, error: str | None) -> dict[str, Any]:
    args = {"group": s["group"], "seq": s["seq"], "callsite": s["callsite"]}
    if s["peer"] is not None:
        args["peer"] = s["peer"]
    if s["capturing"]:
        args["capturing"] = True
    if error:
        args["error"] = error
    return {"ph": "X", "name": s["name"], "cat": s["category"] or "op", "pid": s["rank"], "tid": s["tid"] or 0,
            "ts": ts, "dur": max(end - ts, 0.001), "args": args}
