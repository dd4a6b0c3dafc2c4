"""The fifth question of `trace compare`: how long did things take? Phase durations side by side (init, the
phases a --hook or a server log names: weights, KV pool, each CUDA graph capture in order) and per-op latency
distributions (p50/p99 by op and size) from whatever timed the ops: our rings (host call), nsys (GPU kernel), Kineto
(CPU op to kernel end), NCCL COLL lines with sub-second timestamps (interval between two enqueues). Vectorised, and
sampled past a bound, so 8 ranks x 1M events stay cheap."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.compare.sequences import filter_rows
from ranktrace.analyzers.compare.whole import RunTables, decoded, is_in
from ranktrace.analyzers.model.values import LatencyRow, PhaseTiming

__all__ = ["phase_durations", "phases_side_by_side", "latency", "latency_side_by_side", "MAX_SAMPLES"]

MAX_SAMPLES = 400_000      # ops per run a latency distribution is computed from (an even stride beyond)
_SPAN_CATEGORIES = ("init", "phase", "graph")
_BASIS = {"events": "host call (our rings)", "nsys": "GPU kernel (nsys)", "kineto": "CPU op to kernel end (Kineto)",
          "fr": "Flight Recorder start to end", "nccl": "interval between enqueues (NCCL COLL timestamps)"}


def _t(table: pa.Table) -> pa.ChunkedArray:
    return pc.coalesce(table["t_ns"], table["wall_ns"])


def _bools(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if arr.null_count:
        arr = pc.fill_null(arr, False)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


def _ints(arr: pa.ChunkedArray | pa.Array, null: int = -1) -> np.ndarray:
    if arr.null_count:
        arr = pc.fill_null(arr, null)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


_NO_TIME = np.iinfo(np.int64).max


def phase_durations(an: RunTables) -> dict[str, tuple[float, str]]:
    """phase -> (seconds of the slowest rank, where from). Spans of category init/phase/graph (enter..exit, by
    span), server-log begin/end marks, CUDA graph captures numbered in order per rank, and the time from the first
    event to the first and the last collective issued."""
    out: dict[str, tuple[float, str]] = {}
    if not an.events.num_rows:
        return out
    ev = an.events.select(["rank", "pid", "span_id", "kind", "name", "detail", "category", "source", "t_ns",
                           "wall_ns"])
    sub = decoded(filter_rows(ev, pa.array(is_in(ev["category"], _SPAN_CATEGORIES))))   # few rows: first
    sub = sub.filter(pc.and_(pc.is_in(sub["kind"], value_set=pa.array(["enter", "exit", "error", "mark"])),
                             pc.invert(pc.fill_null(pc.match_substring(sub["name"], "replay"), False))))
    sub = sub.append_column("t", _t(sub))
    sub = sub.filter(pc.is_valid(sub["t"]))
    rows = sub.select(["rank", "pid", "span_id", "kind", "name", "detail", "category", "source", "t"]).to_pylist()
    spans: dict[tuple[Any, ...], list[Any]] = {}
    marks: dict[tuple[Any, str], dict[str, int]] = defaultdict(dict)
    for r in rows:
        name = r["name"] or "?"
        if "replay" in name:
            continue
        if r["kind"] == "mark":
            for suffix in ("_begin", "_end"):
                if name.endswith(suffix):
                    marks[(r["rank"], name[: -len(suffix)])].setdefault(suffix, r["t"])
            continue
        key = (r["rank"], r["pid"], r["span_id"] if r["span_id"] is not None else name)
        s = spans.setdefault(key, [r["rank"], name, r["detail"], None, None, r["source"]])
        if r["kind"] == "enter":
            s[3] = r["t"] if s[3] is None else s[3]
        else:
            s[4] = r["t"]
    per: dict[str, list[float]] = defaultdict(list)
    src: dict[str, str] = {}
    captures: dict[Any, int] = defaultdict(int)
    for rank, name, _detail, start, end, source in sorted(spans.values(), key=lambda s: (s[3] is None, s[3] or 0)):
        if start is None or end is None or end < start:
            continue
        if name == "cuda_graph_capture":
            captures[rank] += 1
            name = f"CUDA graph capture #{captures[rank]}"
        per[name].append((end - start) / 1e9)
        src.setdefault(name, "our rings" if source == "events" else source or "?")
    for (rank, name), ends in marks.items():
        if "_begin" in ends and "_end" in ends and ends["_end"] >= ends["_begin"]:
            per[name].append((ends["_end"] - ends["_begin"]) / 1e9)
            src.setdefault(name, "server log")
    for name, secs in per.items():
        out[name] = (max(secs), src[name])
    first, last, t0 = _collective_span(an)
    if first is not None and t0 is not None:
        out["time to first collective"] = ((first - t0) / 1e9, "first event to first collective")
        out["time to last collective issued"] = ((cast(int, last) - t0) / 1e9, "first event to last collective")
    return out


def _collective_span(an: RunTables) -> tuple[int | None, int | None, int | None]:
    """(first, last) collective issue time (the ops table: one row per op) and the first event's time, in the same
    clock (CLOCK_MONOTONIC ns where the inputs have it, else wall ns)."""
    ev, ops = an.events, an.ops
    if not ev.num_rows or not ops.num_rows:
        return None, None, None
    mono = ev["t_ns"].null_count < ev.num_rows
    t_ev, t_op = (ev["t_ns"], ops["t_enter"]) if mono else (ev["wall_ns"], ops["wall_enter"])
    coll = pa.array(is_in(ops["category"], ("collective", "p2p")))
    t = pc.filter(t_op, pc.and_(coll, pc.is_valid(t_op)))
    if not len(t) or t_ev.null_count == len(t_ev):
        return None, None, None
    return pc.min(t).as_py(), pc.max(t).as_py(), pc.min(t_ev).as_py()


def phases_side_by_side(pa_: dict[str, tuple[float, str]], pb: dict[str, tuple[float, str]]) -> list[PhaseTiming]:
    rows = []
    for name in sorted(set(pa_) | set(pb), key=lambda n: (n.startswith("time to"), n)):
        a, b = pa_.get(name), pb.get(name)
        ratio = (b[0] / a[0]) if a and b and a[0] > 0 else None
        rows.append(PhaseTiming(name, a[0] if a else None, b[0] if b else None, ratio, (a or b)[1]))  # type: ignore[index]
    return rows


def _stride(idx: np.ndarray) -> np.ndarray:
    if idx.size <= MAX_SAMPLES:
        return idx
    return idx[:: int(np.ceil(idx.size / MAX_SAMPLES))]


def _durations_by_key(t: np.ndarray, key: np.ndarray, is_start: np.ndarray, is_end: np.ndarray) -> tuple[np.ndarray,
                                                                                                        np.ndarray]:
    """(start rows, durations ns): each start row paired with the (first) end row of the same key: one span, one
    kernel, one Kineto op."""
    starts = np.flatnonzero(is_start)
    ends = np.flatnonzero(is_end)
    if not starts.size or not ends.size:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    starts = _stride(starts)
    order = np.lexsort((t[ends], key[ends]))
    ek, et = key[ends][order], t[ends][order]
    sk, st = key[starts], t[starts]
    pos = np.searchsorted(ek, sk, side="left")
    ok = pos < ek.size
    ok[ok] &= ek[pos[ok]] == sk[ok]
    dur = np.where(ok, et[np.minimum(pos, ek.size - 1)] - st, -1)
    good = ok & (dur >= 0)
    return starts[good], dur[good]


def latency(an: RunTables) -> dict[tuple[str, int | None, str], np.ndarray]:
    """(op, nbytes, basis) -> durations in µs. Past MAX_SAMPLES ops, every k-th span is kept (chosen by span id, or
    by source row: an op's start and end rows are kept or dropped together), so the cost stays bounded."""
    out: dict[tuple[str, int | None, str], np.ndarray] = {}
    if not an.events.num_rows:
        return out
    ev = an.events.select(["category", "source", "kind", "name", "nbytes", "t_ns", "wall_ns", "span_id", "pid",
                           "line", "detail", "rank", "group"])
    # sample first, by span (our rings) or source row (nsys, Kineto), with integer columns only: the string masks
    # below then run on at most ~2 x MAX_SAMPLES rows, however big the run
    k = max(1, -(-an.ops.num_rows // MAX_SAMPLES))
    if k > 1:
        span = _ints(ev["span_id"])
        keep = (span >= 0) & (span % k == 0)
        nospan = np.flatnonzero(span < 0)
        if nospan.size:   # NCCL COLL lines are kept whole: their intervals need every line
            line = _ints(ev["line"].take(pa.array(nospan)))
            nccl = _bools(pc.equal(ev["source"].take(pa.array(nospan)), "nccl"))
            keep[nospan[nccl | (line % k == 0)]] = True
        ev = filter_rows(ev, pa.array(keep))
    ev = decoded(filter_rows(ev, pa.array(is_in(ev["category"], ("collective", "p2p")))))
    t_all = _ints(_t(ev), _NO_TIME)
    for source in pc.unique(ev["source"]).to_pylist():
        if source not in _BASIS:
            continue
        rows = _bools(pc.equal(ev["source"], source)) & (t_all != _NO_TIME)
        if not rows.any():
            continue
        sub = filter_rows(ev, pa.array(rows))
        t = t_all[rows]
        kind = sub["kind"]
        if source == "nccl":
            starts, dur = _intervals(sub, t)
        else:
            if source == "events":
                sid = _ints(sub["span_id"])
                key = _ints(sub["pid"], 0) * (1 << 40) + sid
                valid = sid >= 0
            else:   # one source row (a kernel, a Kineto op) gives its enter and its end the same line; nsys lines
                # are row ids of different tables, so a kernel's rows are kept apart from an NVTX range's
                line_s = _ints(sub["line"])
                kernel = _bools(pc.starts_with(sub["detail"], "kernel"))
                key = line_s * 2 + kernel
                valid = line_s >= 0
            is_start = _bools(pc.equal(kind, "enter")) & valid
            end_kind = "complete" if source in ("nsys", "kineto") and pc.any(pc.equal(kind, "complete")).as_py() \
                else "exit"
            is_end = _bools(pc.equal(kind, end_kind)) & valid
            starts, dur = _durations_by_key(t, key, is_start, is_end)
        if not starts.size:
            continue
        picked = sub.select(["name", "nbytes"]).take(pa.array(starts))
        names = picked["name"].combine_chunks().dictionary_encode()
        ncode = _ints(names.indices)
        nb = _ints(picked["nbytes"])
        combo = ncode * (1 << 44) + nb + 1
        uniq, inv = np.unique(combo, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
        dict_names = names.dictionary.to_pylist()
        for i, u in enumerate(uniq.tolist()):
            sel = order[bounds[i]:bounds[i + 1]]
            code, nbytes = int(u) // (1 << 44), int(u) % (1 << 44) - 1
            name = dict_names[code] if 0 <= code < len(dict_names) else "?"
            out[(name, None if nbytes < 0 else nbytes, _BASIS[source])] = dur[sel] / 1e3
    return out


def _intervals(sub: pa.Table, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NCCL COLL lines: the time from one enqueue to the next on the same rank and communicator, where the log's
    timestamps have sub-second resolution (NCCL_DEBUG_TIMESTAMP_FORMAT with %Nf); else nothing."""
    if not np.any(t % 1_000_000_000):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    grp = sub["group"].combine_chunks().dictionary_encode()
    g = np.asarray(pc.fill_null(grp.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    r = np.asarray(pc.fill_null(sub["rank"], -1).to_numpy(), dtype=np.int64)
    line = np.asarray(pc.fill_null(sub["line"], 0).to_numpy(), dtype=np.int64)
    order = np.lexsort((line, r, g))
    same = (g[order][1:] == g[order][:-1]) & (r[order][1:] == r[order][:-1])
    dur = t[order][1:] - t[order][:-1]
    keep = same & (dur >= 0)
    return order[:-1][keep], dur[keep]


def _stats(x: np.ndarray | None) -> tuple[int, float | None, float | None]:
    if x is None or not x.size:
        return 0, None, None
    p50, p99 = np.percentile(x, [50, 99])
    return int(x.size), round(float(p50), 3), round(float(p99), 3)


def latency_side_by_side(la: dict[tuple[str, int | None, str], np.ndarray],
                         lb: dict[tuple[str, int | None, str], np.ndarray], limit: int = 40) -> list[LatencyRow]:
    """One row per (op, size, basis) either run has, those both have first, the most frequent first."""
    rows = []
    for key in set(la) | set(lb):
        na, a50, a99 = _stats(la.get(key))
        nb, b50, b99 = _stats(lb.get(key))
        r50 = round(b50 / a50, 3) if a50 and b50 is not None else None
        r99 = round(b99 / a99, 3) if a99 and b99 is not None else None
        rows.append(LatencyRow(key[0], key[1], key[2], na, a50, a99, nb, b50, b99, r50, r99))
    rows.sort(key=lambda r: (not (r.a_n and r.b_n), -(r.a_n + r.b_n), r.op, r.nbytes or 0))
    return rows[:limit]
