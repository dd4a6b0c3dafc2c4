"""The common Arrow tables every reader produces and every analyzer consumes.

Why one module: readers (our rings, NCCL logs, Flight Recorder, py-spy, nsys, ...) must feed the *same*
wait-for engine (DESIGN §6), so they agree here on column names and types, not with each other.

Three tables:

* ``EVENTS`` — one row per op / phase event (DESIGN §3 columns plus provenance). ``kind`` is one of
  ``enter | exit | error | complete | mark | identity | group``. ``complete`` means the *backend* reported the op
  finished (Flight Recorder ``state == completed``, a CUDA event, an NCCL kernel end) — distinct from ``exit``,
  which only says the Python call returned (on NCCL: enqueued, DESIGN §2).
* ``STACKS`` — one row per thread per stack snapshot (py-spy, faulthandler, gdb, our agent).
* ``OBSERVATIONS`` — facts that are neither ops nor stacks (NCCL init/transport/WARN lines, RAS counts, pid↔rank
  lines, exit statuses, GPU utilisation, topology), each with provenance so a finding can cite it.

Every table carries ``source`` (which kind of evidence), ``file`` and ``line`` (where in that file; for binary
sources the record index) so that every claim the analyzer makes can point back to its evidence.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import pyarrow as pa

__all__ = [
    "EVENTS",
    "STACKS",
    "OBSERVATIONS",
    "EVENT_KINDS",
    "CATEGORIES",
    "RING_WRAPPED",
    "table_from_rows",
    "empty",
    "concat",
]

EVENT_KINDS = ("enter", "exit", "error", "complete", "mark", "identity", "group")
CATEGORIES = ("collective", "p2p", "graph", "sync", "init", "phase", "user")
# The mark a ring reader writes at a wrapped ring's oldest surviving record: the model reads it to know that rank's
# earlier records are gone (an op missing there is not an op never issued).
RING_WRAPPED = "ring_wrapped"

EVENTS = pa.schema(
    [
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("rank", pa.int32()),          # global rank when known
        ("world", pa.int32()),
        ("t_ns", pa.int64()),          # CLOCK_MONOTONIC of the recording host
        ("wall_ns", pa.int64()),       # ns since the Unix epoch
        ("kind", pa.string()),
        ("name", pa.string()),         # all_reduce, broadcast, recv, init_process_group, phase name, ...
        ("category", pa.string()),
        ("group", pa.string()),        # process-group name (or NCCL commId for NCCL-log-only inputs)
        ("group_desc", pa.string()),
        ("backend", pa.string()),
        ("group_ranks", pa.list_(pa.int32())),  # global ranks of the group members, in group-rank order
        ("seq", pa.int64()),           # per-group 1-based counter that aligns ranks (DESIGN §3)
        ("backend_seq", pa.int64()),   # backend's own counter (FR collective_seq_id, watchdog SeqNum)
        ("peer", pa.int32()),          # p2p peer, global rank
        ("capturing", pa.bool_()),
        ("graph_id", pa.int64()),
        ("nbytes", pa.int64()),
        ("dtype", pa.string()),
        ("shape", pa.string()),
        ("callsite", pa.string()),
        ("span_id", pa.int64()),
        ("parent_span_id", pa.int64()),
        ("error", pa.string()),
        ("state", pa.string()),        # backend state when known: scheduled | started | completed
        ("async_op", pa.bool_()),
        ("detail", pa.string()),
        ("source", pa.string()),       # events | nccl | fr | watchdog | pyspy | nsys | kineto | server_log | ...
        ("file", pa.string()),
        ("line", pa.int64()),          # line number in `file`, or record index for binary files
    ]
)

STACKS = pa.schema(
    [
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("rank", pa.int32()),
        ("wall_ns", pa.int64()),
        ("t_ns", pa.int64()),
        ("thread_name", pa.string()),
        ("thread_state", pa.string()),  # idle | active | active+gil | unknown
        ("frames", pa.list_(pa.string())),  # innermost first, "function (file:line)"
        ("native", pa.bool_()),
        ("snapshot", pa.string()),      # identifies one capture (file or burst) so stacks can be compared over time
        ("source", pa.string()),        # pyspy | faulthandler | gdb | agent | fr
        ("file", pa.string()),
        ("line", pa.int64()),
    ]
)

OBSERVATIONS = pa.schema(
    [
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("rank", pa.int32()),
        ("wall_ns", pa.int64()),
        ("kind", pa.string()),   # e.g. nccl_init_start, nccl_init_complete, nccl_transport, nccl_warn, ras_rank_state
        ("name", pa.string()),
        ("group", pa.string()),
        ("detail", pa.string()),
        ("value", pa.int64()),
        ("source", pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),
    ]
)


def table_from_rows(schema: pa.Schema, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Build a table of `schema` from dict rows; missing keys become null, unknown keys are an error.

    Readers build rows as dicts internally (convenient while parsing) but hand out only typed tables.
    """
    rows = list(rows)
    names = schema.names
    unknown = {k for r in rows for k in r} - set(names)
    if unknown:
        raise KeyError(f"columns not in schema: {sorted(unknown)}")
    columns = {n: [r.get(n) for r in rows] for n in names}
    return pa.Table.from_pydict(columns, schema=schema)


def empty(schema: pa.Schema) -> pa.Table:
    """An empty table with `schema`."""
    return schema.empty_table()


def concat(schema: pa.Schema, tables: Iterable[pa.Table]) -> pa.Table:
    """Concatenate tables of one schema (casting compatible ones); empty input gives an empty table."""
    tables = [t.cast(schema) if t.schema != schema else t for t in tables]
    if not tables:
        return empty(schema)
    return pa.concat_tables(tables)
