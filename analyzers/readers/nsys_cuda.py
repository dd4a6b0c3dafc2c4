"""CUDA activity of an nsys export → EVENTS: completed NCCL kernels (enter + ``complete``), kernel launches and
memcpys with no completion recorded (one ``enter``, ``state="scheduled"``), and host-blocking CUDA API calls
(``category="sync"``); GPU work is named after the op range it was launched in, when there is one.

Why separate: these stages read the CUPTI activity tables (the big ones, joined by correlationId), a different
source and a different job from NVTX interpretation, whose op ranges they only look up.
"""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.opnames import P2P_OPS, canonical_op
from ranktrace.analyzers.readers.nsys_decode import _API_VERSION, _MASK24, decode_global_tid, parse_nccl_kernel_name
from ranktrace.analyzers.readers.nsys_export import _ExportBase
from ranktrace.analyzers.readers.nsys_fields import NO_COMPLETION, OPEN_AT_END


class _CudaStages(_ExportBase):
    """Stages: NCCL kernels, unfinished GPU work, synchronizing CUDA calls."""

    # -- kernels and pending GPU work

    def _kernels(self) -> None:
        t = self._table("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId", "globalPid"),
                        "no completed kernels")
        if not t or "StringIds" not in self.columns:
            return
        name_col = "shortName" if self._has(t, "shortName") else ("demangledName" if self._has(t, "demangledName")
                                                                   else None)
        if name_col is None:
            self._skip(f"table {t} has no kernel name column: NCCL kernels not read")
            return
        graph = "k.graphId" if self._has(t, "graphId") else "NULL"
        device = "k.deviceId" if self._has(t, "deviceId") else "NULL"
        rt = self._resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
        launch_cols, launch_join = "NULL, NULL", ""
        if {"correlationId", "globalTid", "start"} <= self.columns.get(rt, set()):
            launch_cols = "r.globalTid, r.start"
            launch_join = (f'LEFT JOIN "{rt}" r ON r.correlationId = k.correlationId '
                           f"AND ((r.globalTid >> 24) & {_MASK24}) = ((k.globalPid >> 24) & {_MASK24})")
        names = self._string_ids("value LIKE 'nccl%'")
        sql = (f'SELECT k.rowid, k.start, k."end", {device}, k.globalPid, k.{name_col}, {graph}, {launch_cols} '
               f'FROM "{t}" k {launch_join} WHERE k.{name_col} IN ({",".join(map(str, names)) or "NULL"})')
        for batch in self._batches(sql) if names else ():
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, dev, gpid, kname_id, graph_id, launch_tid, launch_t in batch:
                kname = names[kname_id]
                pid, _ = decode_global_tid(gpid)
                _, tid = decode_global_tid(launch_tid)
                raw_op, dtype = parse_nccl_kernel_name(str(kname))
                fields = self._op_fields(pid, tid, launch_t, raw_op)
                fields.setdefault("dtype", dtype)
                detail = f"kernel {kname}" + (f" on device {dev}" if dev is not None else "")
                common = dict(line=rowid, detail=detail, graph_id=graph_id, **fields)
                rows.append(self._event(pid, tid, start, "enter", **common))
                if stop is not None:
                    rows.append(self._event(pid, tid, stop, "complete", state="completed", **common))
            self._emit_events(rows)
        if device != "NULL":
            rows = []
            for gpid, dev, count in self.conn.execute(f'SELECT globalPid, deviceId, COUNT(*) FROM "{t}" '
                                                      f"GROUP BY globalPid, deviceId"):
                pid, _ = decode_global_tid(gpid)
                if pid is not None:
                    self.active_pids.add(pid)
                rows.append(self._obs(pid, None, "pid_device", name=None if dev is None else str(dev), value=count))
            self._emit_obs(rows)

    def _op_fields(self, pid: int | None, tid: int | None, t: int | None, raw_op: str) -> dict[str, Any]:
        """name/category (+ group/seq/...) for GPU work launched at (pid, tid, t)."""
        op = self._op_at(pid, tid, t)
        if op is not None:
            fields = dict(op.fields)
            fields.update(name=op.name, category=op.category)
            return fields
        name = canonical_op(raw_op)
        category = "p2p" if raw_op == "SendRecv" or name in P2P_OPS else "collective"
        return {"name": name, "category": category}

    def _pending_gpu_work(self) -> None:
        rt = self._table("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "correlationId", "globalTid", "nameId"),
                         "launches without a finished kernel cannot be found")
        if not rt or "StringIds" not in self.columns:
            return
        kinds = (
            ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel_launch",
             "value LIKE '%LaunchKernel%' OR value LIKE '%LaunchCooperativeKernel%' OR value LIKE '%GraphLaunch%'"),
            ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy", "value LIKE '%Memcpy%'"),
        )
        for base, default_name, pred in kinds:
            gpu_table = self._resolve(base) or base
            # LEFT JOIN ... IS NULL, not NOT EXISTS: SQLite then builds one automatic index on the GPU table
            # instead of scanning it once per launch.
            join, missing = "", ""
            if gpu_table in self.columns and {"correlationId", "globalPid"} <= self.columns[gpu_table]:
                join = (f'LEFT JOIN "{gpu_table}" g ON g.correlationId = r.correlationId '
                        f"AND ((g.globalPid >> 24) & {_MASK24}) = ((r.globalTid >> 24) & {_MASK24})")
                missing = "AND g.correlationId IS NULL"
            apis = self._string_ids(pred)
            if not apis:
                continue
            sql = (f'SELECT r.rowid, r.start, r.globalTid, r.correlationId, r.nameId FROM "{rt}" r {join} '
                   f"WHERE r.nameId IN ({','.join(map(str, apis))}) {missing}")
            for batch in self._batches(sql):
                rows: list[dict[str, Any]] = []
                for rowid, start, gtid, corr, api_id in batch:
                    api = apis[api_id]
                    pid, tid = decode_global_tid(gtid)
                    op = self._op_at(pid, tid, start)
                    if op is not None:
                        fields: dict[str, Any] = dict(op.fields)
                        fields.update(name=op.name, category=op.category)
                    else:
                        fields = {"name": default_name, "category": "user"}
                    rows.append(self._event(pid, tid, start, "enter", line=rowid, detail=NO_COMPLETION,
                                            state="scheduled", callsite=f"{_API_VERSION.sub('', str(api))} "
                                                                        f"correlationId={corr}", **fields))
                self._emit_events(rows)

    def _sync_calls(self) -> None:
        rt = self._resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
        if rt not in self.columns or "StringIds" not in self.columns or not (
                {"start", "globalTid", "nameId"} <= self.columns[rt]):
            return  # already reported by _pending_gpu_work
        end = 'r."end"' if self._has(rt, "end") else "NULL"
        apis = self._string_ids("value LIKE '%Synchronize%' OR (value LIKE '%Memcpy%' AND value NOT LIKE '%Async%')")
        if not apis:
            return
        sql = (f'SELECT r.rowid, r.start, {end}, r.globalTid, r.nameId FROM "{rt}" r '
               f"WHERE r.nameId IN ({','.join(map(str, apis))})")
        for batch in self._batches(sql):
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, gtid, api_id in batch:
                api = apis[api_id]
                pid, tid = decode_global_tid(gtid)
                if pid is not None:
                    self.active_pids.add(pid)
                name = _API_VERSION.sub("", str(api))
                if stop is None or (start is not None and stop < start):
                    rows.append(self._event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                            detail=OPEN_AT_END))
                    continue
                rows.append(self._event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                        detail="CUDA API call"))
                rows.append(self._event(pid, tid, stop, "exit", name=name, category="sync", line=rowid,
                                        detail="CUDA API call"))
            self._emit_events(rows)
