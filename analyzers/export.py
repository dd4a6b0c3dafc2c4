"""A run as plain tables (`trace export`, `trace sql`): what the analyzer built, in files any tool reads.

Tables (:data:`TABLES`), each from one Analysis plus the run's sample files:

* ``ops`` — the analyzer's ops table (analyzers.timeline.OPS): one row per (rank, channel, seq) with
  issued / returned / errored / completed;
* ``spans`` — one row per call, its enter paired with its exit or error: start, end, ``duration_ns``, ``outcome``
  (returned | error | open), ``completed`` (analyzers.report.spans.span_table), ``open``: the call never returned
  and its ``duration_ns`` runs until the end of the trace (:func:`open_until_end`);
* ``stacks`` — the stack rows the analysis used (hang-time dumps, the latest samples), frames innermost first;
* ``samples_stacks`` — every sampled thread stack of ``samples/stacks.arrows`` (the sample rows with their frames);
* ``samples_proc``, ``samples_gpu`` — ``samples/proc.arrows`` and ``gpu.arrows`` as written (one row per process /
  thread / GPU per sample);
* ``phases`` — phase spans (``--hook ...=phase``, serving) and phase marks (process exit, ...);
* ``events`` — every record as read (schema.EVENTS).

Formats: Parquet (one ``<table>.parquet`` each), CSV (list columns joined with newlines), DuckDB (one
``ranktrace.duckdb`` with a table each). DuckDB is optional (``pip install 'ranktrace[sql]'``): :class:`NoDuckDB`
when it is not installed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import Analysis
from ranktrace.analyzers.report.spans import as_of, span_table

__all__ = ["TABLES", "FORMATS", "NoDuckDB", "run_tables", "open_until_end", "sample_tables", "write", "sql",
           "duckdb_module", "table_text"]

TABLES = ("ops", "spans", "stacks", "samples_stacks", "samples_proc", "samples_gpu", "phases", "events")
FORMATS = ("parquet", "csv", "duckdb")
DUCKDB_HINT = "pip install 'ranktrace[sql]'"


class NoDuckDB(RuntimeError):
    """DuckDB is not installed (the `sql` extra)."""


def duckdb_module() -> Any:
    try:
        import duckdb
    except ImportError as e:
        raise NoDuckDB(f"DuckDB is not installed ({DUCKDB_HINT})") from e
    return duckdb


def _sample_files(analysis: Analysis, kind: str) -> list[Path]:
    out = []
    for h in analysis.hosts:
        for name in (f"{kind}.arrows", f"{kind}.arrow"):  # .arrow: runs recorded before the streams were renamed
            p = Path(h.host_dir) / "samples" / name
            if p.exists():
                out.append(p)
                break
    return out


def _with_host(t: pa.Table, host: str) -> pa.Table:
    return t.add_column(0, "host", pa.array([host] * t.num_rows, pa.string()))


def sample_tables(analysis: Analysis) -> dict[str, pa.Table]:
    """``samples_proc``, ``samples_gpu``, ``samples_stacks`` of every host of the run (empty tables when it has no
    samples: foreign inputs, RANKTRACE_SAMPLES=0); a cut stream keeps the batches before the cut."""
    from ranktrace.analyzers.readers import ranktrace_samples

    out: dict[str, pa.Table] = {}
    for kind in ("proc", "gpu", "stacks"):
        parts = []
        for f in _sample_files(analysis, kind):
            try:
                t, _kind, _cut = ranktrace_samples.read_table(f)
            except Exception:  # an unreadable sample file loses its rows, not the export
                continue
            host = f.parent.parent.name
            parts.append(_with_host(_stack_rows(t) if kind == "stacks" else t, host))
        out[f"samples_{kind}"] = pa.concat_tables(parts, promote_options="default") if parts else _empty_samples(kind)
    return out


def _empty_samples(kind: str) -> pa.Table:
    """The leading columns of a sample table, no rows (a run without that sample file)."""
    base = {"proc": [("wall_ns", pa.int64()), ("t_ns", pa.int64()), ("kind", pa.string()), ("pid", pa.int64()),
                     ("tid", pa.int64()), ("rank", pa.int32())],
            "gpu": [("wall_ns", pa.int64()), ("t_ns", pa.int64()), ("kind", pa.string()), ("gpu", pa.int32()),
                    ("pid", pa.int64()), ("rank", pa.int32())],
            "stacks": [("sample_id", pa.int64()), ("wall_ns", pa.int64()), ("t_ns", pa.int64()), ("pid", pa.int64()),
                       ("tid", pa.int64()), ("rank", pa.int32()), ("thread_name", pa.string()),
                       ("thread_state", pa.string()), ("changed", pa.bool_()), ("trigger", pa.string()),
                       ("frames", pa.list_(pa.string()))]}[kind]
    return pa.schema([("host", pa.string())] + base).empty_table()


def _stack_rows(t: pa.Table) -> pa.Table:
    """stacks.arrows stores each distinct stack once (kind=stack) and samples by reference (kind=sample): one row
    per sampled thread with its frames."""
    defs = t.filter(pc.equal(t["kind"], "stack"))
    samples = t.filter(pc.and_(pc.equal(t["kind"], "sample"), pc.is_valid(t["stack_id"])))
    frames = defs["frames"].take(pc.index_in(samples["stack_id"], value_set=defs["stack_id"]))
    cols = ["sample_id", "wall_ns", "t_ns", "pid", "tid", "rank", "thread_name", "thread_state", "changed", "trigger"]
    return samples.select(cols).append_column("frames", frames)


def _phases(events: pa.Table, spans: pa.Table) -> pa.Table:
    """Phase spans (one row per phase call) and phase marks (instants: end null)."""
    ph = spans.filter(pc.equal(spans["category"], "phase"))
    span_rows = pa.table({
        "host": ph["host"], "rank": ph["rank"], "pid": ph["pid"], "tid": ph["tid"], "name": ph["name"],
        "what": pa.array(["span"] * ph.num_rows, pa.string()), "start_wall_ns": ph["start_wall_ns"],
        "end_wall_ns": ph["end_wall_ns"], "duration_ns": ph["duration_ns"], "outcome": ph["outcome"],
        "detail": pa.nulls(ph.num_rows, pa.string()), "source": ph["source"]})
    marks = events.filter(pc.and_(pc.equal(events["kind"], "mark"), pc.equal(events["category"], "phase"))) \
        if events.num_rows else events
    mark_rows = pa.table({
        "host": marks["host"], "rank": marks["rank"], "pid": marks["pid"], "tid": marks["tid"], "name": marks["name"],
        "what": pa.array(["mark"] * marks.num_rows, pa.string()), "start_wall_ns": marks["wall_ns"],
        "end_wall_ns": pa.nulls(marks.num_rows, pa.int64()), "duration_ns": pa.nulls(marks.num_rows, pa.int64()),
        "outcome": pa.nulls(marks.num_rows, pa.string()), "detail": marks["detail"], "source": marks["source"]},
        schema=span_rows.schema)
    return pa.concat_tables([span_rows, mark_rows]).sort_by([("rank", "ascending"), ("start_wall_ns", "ascending")])


def open_until_end(spans: pa.Table, end_wall_ns: int | None, end_t_ns: int | None) -> pa.Table:
    """A call that never returned lasts until the end of the trace (the verdict's moment, spans.as_of): its
    ``duration_ns`` counts until then, never NULL, and the ``open`` column says that it is still open (its
    ``end_*`` columns stay NULL: it never ended)."""
    is_open = pc.equal(spans["outcome"], "open")
    dur = spans["duration_ns"]
    if end_wall_ns is not None:
        dur = pc.if_else(pc.and_(is_open, pc.is_valid(spans["start_wall_ns"])),
                         pc.subtract(pa.scalar(end_wall_ns, pa.int64()), spans["start_wall_ns"]), dur)
    if end_t_ns is not None:  # a reader's rows with a monotonic time only (one host's clock)
        dur = pc.if_else(pc.and_(is_open, pc.is_null(dur)),
                         pc.subtract(pa.scalar(end_t_ns, pa.int64()), spans["start_t_ns"]), dur)
    dur = pc.max_element_wise(dur, 0, skip_nulls=False)  # a clock step back never makes it negative
    out = spans.set_column(spans.schema.get_field_index("duration_ns"), "duration_ns", dur)
    return out.append_column("open", pc.fill_null(is_open, False))


def run_tables(analysis: Analysis) -> dict[str, pa.Table]:
    """Every table of :data:`TABLES` for one analysis."""
    spans = open_until_end(span_table(analysis.events), as_of(analysis, "wall_ns"), as_of(analysis, "t_ns"))
    out = {"ops": analysis.ops, "spans": spans, "stacks": analysis.stacks}
    out.update(sample_tables(analysis))
    out["phases"] = _phases(analysis.events, spans)
    out["events"] = analysis.events
    return {k: out[k] for k in TABLES}


def _csv_ready(t: pa.Table) -> pa.Table:
    """CSV has no lists: a list column becomes its items joined with newlines."""
    for i, f in enumerate(t.schema):
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            items = pc.cast(t[f.name], pa.list_(pa.string()))
            t = t.set_column(i, f.name, pc.binary_join(items, "\n"))
    return t


def write(tables: dict[str, pa.Table], out_dir: Path, fmt: str) -> list[Path]:
    """Write the tables into `out_dir` (created; files already there are never overwritten: FileExistsError)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} not one of {FORMATS}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "duckdb":
        duckdb = duckdb_module()
        path = out_dir / "ranktrace.duckdb"
        if path.exists():
            raise FileExistsError(str(path))
        con = duckdb.connect(str(path))
        try:
            for name, t in tables.items():
                con.register("_t", t)
                con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM _t')
                con.unregister("_t")
        finally:
            con.close()
        return [path]
    paths = [out_dir / f"{name}.{fmt}" for name in tables]
    taken = [p for p in paths if p.exists()]
    if taken:
        raise FileExistsError(str(taken[0]))
    for (name, t), p in zip(tables.items(), paths):
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(t, p)
        else:
            import pyarrow.csv as pcsv

            pcsv.write_csv(_csv_ready(t), p)
    return paths


def sql(tables: dict[str, pa.Table], query: str) -> pa.Table:
    """Run `query` with each table registered under its name (DuckDB, in memory). NoDuckDB without DuckDB; DuckDB's
    own error for a bad query."""
    duckdb = duckdb_module()
    con = duckdb.connect()
    try:
        for name, t in tables.items():
            con.register(name, t)
        rel = con.sql(query)
        if rel is None:  # a statement without a result (CREATE VIEW ...)
            return pa.table({})
        return rel.fetch_arrow_table() if hasattr(rel, "fetch_arrow_table") else rel.arrow()
    finally:
        con.close()


def table_text(t: pa.Table, max_rows: int = 200, max_width: int = 60) -> str:
    """An aligned plain-text rendering of a query result (the first `max_rows` rows; long cells cut)."""
    def cell(v: Any) -> str:
        s = "NULL" if v is None else (", ".join(map(str, v)) if isinstance(v, list) else str(v))
        s = s.replace("\n", " ")
        return s if len(s) <= max_width else s[:max_width - 1] + "…"

    names = t.column_names
    rows = [[cell(v) for v in r.values()] for r in t.slice(0, max_rows).to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if t.num_rows > max_rows:
        lines.append(f"({t.num_rows} rows, the first {max_rows} shown)")
    else:
        lines.append(f"({t.num_rows} row{'s' if t.num_rows != 1 else ''})")
    return "\n".join(lines) + "\n"
