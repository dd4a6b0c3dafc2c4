"""When the job ends: rings -> events.arrow, and the facts only the rings know (pid -> rank, versions) -> meta.json.

events.arrow (with its index) holds every record of every ring it was written from, so the rings are removed once
it is in place (issue #27: each ring is reserved whole when it is made, ~9 MiB per process whatever the job
recorded; a 4-rank run was 46 MB of rings for 49 KB of events). A ring stays where it is still the only copy: it
could not be read (its records are not in events.arrow), or its writer is still alive (a process the job left
running goes on recording). ``trace run --keep-rings`` keeps them all. Agent sockets of processes that are gone
(exited, killed, zombies, or a pid taken since by another process) are removed. Finalizing is idempotent and never
deletes anything the job or the user wrote.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats import ringevents
from ranktrace.tracer.formats.ringreader import RingError, read_ring

__all__ = ["finalize_host_dir", "EVENTS_SCHEMA_VERSION", "write_events", "seal_samples", "remove_rings",
           "remove_stale_sockets"]

EVENTS_SCHEMA_VERSION = "ranktrace.events/1"


def write_events(path: Path, table: pa.Table | Iterable[pa.Table]) -> None:
    """Arrow IPC *file* with the schema version in its metadata (self-describing); its string columns
    dictionary-encoded (ringevents.ENCODED: one growing dictionary per column, written as IPC dictionary deltas),
    so a table per ring is written as it is read and a million-record ring costs ids, not strings. Beside it, its
    index (hostdir.INDEX_NAME: each rank's rows and the ones an analysis keeps whatever their age), so a run of a
    thousand ranks is analyzed without reading every row."""
    from ranktrace.tracer.formats.eventsindex import INDEX_NAME, EventsIndex

    tables = [table] if isinstance(table, pa.Table) else table
    target = ringevents.ENCODED.with_metadata({"schema": EVENTS_SCHEMA_VERSION})
    dicts = _Dictionaries(target)
    tmp = path.with_name(path.name + ".tmp")
    options = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    parts, rows, indexable = [], 0, True
    try:
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, target, options=options) as writer:
            for t in tables:
                if t.num_rows:
                    part = EventsIndex.of_ring(t, rows) if indexable else None
                    if part is not None:
                        parts.append(part)
                    writer.write_table(dicts.recode(t), max_chunksize=1 << 16)
                    rows += t.num_rows
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: no half file left to hold its space (the rings stay the record)
        raise
    index = path.with_name(INDEX_NAME)
    index.unlink(missing_ok=True)  # never an index of an older events.arrow beside a new one
    tmp.replace(path)
    if parts:
        EventsIndex.write(index, parts, rows)


class _Dictionaries:
    """One dictionary per string column, extended as tables come (first-seen order): every table written refers to
    a prefix-extension of the dictionary the previous one used, which the IPC file format takes as a delta."""

    def __init__(self, target: pa.Schema) -> None:
        self.target = target
        self.names = [f.name for f in target if pa.types.is_dictionary(f.type)]
        # seeded with "": an IPC writer takes an empty dictionary followed by any other as a replacement
        self.values: dict[str, list[str]] = {n: [""] for n in self.names}
        self.codes: dict[str, dict[str, int]] = {n: {"": 0} for n in self.names}

    def recode(self, table: pa.Table) -> pa.Table:
        table = table.cast(self.target) if table.schema != self.target else table
        cols = []
        for f in self.target:
            col = table[f.name]
            if f.name in self.codes:
                col = self._recode(f.name, col)
            cols.append(col)
        return pa.table(cols, schema=self.target)

    def _recode(self, name: str, col: pa.ChunkedArray) -> pa.ChunkedArray:
        codes, values = self.codes[name], self.values[name]
        pieces = []
        for chunk in col.chunks:
            local = chunk.dictionary.to_pylist()
            look = []
            for v in local:
                if v is not None and v not in codes:
                    codes[v] = len(values)
                    values.append(v)
                look.append(codes.get(v, 0) if v is not None else 0)
            idx = np.asarray(chunk.indices.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
            null = chunk.is_null().to_numpy(zero_copy_only=False) if chunk.null_count else None
            new = np.asarray(look + [0], dtype=np.int32)[idx]
            pieces.append(pa.DictionaryArray.from_arrays(pa.array(new, pa.int32(), mask=null), pa.array(values,
                                                                                                         pa.string())))
        return pa.chunked_array(pieces, pa.dictionary(pa.int32(), pa.string()))


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
        path = host_dir / "agents" / name
        if _socket_owner_alive(int(head), path):
            continue
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    try:
        (host_dir / "agents").rmdir()  # only when empty
    except OSError:
        pass
    return removed


def _socket_owner_alive(pid: int, sock: Path) -> bool:
    """The process that made `sock` still runs: its pid is alive, not a zombie, and started before the socket was
    made (a later start is another process that got the pid since)."""
    from ranktrace.tracer.launch import pidident

    from ranktrace.tracer.watch.live import pid_running

    st = pidident.stat(pid)
    if st is None:  # /proc hides it (hidepid): existence is all that can be known (live.py's one check)
        return pid_running(pid)
    if st.zombie:
        return False
    try:
        made_wall = sock.lstat().st_mtime
    except OSError:
        return True
    boot_wall = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return st.start_s <= made_wall - boot_wall + pidident.SLACK_S


def remove_rings(host_dir: Path, in_events: set[str]) -> tuple[int, int, list[str]]:
    """Remove the rings whose records are all in events.arrow (`in_events`: their paths relative to `host_dir`)
    and whose writer is gone: (rings removed, bytes freed, why each other ring stayed)."""
    from ranktrace.tracer.launch import pidident

    removed, freed, kept = 0, 0, []
    for ring in sorted((host_dir / "rings").glob("*.ring")):
        rel = str(ring.relative_to(host_dir))
        if rel not in in_events:
            kept.append(f"{rel} kept: its records could not be read into events.arrow")
            continue
        writer = pidident.ring_writer(ring)
        if writer is not None and pidident.writer_matches(writer.pid, writer):
            kept.append(f"{rel} kept: its process {writer.pid} still runs")
            continue
        try:
            size = ring.stat().st_blocks * 512
            ring.unlink()
        except OSError as e:
            kept.append(f"{rel} kept: {e.strerror or e}")
            continue
        removed, freed = removed + 1, freed + size
    try:
        (host_dir / "rings").rmdir()  # only when empty
    except OSError:
        pass
    return removed, freed, kept


def finalize_host_dir(host_dir: Path, keep_rings: bool = False) -> dict[str, Any]:
    """Write events.arrow from every ring, then remove the rings it holds (unless `keep_rings`); return {'pids':
    {pid: {...}}, 'versions': {...}, 'problems': [...], 'hook_problems': [{'target', 'problem', 'ranks', 'pids'}]
    (--hook targets that did not resolve, per job), 'rings': {'removed', 'bytes_freed', 'kept'}}."""
    host = host_dir.name
    pids: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    problems: list[str] = []
    hook_problems: dict[tuple[str, str], dict[str, Any]] = {}
    converted: set[str] = set()

    def tables() -> Iterator[pa.Table]:  # one ring at a time: written as it is read
        for ring in sorted((host_dir / "rings").glob("*.ring")):
            try:
                rc = read_ring(str(ring))
            except (RingError, OSError) as e:
                problems.append(str(e))
                continue
            rel = str(ring.relative_to(host_dir))
            yield ringevents.ring_to_events(rc, host, rel, encoded=True)
            converted.add(rel)  # its table was written (write_events takes each before asking for the next)
            _note_ring(rc, rel, pids, versions, problems, hook_problems)

    write_events(host_dir / "events.arrow", tables())
    problems.extend(seal_samples(host_dir))
    remove_stale_sockets(host_dir)
    rings: dict[str, Any] = {"removed": 0, "bytes_freed": 0, "kept": "all (--keep-rings)" if keep_rings else []}
    if not keep_rings:
        n, freed, kept = remove_rings(host_dir, converted)
        rings.update(removed=n, bytes_freed=freed, kept=kept)
    return {"pids": pids, "versions": versions, "problems": problems,
            "hook_problems": [dict(v, ranks=sorted(v["ranks"]), pids=sorted(v["pids"]))
                              for v in hook_problems.values()],
            "rings": rings}


def _note_ring(rc: Any, rel: str, pids: dict[str, Any], versions: dict[str, Any], problems: list[str],
               hook_problems: dict[tuple[str, str], dict[str, Any]]) -> None:
    """What meta.json keeps of one ring: its process (pid -> rank), versions seen, --hook problems, torn records."""
    ident = ringevents.identity_of(rc)
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
