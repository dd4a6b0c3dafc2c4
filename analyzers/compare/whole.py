"""The tables trace compare's sequences and timings are computed from: every op of a run, not the window of each
rank's latest records a verdict reads (analyzers/inputs/own_records.py).

A finalized run (every host dir has its events.arrow) is read here straight from the memory-mapped files: only the
columns compare needs, strings left dictionary-encoded (a dictionary's indices are compared, filtered and taken; the
strings themselves are decoded for the few rows a person reads). Casting 8 ranks x 1M records to plain strings, and
building the full ops table from them, is what made a whole analysis cost seconds per run (issue #17). Anything
else (a live run's rings, logs, dumps, archives) comes from one analysis with ``whole=True``, as before."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.analyzers import api
from ranktrace.analyzers.model.values import Analysis, Liveness
from ranktrace.analyzers.inputs.collect import readable_host_dirs

__all__ = ["RunTables", "run_tables", "decoded", "codes", "is_in"]

#: the event columns sequences and timings read
EVENT_COLUMNS = ("rank", "pid", "span_id", "kind", "name", "detail", "category", "source", "t_ns", "wall_ns",
                 "nbytes", "line", "group", "group_desc", "seq", "dtype", "shape", "callsite", "capturing")
_OPS_CATEGORIES = ("collective", "p2p")


@dataclass(frozen=True)
class RunTables:
    """Every record (``events``: at least EVENT_COLUMNS) and every issued op (``ops``: the timeline.OPS columns
    sequences and timings read, in (rank, time of issue) order) of one run. String columns may be
    dictionary-encoded."""

    events: pa.Table
    ops: pa.Table
    how: str   # "events.arrow" (read here) or "analysis"


def run_tables(an: Analysis, path: Path, *, liveness: Liveness | None) -> RunTables:
    """The whole-run tables for `path`, whose verdict analysis is `an`: `an`'s own tables when they are already
    whole (no record of ours left out), the finalized files when there are some, else a second analysis that
    keeps every record."""
    if not an.windowed:
        return RunTables(an.events, an.ops, "analysis")
    own = _own_tables(path)
    if own is not None and _same_ranks(own.ops, an.ops):
        return _with_foreign(own, an)
    whole = api.analyze([path], liveness=liveness, whole=True)
    return RunTables(whole.events, whole.ops, "analysis")


def _own_tables(path: Path) -> RunTables | None:
    """Every record of a finalized run from its events.arrow files (None when a host dir has none, or it is not
    ours: the caller then analyses the run whole)."""
    hds = readable_host_dirs(path)
    if not hds:
        return None
    parts = []
    for hd in hds:
        ev = hd / "events.arrow"
        try:
            reader = ipc.open_file(pa.memory_map(str(ev)))   # zero-copy: pages are read as columns are touched
            meta = reader.schema.metadata or {}
            if not meta.get(b"schema", b"").startswith(b"ranktrace.events/"):
                return None
            table = reader.read_all()
        except (OSError, pa.ArrowInvalid):
            return None
        if any(c not in table.column_names for c in EVENT_COLUMNS):
            return None
        parts.append(table.select(list(EVENT_COLUMNS)))
    try:
        events = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    except pa.ArrowInvalid:   # files of different schema versions
        return None
    ops = _issued_ops(events)
    if ops is None:
        return None
    return RunTables(events, ops, "events.arrow")


def _issued_ops(events: pa.Table) -> pa.Table | None:
    """One row per op our rings saw issued: its enter record (a collective or p2p call with a rank and a seq), in
    (rank, time of issue) order; None when an op record has no rank (the analysis fills those in: use it)."""
    enter = (is_in(events["category"], _OPS_CATEGORIES) & is_in(events["kind"], ("enter",))
             & _valid(events["seq"]))
    if not _valid(events["rank"])[enter].all():
        return None
    cols = ["rank", "t_ns", "wall_ns", "source", "group", "group_desc", "name", "seq", "dtype", "shape", "callsite",
            "capturing", "category"]
    mask = pa.array(enter)
    ops = pa.table({c: events[c].filter(mask) for c in cols})
    ops = ops.rename_columns([{"t_ns": "t_enter", "wall_ns": "wall_enter"}.get(c, c) for c in cols])
    rank = np.asarray(pc.fill_null(ops["rank"], -1).to_numpy(), dtype=np.int64)
    t = np.asarray(pc.fill_null(ops["t_enter"], np.iinfo(np.int64).max).to_numpy(), dtype=np.int64)
    ordered = rank.size < 2 or bool(np.all((rank[1:] > rank[:-1]) | ((rank[1:] == rank[:-1]) & (t[1:] >= t[:-1]))))
    if not ordered:   # several rings per rank (threads, restarts): one stable sort puts them in issue order
        order = np.lexsort((t, rank))
        ops = pa.table({c: ops[c].take(pa.array(order)) for c in ops.column_names})
    return ops.append_column("issued", pa.array(np.ones(ops.num_rows, dtype=bool)))


def _valid(col: pa.ChunkedArray) -> np.ndarray:
    if not col.null_count:
        return np.ones(len(col), dtype=bool)
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)


def _same_ranks(own_ops: pa.Table, ops: pa.Table) -> bool:
    """The files' ranks are the analysis' ranks (not so when DP replicas that reuse ranks were moved apart)."""
    mine = ops.filter(pc.equal(ops["source"], "events")) if ops.num_rows else ops
    a = set(pc.unique(own_ops["rank"]).to_pylist()) if own_ops.num_rows else set()
    b = set(pc.unique(mine["rank"]).to_pylist()) if mine.num_rows else set()
    return a == b


def _with_foreign(own: RunTables, an: Analysis) -> RunTables:
    """Our whole records plus what the analysis read from other inputs in the run (an NCCL log in output.log, an
    nsys export): those are never windowed."""
    ev = an.events.filter(pc.not_equal(an.events["source"], "events")) if an.events.num_rows else an.events
    ops = an.ops.filter(pc.not_equal(an.ops["source"], "events")) if an.ops.num_rows else an.ops
    if not ev.num_rows and not ops.num_rows:
        return own
    events = pa.concat_tables([_like(own.events, ev), own.events]) if ev.num_rows else own.events
    all_ops = pa.concat_tables([own.ops, _like(own.ops, ops)]) if ops.num_rows else own.ops
    return RunTables(events, all_ops, own.how)


def _like(target: pa.Table, table: pa.Table) -> pa.Table:
    """`table`'s columns of `target`, each in `target`'s type (plain strings dictionary-encoded)."""
    cols = {}
    for field in target.schema:
        col = table[field.name] if field.name in table.column_names else pa.nulls(table.num_rows, field.type)
        if pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col.cast(field.type.value_type))
        if col.type != field.type:
            col = col.cast(field.type)
        cols[field.name] = col
    return pa.table(cols, schema=target.schema)


def decoded(table: pa.Table) -> pa.Table:
    """`table` with its dictionary-encoded columns as plain values (for the few rows a person reads)."""
    if not any(pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    return pa.table({f.name: table[f.name].cast(f.type.value_type) if pa.types.is_dictionary(f.type)
                     else table[f.name] for f in table.schema})


def codes(col: pa.ChunkedArray | pa.Array, values: dict[Any, int]) -> np.ndarray:
    """Per element an int code for its value, from (and adding to) `values` (value -> code); nulls read as "".
    Dictionary-encoded chunks cost one lookup per distinct value and one gather; plain ones are encoded first."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        remap = np.array([values.setdefault("" if v is None else v, len(values))
                          for v in chunk.dictionary.to_pylist()] + [values.setdefault("", len(values))],
                         dtype=np.int32)
        idx = chunk.indices
        if idx.null_count:
            idx = pc.fill_null(idx, len(remap) - 1)
        out.append(remap.take(idx.to_numpy(zero_copy_only=False)))
    return np.concatenate(out) if len(out) != 1 else out[0]


def is_in(col: pa.ChunkedArray | pa.Array, wanted: tuple[str, ...]) -> np.ndarray:
    """Per element: is its value one of `wanted` (null: no)? For a dictionary-encoded column, the few dictionary
    values are tested and the answer gathered by index."""
    values: dict[object, int] = {}
    c = codes(col, values)
    hit = np.zeros(len(values), dtype=bool)
    for w in wanted:
        if w in values:
            hit[values[w]] = True
    return hit[c] if c.size else np.zeros(0, dtype=bool)
