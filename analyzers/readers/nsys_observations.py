"""The export-level facts of an nsys export: version (export metadata), host name, session clock and capture
window, processes and threads (with the process-name and ``MPI_RANKS`` rank hints), GPUs and CUDA devices,
captured stdout/stderr lines and profiler diagnostics; all but the version and clock become OBSERVATIONS rows.

Why separate: these stages read small descriptive tables and emit observations, not the events the wait-for engine
orders; they share nothing with NVTX or kernel interpretation beyond the export base.
"""
from __future__ import annotations

import re
from typing import Any

from ranktrace.analyzers.readers import nsys_export
from ranktrace.analyzers.readers.nsys_decode import _PROC_RANK, decode_global_tid
from ranktrace.analyzers.readers.nsys_export import _ExportBase


class _ObservationStages(_ExportBase):
    """Stages: export metadata, host and clock, processes and threads, GPUs, streams, diagnostics."""

    # -- metadata, host, clock

    def _metadata(self) -> str | None:
        table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in self.columns), None)
        if table is None:
            self._skip("table META_DATA_EXPORT/EXPORT_META_DATA absent: export version unknown")
            return None
        meta: dict[str, str] = {}
        if {"name", "value"} <= self.columns[table]:
            meta = {str(n): str(v) for n, v in self.conn.execute(f'SELECT name, value FROM "{table}"')}
        self.normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
        product, schema_v = meta.get("EXPORT_PRODUCT_VERSION"), meta.get("EXPORT_SCHEMA_VERSION")
        if product or schema_v:
            return f"nsys {product or '?'}, schema {schema_v or '?'}"
        return None

    def _host_and_clock(self) -> None:
        if "TARGET_INFO_SYSTEM_ENV" in self.columns and {"name", "value"} <= self.columns["TARGET_INFO_SYSTEM_ENV"]:
            row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1"
                                    ).fetchone()
            self.host = str(row[0]) if row and row[0] else None
        t = self._table("TARGET_INFO_SESSION_START_TIME", ("utcEpochNs", "systemClockNs"), "wall_ns left null")
        if t:
            row = self.conn.execute(f'SELECT utcEpochNs, systemClockNs FROM "{t}" LIMIT 1').fetchone()
            if row and row[0] is not None and row[1] is not None:
                self.clock = (int(row[0]), int(row[1]))
        t = self._table("ANALYSIS_DETAILS", ("startTime", "stopTime"), "capture window unknown")
        if t:
            row = self.conn.execute(f'SELECT startTime, stopTime FROM "{t}" LIMIT 1').fetchone()
            if row and row[1] is not None:
                start, stop = row
                self._emit_obs([self._obs(None, None, "nsys_capture_window", name="capture", value=int(stop),
                                          detail=f"startTime={start} stopTime={stop} (session clock ns)"
                                                 + (f" duration_ns={int(stop) - int(start)}" if start is not None
                                                    else ""))])

    # -- processes, threads

    def _processes_and_threads(self) -> None:
        t = self._table("PROCESSES", ("globalPid",), "no process names")
        if t:
            name_col = "name" if self._has(t, "name") else "NULL"
            rows = []
            for rowid, gpid, name in self.conn.execute(f'SELECT rowid, globalPid, {name_col} FROM "{t}"'):
                pid, _ = decode_global_tid(gpid)
                rows.append(self._obs(pid, None, "nsys_process", name=name, line=rowid))
                if name:
                    m = _PROC_RANK.search(str(name))
                    if m and pid is not None:
                        self.rank_hints[pid]["process name"].add(int(m.group(1)))
            self._emit_obs(rows)
        t = self._table("ThreadNames", ("nameId", "globalTid"), "no thread names")
        if t and "StringIds" in self.columns:
            rows = []
            for batch in self._batches(f'SELECT t.rowid, t.globalTid, s.value FROM "{t}" t '
                                       f"LEFT JOIN StringIds s ON s.id = t.nameId"):
                for rowid, gtid, name in batch:
                    pid, tid = decode_global_tid(gtid)
                    rows.append(self._obs(pid, tid, "nsys_thread", name=name, line=rowid))
            self._emit_obs(rows)
        if {"globalTid", "rank"} <= self.columns.get("MPI_RANKS", set()):  # only with --trace mpi: absence is normal
            for gtid, rank in self.conn.execute('SELECT globalTid, rank FROM "MPI_RANKS"'):
                pid, _ = decode_global_tid(gtid)
                if pid is not None and rank is not None:
                    self.rank_hints[pid]["MPI_RANKS"].add(int(rank))

    # -- GPUs, streams, diagnostics

    def _gpus(self) -> None:
        rows: list[dict[str, Any]] = []
        t = self._table("TARGET_INFO_GPU", ("id",), "GPU models/bus ids unknown")
        if t:
            cols = [c for c in ("name", "busLocation", "uuid", "totalMemory", "computeMajor", "computeMinor")
                    if self._has(t, c)]
            sel = ", ".join(["id"] + cols)
            for rec in self.conn.execute(f'SELECT rowid, {sel} FROM "{t}"'):
                info = dict(zip(["rowid", "id"] + cols, rec))
                mem = info.get("totalMemory")
                cc = (f"sm {info.get('computeMajor')}.{info.get('computeMinor')}"
                      if info.get("computeMajor") is not None else None)
                detail = "; ".join(str(x) for x in (info.get("name"), info.get("busLocation") and
                                                     f"bus {info['busLocation']}", info.get("uuid"), cc) if x)
                rows.append(self._obs(None, None, "gpu_device", name=str(info["id"]), line=info["rowid"],
                                      value=None if mem is None else int(mem) // (1 << 20), detail=detail or None))
        elif "TARGET_INFO_SYSTEM_ENV" in self.columns:
            row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'GpuInfo' LIMIT 1"
                                    ).fetchone()
            if row and row[0] and str(row[0]).strip() not in ("{}", "[]", ""):
                rows.append(self._obs(None, None, "gpu_device", name=None, detail=str(row[0])[:4000]))
        t = self._table("TARGET_INFO_CUDA_DEVICE", ("gpuId", "cudaId", "pid"), "CUDA ordinal → GPU map unknown")
        if t:
            uuid = "uuid" if self._has(t, "uuid") else "NULL"
            for rowid, gpu_id, cuda_id, pid, uid in self.conn.execute(
                    f'SELECT rowid, gpuId, cudaId, pid, {uuid} FROM "{t}"'):
                rows.append(self._obs(pid, None, "cuda_device", name=None if cuda_id is None else str(cuda_id),
                                      value=gpu_id, detail=uid, line=rowid))
        self._emit_obs(rows)

    def _streams(self) -> None:
        t = self._table("ProcessStreams", ("globalPid", "filenameId", "contentId"), "captured stdout/stderr "
                        "(where NCCL_DEBUG output lands) not available")
        if not t or "StringIds" not in self.columns:
            return
        listing = self.conn.execute(f'SELECT p.rowid, p.globalPid, f.value, p.contentId FROM "{t}" p '
                                    f"LEFT JOIN StringIds f ON f.id = p.filenameId").fetchall()
        for rowid, gpid, fname, content_id in listing:
            base = str(fname or "").rsplit("/", 1)[-1]
            if not re.search(r"(stdout|stderr)", base):
                continue  # e.g. nsys-config.ini
            pid, _ = decode_global_tid(gpid)
            m = re.match(r"pid_(\d+)_", base)
            if m:
                pid = int(m.group(1))
            row = self.conn.execute("SELECT value FROM StringIds WHERE id = ?", (content_id,)).fetchone()
            if row is None or row[0] is None:
                self._skip(f"ProcessStreams {base}: content not in the export (StringIds id {content_id} missing)",
                           rowid)
                continue
            rows: list[dict[str, Any]] = []
            for n, line in enumerate(str(row[0]).splitlines(), start=1):
                rows.append(self._obs(pid, None, "nsys_stream_text", name=base, detail=line, line=n))
                if len(rows) >= nsys_export.BATCH_ROWS:
                    self._emit_obs(rows)
                    rows = []
            self._emit_obs(rows)

    def _diagnostics(self) -> None:
        t = "DIAGNOSTIC_EVENT"
        if t not in self.columns or "text" not in self.columns[t]:
            return
        gpid = "globalPid" if self._has(t, "globalPid") else "NULL"
        rows = []
        for rowid, g, text in self.conn.execute(f'SELECT rowid, {gpid}, text FROM "{t}" LIMIT 10000'):
            pid, _ = decode_global_tid(g)
            rows.append(self._obs(pid, None, "nsys_diagnostic", detail=text, line=rowid))
        self._emit_obs(rows)
