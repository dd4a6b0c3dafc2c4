"""A ranktrace host directory's own records — events.arrow, or the rings of a live or unfinalized job — read in
bounded memory (issue #19): rank by rank, through the window of readers/ranktrace_ring/window.py, so a run of a
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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.ranktrace_ring.rank_rings import read_host_rings
from ranktrace.analyzers.readers.ranktrace_ring.window import (CATEGORY_CODES, KIND_CODES, NO_COMPLETION_SOURCES,
                                                               SENDS, Records, channel_ranges, labels_before, select)

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
            procs += rings or len(json.loads((hd / "meta.json").read_text()).get("pids") or {})
        except (OSError, ValueError, AttributeError):
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
        rank = _ints(table["rank"], -1)
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
            rec = _records(part, window.labels)
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


INDEX_NAME = "events.index.arrow"
INDEX_SCHEMA = "ranktrace.events-index/1"
MARGIN = 256   # rows read before a rank's window: the enters of ops its window starts in the middle of


@dataclass
class EventsIndex:
    """What finalize knows of events.arrow that the window needs (INDEX_NAME beside it): per rank of one process its
    rows [first, end) (time order, rows without a time last: `untimed` of them), the rows of every op and record
    select keeps whatever its age (`needed`), and each channel's seq range. With it an analysis reads a rank's
    latest rows and the listed ones, not the million before them."""

    ranges: dict[int, tuple[int, int, int]] = field(default_factory=dict)   # rank -> (first, end, untimed)
    needed: dict[int, np.ndarray] = field(default_factory=dict)
    chans: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)

    def covers(self, rank: int, span: tuple[int, int]) -> bool:
        got = self.ranges.get(rank)
        return got is not None and (got[0], got[1]) == span

    def rows_to_read(self, rank: int, rows: int) -> np.ndarray:
        first, end, untimed = self.ranges[rank]
        start = max(first, end - untimed - rows - MARGIN)
        return np.union1d(np.arange(start, end), self.needed.get(rank, np.zeros(0, dtype=np.int64)))

    @staticmethod
    def of_ring(table: pa.Table, start: int) -> "tuple[int, tuple[int, int, int], np.ndarray, dict] | None":
        """One ring's part (its table as written, starting at row `start` of the file): None when it cannot be
        indexed (no rank; rows not in time order)."""
        rank = _ints(table["rank"], -1)
        if table.num_rows == 0 or rank[0] < 0 or not bool(np.all(rank == rank[0])):
            return None
        t = table["t_ns"]
        untimed = int(t.null_count)
        tv = _ints(t, 0)
        timed = tv[:table.num_rows - untimed]
        if untimed and bool(_valid(t)[table.num_rows - untimed:].any()) or bool(np.any(timed[1:] < timed[:-1])):
            return None
        rec = _records(table)
        needed = np.flatnonzero(select(rec, 0).keep) + start
        return int(rank[0]), (start, start + table.num_rows, untimed), needed, channel_ranges(rec)

    @staticmethod
    def write(path: Path, parts: list[tuple[int, tuple[int, int, int], np.ndarray, dict]], n_rows: int) -> None:
        """The index of an events.arrow of `n_rows` rows; a rank of several processes is left out (read whole)."""
        seen: dict[int, int] = {}
        for rank, *_ in parts:
            seen[rank] = seen.get(rank, 0) + 1
        cols: dict[str, list] = {"rank": [], "kind": [], "a": [], "b": [], "c": [], "chan": []}

        def add(rank: int, kind: str, a: int, b: int = 0, c: int = 0, chan: str | None = None) -> None:
            for k, v in zip(cols, (rank, kind, a, b, c, chan)):
                cols[k].append(v)

        for rank, (first, end, untimed), needed, chans in parts:
            if seen[rank] > 1:
                continue
            add(rank, "range", first, end, untimed)
            for r in needed.tolist():
                add(rank, "row", r)
            for chan, (lo, hi) in chans.items():
                add(rank, "chan", lo, hi, 0, chan)
        table = pa.table({"rank": pa.array(cols["rank"], pa.int32()), "kind": pa.array(cols["kind"]),
                          "a": pa.array(cols["a"], pa.int64()), "b": pa.array(cols["b"], pa.int64()),
                          "c": pa.array(cols["c"], pa.int64()), "chan": pa.array(cols["chan"], pa.string())})
        table = table.replace_schema_metadata({"schema": INDEX_SCHEMA, "rows": str(n_rows)})
        tmp = path.with_name(path.name + ".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path, n_rows: int) -> "EventsIndex | None":
        """The index, if there is one for an events.arrow of `n_rows` rows (any doubt: None, the file is read)."""
        try:
            with pa.OSFile(str(path), "rb") as src:
                table = ipc.open_file(src).read_all()
        except (OSError, pa.ArrowInvalid):
            return None
        meta = table.schema.metadata or {}
        if meta.get(b"schema") != INDEX_SCHEMA.encode() or meta.get(b"rows") != str(n_rows).encode():
            return None
        out = cls()
        needed: dict[int, list[int]] = {}
        for r, k, a, b, c, chan in zip(*(table[x].to_pylist() for x in ("rank", "kind", "a", "b", "c", "chan"))):
            if k == "range":
                out.ranges[r] = (a, b, c)
            elif k == "row":
                needed.setdefault(r, []).append(a)
            elif k == "chan":
                out.chans.setdefault(r, {})[chan] = (a, b)
        out.needed = {r: np.asarray(v, dtype=np.int64) for r, v in needed.items()}
        return out


def _ints(col: Any, null: int) -> np.ndarray:
    return np.asarray(pc.fill_null(col, null).to_numpy(), dtype=np.int64) if col.null_count else np.asarray(
        col.to_numpy(), dtype=np.int64)


def _bools(col: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False), dtype=bool)


def _valid(col: Any) -> np.ndarray:
    return np.ones(len(col), dtype=bool) if col.null_count == 0 else _bools(pc.is_valid(col))


def _codes(col: pa.ChunkedArray, table: dict[str, int] | None = None) -> tuple[np.ndarray, list[str]]:
    """Per row: `table`'s code of the value (-1 for null or any other value); without `table`, a dense code per
    distinct value (-1 for null) and the values, in order of their codes."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    found: dict[str, int] = {}
    out = []
    prev: tuple[pa.Array, np.ndarray] | None = None
    for chunk in col.chunks:
        if prev is not None and chunk.dictionary.equals(prev[0]):  # events.arrow's batches share one dictionary
            look = prev[1]
        else:
            codes = []
            for v in chunk.dictionary.to_pylist():
                if v is None:
                    codes.append(-1)
                elif table is not None:
                    codes.append(table.get(v, -1))
                else:
                    codes.append(found.setdefault(v, len(found)))
            look = np.asarray(codes + [-1], dtype=np.int64)  # the last: null indices
            prev = (chunk.dictionary, look)
        idx = chunk.indices
        idx = pc.fill_null(idx, len(look) - 1) if idx.null_count else idx
        out.append(look[np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)])
    return (np.concatenate(out) if out else np.zeros(0, dtype=np.int64)), list(found)


def _records(t: pa.Table, labels: bool = False) -> Records:
    """The window's columns from EVENTS rows (dictionary-encoded, as events.arrow holds them, or plain); `labels`:
    names and call sites too."""
    n = t.num_rows
    named: dict[str, object] = {}
    if labels:
        name, names = _codes(t["name"])
        site, sites = _codes(t["callsite"])
        strings = names + sites
        named = {"name": name, "callsite": np.where(site >= 0, site + len(names), -1), "strings": strings}
    kind, _ = _codes(t["kind"], KIND_CODES)
    category, _ = _codes(t["category"], CATEGORY_CODES)
    group, groups = _codes(t["group"])
    name_valid = _valid(t["name"])
    is_send = _codes(t["name"], {s: 0 for s in SENDS})[0] == 0
    backend_valid = _valid(t["backend"])
    gloo = _codes(t["backend"], {"gloo": 0})[0] == 0
    source_valid = _valid(t["source"])
    no_completion = _codes(t["source"], {s: 0 for s in NO_COMPLETION_SOURCES})[0] == 0
    pid = _ints(t["pid"], -1)
    file, _ = _codes(t["file"])
    proc = pid * (int(file.max()) + 2 if n else 1) + file + 1
    line = _ints(t["line"], 0)
    carriers = np.zeros(n, dtype=bool)
    has_members = _valid(t["group_ranks"])
    if has_members.any():  # the last row of each (process, group) with members: what analyses read them from
        rows = np.flatnonzero(has_members)
        key = proc[rows] * (len(groups) + 2) + group[rows] + 1
        last = np.unique(key[::-1], return_index=True)[1]
        carriers[rows[::-1][last]] = True
    return Records(
        rank=_ints(t["rank"], -1), kind=kind.astype(np.int8), category=category.astype(np.int8),
        seq=_ints(t["seq"], 0), seq_valid=_valid(t["seq"]), group=group, groups=groups, is_send=is_send,
        name_valid=name_valid, peer=_ints(t["peer"], -1), gloo=gloo, backend_valid=backend_valid,
        no_completion=no_completion, source_valid=source_valid, async_op=_bools(t["async_op"]),
        t=_ints(t["t_ns"], 0), t_valid=_valid(t["t_ns"]), span=_ints(t["span_id"], 0), proc=proc,
        keep=(line < 0) | (kind == KIND_CODES["error"]) | (kind == KIND_CODES["mark"]) | _valid(t["error"]) | carriers,
        **named,  # type: ignore[arg-type]
    )


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
