"""When the job ends: rings -> events.arrow, and the facts only the rings know (pid -> rank, versions) -> meta.json.

Rings are kept (the raw record is the evidence); events.arrow is the analysis-ready
copy. Finalizing is idempotent and never deletes anything the job or the user wrote.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers import ranktrace_ring
from ranktrace.tracer.ringreader import RingError, read_ring

__all__ = ["finalize_host_dir", "EVENTS_SCHEMA_VERSION", "write_events", "seal_samples"]

EVENTS_SCHEMA_VERSION = "ranktrace.events/1"


def write_events(path: Path, table: pa.Table) -> None:
    """Arrow IPC *file* with the schema version in its metadata (self-describing)."""
    table = table.replace_schema_metadata({"schema": EVENTS_SCHEMA_VERSION})
    tmp = path.with_name(path.name + ".tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1 << 16)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: no half file left to hold its space (the rings stay the record)
        raise
    tmp.replace(path)


def seal_samples(host_dir: Path) -> list[str]:
    """samples/<name>.arrows (Arrow IPC streams, flushed while the job ran) -> samples/<name>.arrow (an Arrow IPC
    file, the trace dir's contract name, readable by ``pyarrow.ipc.open_file`` and DuckDB), the stream removed once
    the file is in place. Every complete batch is kept; a batch cut by a kill is the only loss. Returns problems."""
    problems: list[str] = []
    for stream in sorted((host_dir / "samples").glob("*.arrows")):
        target = stream.with_suffix(".arrow")
        try:
            with pa.OSFile(str(stream), "rb") as src:
                reader = ipc.open_stream(src)
                schema_, batches = reader.schema, []
                try:
                    for batch in reader:
                        batches.append(batch)
                except (pa.ArrowInvalid, OSError):
                    pass  # a batch cut mid-write: the ones before it stand
            tmp = target.with_name(target.name + ".tmp")
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema_) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            tmp.replace(target)
            stream.unlink()
        except (pa.ArrowInvalid, OSError) as e:
            problems.append(f"{stream.name} kept as a stream: {e}")
    return problems


def remove_stale_sockets(host_dir: Path) -> int:
    """Remove the agent sockets of processes that are gone (a forked child ends with os._exit, a killed one with
    nothing: neither removes its own); a process still alive (a daemon the job left running) keeps its socket."""
    removed = 0
    try:
        names = os.listdir(host_dir / "agents")
    except OSError:
        return 0
    for name in names:
        head = name.split(".")[0]
        if not (name.endswith(".sock") and head.isdigit()):
            continue
        try:
            os.kill(int(head), 0)
            continue  # alive (or not ours to signal): keep
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(host_dir / "agents" / name)
            removed += 1
        except OSError:
            pass
    return removed


def finalize_host_dir(host_dir: Path) -> dict[str, Any]:
    """Write events.arrow from every ring; return {'pids': {pid: {...}}, 'versions': {...}, 'problems': [...],
    'hook_problems': [{'target', 'problem', 'ranks', 'pids'}]} (--hook targets that did not resolve, per job)."""
    host = host_dir.name
    tables: list[pa.Table] = []
    pids: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    problems: list[str] = []
    hook_problems: dict[tuple[str, str], dict[str, Any]] = {}
    for ring in sorted((host_dir / "rings").glob("*.ring")):
        try:
            rc = read_ring(str(ring))
        except (RingError, OSError) as e:
            problems.append(str(e))
            continue
        rel = str(ring.relative_to(host_dir))
        tables.append(ranktrace_ring.ring_to_events(rc, host, rel))
        ident = ranktrace_ring.identity_of(rc)
        pids[str(rc.pid)] = {"rank": ident.get("rank"), "world": ident.get("world"),
                             "local_rank": ident.get("local_rank"), "ppid": ident.get("ppid"),
                             "argv": ident.get("argv"), "ring": rel,
                             "ops": rc.num_slots}
        for m in rc.meta:
            if m.get("type") == "versions":
                versions.update({k: v for k, v in m.items() if k != "type" and v is not None})
            elif m.get("type") == "hook_problem":  # --hook targets a rank could not patch (tracer.user_hooks)
                hp = hook_problems.setdefault((str(m.get("target")), str(m.get("problem"))),
                                              {"target": m.get("target"), "problem": m.get("problem"), "ranks": [],
                                               "pids": []})
                hp["pids"].append(rc.pid)
                if ident.get("rank") is not None and ident["rank"] not in hp["ranks"]:
                    hp["ranks"].append(ident["rank"])
        if rc.torn_meta:
            problems.append(f"{rel}: {rc.torn_meta} torn meta record(s)")
    write_events(host_dir / "events.arrow", schema.concat(schema.EVENTS, tables))
    problems.extend(seal_samples(host_dir))
    remove_stale_sockets(host_dir)
    return {"pids": pids, "versions": versions, "problems": problems,
            "hook_problems": [dict(v, ranks=sorted(v["ranks"]), pids=sorted(v["pids"])) for v in hook_problems.values()]}
