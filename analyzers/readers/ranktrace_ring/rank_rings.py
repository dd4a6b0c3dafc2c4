"""The rings of one host directory read rank by rank through the record window: a ring with a tail index (issue #28)
only where it must be, its latest records and the older ones the index names; any other (an older ring, an index
that cannot vouch, a read asking for ops by seq or every op's label) is mapped whole. Only kept records are decoded."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.ranktrace_ring.events import identity_of, ring_result
from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.recordwindow import SENDS, Records, channel_ranges, labels_before, select
from ranktrace.tracer.formats.ringreader import SLOT_FIELDS, RingError, RingView
from ranktrace.tracer.formats.ringwindow import RingWindow, open_window

__all__ = ["HostRings", "read_host_rings"]

_N_KINDS = len(rf.KINDS)   # ring kind codes are KIND_CODES (enter, exit, error, complete, mark); others -1
THREADS = max(1, min(4, os.cpu_count() or 1))   # ranks read side by side
IO_THREADS = 8   # rings opened side by side: a cold open waits on the disk, not the CPU
UNREAD_LOW = -(2**62)   # the lowest seq a ring's unread older records may hold
AnyView = RingView | RingWindow


@dataclass
class HostRings:
    """What the rings of one host dir gave: one ReadResult per ring (in file order), problems, what was dropped."""

    results: list[ReadResult] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    dropped: dict[str, tuple[int, int]] = field(default_factory=dict)   # channel -> (lowest, highest) seq dropped
    records: int = 0
    kept: int = 0
    windowed: int = 0   # rings read through their tail index (the others whole)
    prefixes: dict[int, tuple[np.ndarray, list[str | None], int]] = field(default_factory=dict)  # window.labels_before


def read_host_rings(rings: list[Path], host: str, rows: int,
                    extra: frozenset[tuple[str, int]] = frozenset(), labels: bool = False) -> HostRings:
    """Every ring under one host dir, each rank's rings through one window of `rows` latest records (`labels`: also
    what each rank ran before its window, window.labels_before)."""
    out = HostRings()
    views: dict[Path, AnyView] = {}
    whole = bool(extra) or labels  # ops asked for by seq, or every op's label: the whole ring
    try:
        by_rank: dict[Any, list[Path]] = {}
        for ring, got in zip(rings, _open_all(rings, rows, whole)):
            if isinstance(got, Exception):
                out.skipped.append(Skipped(str(ring), None, str(got)))
                continue
            views[ring] = got
            out.windowed += isinstance(views[ring], RingWindow)
            rank = identity_of(views[ring].contents).get("rank")
            by_rank.setdefault(rank if rank is not None else ("pid", ring), []).append(ring)
        tables: dict[Path, ReadResult] = {}

        def one(part: list[Path]) -> tuple[dict[Path, ReadResult], HostRings]:
            mine = HostRings()
            try:
                return _read_rank([views[r] for r in part], part, host, rows, extra, mine, labels), mine
            finally:
                for r in part:  # done with it: let its mapping go before the next rank's
                    views[r].close()

        parts = list(by_rank.values())
        workers = min(THREADS, len(parts))
        if workers > 1:  # ranks side by side: numpy and the page cache copies run outside the GIL
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(workers) as pool:
                done = list(pool.map(one, parts))
        else:
            done = [one(p) for p in parts]
        for got, mine in done:
            tables.update(got)
            for chan, (lo, hi) in mine.dropped.items():
                old = out.dropped.get(chan)
                out.dropped[chan] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            out.records += mine.records
            out.kept += mine.kept
            out.prefixes.update(mine.prefixes)
        out.results = [tables[r] for r in rings if r in tables]
    finally:
        for v in views.values():
            v.close()
    return out


def _open_all(rings: list[Path], rows: int, whole: bool) -> list[AnyView | Exception]:
    """Every ring opened (its header, meta region and, through its index, its window read): side by side, as a
    cold read of rings nobody has in memory waits on the disk a few times a ring."""
    def one(ring: Path) -> AnyView | Exception:
        try:
            return _open(ring, rows, whole)
        except (RingError, OSError) as e:
            return e

    if len(rings) < 2:
        return [one(r) for r in rings]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(IO_THREADS, len(rings))) as pool:
        return list(pool.map(one, rings))


def _open(ring: Path, rows: int, whole: bool) -> AnyView:
    """The ring's window through its tail index where it has one that vouches for it, else the whole ring."""
    if not whole:
        got = open_window(str(ring), rows)
        if got is not None:
            return got
    return RingView(str(ring))


def _read_rank(views: list[AnyView], paths: list[Path], host: str, rows: int,
               extra: frozenset[tuple[str, int]], out: HostRings, labels: bool = False) -> dict[Path, ReadResult]:
    rec, t_all = _records(views, labels)
    total = rec.n
    keep = select(rec, rows, extra) if total > rows else None
    if keep is not None and labels:
        out.prefixes.update(labels_before(rec, keep.keep))
    if keep is not None:
        if any(v.partial for v in views):  # older records not read at all: any lower seq of a channel may be there
            for chan, (lo, _hi) in channel_ranges(rec).items():
                _, b = keep.dropped.get(chan, (lo, lo - 1))
                keep.dropped[chan] = (UNREAD_LOW, max(b, lo - 1))
        for chan, (lo, hi) in keep.dropped.items():
            old = out.dropped.get(chan)
            out.dropped[chan] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    got: dict[Path, ReadResult] = {}
    start = 0
    for view, path, t in zip(views, paths, t_all):
        n = len(view)
        positions = None if keep is None else np.flatnonzero(keep.keep[start:start + n])
        start += n
        rc = view.contents
        cols = ({name: view.field(name) for name in SLOT_FIELDS} if positions is None
                else view.fields(SLOT_FIELDS, positions))
        same = view.unchanged(positions)  # seqlock: a slot rewritten while read is dropped
        if not same.all():
            cols = {name: values[same] for name, values in cols.items()}
        rc.dropped_slots = int(same.size - np.count_nonzero(same))
        if view.duplicates:  # a damaged ring: ties ordered by the other fields, as read_ring does
            rc.cols = cols
            arr = rc.slots
            arr.sort(order="commit")
            cols = {name: np.ascontiguousarray(arr[name]) for name in SLOT_FIELDS}
        rc.cols = cols
        if n:
            rc.lost_ops = view.lost
            rc.oldest_t_ns = view.oldest_t_ns if view.partial else int(t.min())
        out.records += view.total
        out.kept += len(cols["commit"])
        got[path] = ring_result(str(path), rc, host)
    return got


# 8-byte words of a slot (ringformat.SLOT) the window reads: 1 t_ns, 2 tid|kind|category|flags, 3 name|group,
# 5 shape|error, 6 peer|graph_id, 7 seq, 10 span_id
_WORDS = (1, 2, 3, 5, 6, 7, 10, 4)   # and 4 callsite|dtype, read only to tell what a rank ran
_LOW32 = np.uint64(0xFFFFFFFF)


def _records(views: list[AnyView], labels: bool = False) -> tuple[Records, list[np.ndarray]]:
    """The window's columns from each ring's slots, read as whole words in one pass (string ids mapped to one group
    list for the rank; a group's backend from its group record). `labels`: names and call sites too."""
    parts: list[dict[str, np.ndarray]] = []
    groups: dict[str, int] = {}
    strings_of_rank: dict[str, int] = {}
    t_all = []
    for proc, view in enumerate(views):
        rc = view.contents
        n = len(view)
        w = view.words(_WORDS if labels else _WORDS[:-1])
        t = w[:, 0].view(np.int64)
        t = np.ascontiguousarray(t)
        t_all.append(t)
        max_id = max(rc.strings) if rc.strings else 0
        strings = [rc.strings.get(i, "?") for i in range(max_id + 1)]
        records = {m["name"]: m for m in rc.meta if m.get("type") == "group" and m.get("name") is not None}
        gid = np.minimum((w[:, 2] >> np.uint64(32)).astype(np.int64), max_id)
        gcode = np.array([groups.setdefault(x, len(groups)) for x in strings], dtype=np.int64)
        gcode[0] = -1  # id 0: no group (null)
        backend = [(records.get(x) or {}).get("backend") if i else None for i, x in enumerate(strings)]
        kcf = w[:, 1] >> np.uint64(32)
        kind = (kcf & np.uint64(0xFF)).astype(np.int8)
        kind[(kind < 0) | (kind >= _N_KINDS)] = -1
        category = ((kcf >> np.uint64(8)) & np.uint64(0xFF)).astype(np.int8)
        category[(category < 0) | (category > 1)] = -1
        p2p = bool((category == 1).any())
        seq = w[:, 5].view(np.int64)
        if p2p:
            name = np.minimum((w[:, 2] & _LOW32).astype(np.int64), max_id)
            peer = (w[:, 4] & _LOW32).astype(np.uint32).view(np.int32).astype(np.int64)
            is_send = np.array([x in SENDS for x in strings], dtype=bool)[name]
            name_valid = name != 0
            peer = np.where(peer == rf.NONE_I32, -1, peer)
        else:  # only p2p records read these
            is_send = name_valid = np.zeros(n, dtype=bool)
            peer = np.full(n, -1, dtype=np.int64)
        keep = (kind == rf.KINDS.index("mark")) | ((w[:, 3] >> np.uint64(32)) != 0)  # marks, errors
        present: np.ndarray | list[int] = np.flatnonzero(np.bincount(gid, minlength=max_id + 1)) if n else []
        for g in present:  # each group's last record carries its members
            keep[n - 1 - int(np.argmax(gid[::-1] == g))] = True
        rank = identity_of(rc).get("rank")
        ones = np.ones(n, dtype=bool)
        if labels:
            code = np.array([strings_of_rank.setdefault(x, len(strings_of_rank)) for x in strings], dtype=np.int64)
            code[0] = -1  # id 0: none
            name_id = np.minimum((w[:, 2] & _LOW32).astype(np.int64), max_id)
            site_id = np.minimum((w[:, 7] & _LOW32).astype(np.int64), max_id)
            named = {"name": code[name_id], "callsite": code[site_id]}
        else:
            named = {}
        parts.append({
            **named,
            "rank": np.full(n, -1 if rank is None else int(rank), dtype=np.int64),
            "kind": kind, "category": category, "seq": np.ascontiguousarray(seq), "seq_valid": seq != rf.NONE_I64,
            "group": gcode[gid], "is_send": is_send, "name_valid": name_valid, "peer": peer,
            "gloo": np.array([b == "gloo" for b in backend], dtype=bool)[gid],
            "backend_valid": np.array([b is not None for b in backend], dtype=bool)[gid],
            "no_completion": ones, "source_valid": ones,
            "async_op": ((kcf >> np.uint64(16)) & np.uint64(rf.FLAG_ASYNC)) != 0, "t": t, "t_valid": ones,
            "span": np.ascontiguousarray(w[:, 6].view(np.int64)), "proc": np.full(n, proc, dtype=np.int64),
            "keep": keep,
        })
    cat = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
    names = [""] * len(groups)
    for x, i in groups.items():
        names[i] = x
    return Records(groups=names, strings=list(strings_of_rank) if labels else None, **cat), t_all
