"""The stages that make EVENTS: NVTX ranges and marks (ranktrace-domain op texts parsed, op ranges remembered),
completed NCCL kernels, GPU work launched with no completion recorded, and host-blocking CUDA calls; GPU work takes
the name of the op range it was launched in, when there is one."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats.opnames import COLLECTIVE_OPS, P2P_OPS, canonical_op
from ranktrace.analyzers.readers.nsys.decode import (API_VERSION, BACKEND_PREFIX, MASK24, NO_COMPLETION,
                                                     NVTX_DOMAIN_CREATE, NVTX_END_ONLY, NVTX_MARKS, NVTX_OPEN,
                                                     NVTX_RANGES, NVTX_TOKENS, OPEN_AT_END, OPENED_BEFORE,
                                                     RANK_TOKEN, RANKTRACE_DOMAIN, RANKTRACE_TEXT, decode_global_tid,
                                                     parse_nccl_kernel_name)
from ranktrace.analyzers.readers.nsys.export import Export, OpRange

__all__ = ["nvtx", "kernels", "pending_gpu_work", "sync_calls"]


def nvtx(ex: Export) -> None:
    t = ex.table("NVTX_EVENTS", ("start", "eventType", "globalTid"), "no NVTX ranges")
    if not t:
        return
    has = lambda c: ex.has(t, c)  # noqa: E731
    text = "COALESCE(n.text, s.value)" if has("textId") and "StringIds" in ex.columns else (
        "n.text" if has("text") else "NULL")
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if "s.value" in text else ""
    end = 'n."end"' if has("end") else "NULL"
    dom = "n.domainId" if has("domainId") else "0"
    for batch in ex.batches(f'SELECT n.globalTid, {dom}, {text} FROM "{t}" n {join} '
                               f"WHERE n.eventType = {NVTX_DOMAIN_CREATE}"):
        for gtid, domain_id, name in batch:
            pid, _ = decode_global_tid(gtid)
            if pid is not None and name:
                ex.domains[(pid, int(domain_id or 0))] = str(name)
    types = ",".join(str(x) for x in NVTX_MARKS + NVTX_RANGES + NVTX_OPEN + NVTX_END_ONLY)
    sql = (f'SELECT n.rowid, n.start, {end}, n.eventType, n.globalTid, {dom}, {text} FROM "{t}" n {join} '
           f"WHERE n.eventType IN ({types})")
    for batch in ex.batches(sql):
        rows: list[dict[str, Any]] = []
        for rowid, start, stop, etype, gtid, domain_id, name in batch:
            pid, tid = decode_global_tid(gtid)
            if pid is not None:
                ex.active_pids.add(pid)
            domain = ex.domains.get((pid or 0, int(domain_id or 0)))
            rows.extend(_nvtx_rows(ex, rowid, start, stop, int(etype), pid, tid, domain, name))
        ex.emit_events(rows)
    for key, ranges in ex.op_ranges.items():
        ranges.sort(key=lambda r: r.start)
        ex.op_starts[key] = [r.start for r in ranges]


def _nvtx_rows(ex: Export, rowid: int, start: int | None, stop: int | None, etype: int, pid: int | None,
               tid: int | None, domain: str | None, text: Any) -> list[dict[str, Any]]:
    text = "" if text is None else str(text)
    # the domain-create row can be missing (sliced exports): fall back to the text's own shape
    is_ranktrace = (domain or "").lower() == RANKTRACE_DOMAIN or (domain is None and RANKTRACE_TEXT.match(text)
                                                                  is not None)
    fields: dict[str, Any] = {}
    name, category = text, "user"
    if is_ranktrace:
        name, category, fields = _ranktrace_text(ex, text, pid)
    elif pid is not None:
        for m in RANK_TOKEN.finditer(text):
            ex.rank_hints[pid]["NVTX text rank="].add(int(m.group(1)))
    if etype in NVTX_MARKS:
        return [ex.event(pid, tid, start, "mark", name=name, category=category, line=rowid,
                            detail=_nvtx_detail(domain), **fields)]
    if etype in NVTX_END_ONLY:
        t = stop if stop is not None else start
        return [ex.event(pid, tid, t, "exit", name=name, category=category, line=rowid,
                            detail=OPENED_BEFORE, **fields)]
    is_open = etype in NVTX_OPEN or stop is None
    _remember_op_range(ex, pid, tid, start, None if is_open else stop, name, category, fields, is_ranktrace,
                            text)
    if is_open:
        return [ex.event(pid, tid, start, "enter", name=name, category=category, line=rowid,
                            detail=OPEN_AT_END, **fields)]
    detail = _nvtx_detail(domain)
    return [ex.event(pid, tid, start, "enter", name=name, category=category, line=rowid, detail=detail,
                        **fields),
            ex.event(pid, tid, stop, "exit", name=name, category=category, line=rowid, detail=detail,
                        **fields)]


def _ranktrace_text(ex: Export, text: str, pid: int | None) -> tuple[str, str, dict[str, Any]]:
    """(name, category, fields) of a ranktrace-domain text ``<op> key=value ...``; rank/world become hints."""
    parts = text.split()
    head = parts[0] if parts else ""
    fields: dict[str, Any] = {}
    for tok in parts[1:]:
        key, sep, value = tok.partition("=")
        if not sep:
            continue
        key = key.lower()
        if key in ("rank", "world", "world_size"):
            if value.isdigit() and pid is not None:
                if key == "rank":
                    ex.rank_hints[pid]["ranktrace NVTX rank="].add(int(value))
                else:
                    ex.world_hints.add(int(value))
            continue
        spec = NVTX_TOKENS.get(key)
        if spec is None:
            continue
        column, typ = spec
        try:
            fields[column] = typ(value)
        except ValueError:
            continue
    op = canonical_op(head) if head else head
    if op in P2P_OPS:
        return op, "p2p", fields
    if op in COLLECTIVE_OPS:
        return op, "collective", fields
    return text, "user", fields


def _remember_op_range(ex: Export, pid: int | None, tid: int | None, start: int | None, stop: int | None,
                       name: str, category: str, fields: dict[str, Any], ranktrace: bool, text: str) -> None:
    if pid is None or tid is None or start is None:
        return
    if not ranktrace:  # PyTorch emit_nvtx "nccl:all_reduce, op_id = 7" or NCCL's "ncclAllReduce"
        raw = text.split(",", 1)[0].strip()
        if BACKEND_PREFIX.match(raw):
            op = canonical_op(raw)
        elif raw.startswith("nccl") and raw[4:5].isupper():
            op = canonical_op(raw[4:])
        else:
            return
        if op in P2P_OPS:
            name, category = op, "p2p"
        elif op in COLLECTIVE_OPS:
            name, category = op, "collective"
        else:
            return
    elif category == "user":
        return
    ex.op_ranges[(pid, tid)].append(OpRange(int(start), float("inf") if stop is None else int(stop),
                                               name, category, tuple(fields.items()), ranktrace))


def _nvtx_detail(domain: str | None) -> str:
    return f"NVTX domain {domain}" if domain else "NVTX"


def kernels(ex: Export) -> None:
    t = ex.table("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId", "globalPid"),
                    "no completed kernels")
    if not t or "StringIds" not in ex.columns:
        return
    name_col = "shortName" if ex.has(t, "shortName") else ("demangledName" if ex.has(t, "demangledName")
                                                               else None)
    if name_col is None:
        ex.skip(f"table {t} has no kernel name column: NCCL kernels not read")
        return
    graph = "k.graphId" if ex.has(t, "graphId") else "NULL"
    device = "k.deviceId" if ex.has(t, "deviceId") else "NULL"
    rt = ex.resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
    launch_cols, launch_join = "NULL, NULL", ""
    if {"correlationId", "globalTid", "start"} <= ex.columns.get(rt, set()):
        launch_cols = "r.globalTid, r.start"
        launch_join = (f'LEFT JOIN "{rt}" r ON r.correlationId = k.correlationId '
                       f"AND ((r.globalTid >> 24) & {MASK24}) = ((k.globalPid >> 24) & {MASK24})")
    names = ex.string_ids("value LIKE 'nccl%'")
    sql = (f'SELECT k.rowid, k.start, k."end", {device}, k.globalPid, k.{name_col}, {graph}, {launch_cols} '
           f'FROM "{t}" k {launch_join} WHERE k.{name_col} IN ({",".join(map(str, names)) or "NULL"})')
    for batch in ex.batches(sql) if names else ():
        rows: list[dict[str, Any]] = []
        for rowid, start, stop, dev, gpid, kname_id, graph_id, launch_tid, launch_t in batch:
            kname = names[kname_id]
            pid, _ = decode_global_tid(gpid)
            _, tid = decode_global_tid(launch_tid)
            raw_op, dtype = parse_nccl_kernel_name(str(kname))
            fields = _op_fields(ex, pid, tid, launch_t, raw_op)
            fields.setdefault("dtype", dtype)
            detail = f"kernel {kname}" + (f" on device {dev}" if dev is not None else "")
            common = dict(line=rowid, detail=detail, graph_id=graph_id, **fields)
            rows.append(ex.event(pid, tid, start, "enter", **common))
            if stop is not None:
                rows.append(ex.event(pid, tid, stop, "complete", state="completed", **common))
        ex.emit_events(rows)
    if device != "NULL":
        rows = []
        for gpid, dev, count in ex.conn.execute(f'SELECT globalPid, deviceId, COUNT(*) FROM "{t}" '
                                                  f"GROUP BY globalPid, deviceId"):
            pid, _ = decode_global_tid(gpid)
            if pid is not None:
                ex.active_pids.add(pid)
            rows.append(ex.obs(pid, None, "pid_device", name=None if dev is None else str(dev), value=count))
        ex.emit_obs(rows)


def _op_fields(ex: Export, pid: int | None, tid: int | None, t: int | None, raw_op: str) -> dict[str, Any]:
    """name/category (+ group/seq/...) for GPU work launched at (pid, tid, t)."""
    op = ex.op_at(pid, tid, t)
    if op is not None:
        fields = dict(op.fields)
        fields.update(name=op.name, category=op.category)
        return fields
    name = canonical_op(raw_op)
    category = "p2p" if raw_op == "SendRecv" or name in P2P_OPS else "collective"
    return {"name": name, "category": category}


def pending_gpu_work(ex: Export) -> None:
    rt = ex.table("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "correlationId", "globalTid", "nameId"),
                     "launches without a finished kernel cannot be found")
    if not rt or "StringIds" not in ex.columns:
        return
    kinds = (
        ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel_launch",
         "value LIKE '%LaunchKernel%' OR value LIKE '%LaunchCooperativeKernel%' OR value LIKE '%GraphLaunch%'"),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy", "value LIKE '%Memcpy%'"),
    )
    for base, default_name, pred in kinds:
        gpu_table = ex.resolve(base) or base
        # LEFT JOIN ... IS NULL, not NOT EXISTS: SQLite then builds one automatic index on the GPU table
        # instead of scanning it once per launch.
        join, missing = "", ""
        if gpu_table in ex.columns and {"correlationId", "globalPid"} <= ex.columns[gpu_table]:
            join = (f'LEFT JOIN "{gpu_table}" g ON g.correlationId = r.correlationId '
                    f"AND ((g.globalPid >> 24) & {MASK24}) = ((r.globalTid >> 24) & {MASK24})")
            missing = "AND g.correlationId IS NULL"
        apis = ex.string_ids(pred)
        if not apis:
            continue
        sql = (f'SELECT r.rowid, r.start, r.globalTid, r.correlationId, r.nameId FROM "{rt}" r {join} '
               f"WHERE r.nameId IN ({','.join(map(str, apis))}) {missing}")
        for batch in ex.batches(sql):
            rows: list[dict[str, Any]] = []
            for rowid, start, gtid, corr, api_id in batch:
                api = apis[api_id]
                pid, tid = decode_global_tid(gtid)
                op = ex.op_at(pid, tid, start)
                if op is not None:
                    fields: dict[str, Any] = dict(op.fields)
                    fields.update(name=op.name, category=op.category)
                else:
                    fields = {"name": default_name, "category": "user"}
                rows.append(ex.event(pid, tid, start, "enter", line=rowid, detail=NO_COMPLETION,
                                        state="scheduled", callsite=f"{API_VERSION.sub('', str(api))} "
                                                                    f"correlationId={corr}", **fields))
            ex.emit_events(rows)


def sync_calls(ex: Export) -> None:
    rt = ex.resolve("CUPTI_ACTIVITY_KIND_RUNTIME") or ""
    if rt not in ex.columns or "StringIds" not in ex.columns or not (
            {"start", "globalTid", "nameId"} <= ex.columns[rt]):
        return  # already reported by _pending_gpu_work
    end = 'r."end"' if ex.has(rt, "end") else "NULL"
    apis = ex.string_ids("value LIKE '%Synchronize%' OR (value LIKE '%Memcpy%' AND value NOT LIKE '%Async%')")
    if not apis:
        return
    sql = (f'SELECT r.rowid, r.start, {end}, r.globalTid, r.nameId FROM "{rt}" r '
           f"WHERE r.nameId IN ({','.join(map(str, apis))})")
    for batch in ex.batches(sql):
        rows: list[dict[str, Any]] = []
        for rowid, start, stop, gtid, api_id in batch:
            api = apis[api_id]
            pid, tid = decode_global_tid(gtid)
            if pid is not None:
                ex.active_pids.add(pid)
            name = API_VERSION.sub("", str(api))
            if stop is None or (start is not None and stop < start):
                rows.append(ex.event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                        detail=OPEN_AT_END))
                continue
            rows.append(ex.event(pid, tid, start, "enter", name=name, category="sync", line=rowid,
                                    detail="CUDA API call"))
            rows.append(ex.event(pid, tid, stop, "exit", name=name, category="sync", line=rowid,
                                    detail="CUDA API call"))
        ex.emit_events(rows)
