"""The start-up phase ledger: per rank, which phase it went through (torch distributed init, weight loading, KV
cache, kernel warm-up, each CUDA-graph capture with its batch size, the draft worker's captures, serving), when each
started, how long it took, and the one it is in now.

Two sources, one ledger: the rings' phase spans (a profile's phase targets, ``--hook X=phase``; their detail names
the instance, ``bs=64``), and the job's own log lines as the server-log reader read them (``Load weight begin`` /
``end``, ``Capture cuda graph begin`` / ``end``, ``KV Cache is allocated``, the server saying it is ready). A phase
the rings recorded for a rank is not taken again from that rank's log.

Pure: tables in, a list of ``PhaseEntry`` out (``as_of_ns``: the time an open phase is measured up to).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.verdict import PHASE_TEXT, PhaseEntry, phase_text

__all__ = ["build_ledger", "current_phases", "LOG_PHASES", "PHASE_TEXT", "phase_text"]

# server-log marks -> (ledger phase, begins | ends | point)
LOG_PHASES = {
    "dist_init_begin": ("torch_distributed_init", "begin"), "dist_init_end": ("torch_distributed_init", "end"),
    "load_weights_begin": ("weight_loading", "begin"), "load_weights_end": ("weight_loading", "end"),
    "kv_cache_alloc": ("kv_cache_alloc", "point"),
    "cuda_graph_capture_begin": ("cuda_graph_init", "begin"), "cuda_graph_capture_end": ("cuda_graph_init", "end"),
    "cuda_graph_capture_error": ("cuda_graph_init", "point"), "serving": ("serving", "begin"),
}
@dataclass
class _Open:
    rank: int | None
    name: str
    detail: str | None
    start: int | None
    source: str
    file: str | None
    line: int | None


#: the ledger's last phase: a span of it that holds other phases (vLLM's worker_busy_loop runs memory profiling, KV
#: cache allocation and warm-up as requests of its loop) serves only once the last of them ended
SERVING = "serving"


def build_ledger(events: pa.Table, as_of_ns: int | None) -> list[PhaseEntry]:
    """Every phase of every rank, in start order."""
    if events.num_rows == 0:
        return []
    out = _serving_after_startup(_ring_phases(events, as_of_ns), as_of_ns, _server_serving(events))
    seen = {(p.rank, p.name) for p in out}
    out += [p for p in _log_phases(events, as_of_ns) if (p.rank, p.name) not in seen]
    out.sort(key=lambda p: (p.start_ns if p.start_ns is not None else 1 << 62, -1 if p.rank is None else p.rank))
    return out


def current_phases(ledger: list[PhaseEntry]) -> dict[int, PhaseEntry]:
    """Per rank: the innermost phase still open (the latest-started one), else the last one that ended."""
    cur: dict[int, PhaseEntry] = {}
    for p in ledger:  # start order
        if p.rank is None:
            continue
        have = cur.get(p.rank)
        if have is None or p.open or not have.open:
            cur[p.rank] = p
    return cur


def _entry(o: _Open, end: int | None, as_of_ns: int | None, closed: bool, error: bool = False) -> PhaseEntry:
    stop = end if closed else as_of_ns
    secs = None if o.start is None or stop is None else max(0.0, (stop - o.start) / 1e9)
    return PhaseEntry(rank=o.rank, name=o.name, detail=o.detail, start_ns=o.start, seconds=secs, open=not closed,
                      source=o.source, file=o.file, line=o.line, failed=error)


def _ring_phases(events: pa.Table, as_of_ns: int | None) -> list[PhaseEntry]:
    ev = events.filter(pc.and_(pc.equal(events["category"], "phase"), pc.equal(events["source"], "events")))
    ev = ev.filter(pc.is_in(ev["kind"], value_set=pa.array(["enter", "exit", "error"])))
    if ev.num_rows == 0:
        return []
    rows = ev.select(["host", "pid", "file", "span_id", "kind", "rank", "name", "detail", "wall_ns", "line"]).to_pylist()
    opened: dict[tuple, _Open] = {}
    out: list[PhaseEntry] = []
    for r in sorted(rows, key=lambda r: (r["wall_ns"] or 0)):
        key = (r["host"], r["pid"], r["file"], r["span_id"])
        if r["kind"] == "enter":
            name, detail = r["name"] or "?", _detail(r["detail"])
            if " " in name and detail is None:  # a span spilled to op slots: "cuda_graph_capture bs=8"
                name, detail = name.split(" ", 1)
            opened[key] = _Open(r["rank"], name, detail, r["wall_ns"], "events", r["file"], r["line"])
        else:
            o = opened.pop(key, None)
            if o is not None:
                out.append(_entry(o, r["wall_ns"], as_of_ns, True, r["kind"] == "error"))
    out += [_entry(o, None, as_of_ns, False) for o in opened.values()]
    return out


def _server_serving(events: pa.Table) -> list[int] | None:
    """When the server said it serves (its log's serving marks of no rank: "Application startup complete", "Starting
    vLLM server on"); [] when there is a server log that has not said so; None when there is no server log."""
    marks = events.filter(pc.and_(pc.equal(events["kind"], "mark"), pc.equal(events["source"], "server_log")))
    if marks.num_rows == 0:
        return None
    return sorted(r["wall_ns"] for r in marks.select(["rank", "name", "wall_ns"]).to_pylist()
                  if r["name"] == "serving" and r["rank"] is None and r["wall_ns"] is not None)


def _serving_after_startup(phases: list[PhaseEntry], as_of_ns: int | None,
                           server_says: list[int] | None) -> list[PhaseEntry]:
    """A rank's serving span (vLLM's worker_busy_loop: the loop that serves also runs the rest of the start-up as
    its first requests — memory profiling, KV cache allocation, warm-up) begins when the start-up is over: its own
    phases inside the span have ended, no rank is still in a start-up phase, and — where the server's log is read —
    the server has said that it serves (from that moment, when it falls inside the span). Until then the rank is
    not serving and its serving span is left out of the ledger."""
    startup = [q for q in phases if q.name != SERVING]
    if any(q.open and q.rank is not None for q in startup):  # some rank still starts up: nobody serves yet
        return [p for p in phases if p.name != SERVING or p.rank is None]
    out: list[PhaseEntry] = []
    for p in phases:
        if p.name != SERVING or p.start_ns is None or p.rank is None:
            out.append(p)
            continue
        end_ns = _end(p)
        inside = [q for q in startup if q.rank == p.rank and _within(q, p.start_ns, end_ns)]
        begin = max([p.start_ns] + [_end(q) or p.start_ns for q in inside])
        if server_says is not None:
            said = [t for t in server_says if t >= p.start_ns and (end_ns is None or t <= end_ns)]
            if not said and (inside or server_says == []):
                continue  # the server has not said that it serves: start-up is not over
            if said:
                begin = max(begin, said[0])
        if begin == p.start_ns:
            out.append(p)
            continue
        stop = end_ns if end_ns is not None else as_of_ns
        secs = None if stop is None else max(0.0, (stop - begin) / 1e9)
        out.append(PhaseEntry(rank=p.rank, name=p.name, detail=p.detail, start_ns=begin, seconds=secs, open=p.open,
                              source=p.source, file=p.file, line=p.line, failed=p.failed))
    return out


def _end(p: PhaseEntry) -> int | None:
    if p.open or p.start_ns is None:
        return None
    return p.start_ns + int((p.seconds or 0) * 1e9)


def _within(q: PhaseEntry, start: int, end: int | None) -> bool:
    return q.start_ns is not None and q.start_ns >= start and (end is None or q.start_ns <= end)


def _detail(d: str | None) -> str | None:
    """A ring meta event's detail column is 'detail=bs=8' (or other key=value pairs): the instance text."""
    if not d:
        return None
    return d[len("detail="):] if d.startswith("detail=") else d


def _log_phases(events: pa.Table, as_of_ns: int | None) -> list[PhaseEntry]:
    marks = events.filter(pc.and_(pc.equal(events["kind"], "mark"), pc.equal(events["source"], "server_log")))
    if marks.num_rows == 0:
        return []
    out: list[PhaseEntry] = []
    opened: dict[tuple, _Open] = {}
    rows = marks.select(["rank", "name", "wall_ns", "file", "line"]).to_pylist()
    for r in sorted(rows, key=lambda r: (r["file"] or "", r["line"] or 0)):
        what = LOG_PHASES.get(r["name"] or "")
        if what is None:
            continue
        name, how = what
        key = (r["rank"], name)
        o = _Open(r["rank"], name, None, r["wall_ns"], "server_log", r["file"], r["line"])
        if how == "point":
            out.append(_entry(o, r["wall_ns"], as_of_ns, True))
        elif how == "begin":
            if key in opened:  # begun again (a second capture pass): the first one ended where this began
                out.append(_entry(opened.pop(key), r["wall_ns"], as_of_ns, True))
            opened[key] = o
        else:
            b = opened.pop(key, None)
            if b is not None:
                out.append(_entry(b, r["wall_ns"], as_of_ns, True))
    out += [_entry(o, None, as_of_ns, False) for o in opened.values()]
    return out
