"""Read ranktrace's periodic samples (``<run>/<host>/samples/{stacks,proc,gpu}.arrows``, Arrow IPC streams; the
``.arrow`` name runs before this one used is read alike) into the common tables.

Why: the monitor samples every rank's stacks, /proc threads and GPUs while the job runs (tracer.samplers). Those
samples say what a burst cannot: whether a stack kept changing before the hang, how long a thread has sat in the
same place, whether a GPU's memory or utilisation moved.

What comes out:

* STACKS — the last ``MAX_SNAPSHOTS`` samples per process from ``stacks.arrow``: one row per thread, ``wall_ns`` =
  when py-spy read it, ``snapshot`` = ``stacks.arrow[sample N pid P]``, ``source`` = ``pyspy``, ``line`` = the row
  in the file. Left out (``with_stacks=False``) for a job that completed cleanly: samples are older than the end,
  and stale stacks of a finished job would read as a rank still waiting.
* OBSERVATIONS (latest state only, so the table stays small):
  ``stack_change`` per thread (``value`` = seconds its stack has not changed as of its last sample, ``detail``
  samples / changes), ``thread_state`` per thread alive in the last two minutes of samples (``name`` = /proc state
  letter, ``value`` = CPU ns so far, ``detail`` comm, wchan, CPU ms in the last 10 s of samples), ``proc_memory``
  per process (``value`` = RSS bytes),
  ``gpu_util`` per GPU (``value`` = %), ``gpu_memory`` per GPU and per process on it (``value`` = bytes used),
  ``gpu_xid`` per Xid event, ``gpu_ecc`` when volatile uncorrected ECC errors are non-zero.
* ``ras_progress`` (``source`` = ``ras``) per communicator from a burst's ``ras.json``/``ras.txt`` (two RAS answers
  a moment apart, tracer.ras): ``value`` 1 when some rank's launched-op count moved between the two answers (NCCL
  still issues work: not hung), 0 when every comparable count stood still; ``detail`` says which counts.

Files are Arrow IPC streams; a batch cut by a killed writer ends the read (earlier batches are kept, one Skipped).
Known limits: RAS text output lists per-rank counts only for outlier ranks, so ``ras_progress`` from text compares
what was listed (JSON, NCCL 2.28.7+, lists every rank).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = ["FORMAT", "MAX_SNAPSHOTS", "sniff", "read", "read_table", "read_host", "ras_summary", "ras_progress"]

FORMAT = "ranktrace_samples"
MAX_SNAPSHOTS = 6
_PREFIX = b"ranktrace.samples."
_SNAP = re.compile(r"snapshot=(\d+)")


def sniff(path: Path, head: bytes) -> bool:
    return (head.startswith(b"\xff\xff\xff\xff") or head.startswith(b"ARROW1")) and _PREFIX in head


def read_table(path: Path) -> tuple[pa.Table, str, list[Skipped]]:
    """All complete batches of a samples file, its kind (stacks|proc|gpu) and what was cut."""
    skipped: list[Skipped] = []
    try:
        data = pa.memory_map(str(path))
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    with data:
        try:
            if data.read(6) == b"ARROW1":
                data.seek(0)
                reader: Any = ipc.open_file(data)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                sch = reader.schema
            else:
                data.seek(0)
                reader = ipc.open_stream(data)
                sch = reader.schema
                batches = []
                while True:
                    try:
                        batches.append(reader.read_next_batch())
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowInvalid) as e:
                        skipped.append(Skipped(str(path), len(batches),
                                               f"samples cut after {len(batches)} batch(es) (writer killed?): {e}"))
                        break
        except (OSError, pa.ArrowInvalid) as e:
            raise ReaderError(path, f"not an Arrow stream or file ({e})") from e
    name = (sch.metadata or {}).get(b"schema", b"").decode()
    if not name.startswith("ranktrace.samples."):
        raise ReaderError(path, "Arrow data without a ranktrace.samples schema")
    kind = name[len("ranktrace.samples."):].split("/")[0]
    return pa.Table.from_batches(batches, schema=sch), kind, skipped


def read(path: Path, host: str | None = None, with_stacks: bool = True) -> ReadResult:
    """Read one samples file (stacks, proc or gpu)."""
    path = Path(path)
    table, kind, skipped = read_table(path)
    host = host if host is not None else (path.parent.parent.name if path.parent.name == "samples" else None)
    file = str(path)
    if kind == "stacks":
        stacks, obs = _stacks(table, host, file, with_stacks)
        return ReadResult(file, FORMAT, "1", stacks=stacks, observations=obs, skipped=tuple(skipped))
    if kind == "proc":
        return ReadResult(file, FORMAT, "1", observations=_proc(table, host, file), skipped=tuple(skipped))
    if kind == "gpu":
        return ReadResult(file, FORMAT, "1", observations=_gpu(table, host, file), skipped=tuple(skipped))
    raise ReaderError(path, f"unknown samples kind {kind!r}")


def read_host(host_dir: Path, *, host: str | None = None, with_stacks: bool = True
              ) -> tuple[list[ReadResult], list[Skipped]]:
    """Every samples file of a host dir, plus ``ras_progress`` from the RAS answers its bursts saved."""
    results: list[ReadResult] = []
    skipped: list[Skipped] = []
    host = host or host_dir.name
    for f in sorted(p for p in (host_dir / "samples").glob("*.arrow*") if p.suffix in (".arrows", ".arrow")):
        try:
            results.append(read(f, host=host, with_stacks=with_stacks))
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, e.reason))
        except Exception as e:  # a reader bug must not lose the rest of the trace
            skipped.append(Skipped(str(f), None, f"{FORMAT} reader failed: {type(e).__name__}: {e}"))
    for f in sorted((host_dir / "dumps").glob("*/ras.*")):
        try:
            obs = ras_progress(f, host=host)
            if obs.num_rows:
                results.append(ReadResult(str(f), FORMAT, "1", observations=obs))
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, e.reason))
        except Exception as e:
            skipped.append(Skipped(str(f), None, f"RAS progress failed: {type(e).__name__}: {e}"))
    return results, skipped


# ------------------------------------------------------------------------------------------------ stacks.arrow

def _stacks(t: pa.Table, host: str | None, file: str, with_stacks: bool) -> tuple[pa.Table, pa.Table]:
    t = t.append_column("_row", pa.array(range(t.num_rows), pa.int64()))
    defs = t.filter(pc.equal(t["kind"], "stack"))
    samples = t.filter(pc.and_(pc.equal(t["kind"], "sample"), pc.is_valid(t["stack_id"])))
    if samples.num_rows == 0:
        return schema.empty(schema.STACKS), schema.empty(schema.OBSERVATIONS)
    # stack_change: per thread, seconds since its stack last changed (first sample counts as a change)
    changed = pc.fill_null(samples["changed"], True)
    s2 = samples.append_column("_chg", changed).append_column("_chg_i", pc.cast(changed, pa.int64()))
    per = s2.group_by(["pid", "tid"], use_threads=False).aggregate(
        [("wall_ns", "max"), ("wall_ns", "count"), ("_chg_i", "sum"), ("thread_name", "last"), ("rank", "last")])
    lastchg = s2.filter(s2["_chg"]).group_by(["pid", "tid"], use_threads=False).aggregate([("wall_ns", "max")])
    last_change = {(r["pid"], r["tid"]): r["wall_ns_max"] for r in lastchg.to_pylist()}
    obs = []
    for r in per.to_pylist():
        lc = last_change.get((r["pid"], r["tid"]), r["wall_ns_max"])
        still = max(0, (r["wall_ns_max"] - lc) // 1_000_000_000)
        obs.append({"host": host, "pid": r["pid"], "tid": r["tid"], "rank": r["rank_last"], "wall_ns": r["wall_ns_max"],
                    "kind": "stack_change", "name": r["thread_name_last"], "value": int(still),
                    "detail": f"samples={r['wall_ns_count']} changes={r['_chg_i_sum'] - 1} unchanged_s={still}",
                    "source": "pyspy", "file": file})
    obs_table = schema.table_from_rows(schema.OBSERVATIONS, obs)
    if not with_stacks:
        return schema.empty(schema.STACKS), obs_table
    # the last MAX_SNAPSHOTS samples of each process
    pairs = samples.group_by(["pid", "sample_id"], use_threads=False).aggregate([]).sort_by(
        [("pid", "ascending"), ("sample_id", "descending")])
    keep: list[int] = []
    count: dict[Any, int] = {}
    for pid, sid in zip(pairs["pid"].to_pylist(), pairs["sample_id"].to_pylist()):
        if count.get(pid, 0) < MAX_SNAPSHOTS:
            count[pid] = count.get(pid, 0) + 1
            keep.append((pid << 24) ^ sid)
    key = pc.bit_wise_xor(pc.shift_left(samples["pid"], 24), samples["sample_id"])
    kept = samples.filter(pc.is_in(key, value_set=pa.array(keep, pa.int64())))
    idx = pc.index_in(kept["stack_id"], value_set=defs["stack_id"])
    frames = defs["frames"].take(idx)
    n = kept.num_rows
    snapshot = pc.binary_join_element_wise(
        pa.array(["stacks.arrow[sample "] * n), pc.cast(kept["sample_id"], pa.string()),
        pa.array([" pid "] * n), pc.cast(kept["pid"], pa.string()), pa.array(["]"] * n), "")
    stacks = pa.table({
        "host": pa.array([host] * n, pa.string()), "pid": kept["pid"], "tid": kept["tid"], "rank": kept["rank"],
        "wall_ns": kept["wall_ns"], "t_ns": kept["t_ns"], "thread_name": kept["thread_name"],
        "thread_state": kept["thread_state"], "frames": frames, "native": pa.array([False] * n),
        "snapshot": snapshot, "source": pa.array(["pyspy"] * n), "file": pa.array([file] * n), "line": kept["_row"],
    }, schema=schema.STACKS)
    return stacks, obs_table


# -------------------------------------------------------------------------------------------------- proc.arrow

def _last_per(t: pa.Table, keys: list[str], cols: list[str]) -> list[dict[str, Any]]:
    t = t.sort_by([("wall_ns", "ascending")])
    agg = t.group_by(keys, use_threads=False).aggregate([(c, "last") for c in cols])
    return [{**{k: r[k] for k in keys}, **{c: r[f"{c}_last"] for c in cols}} for r in agg.to_pylist()]


def _proc(t: pa.Table, host: str | None, file: str) -> pa.Table:
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
        for r in _last_per(threads, ["pid", "tid"], ["rank", "wall_ns", "comm", "state", "wchan", "cpu_ns"]):
            recent_ms = delta.get((r["pid"], r["tid"]), 0) // 1_000_000
            obs.append({"host": host, "pid": r["pid"], "tid": r["tid"], "rank": r["rank"], "wall_ns": r["wall_ns"],
                        "kind": "thread_state", "name": r["state"], "value": r["cpu_ns"],
                        "detail": f"comm={r['comm']} wchan={r['wchan'] or '-'} cpu_ms={(r['cpu_ns'] or 0) // 1_000_000}"
                                  f" cpu_ms_last_10s={recent_ms}",
                        "source": "proc", "file": file})
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


# --------------------------------------------------------------------------------------------------- gpu.arrow

def _gpu(t: pa.Table, host: str | None, file: str) -> pa.Table:
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


# ------------------------------------------------------------------------------------------------ NCCL RAS pair

def ras_summary(path: Path) -> dict[str, Any]:
    """Compare consecutive RAS answers in one file (tracer.ras saves two): counts per comm, moved, missing, dead.

    ``moved`` is True when any launched-op count grew between the first and the last answer, False when counts
    were comparable and none grew, None when there is nothing to compare (one answer, or no counts printed).
    """
    from ranktrace.analyzers.readers import nccl_ras

    obs = nccl_ras.read(Path(path)).observations.to_pylist()
    counts: dict[int, dict[tuple[Any, Any, Any], int]] = {}
    for o in obs:
        if o["kind"] != "ras_op_count" or o["value"] is None:
            continue
        m = _SNAP.search(o["detail"] or "")
        snap = int(m.group(1)) if m else 1
        key = (o["group"], o["rank"], o["name"])
        cur = counts.setdefault(snap, {})
        cur[key] = max(cur.get(key, o["value"]), o["value"])
    snaps = sorted(counts)
    comms: dict[str, dict[str, Any]] = {}
    for snap in snaps:
        for (g, r, name), v in counts[snap].items():
            c = comms.setdefault(g, {"moved": None, "counts": {}, "changes": []})
            c["counts"].setdefault(str(snap), {})[f"{'r' + str(r) if r is not None else 'unlisted'} {name}"] = v
    if len(snaps) >= 2:
        first, last = counts[snaps[0]], counts[snaps[-1]]
        for key, v2 in last.items():
            if key in first:
                c = comms[key[0]]
                grew = v2 > first[key]
                c["moved"] = bool(c["moved"]) or grew
                if grew:
                    r = f"rank {key[1]}" if key[1] is not None else "unlisted ranks"
                    c["changes"].append(f"{r} {key[2]} {first[key]}->{v2}")
    flags = [c["moved"] for c in comms.values() if c["moved"] is not None]
    last_snap = max((int(m.group(1)) for o in obs if (m := _SNAP.search(o["detail"] or ""))), default=1)

    def rows(kind: str) -> list[dict[str, Any]]:
        out = []
        for o in obs:
            m = _SNAP.search(o["detail"] or "")
            if o["kind"] == kind and (m is None or int(m.group(1)) == last_snap):
                out.append({k: o[k] for k in ("group", "rank", "pid", "host") if o.get(k) is not None})
        return out

    return {"snapshots": len(snaps), "moved": (any(flags) if flags else None), "comms": comms,
            "missing": rows("ras_missing_rank"), "dead": rows("ras_dead_rank") + rows("ras_dead_process")}


def ras_progress(path: Path, host: str | None = None) -> pa.Table:
    """``ras_progress`` observations (one per communicator with comparable counts) from a saved RAS pair."""
    s = ras_summary(path)
    obs = []
    for g, c in s["comms"].items():
        if c["moved"] is None:
            continue
        detail = ("counts moved: " + ", ".join(c["changes"][:8])) if c["moved"] else \
            f"no launched-op count moved across {s['snapshots']} RAS answers"
        obs.append({"host": host, "kind": "ras_progress", "group": g, "value": 1 if c["moved"] else 0,
                    "detail": detail, "source": "ras", "file": str(path)})
    return schema.table_from_rows(schema.OBSERVATIONS, obs)
