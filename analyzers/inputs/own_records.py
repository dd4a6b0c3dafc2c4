"""A ranktrace host directory's own records — events.arrow, or the rings of a live or unfinalized job — read in
bounded memory (issue #19): rank by rank, through the record window (tracer/formats/recordwindow.py), so a run of a
thousand ranks with a million records each is never decoded whole.

The window keeps each rank's latest records (``Window.rows``: a budget of decoded records for the whole run, shared
out over its processes) and every op that an analysis reads whatever its age (pending, failed, open, each channel's
last). What was dropped is summarised per channel, so the wait-for graph can ask for an op it needs (an old head of
another rank: ``needed_keys``) and the inputs are read again with it (``extra``). Runs smaller than the window are
read whole, exactly as before.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.ranktrace_ring.rank_rings import read_host_rings
from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.eventsindex import INDEX_NAME, EventsIndex, ints_of, records_of
from ranktrace.tracer.formats.recordwindow import channel_ranges, labels_before, select

__all__ = ["Window", "read_own", "rows_per_rank", "needed_keys", "ROWS_ENV", "EventsIndex", "INDEX_NAME"]

ROWS_ENV = "RANKTRACE_WINDOW_ROWS"   # records kept per rank (tests set it small to check the window changes nothing)
ROW_BUDGET = 600_000                 # decoded records kept for a whole run, shared out over its processes
MIN_ROWS, MAX_ROWS = 512, 8192   # 8192: about the 4,000 calls report.html draws one by one a lane


@dataclass
class Window:
    """One analysis's window: records kept per rank, ops asked for by (channel, seq), and what was dropped."""

    rows: int
    extra: frozenset[tuple[str, int]] = frozenset()
    labels: bool = False  # also what each rank ran before its window (for departures from the majority)
    dropped: dict[str, tuple[int, int]] = field(default_factory=dict)   # channel -> lowest, highest seq dropped
    records: int = 0      # op-slot records read
    kept: int = 0         # of them kept
    prefixes: dict[int, tuple[np.ndarray, list[str | None], int]] = field(default_factory=dict)  # window.labels_before

    @property
    def cut(self) -> bool:
        """Whether any record was left out."""
        return self.kept < self.records

    def note(self, dropped: dict[str, tuple[int, int]], records: int, kept: int) -> None:
        for chan, (lo, hi) in dropped.items():
            old = self.dropped.get(chan)
            self.dropped[chan] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        self.records += records
        self.kept += kept


def rows_per_rank(host_dirs: list[Path]) -> int:
    """Records kept per rank: ROWS_ENV if set, else the run's budget over its processes (rings, or meta.json's pids
    of a finalized run), within MIN_ROWS..MAX_ROWS."""
    env = os.environ.get(ROWS_ENV)
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    procs = 0
    for hd in host_dirs:
        try:
            rings = sum(1 for _ in (hd / "rings").glob("*.ring")) if (hd / "rings").is_dir() else 0
            pids = None if rings else json.loads((hd / "meta.json").read_text()).get("pids")
            procs += rings or (len(pids) if isinstance(pids, dict) else 0)   # (a damaged meta.json: none)
        except (OSError, ValueError, AttributeError, RecursionError):  # a meta.json nested past reason: none
            pass
    return max(MIN_ROWS, min(MAX_ROWS, ROW_BUDGET // max(1, procs)))


def read_own(hd: Path, host: str, window: Window, skipped: list[Skipped]) -> list[ReadResult]:
    """events.arrow if it is ours and readable, else the rings; notes go to `skipped` as before issue #19."""
    ev = hd / "events.arrow"
    if ev.exists():
        try:
            got = _read_events_arrow(ev, window)
            if got is not None:
                return [got]
            skipped.append(Skipped(str(ev), None, "events.arrow without a ranktrace schema; using rings"))
        except (OSError, pa.ArrowInvalid) as e:
            skipped.append(Skipped(str(ev), None, f"unreadable events.arrow ({e}); using the rings instead"))
    rings = sorted((hd / "rings").glob("*.ring"))
    got_rings = read_host_rings(rings, host, window.rows, window.extra, window.labels)
    window.note(got_rings.dropped, got_rings.records, got_rings.kept)
    window.prefixes.update(got_rings.prefixes)
    skipped.extend(got_rings.skipped)
    return got_rings.results


def _read_events_arrow(ev: Path, window: Window) -> ReadResult | None:
    """events.arrow, memory-mapped: rank by rank through the window when it is larger than one, each rank's rows
    mapped only while they are read (a file of a thousand ranks never counts whole in this process's memory). With
    its index (written by finalize: INDEX_NAME) a rank's rows are its latest ones and those the index lists, never
    all of them."""
    with pa.memory_map(str(ev)) as src:
        reader = ipc.open_file(src)
        meta = reader.schema.metadata
        if not (meta and meta.get(b"schema", b"").startswith(b"ranktrace.events/")):
            return None
        table = reader.read_all()  # zero-copy: only what is read below is touched
        n_rows = table.num_rows
        if n_rows <= window.rows:
            return ReadResult(file=str(ev), format="ranktrace_events", events=table.cast(schema.EVENTS))
        index = EventsIndex.read(ev.with_name(INDEX_NAME), n_rows) if not (window.extra or window.labels) else None
        rank = ints_of(table["rank"], -1)
    del table
    keep, dropped = _select_file(ev, rank, window, index)
    window.note(dropped, int(rank.size), int(keep.size))
    with pa.memory_map(str(ev)) as src:
        reader = ipc.open_file(src)
        pieces, start = [], 0
        for i in range(reader.num_record_batches):  # batch by batch: a take of the whole table would join them all
            batch = reader.get_batch(i)
            lo, hi = np.searchsorted(keep, [start, start + batch.num_rows])
            if hi > lo:
                pieces.append(batch.take(pa.array(keep[lo:hi] - start)))
            start += batch.num_rows
        events = pa.Table.from_batches(pieces, reader.schema).cast(schema.EVENTS)
        del pieces, reader
    return ReadResult(file=str(ev), format="ranktrace_events", events=events)


def _select_file(ev: Path, rank: np.ndarray, window: Window,
                 index: "EventsIndex | None" = None) -> tuple[np.ndarray, dict[str, tuple[int, int]]]:
    """Rows of events.arrow to keep (ascending), rank by rank (a rank's rows are the runs of its rings)."""
    cuts = np.flatnonzero(rank[1:] != rank[:-1]) + 1
    starts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [rank.size]))
    runs: dict[int, list[tuple[int, int]]] = {}
    for a, b in zip(starts.tolist(), ends.tolist()):
        runs.setdefault(int(rank[a]), []).append((a, b))
    kept: list[np.ndarray] = []
    dropped: dict[str, tuple[int, int]] = {}
    for r, spans in runs.items():
        rows = np.concatenate([np.arange(a, b) for a, b in spans])
        if r < 0 or rows.size <= window.rows:
            kept.append(rows)
            continue
        unread: dict[str, tuple[int, int]] = {}
        if index is not None and len(spans) == 1 and index.covers(r, spans[0]):
            rows = index.rows_to_read(r, window.rows)  # its latest rows and the ones the index lists
            unread = index.chans.get(r, {})
        with pa.memory_map(str(ev)) as src:  # mapped for this rank only
            table = ipc.open_file(src).read_all()
            if rows.size == sum(b - a for a, b in spans):
                part = pa.concat_tables([table.slice(a, b - a) for a, b in spans])
            else:
                part = _take(table, rows)
            rec = records_of(part, window.labels)
            del table, part
        sel = select(rec, window.rows, window.extra)
        kept.append(rows[sel.keep])
        if window.labels:
            window.prefixes.update(labels_before(rec, sel.keep))
        gone = dict(sel.dropped)
        if unread:  # through the index: the ops before the rows read were dropped too
            read = channel_ranges(rec)
            for chan, (lo, hi) in unread.items():
                first = read.get(chan, (hi + 1, hi))[0]
                if first > lo:
                    a, b = gone.get(chan, (lo, first - 1))
                    gone[chan] = (min(a, lo), max(b, first - 1))
        for chan, (lo, hi) in gone.items():
            old = dropped.get(chan)
            dropped[chan] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return np.sort(np.concatenate(kept)), dropped


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """`rows` (ascending) of a many-batch table, batch by batch (a take of the whole would join its batches)."""
    pieces, start = [], 0
    for batch in table.to_batches():
        lo, hi = np.searchsorted(rows, [start, start + batch.num_rows])
        if hi > lo:
            pieces.append(batch.take(pa.array(rows[lo:hi] - start)))
        start += batch.num_rows
    return pa.Table.from_batches(pieces, table.schema)


def needed_keys(ops: pa.Table, window: Window | None) -> frozenset[tuple[str, int]]:
    """(channel, seq) of ops the window may have cut short, to be read again with them kept: the ops at every rank's
    pending head (the wait-for graph compares what each rank issued there) and the ops other sources hold (a Flight
    Recorder entry of an op is one op with its ring records: without them it would read as an op with no enter
    time), where the seq lies in a range the window dropped on that channel."""
    if window is None or not window.dropped or ops.num_rows == 0:
        return frozenset()
    keys = ops.select(["rank", "chan", "seq"])
    pending = keys.filter(pc.and_(ops["issued"], pc.invert(ops["completed"])))
    heads = pending.group_by(["rank", "chan"], use_threads=False).aggregate([("seq", "min")])
    foreign = keys.filter(pc.invert(pc.fill_null(pc.equal(ops["source"], "events"), False)))
    out = set()
    for chans, seqs in ((heads["chan"], heads["seq_min"]), (foreign["chan"], foreign["seq"])):
        for chan, seq in zip(chans.to_pylist(), seqs.to_pylist()):
            lo_hi = window.dropped.get(chan)
            if lo_hi is not None and seq is not None and lo_hi[0] <= seq <= lo_hi[1]:
                out.add((chan, int(seq)))
    return frozenset(out - window.extra)
