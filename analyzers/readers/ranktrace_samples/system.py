"""``samples/proc.arrow`` and ``samples/gpu.arrow``: the latest state of each thread, process and GPU the monitor
sampled, as observations (the tables stay small whatever the length of the run)."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.tracer.formats import schema

__all__ = ["read_proc", "read_gpu"]


def _last_per(t: pa.Table, keys: list[str], cols: list[str]) -> list[dict[str, Any]]:
    t = t.sort_by([("wall_ns", "ascending")])
    agg = t.group_by(keys, use_threads=False).aggregate([(c, "last") for c in cols])
    return [{**{k: r[k] for k in keys}, **{c: r[f"{c}_last"] for c in cols}} for r in agg.to_pylist()]


def read_proc(t: pa.Table, host: str | None, file: str) -> pa.Table:
    """``thread_state`` per thread alive in the last two minutes of samples, ``proc_memory`` per process."""
    if t.num_rows == 0:
        return schema.empty(schema.OBSERVATIONS)
    obs: list[dict[str, Any]] = []
    # every live thread has a row at least every THREAD_KEYFRAME_S (30 s): the last two minutes hold the latest
    # state of each, whatever the length of the run
    t = t.filter(pc.greater_equal(t["wall_ns"], pc.max(t["wall_ns"]).as_py() - 120_000_000_000))
    threads = t.filter(pc.equal(t["kind"], "thread"))
    if threads.num_rows:
        cpu = pc.add(pc.fill_null(threads["utime_ns"], 0), pc.fill_null(threads["stime_ns"], 0))
        threads = threads.append_column("cpu_ns", cpu)
        end = pc.max(threads["wall_ns"]).as_py()
        recent = threads.filter(pc.greater_equal(threads["wall_ns"], end - 10_000_000_000))
        delta = {(r["pid"], r["tid"]): (r["cpu_ns_max"] or 0) - (r["cpu_ns_min"] or 0) for r in recent.group_by(
            ["pid", "tid"], use_threads=False).aggregate([("cpu_ns", "max"), ("cpu_ns", "min")]).to_pylist()}
        since = _state_since(threads)
        for r in _last_per(threads, ["pid", "tid"], ["rank", "wall_ns", "comm", "state", "wchan", "cpu_ns"]):
            recent_ms = delta.get((r["pid"], r["tid"]), 0) // 1_000_000
            obs.append({"host": host, "pid": r["pid"], "tid": r["tid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "thread_state", "name": r["state"], "value": r["cpu_ns"],
                        "detail": f"comm={r['comm']} wchan={r['wchan'] or '-'} cpu_ms={(r['cpu_ns'] or 0) // 1_000_000}"
                                  f" cpu_ms_last_10s={recent_ms} since_ns={since.get((r['pid'], r['tid']), '-')}",
                        "source": "proc", "file": file})
    obs += _host_waits(t, host, file)
    procs = t.filter(pc.equal(t["kind"], "process"))
    if procs.num_rows:
        for r in _last_per(procs, ["pid"], ["rank", "wall_ns", "comm", "rss_bytes", "vms_bytes", "majflt",
                                            "read_bytes", "write_bytes", "num_threads"]):
            obs.append({"host": host, "pid": r["pid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "proc_memory", "name": r["comm"], "value": r["rss_bytes"],
                        "detail": f"vms={r['vms_bytes']} majflt={r['majflt']} read_bytes={r['read_bytes']} "
                                  f"write_bytes={r['write_bytes']} threads={r['num_threads']}",
                        "source": "proc", "file": file})
    return schema.table_from_rows(schema.OBSERVATIONS, obs)


def _host_waits(t: pa.Table, host: str | None, file: str) -> list[dict[str, Any]]:
    """The watchdog's host-wait probes (tracer/watch/wait_probe.py), latest per process (and per lock file):
    ``host_wait`` (name = syscall, value = first peer pid, detail ``fd= peers= ... target=<fd target>``),
    ``lock_file`` (name = path, value = its age in s at the sample, detail ``holders= waiters= openers= builders=``),
    ``child_process`` (name = state, value = CPU ns, detail ``comm= ppid= root= cpu_ms_last_10s= cmd=...``).
    Files written before these rows existed have no such columns: nothing is said."""
    if "path" not in t.column_names:
        return []
    out: list[dict[str, Any]] = []
    end = pc.max(t["wall_ns"]).as_py()
    waits = t.filter(pc.equal(t["kind"], "wait"))
    if waits.num_rows:
        for r in _last_per(waits, ["pid"], ["tid", "rank", "wall_ns", "state", "path", "peer_pid", "detail"]):
            syscall, _, rest = (r["detail"] or "").partition(" ")
            out.append({"host": host, "pid": r["pid"], "tid": r["tid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "host_wait", "name": syscall.removeprefix("syscall=") or None, "value": r["peer_pid"],
                        "detail": f"state={r['state']} {rest} target={r['path'] or '-'}", "source": "proc",
                        "file": file})
    locks = t.filter(pc.equal(t["kind"], "lock"))
    if locks.num_rows:
        for r in _last_per(locks, ["pid", "path"], ["rank", "wall_ns", "peer_pid", "detail"]):
            mtime = _field(r["detail"], "mtime_ns")
            age = (r["wall_ns"] - int(mtime)) // 1_000_000_000 if mtime and mtime.isdigit() else None
            out.append({"host": host, "pid": r["pid"], "rank": r["rank"], "wall_ns": r["wall_ns"], "kind": "lock_file",
                        "name": r["path"], "value": age, "detail": r["detail"], "source": "proc", "file": file})
    kids = t.filter(pc.equal(t["kind"], "child"))
    if kids.num_rows:
        kids = kids.filter(pc.greater_equal(kids["wall_ns"], end - 60_000_000_000))
        recent = kids.filter(pc.greater_equal(kids["wall_ns"], end - 10_000_000_000))
        delta = {r["pid"]: (r["utime_ns_max"] or 0) - (r["utime_ns_min"] or 0) for r in recent.group_by(
            ["pid"], use_threads=False).aggregate([("utime_ns", "max"), ("utime_ns", "min")]).to_pylist()}
        for r in _last_per(kids, ["pid"], ["rank", "wall_ns", "comm", "state", "utime_ns", "ppid", "detail"]):
            root, _, cmd = (r["detail"] or "").partition(" ")
            out.append({"host": host, "pid": r["pid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "child_process", "name": r["state"], "value": r["utime_ns"],
                        "detail": f"comm={r['comm']} ppid={r['ppid']} {root} "
                                  f"cpu_ms_last_10s={delta.get(r['pid'], 0) // 1_000_000} {cmd}",
                        "source": "proc", "file": file})
    return out


def _state_since(threads: pa.Table) -> dict[tuple[int, int], int]:
    """(pid, tid) -> the first sample of the state its thread is in now (rows are written on change, so this is when
    it entered it, or no later than the oldest row kept when it never left it)."""
    out: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], str | None] = {}
    t = threads.select(["pid", "tid", "state", "wall_ns"]).sort_by([("wall_ns", "ascending")])
    for pid, tid, state, wall in zip(*(t[c].to_pylist() for c in ("pid", "tid", "state", "wall_ns"))):
        key = (pid, tid)
        if key not in last or last[key] != state:
            out[key], last[key] = wall, state
    return out


def _field(detail: str | None, key: str) -> str | None:
    for part in (detail or "").split():
        if part.startswith(key + "="):
            return part[len(key) + 1:]
    return None


def read_gpu(t: pa.Table, host: str | None, file: str) -> pa.Table:
    """``gpu_util`` / ``gpu_memory`` per GPU (latest), ``gpu_memory`` per process on it, ``gpu_xid``, ``gpu_ecc``."""
    if t.num_rows == 0:
        return schema.empty(schema.OBSERVATIONS)
    obs: list[dict[str, Any]] = []
    dev = t.filter(pc.equal(t["kind"], "device"))
    if dev.num_rows:
        cols = ["wall_ns", "uuid", "util_gpu", "util_mem", "mem_used", "mem_total", "power_mw", "sm_clock_mhz",
                "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps", "ecc_uncorrected"]
        for r in _last_per(dev, ["gpu"], cols):
            base = {"host": host, "wall_ns": r["wall_ns"], "name": f"gpu{r['gpu']}", "source": "gpu", "file": file}
            obs.append({**base, "kind": "gpu_util", "value": r["util_gpu"],
                        "detail": f"util_mem={r['util_mem']} power_mw={r['power_mw']} sm_clock_mhz={r['sm_clock_mhz']}"
                                  f" temperature_c={r['temperature_c']} pcie_tx_kbps={r['pcie_tx_kbps']}"
                                  f" pcie_rx_kbps={r['pcie_rx_kbps']} uuid={r['uuid']}"})
            obs.append({**base, "kind": "gpu_memory", "value": r["mem_used"], "detail": f"total={r['mem_total']}"})
            if r["ecc_uncorrected"]:
                obs.append({**base, "kind": "gpu_ecc", "value": r["ecc_uncorrected"],
                            "detail": "volatile uncorrected ECC errors"})
    procs = t.filter(pc.equal(t["kind"], "process"))
    if procs.num_rows:
        last = pc.max(procs["wall_ns"]).as_py()
        for r in _last_per(procs.filter(pc.equal(procs["wall_ns"], last)), ["gpu", "pid"],
                           ["wall_ns", "rank", "mem_used"]):
            obs.append({"host": host, "pid": r["pid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "gpu_memory", "name": f"gpu{r['gpu']}", "value": r["mem_used"],
                        "detail": "process", "source": "gpu", "file": file})
    xids = t.filter(pc.equal(t["kind"], "xid"))
    for r in xids.to_pylist():
        obs.append({"host": host, "wall_ns": r["wall_ns"], "kind": "gpu_xid", "name": f"gpu{r['gpu']}",
                    "value": r["xid"], "detail": r["detail"], "source": "gpu", "file": file})
    return schema.table_from_rows(schema.OBSERVATIONS, obs)
