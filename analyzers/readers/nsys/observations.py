"""The stages that make OBSERVATIONS from the export's descriptive tables (version, host, clock and capture window,
processes and threads, GPUs and CUDA devices, captured stdout/stderr, profiler diagnostics), and the last one: pid ->
rank (and world) from the hints the stages collected, in order of trust, never guessed, filled into the tables."""
from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.readers.nsys import export
from ranktrace.analyzers.readers.nsys.decode import PROC_RANK, decode_global_tid
from ranktrace.analyzers.readers.nsys.export import Export

__all__ = ["metadata", "host_and_clock", "processes_and_threads", "gpus", "streams", "diagnostics", "resolve_ranks",
           "fill_identity"]


def metadata(ex: Export) -> str | None:
    table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in ex.columns), None)
    if table is None:
        ex.skip("table META_DATA_EXPORT/EXPORT_META_DATA absent: export version unknown")
        return None
    meta: dict[str, str] = {}
    if {"name", "value"} <= ex.columns[table]:
        meta = {str(n): str(v) for n, v in ex.conn.execute(f'SELECT name, value FROM "{table}"')}
    ex.normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    product, schema_v = meta.get("EXPORT_PRODUCT_VERSION"), meta.get("EXPORT_SCHEMA_VERSION")
    if product or schema_v:
        return f"nsys {product or '?'}, schema {schema_v or '?'}"
    return None


def host_and_clock(ex: Export) -> None:
    if "TARGET_INFO_SYSTEM_ENV" in ex.columns and {"name", "value"} <= ex.columns["TARGET_INFO_SYSTEM_ENV"]:
        row = ex.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1"
                                ).fetchone()
        ex.host = str(row[0]) if row and row[0] else None
        facts = ex.conn.execute("SELECT rowid, name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN "
                                "('NvDriverVersion', 'CudaDriverVersion', 'OsDescription')").fetchall()
        ex.emit_obs([ex.obs(None, None, "nsys_system", name=str(name), detail=str(value), line=rowid)
                     for rowid, name, value in facts if value not in (None, "")])
    t = ex.table("TARGET_INFO_SESSION_START_TIME", ("utcEpochNs", "systemClockNs"), "wall_ns left null")
    if t:
        row = ex.conn.execute(f'SELECT utcEpochNs, systemClockNs FROM "{t}" LIMIT 1').fetchone()
        if row and row[0] is not None and row[1] is not None:
            ex.clock = (int(row[0]), int(row[1]))
    t = ex.table("ANALYSIS_DETAILS", ("startTime", "stopTime"), "capture window unknown")
    if t:
        row = ex.conn.execute(f'SELECT startTime, stopTime FROM "{t}" LIMIT 1').fetchone()
        if row and row[1] is not None:
            start, stop = row
            ex.emit_obs([ex.obs(None, None, "nsys_capture_window", name="capture", value=int(stop),
                                      detail=f"startTime={start} stopTime={stop} (session clock ns)"
                                             + (f" duration_ns={int(stop) - int(start)}" if start is not None
                                                else ""))])


def processes_and_threads(ex: Export) -> None:
    t = ex.table("PROCESSES", ("globalPid",), "no process names")
    if t:
        name_col = "name" if ex.has(t, "name") else "NULL"
        rows = []
        for rowid, gpid, name in ex.conn.execute(f'SELECT rowid, globalPid, {name_col} FROM "{t}"'):
            pid, _ = decode_global_tid(gpid)
            rows.append(ex.obs(pid, None, "nsys_process", name=name, line=rowid))
            if name:
                m = PROC_RANK.search(str(name))
                if m and pid is not None:
                    ex.rank_hints[pid]["process name"].add(int(m.group(1)))
        ex.emit_obs(rows)
    t = ex.table("ThreadNames", ("nameId", "globalTid"), "no thread names")
    if t and "StringIds" in ex.columns:
        rows = []
        for batch in ex.batches(f'SELECT t.rowid, t.globalTid, s.value FROM "{t}" t '
                                   f"LEFT JOIN StringIds s ON s.id = t.nameId"):
            for rowid, gtid, name in batch:
                pid, tid = decode_global_tid(gtid)
                rows.append(ex.obs(pid, tid, "nsys_thread", name=name, line=rowid))
        ex.emit_obs(rows)
    if {"globalTid", "rank"} <= ex.columns.get("MPI_RANKS", set()):  # only with --trace mpi: absence is normal
        for gtid, rank in ex.conn.execute('SELECT globalTid, rank FROM "MPI_RANKS"'):
            pid, _ = decode_global_tid(gtid)
            if pid is not None and rank is not None:
                ex.rank_hints[pid]["MPI_RANKS"].add(int(rank))


def gpus(ex: Export) -> None:
    rows: list[dict[str, Any]] = []
    t = ex.table("TARGET_INFO_GPU", ("id",), "GPU models/bus ids unknown")
    if t:
        cols = [c for c in ("name", "busLocation", "uuid", "totalMemory", "computeMajor", "computeMinor")
                if ex.has(t, c)]
        sel = ", ".join(["id"] + cols)
        for rec in ex.conn.execute(f'SELECT rowid, {sel} FROM "{t}"'):
            info = dict(zip(["rowid", "id"] + cols, rec))
            mem = info.get("totalMemory")
            cc = (f"sm {info.get('computeMajor')}.{info.get('computeMinor')}"
                  if info.get("computeMajor") is not None else None)
            detail = "; ".join(str(x) for x in (info.get("name"), info.get("busLocation") and
                                                 f"bus {info['busLocation']}", info.get("uuid"), cc) if x)
            rows.append(ex.obs(None, None, "gpu_device", name=str(info["id"]), line=info["rowid"],
                                  value=None if mem is None else int(mem) // (1 << 20), detail=detail or None))
    elif "TARGET_INFO_SYSTEM_ENV" in ex.columns:
        row = ex.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'GpuInfo' LIMIT 1"
                                ).fetchone()
        if row and row[0] and str(row[0]).strip() not in ("{}", "[]", ""):
            rows.append(ex.obs(None, None, "gpu_device", name=None, detail=str(row[0])[:4000]))
    t = ex.table("TARGET_INFO_CUDA_DEVICE", ("gpuId", "cudaId", "pid"), "CUDA ordinal → GPU map unknown")
    if t:
        uuid = "uuid" if ex.has(t, "uuid") else "NULL"
        for rowid, gpu_id, cuda_id, pid, uid in ex.conn.execute(
                f'SELECT rowid, gpuId, cudaId, pid, {uuid} FROM "{t}"'):
            rows.append(ex.obs(pid, None, "cuda_device", name=None if cuda_id is None else str(cuda_id),
                                  value=gpu_id, detail=uid, line=rowid))
    ex.emit_obs(rows)


def streams(ex: Export) -> None:
    t = ex.table("ProcessStreams", ("globalPid", "filenameId", "contentId"), "captured stdout/stderr "
                    "(where NCCL_DEBUG output lands) not available")
    if not t or "StringIds" not in ex.columns:
        return
    listing = ex.conn.execute(f'SELECT p.rowid, p.globalPid, f.value, p.contentId FROM "{t}" p '
                                f"LEFT JOIN StringIds f ON f.id = p.filenameId").fetchall()
    for rowid, gpid, fname, content_id in listing:
        base = str(fname or "").rsplit("/", 1)[-1]
        if not re.search(r"(stdout|stderr)", base):
            continue  # e.g. nsys-config.ini
        pid, _ = decode_global_tid(gpid)
        m = re.match(r"pid_(\d+)_", base)
        if m:
            pid = int(m.group(1))
        row = ex.conn.execute("SELECT value FROM StringIds WHERE id = ?", (content_id,)).fetchone()
        if row is None or row[0] is None:
            ex.skip(f"ProcessStreams {base}: content not in the export (StringIds id {content_id} missing)",
                       rowid)
            continue
        rows: list[dict[str, Any]] = []
        for n, line in enumerate(str(row[0]).splitlines(), start=1):
            rows.append(ex.obs(pid, None, "nsys_stream_text", name=base, detail=line, line=n))
            if len(rows) >= export.BATCH_ROWS:
                ex.emit_obs(rows)
                rows = []
        ex.emit_obs(rows)


def diagnostics(ex: Export) -> None:
    t = "DIAGNOSTIC_EVENT"
    if t not in ex.columns or "text" not in ex.columns[t]:
        return
    gpid = "globalPid" if ex.has(t, "globalPid") else "NULL"
    rows = []
    for rowid, g, text in ex.conn.execute(f'SELECT rowid, {gpid}, text FROM "{t}" LIMIT 10000'):
        pid, _ = decode_global_tid(g)
        rows.append(ex.obs(pid, None, "nsys_diagnostic", detail=text, line=rowid))
    ex.emit_obs(rows)


def resolve_ranks(ex: Export) -> tuple[dict[int, int], dict[int, int]]:
    """pid → rank from the hints, in order of trust; conflicting values from one source are dropped."""
    _env_rank_hint(ex)
    order = ("MPI_RANKS", "ranktrace NVTX rank=", "NVTX text rank=", "process name", "launch environment RANK=")
    pid_rank: dict[int, int] = {}
    rows = []
    for pid, by_source in sorted(ex.rank_hints.items()):
        for src in order:
            values = by_source.get(src)
            if values and len(values) == 1:
                pid_rank[pid] = next(iter(values))
                rows.append(ex.obs(pid, None, "pid_rank", rank=pid_rank[pid], value=pid_rank[pid],
                                      detail=f"rank from {src}"))
                break
    ex.emit_obs(rows)
    world = next(iter(ex.world_hints)) if len(ex.world_hints) == 1 else None
    pid_world = {pid: world for pid in pid_rank} if world is not None else {}
    return pid_rank, pid_world


def _env_rank_hint(ex: Export) -> None:
    if "META_DATA_CAPTURE" not in ex.columns or len(ex.active_pids) != 1:
        return
    for name, value in ex.conn.execute("SELECT name, value FROM META_DATA_CAPTURE "
                                         "WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"):
        m = re.fullmatch(r'(RANK|WORLD_SIZE)="?(\d+)"?', str(value or "").strip())
        if m and m.group(1) == "RANK":
            ex.rank_hints[next(iter(ex.active_pids))]["launch environment RANK="].add(int(m.group(2)))
        elif m:
            ex.world_hints.add(int(m.group(2)))


def fill_identity(table: pa.Table, pid_rank: dict[int, int], pid_world: dict[int, int]) -> pa.Table:
    """Fill null ``rank``/``world`` from the pid maps (vectorised; rows that already carry a rank keep it)."""
    if table.num_rows == 0:
        return table
    for column, mapping, typ in (("rank", pid_rank, pa.int32()), ("world", pid_world, pa.int32())):
        if not mapping or column not in table.column_names:
            continue
        keys = pa.array(list(mapping), pa.int64())
        values = pa.array(list(mapping.values()), typ)
        looked_up = pc.take(values, pc.index_in(table["pid"], value_set=keys))
        merged = pc.coalesce(table[column], looked_up)
        table = table.set_column(table.column_names.index(column), column, merged)
    return table
