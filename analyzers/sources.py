"""Find, sniff (by content) and read every input, and merge what the readers produced into the common tables; a
bad file never stops the analysis, it becomes a ``Skipped`` entry the verdict reports."""
from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.analyzers import schema
from ranktrace.analyzers.model import HostRun
from ranktrace.analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = ["Inputs", "InputError", "collect", "READERS", "HostRun"]

# Sniff order: specific binary/JSON formats first, then text logs (which may share a file).
READERS = ("ranktrace_ring", "nsys", "flight_recorder", "kineto", "nccl_ras", "fr_text", "pyspy", "faulthandler",
           "gdb", "watchdog", "nccl_log", "server_log", "nvidia_smi")
TEXT_READERS = frozenset({"pyspy", "faulthandler", "gdb", "watchdog", "nccl_log", "server_log", "nvidia_smi",
                          "fr_text", "nccl_ras"})
HEAD_BYTES = 64 * 1024
_OWN_FILES = {"meta.json", "verdict.json", "report.html", "events.arrow", "proc.json", "problems.txt"}


class InputError(Exception):
    """Nothing analyzable was given (missing path, empty folder, nothing recognised). Maps to exit 2."""


@dataclass
class Inputs:
    events: pa.Table
    stacks: pa.Table
    observations: pa.Table
    skipped: list[Skipped] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    formats: dict[str, list[str]] = field(default_factory=dict)
    hosts: list[HostRun] = field(default_factory=list)
    world_size: int | None = None

    @property
    def has_ranktrace(self) -> bool:
        return bool(self.hosts)


def _load_readers() -> list[tuple[str, Any]]:
    mods = []
    for name in READERS:
        try:
            mods.append((name, importlib.import_module(f"ranktrace.analyzers.readers.{name}")))
        except ImportError:
            continue
    return mods


def _is_host_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "meta.json").exists() or (p / "rings").is_dir() or (p / "events.arrow").exists())


def collect(paths: list[Path]) -> Inputs:
    """Read everything under `paths`. Raises InputError when nothing at all could be used."""
    readers = _load_readers()
    results: list[ReadResult] = []
    skipped: list[Skipped] = []
    hosts: list[HostRun] = []
    files: list[Path] = []
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or directory")
        if p.is_file():
            files.append(p)
            continue
        host_dirs = [p] if _is_host_dir(p) else sorted(d for d in p.iterdir() if _is_host_dir(d))
        for hd in host_dirs:
            hosts.append(_read_host_dir(hd, results, skipped, files))
        if not host_dirs:
            files.extend(_walk(p))
    formats: dict[str, list[str]] = {}
    for f in files:
        got = _read_file(f, readers, results, skipped)
        if got:
            formats[str(f)] = got
    if not results and not hosts:
        where = ", ".join(str(p) for p in paths)
        if skipped:
            raise InputError(f"nothing readable in {where}: " + "; ".join(f"{s.file}: {s.reason}" for s in skipped[:5]))
        raise InputError(f"nothing to analyze in {where}: no trace directory and no file in a known format")
    inputs = Inputs(
        events=schema.concat(schema.EVENTS, [r.events for r in results]),
        stacks=schema.concat(schema.STACKS, [r.stacks for r in results]),
        observations=schema.concat(schema.OBSERVATIONS, [r.observations for r in results]),
        skipped=skipped + [s for r in results for s in r.skipped],
        files=[r.file for r in results],
        formats=formats,
        hosts=hosts,
        world_size=max((r.world_size for r in results if r.world_size), default=None),
    )
    _fill_ranks(inputs)
    return inputs


def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out.extend(Path(dirpath) / f for f in sorted(filenames)
                   if not f.startswith(".") and f not in _OWN_FILES and not f.upper().startswith("README"))
    return out


def _read_file(f: Path, readers: list[tuple[str, Any]], results: list[ReadResult], skipped: list[Skipped]) -> list[str]:
    try:
        with open(f, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError as e:
        skipped.append(Skipped(str(f), None, f"cannot open: {e.strerror or e}"))
        return []
    if not head:
        skipped.append(Skipped(str(f), None, "empty file"))
        return []
    claimed: list[str] = []
    for name, mod in readers:
        if claimed and (name not in TEXT_READERS or claimed[0] not in TEXT_READERS):
            continue
        try:
            if not mod.sniff(f, head):
                continue
        except Exception:
            continue
        try:
            results.append(mod.read(f))
            claimed.append(name)
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, f"{name}: {e.reason}"))
        except Exception as e:  # a reader bug must not lose the other files
            skipped.append(Skipped(str(f), None, f"{name} reader failed: {type(e).__name__}: {e}"))
    if not claimed and not any(s.file == str(f) for s in skipped):
        skipped.append(Skipped(str(f), None, "not a format ranktrace reads (skipped)"))
    return claimed


def _read_host_dir(hd: Path, results: list[ReadResult], skipped: list[Skipped], files: list[Path]) -> HostRun:
    """A ranktrace host directory: events.arrow (or the rings, for a live or unfinalized job), plus dumps/ and nccl/."""
    meta: dict[str, Any] | None = None
    mp = hd / "meta.json"
    if mp.exists():
        try:
            meta = json.loads(mp.read_text())
            if not isinstance(meta, dict) or not str(meta.get("schema", "")).startswith("ranktrace.meta/"):
                skipped.append(Skipped(str(mp), None, "not a ranktrace meta.json (schema missing)"))
                meta = None
        except (OSError, ValueError) as e:
            skipped.append(Skipped(str(mp), None, f"corrupt meta.json ({e}); job status unknown"))
    else:
        skipped.append(Skipped(str(mp), None, "missing meta.json; job status unknown"))
    host = hd.name
    used_arrow = False
    ev = hd / "events.arrow"
    if ev.exists():
        try:
            with pa.memory_map(str(ev)) as src:
                table = ipc.open_file(src).read_all()
            if table.schema.metadata and table.schema.metadata.get(b"schema", b"").startswith(b"ranktrace.events/"):
                results.append(ReadResult(file=str(ev), format="ranktrace_events", events=table.cast(schema.EVENTS)))
                used_arrow = True
            else:
                skipped.append(Skipped(str(ev), None, "events.arrow without a ranktrace schema; using rings"))
        except (OSError, pa.ArrowInvalid) as e:
            skipped.append(Skipped(str(ev), None, f"unreadable events.arrow ({e}); using the rings instead"))
    if not used_arrow:
        from ranktrace.analyzers.readers import ranktrace_ring

        for ring in sorted((hd / "rings").glob("*.ring")):
            try:
                results.append(ranktrace_ring.read(ring, host=host))
            except ReaderError as e:
                skipped.append(Skipped(str(ring), None, e.reason))
    if (hd / "samples").is_dir() or (hd / "dumps").is_dir():
        # the monitor's periodic samples (stacks, /proc, GPU) and the RAS pairs its bursts saved; sampled stacks of
        # a job that completed cleanly are older than its end, so only their observations are kept then
        from ranktrace.analyzers.readers import ranktrace_samples

        exit_info = (meta or {}).get("exit") or {}
        clean = exit_info.get("exit_code") == 0 and not exit_info.get("killed_on_hang")
        got, problems = ranktrace_samples.read_host(hd, host=host, with_stacks=not clean)
        results.extend(got)
        skipped.extend(problems)
    for sub in ("dumps", "nccl", "logs"):
        if (hd / sub).is_dir():
            files.extend(_walk(hd / sub))
    ended = bool(meta and meta.get("exit"))
    return HostRun(hd, meta, ended)


def _fill_ranks(inputs: Inputs) -> None:
    """Fill null ranks: pid -> rank from events of the same host, else the file name.

    Vectorised: the rank is decided once per distinct (host, pid, file) among the rows that lack one.
    """
    tables = (inputs.events, inputs.stacks, inputs.observations)
    if not any(t.num_rows and t["rank"].null_count for t in tables):
        return
    from ranktrace.analyzers.readers import rankinfer

    ev = inputs.events
    known = ev.select(["host", "pid", "rank"]).filter(pc.is_valid(ev["rank"]))
    pid_rank: dict[tuple[Any, Any], int] = {}
    for row in known.group_by(["host", "pid"], use_threads=False).aggregate([("rank", "max")]).to_pylist():
        pid_rank[(row["host"], row["pid"])] = row["rank_max"]
    for h_run in inputs.hosts:  # meta.json's pid map covers processes whose ring was lost
        for pid, info in ((h_run.meta or {}).get("pids") or {}).items():
            if info.get("rank") is not None:
                pid_rank.setdefault((h_run.host_dir.name, int(pid)), info["rank"])
    pid_only = {p: r for (_h, p), r in pid_rank.items()}
    by_name: dict[str, int | None] = {}

    def rank_of(host: Any, pid: Any, fname: Any) -> int | None:
        r = pid_rank.get((host, pid))
        if r is None and host is None and pid is not None:
            r = pid_only.get(pid)
        if r is None and fname:
            if fname not in by_name:
                by_name[fname] = rankinfer.rank_from_name(Path(fname).name)
            r = by_name[fname]
        return r

    def codes(a: pa.ChunkedArray) -> np.ndarray:
        enc = pc.dictionary_encode(a.combine_chunks())
        return np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)

    def fill(table: pa.Table) -> pa.Table:
        if table.num_rows == 0 or table["rank"].null_count == 0:
            return table
        rank = table["rank"].combine_chunks()
        missing = np.flatnonzero(np.asarray(pc.is_null(rank).to_numpy(zero_copy_only=False), dtype=bool))
        sub = table.select(["host", "pid", "file"]).take(pa.array(missing))
        combo = np.zeros(len(missing), dtype=np.int64)
        for name in ("host", "pid", "file"):  # one int per distinct (host, pid, file)
            part = codes(sub[name])
            combo = combo * (int(part.max()) + 2) + part + 1
            combo = codes(pa.chunked_array([pa.array(combo)]))
        first = np.full(int(combo.max()) + 1, len(missing), dtype=np.int64)
        np.minimum.at(first, combo, np.arange(len(missing)))
        per_combo = [rank_of(r["host"], r["pid"], r["file"]) for r in sub.take(pa.array(first)).to_pylist()]
        values = np.asarray(pc.fill_null(rank, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        values[missing] = np.array([0 if r is None else r for r in per_combo], dtype=np.int64)[combo]
        still = np.zeros(len(values), dtype=bool)
        still[missing] = np.array([r is None for r in per_combo], dtype=bool)[combo]
        filled = pa.array(values, pa.int32(), mask=still if still.any() else None)
        return table.set_column(table.schema.get_field_index("rank"), "rank", filled)

    inputs.events = fill(inputs.events)
    inputs.stacks = fill(inputs.stacks)
    inputs.observations = fill(inputs.observations)
