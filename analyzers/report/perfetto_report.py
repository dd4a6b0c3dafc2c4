"""Chrome trace-event JSON for ui.perfetto.dev (and chrome://tracing). Takes an ``Analysis`` (and, optionally, the
run's sample tables: analyzers.export.sample_tables).

What is drawn:

* a process per rank ("rank 3 · host · pid 1234"), a named track per thread (names from the stack samples and
  /proc), one slice per call; flows join the same (group, seq) across ranks;
* a call that never returned is drawn until the moment the verdict speaks for (spans.as_of: the burst, the live
  check, the job's end), named "... (never returned)", with a "hung" instant at its end; the verdict itself is a
  global instant there, and the verdict's operation is flagged in its slices' args;
* a "phases" track per rank: phase spans and marks, and for a culprit the stretch since its last call with where
  its stacks say it sat;
* stack samples as instant events on their thread (frames in args), innermost application frame as the name;
* counter tracks per rank from the /proc samples (RSS, CPU %, I/O bytes) and per GPU from the NVML samples
  (utilisation, memory), plus each rank's GPU memory.

Perfetto's own trace builder (protobuf) would add a dependency for no gain here: every one of these is a Chrome
JSON event type Perfetto imports (format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import Analysis
from ranktrace.analyzers.report.spans import as_of, span_table
from ranktrace.analyzers.report.words import plain, state_text
from ranktrace.analyzers.verdict import Verdict

__all__ = ["render", "EXTENSION", "BINARY", "PHASE_TID", "GPU_PID_BASE"]

EXTENSION = ".json"
BINARY = False
PHASE_TID = 0            # each rank's "phases" track
GPU_PID_BASE = 1 << 20   # GPU n's counters live in pseudo-process GPU_PID_BASE + n (after every rank)
_STACK_SAMPLES_PER_THREAD = 2000


def _clock(events: pa.Table) -> str:
    """wall_ns (comparable across hosts) unless more ranked rows carry only the monotonic t_ns."""
    if events.num_rows == 0:
        return "wall_ns"
    ranked = pc.is_valid(events["rank"])
    n_wall = pc.sum(pc.and_(ranked, pc.is_valid(events["wall_ns"]))).as_py() or 0
    n_mono = pc.sum(pc.and_(ranked, pc.is_valid(events["t_ns"]))).as_py() or 0
    return "wall_ns" if n_wall >= n_mono else "t_ns"


def _innermost_app(frames: list[str]) -> str:
    """The first frame (innermost first) that is the program's own: not the stdlib, torch or ranktrace."""
    skip = ("threading.py", "queue.py", "selectors.py", "socket.py", "multiprocessing/", "torch/", "distributed/",
            "tracer/rank/", "site-packages/", "concurrent/")
    for f in frames:
        if not any(s in f for s in skip):
            return f
    return frames[0] if frames else "?"


def _is_hung_op(row: dict[str, Any], v: Verdict) -> bool:
    op = v.operation
    if op is None or row["name"] != op.name or (op.group is not None and row["group"] != op.group):
        return False
    return row["seq"] == op.seq if op.seq is not None else row["outcome"] == "open"


class _Trace:
    def __init__(self, t0: int) -> None:
        self.t0 = t0
        self.events: list[dict[str, Any]] = []
        self.threads: dict[tuple[int, int], str] = {}

    def us(self, t: int) -> float:
        return (t - self.t0) / 1000.0

    def add(self, e: dict[str, Any]) -> None:
        self.events.append(e)


def render(result: Analysis, samples: Mapping[str, pa.Table] | None = None) -> str:
    v = result.verdict
    clock = _clock(result.events)
    spans = span_table(result.events)
    start_col, end_col = ("start_wall_ns", "end_wall_ns") if clock == "wall_ns" else ("start_t_ns", "end_t_ns")
    spans = spans.filter(pc.and_(pc.is_valid(spans["rank"]), pc.is_valid(spans[start_col])))
    ev = result.events
    ranked = ev.filter(pc.and_(pc.is_valid(ev["rank"]), pc.is_valid(ev[clock]))) if ev.num_rows else ev
    if ranked.num_rows == 0 and spans.num_rows == 0:
        return json.dumps({"traceEvents": [], "displayTimeUnit": "ns", "metadata": {"verdict": plain(v.summary)}})
    samples = samples or {}
    starts = [pc.min(ranked[clock]).as_py() if ranked.num_rows else None,
              pc.min(spans[start_col]).as_py() if spans.num_rows else None]
    starts += [pc.min(t[clock]).as_py() for t in samples.values() if t is not None and t.num_rows
               and clock in t.schema.names]
    t0 = min(x for x in starts if x is not None)  # time 0 of the picture: the first record or sample
    t_end = as_of(result, clock) or t0
    tr = _Trace(t0)
    ranks = sorted(set(ranked["rank"].to_pylist()) | set(spans["rank"].to_pylist()) | set(v.ranks))
    _processes(tr, ranks, result, ranked)
    _slices(tr, spans, v, start_col, end_col, t_end)
    _phases(tr, ranked, spans, v, clock, start_col, end_col, t_end, result)
    _stack_instants(tr, samples.get("samples_stacks"), result.stacks, clock, set(ranks))
    _counters(tr, samples.get("samples_proc"), samples.get("samples_gpu"), clock, set(ranks))
    _thread_names(tr, result, samples)
    if t_end >= t0:
        tr.add({"ph": "i", "s": "g", "name": f"verdict: {v.status.upper()} · {v.kind}", "pid": ranks[0] if ranks
                else 0, "tid": PHASE_TID, "ts": tr.us(t_end), "args": {"summary": plain(v.summary)}})
    return json.dumps({"traceEvents": tr.events, "displayTimeUnit": "ns",
                       "metadata": {"verdict": plain(v.summary), "status": v.status, "kind": v.kind,
                                    "clock": clock, "as_of_ns": t_end}})


def _processes(tr: _Trace, ranks: list[int], result: Analysis, ranked: pa.Table) -> None:
    host_pid: dict[int, tuple[str | None, int | None]] = {}
    if ranked.num_rows:
        for r in ranked.select(["rank", "host", "pid"]).group_by(["rank"], use_threads=False).aggregate(
                [("host", "first"), ("pid", "first")]).to_pylist():
            host_pid[r["rank"]] = (r["host_first"], r["pid_first"])
    culprits = set(result.verdict.culprit_ranks)
    for r in ranks:
        host, pid = host_pid.get(r, (None, None))
        label = f"rank {r}" + (" (culprit)" if r in culprits else "") + \
            "".join(f" · {x}" for x in (host, f"pid {pid}" if pid else None) if x)
        tr.add({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": label}})
        tr.add({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        tr.threads[(r, PHASE_TID)] = "phases"
        tr.add({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": PHASE_TID, "args": {"sort_index": -1}})
        if pid:
            tr.threads.setdefault((r, pid), "main thread")


def _slices(tr: _Trace, spans: pa.Table, v: Verdict, start_col: str, end_col: str, t_end: int) -> None:
    rows = spans.select(["rank", "tid", "name", "category", "group", "seq", "peer", "callsite", "capturing", "error",
                         "outcome", "completed", "source", start_col, end_col]).to_pylist()
    first_of: dict[tuple, tuple[int, int, float]] = {}
    flow_id = 0
    for r in sorted(rows, key=lambda x: x[start_col]):
        tid = r["tid"] or 0
        tr.threads.setdefault((r["rank"], tid), f"thread {tid}")
        ts = tr.us(r[start_col])
        args: dict[str, Any] = {"outcome": r["outcome"]}
        for k in ("group", "seq", "callsite", "peer", "error"):  # only what the call has: the file stays small
            if r[k] is not None:
                args[k] = r[k]
        if r["source"] != "events":
            args["source"] = r["source"]
        if r["capturing"]:
            args["capturing"] = True
        if r["completed"]:
            args["completed"] = True
        name = r["name"] + (f" seq {r['seq']}" if r["seq"] is not None else "")
        hung = _is_hung_op(r, v)
        if hung:
            args["verdict_operation"] = True
        if r["outcome"] == "open":  # never returned: drawn until the verdict's moment, and marked there
            end = tr.us(max(t_end, r[start_col]))
            name += " (never returned)"
            args["open"] = True
            tr.add({"ph": "i", "s": "t", "name": "hung: never returned", "pid": r["rank"], "tid": tid, "ts": end,
                    "args": {"call": r["name"], "seq": r["seq"], "waited_s": round((end - ts) / 1e6, 3)}})
        else:
            end = tr.us(r[end_col]) if r[end_col] is not None else ts
        tr.add({"ph": "X", "name": name, "cat": r["category"] or "op", "pid": r["rank"], "tid": tid, "ts": ts,
                "dur": max(end - ts, 0.001), "args": args})
        if r["seq"] is not None and r["category"] in ("collective", "p2p"):
            k = (r["group"], r["seq"], r["category"], r["peer"] if r["category"] == "p2p" else None)
            if k in first_of:
                pid, ftid, ts0 = first_of[k]
                if pid != r["rank"]:
                    flow_id += 1
                    tr.add({"ph": "s", "id": flow_id, "name": "same op", "cat": "flow", "pid": pid, "tid": ftid,
                            "ts": ts0})
                    tr.add({"ph": "f", "bp": "e", "id": flow_id, "name": "same op", "cat": "flow", "pid": r["rank"],
                            "tid": tid, "ts": ts})
            else:
                first_of[k] = (r["rank"], tid, ts)


def _phases(tr: _Trace, ranked: pa.Table, spans: pa.Table, v: Verdict, clock: str, start_col: str, end_col: str,
            t_end: int, result: Analysis) -> None:
    """Each rank's phases track: phase spans, marks (phase changes, ring wrapped, process exit), and for a culprit
    the stretch since its last call, named by where its stacks say it sat."""
    ph = spans.filter(pc.equal(spans["category"], "phase"))
    for r in ph.select(["rank", "name", "outcome", start_col, end_col]).to_pylist():
        ts = tr.us(r[start_col])
        end = tr.us(r[end_col]) if r[end_col] is not None else tr.us(max(t_end, r[start_col]))
        tr.add({"ph": "X", "name": r["name"], "cat": "phase", "pid": r["rank"], "tid": PHASE_TID, "ts": ts,
                "dur": max(end - ts, 0.001), "args": {"open": r["outcome"] == "open"}})
    marks = ranked.filter(pc.equal(ranked["kind"], "mark")) if ranked.num_rows else ranked
    for m in marks.select(["rank", "name", "detail", clock]).to_pylist():
        tr.add({"ph": "i", "s": "t", "name": m["name"] or "mark", "pid": m["rank"], "tid": PHASE_TID,
                "ts": tr.us(m[clock]), "args": {"detail": m["detail"]}})
    last_call: dict[int, int] = {}
    calls = spans.filter(pc.is_in(spans["category"], value_set=pa.array(["collective", "p2p"])))
    if calls.num_rows:
        ends = pc.coalesce(calls[end_col], calls[start_col])
        for r, t in zip(calls["rank"].to_pylist(), ends.to_pylist()):
            last_call[r] = max(last_call.get(r, t), t)
    for rank in v.culprit_ranks:
        st = v.ranks.get(rank)
        if rank not in last_call or st is None or last_call[rank] >= t_end:
            continue
        where = st.where or (st.stack[0] if st.stack else "outside any traced call")
        ts = tr.us(last_call[rank])
        tr.add({"ph": "X", "name": f"sat in {where}", "cat": "culprit", "pid": rank, "tid": PHASE_TID, "ts": ts,
                "dur": max(tr.us(t_end) - ts, 0.001),
                "args": {"state": state_text(st.state), "where": where, "stack": list(st.stack[:20]),
                         "since": "its last collective", "until": "the verdict"}})


def _stack_instants(tr: _Trace, sampled: pa.Table | None, stacks: pa.Table, clock: str, ranks: set[int]) -> None:
    """One instant per sampled thread stack (the full sample history when given, else the analysis's stacks)."""
    src = sampled if sampled is not None and sampled.num_rows else stacks
    if src is None or src.num_rows == 0 or clock not in src.schema.names:
        return
    src = src.filter(pc.and_(pc.is_valid(src["rank"]), pc.is_valid(src[clock])))
    cols = ["rank", "tid", "thread_name", "thread_state", "frames", clock]
    per_thread: dict[tuple, int] = defaultdict(int)
    for r in src.select(cols).to_pylist():
        if r["rank"] not in ranks:
            continue
        key = (r["rank"], r["tid"])
        per_thread[key] += 1
        if per_thread[key] > _STACK_SAMPLES_PER_THREAD:
            continue
        tid = r["tid"] or 0
        if r["thread_name"]:
            tr.threads[(r["rank"], tid)] = r["thread_name"]
        frames = list(r["frames"] or [])
        tr.add({"ph": "i", "s": "t", "name": f"stack: {_innermost_app(frames)}", "cat": "stack", "pid": r["rank"],
                "tid": tid, "ts": tr.us(r[clock]), "args": {"state": r["thread_state"], "frames": frames[:40]}})


def _counters(tr: _Trace, proc: pa.Table | None, gpu: pa.Table | None, clock: str, ranks: set[int]) -> None:
    # the samples carry both clocks: drawn on the one the spans use
    if proc is not None and proc.num_rows:
        p = proc.filter(pc.and_(pc.equal(proc["kind"], "process"), pc.is_valid(proc["rank"])))
        p = p.filter(pc.is_valid(p[clock])) if p.num_rows else p
        if p.num_rows:
            p = p.sort_by([("pid", "ascending"), (clock, "ascending")])
            t = np.asarray(p[clock].to_numpy(zero_copy_only=False), dtype=np.int64)
            pid = np.asarray(p["pid"].to_numpy(zero_copy_only=False), dtype=np.int64)
            cpu = np.asarray(pc.add(pc.fill_null(p["utime_ns"], 0), pc.fill_null(p["stime_ns"], 0)).to_numpy(
                zero_copy_only=False), dtype=np.float64)
            same = np.concatenate(([False], pid[1:] == pid[:-1]))
            dt = np.where(same, np.diff(t, prepend=t[0]), 0)
            dcpu = np.where(same, np.diff(cpu, prepend=cpu[0]), 0)
            pct = np.where(dt > 0, 100.0 * dcpu / np.maximum(dt, 1), np.nan)
            rows = p.select(["rank", "rss_bytes", "read_bytes", "write_bytes"]).to_pylist()
            for i, r in enumerate(rows):
                if r["rank"] not in ranks:
                    continue
                ts = tr.us(int(t[i]))
                if r["rss_bytes"] is not None:
                    tr.add({"ph": "C", "name": "RSS MiB", "pid": r["rank"], "ts": ts,
                            "args": {"RSS MiB": round(r["rss_bytes"] / 2**20, 1)}})
                if not np.isnan(pct[i]):
                    tr.add({"ph": "C", "name": "CPU %", "pid": r["rank"], "ts": ts, "args": {"CPU %": round(
                        float(pct[i]), 1)}})
                if r["read_bytes"] is not None or r["write_bytes"] is not None:
                    tr.add({"ph": "C", "name": "storage I/O MiB", "pid": r["rank"], "ts": ts, "args": {
                        "read": round((r["read_bytes"] or 0) / 2**20, 2),
                        "write": round((r["write_bytes"] or 0) / 2**20, 2)}})
    if gpu is not None and gpu.num_rows:
        g = gpu.filter(pc.is_valid(gpu[clock]))
        named: set[int] = set()
        for r in g.select(["kind", "gpu", "rank", "util_gpu", "util_mem", "mem_used", clock]).to_pylist():
            ts = tr.us(r[clock])
            if r["kind"] == "device" and r["gpu"] is not None:
                gp = GPU_PID_BASE + r["gpu"]
                if r["gpu"] not in named:
                    named.add(r["gpu"])
                    tr.add({"ph": "M", "name": "process_name", "pid": gp, "tid": 0, "args": {"name": f"GPU {r['gpu']}"}})
                    tr.add({"ph": "M", "name": "process_sort_index", "pid": gp, "tid": 0,
                            "args": {"sort_index": GPU_PID_BASE + r["gpu"]}})
                if r["util_gpu"] is not None:
                    tr.add({"ph": "C", "name": "utilisation %", "pid": gp, "ts": ts,
                            "args": {"gpu": r["util_gpu"], "memory": r["util_mem"] or 0}})
                if r["mem_used"] is not None:
                    tr.add({"ph": "C", "name": "memory used MiB", "pid": gp, "ts": ts,
                            "args": {"used": round(r["mem_used"] / 2**20, 1)}})
            elif r["kind"] == "process" and r["rank"] in ranks and r["mem_used"] is not None:
                tr.add({"ph": "C", "name": f"GPU {r['gpu']} memory MiB", "pid": r["rank"], "ts": ts,
                        "args": {"used": round(r["mem_used"] / 2**20, 1)}})


def _thread_names(tr: _Trace, result: Analysis, samples: Mapping[str, pa.Table]) -> None:
    """thread_name metadata for every track drawn: the stack samples' names, else /proc's comm."""
    proc = samples.get("samples_proc")
    if proc is not None and proc.num_rows:
        th = proc.filter(pc.and_(pc.equal(proc["kind"], "thread"), pc.is_valid(proc["rank"])))
        for r in th.select(["rank", "tid", "comm"]).to_pylist():
            key = (r["rank"], r["tid"])
            if key in tr.threads and tr.threads[key].startswith("thread ") and r["comm"]:
                tr.threads[key] = r["comm"]
    for (rank, tid), name in sorted(tr.threads.items()):
        tr.add({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
