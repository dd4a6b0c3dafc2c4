"""events.arrow's index (finalize writes it beside events.arrow, the analysis reads it: INDEX_NAME): per rank its
rows, the rows the record window (recordwindow.py) keeps whatever their age, each channel's seq range — so an
analysis reads a rank's latest rows and those, not the million before them. Also how EVENTS rows become the
window's columns (:func:`records_of`). Here, numpy and pyarrow only, for both wings (issue #28)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.tracer.formats.recordwindow import (CATEGORY_CODES, KIND_CODES, NO_COMPLETION_SOURCES, SENDS, Records,
                                                   channel_ranges, select)

__all__ = ["INDEX_NAME", "INDEX_SCHEMA", "MARGIN", "EventsIndex", "records_of", "ints_of"]


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
        rank = ints_of(table["rank"], -1)
        if table.num_rows == 0 or rank[0] < 0 or not bool(np.all(rank == rank[0])):
            return None
        t = table["t_ns"]
        untimed = int(t.null_count)
        tv = ints_of(t, 0)
        timed = tv[:table.num_rows - untimed]
        if untimed and bool(_valid(t)[table.num_rows - untimed:].any()) or bool(np.any(timed[1:] < timed[:-1])):
            return None
        rec = records_of(table)
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


def ints_of(col: Any, null: int) -> np.ndarray:
    """An integer column as int64 numpy, nulls as `null`."""
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


def records_of(t: pa.Table, labels: bool = False) -> Records:
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
    pid = ints_of(t["pid"], -1)
    file, _ = _codes(t["file"])
    proc = pid * (int(file.max()) + 2 if n else 1) + file + 1
    line = ints_of(t["line"], 0)
    carriers = np.zeros(n, dtype=bool)
    has_members = _valid(t["group_ranks"])
    if has_members.any():  # the last row of each (process, group) with members: what analyses read them from
        rows = np.flatnonzero(has_members)
        key = proc[rows] * (len(groups) + 2) + group[rows] + 1
        last = np.unique(key[::-1], return_index=True)[1]
        carriers[rows[::-1][last]] = True
    return Records(
        rank=ints_of(t["rank"], -1), kind=kind.astype(np.int8), category=category.astype(np.int8),
        seq=ints_of(t["seq"], 0), seq_valid=_valid(t["seq"]), group=group, groups=groups, is_send=is_send,
        name_valid=name_valid, peer=ints_of(t["peer"], -1), gloo=gloo, backend_valid=backend_valid,
        no_completion=no_completion, source_valid=source_valid, async_op=_bools(t["async_op"]),
        t=ints_of(t["t_ns"], 0), t_valid=_valid(t["t_ns"]), span=ints_of(t["span_id"], 0), proc=proc,
        keep=(line < 0) | (kind == KIND_CODES["error"]) | (kind == KIND_CODES["mark"]) | _valid(t["error"]) | carriers,
        **named,  # type: ignore[arg-type]
    )
