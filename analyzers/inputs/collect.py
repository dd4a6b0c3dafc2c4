"""Find, sniff (by content) and read every input, and merge what the readers produced into the common tables; a
bad file never stops the analysis, it becomes a ``Skipped`` entry the verdict reports."""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.inputs import archives, own_records
from ranktrace.tracer.formats import schema
from ranktrace.analyzers.model.records import MAX_WORLD, InputRead, Inputs, Prefixes
from ranktrace.analyzers.model.values import HostRun
from ranktrace.analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = ["InputError", "collect", "Rereader", "readable_host_dirs", "STRUCTURED"]

# Structured formats (binary, JSON, SQLite) are recognised by their first bytes and read whole, by one reader. Every
# other input is text: opened once by the shared opener and read by each family whose signatures it holds
# (readers/catalogue.py).
STRUCTURED = ("ranktrace_ring", "nsys", "flight_recorder", "kineto", "nccl_ras", "pyspy")
_JSON_ONLY = frozenset({"nccl_ras", "pyspy"})  # their text forms are text families like the others
HEAD_BYTES = 64 * 1024
_OWN_FILES = {"meta.json", "verdict.json", "report.html", "events.arrow", "proc.json", "problems.txt", "system.json"}


class InputError(Exception):
    """Nothing analyzable was given (missing path, empty folder, nothing recognised). Maps to exit 2."""


@dataclass(frozen=True)
class Rereader:
    """The model's way back to the files (model.records.MoreRecords): the same paths read again with more of our
    own records kept, asked only when the window of a rank's latest records left out what the wait-for graph
    compares. The model never calls ``collect`` itself."""

    first: Inputs

    def wanted(self, ops: pa.Table) -> frozenset[tuple[str, int]]:
        return own_records.needed_keys(ops, self.first.window)

    def with_ops(self, keys: frozenset[tuple[str, int]]) -> Inputs:
        w = self.first.window
        assert w is not None, "only asked where wanted() found ops, which needs a window"
        again = collect(self.first.paths, extra=w.extra | keys, rows=w.rows)
        return dataclasses.replace(self.first, events=again.events, window=again.window)

    def earlier_ops(self) -> Prefixes:
        w = self.first.window
        if w is None or not w.cut:
            return {}
        return collect(self.first.paths, extra=w.extra, labels=True, rows=w.rows).window.prefixes


def _load_readers() -> list[tuple[str, Any]]:
    return [(name, importlib.import_module(f"ranktrace.analyzers.readers.{name}")) for name in STRUCTURED]


def _is_host_dir(p: Path) -> bool:
    return _isdir(p) and (_exists(p / "meta.json") or _isdir(p / "rings") or _exists(p / "events.arrow"))


def _exists(p: Path) -> bool:
    """Path.exists() without its exception: a folder we may not read says "no" here, and the walk says why."""
    try:
        os.stat(p)
        return True
    except (OSError, ValueError):
        return False


def _isdir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(p).st_mode)
    except (OSError, ValueError):
        return False


def collect(paths: list[Path], *, extra: frozenset[tuple[str, int]] = frozenset(), labels: bool = False,
            rows: int | None = None) -> Inputs:
    """Read everything under `paths`. Raises InputError when nothing at all could be used.

    `extra`: (channel, seq) of ops to keep even where the window of a host dir's own records would drop them
    (own_records.needed_keys); `labels`: also what each rank ran before its window (own_records.Window.prefixes); `rows`:
    records kept per rank (default: the run's budget, own_records.rows_per_rank)."""
    paths, unpacked = archives.expand_noted(paths)  # tar archives (a host dir packed where it ran) read as what they
    readers = _load_readers()                         # hold; `unpacked`: the bounds archives went past (#31)
    results: list[ReadResult] = []
    skipped: list[Skipped] = list(unpacked)
    hosts: list[HostRun] = []
    files: list[Path] = []
    if rows is None:
        rows = own_records.rows_per_rank([hd for p in paths for hd in readable_host_dirs(p)])
    window = own_records.Window(rows, extra, labels)
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except FileNotFoundError:
            raise InputError(f"{p}: no such file or directory") from None
        except OSError as e:
            skipped.append(Skipped(str(p), None, f"cannot read: {e.strerror or e}"))
            continue
        if stat.S_ISREG(mode):
            files.append(p)
            continue
        if not stat.S_ISDIR(mode):  # a FIFO would block the first read forever; sockets and devices are no logs
            skipped.append(Skipped(str(p), None, "not a regular file (a FIFO, socket or device): not read, it could "
                                                 "block forever"))
            continue
        try:
            host_dirs = _host_dirs(p)
        except OSError as e:
            skipped.append(Skipped(str(p), None, f"cannot read folder: {e.strerror or e}"))
            continue
        for hd in host_dirs:
            hosts.append(_read_host_dir(hd, results, skipped, files, window))
        if not host_dirs:
            files.extend(_walk(p, skipped))
    formats: dict[str, list[str]] = {}
    reads: list[InputRead] = []
    for f in files:
        got = _read_file(f, readers, results, skipped, reads)
        if got:
            formats[str(f)] = got
    skipped += [Skipped(r.file, None, f"world size {r.world_size} ignored: more ranks than a job has (limit {MAX_WORLD})")
                for r in results if r.world_size and not 0 < r.world_size <= MAX_WORLD]
    if not results and not hosts:
        where = ", ".join(str(p) for p in paths)
        if skipped:
            raise InputError(f"nothing readable in {where}: " + "; ".join(f"{s.file}: {s.reason}" for s in skipped[:5]))
        raise InputError(f"nothing to analyze in {where}: no trace directory and no file in a known format")
    from ranktrace.analyzers.model.dpworlds import separate_dp_worlds

    events, stacks, observations = _fill_ranks(
        schema.concat(schema.EVENTS, [r.events for r in results]),
        schema.concat(schema.STACKS, [r.stacks for r in results]),
        schema.concat(schema.OBSERVATIONS, [r.observations for r in results]), hosts)
    events, stacks, observations, dp_world = separate_dp_worlds(events, stacks, observations)
    world_size = max((r.world_size for r in results if r.world_size and 0 < r.world_size <= MAX_WORLD), default=None)
    if dp_world:
        world_size = max(world_size or 0, dp_world)
    return Inputs(
        events=events, stacks=stacks, observations=observations,
        skipped=skipped + [s for r in results for s in r.skipped],
        files=[r.file for r in results],
        formats=formats,
        hosts=hosts,
        world_size=world_size,
        reads=reads,
        paths=list(paths),
        window=window if hosts else None,
    )


def readable_host_dirs(p: Path) -> list[Path]:
    """The host dirs at or under `p`; none where `p` is no folder or cannot be read (the walk says why)."""
    try:
        return _host_dirs(p) if _isdir(p) else []
    except OSError:
        return []


def _host_dirs(p: Path) -> list[Path]:
    return [p] if _is_host_dir(p) else sorted(d for d in p.iterdir() if _is_host_dir(d))


def _walk(root: Path, skipped: list[Skipped]) -> list[Path]:
    """Every file under `root` (hidden ones and our own outputs aside); a folder that cannot be read is a Skipped
    entry, never the end of the walk."""
    out: list[Path] = []

    def unreadable(e: OSError) -> None:
        skipped.append(Skipped(str(e.filename or root), None, f"cannot read folder: {e.strerror or e}"))

    try:
        inside = os.path.realpath(root)
    except (OSError, ValueError):
        inside = str(root)
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if f.startswith(".") or f in _OWN_FILES or f.upper().startswith("README"):
                continue
            path = Path(dirpath) / f
            if os.path.islink(path) and not _within(os.path.realpath(path), inside):
                # a link out of the folder given (to another user's file, /etc/shadow, a device): its target was not
                # among the inputs, so it is not read — and nothing of it can reach a report
                skipped.append(Skipped(str(path), None, f"a link out of {root} (to {os.path.realpath(path)}): not "
                                                        "followed; give that file itself to read it"))
                continue
            out.append(path)
    return out


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _head(f: Path) -> bytes:
    """The first HEAD_BYTES of a regular file. Opened non-blocking and checked on the open descriptor: a FIFO (or a
    file swapped for one after the walk saw it) would block the read forever. OSError / _NotRegular otherwise."""
    fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular()
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(HEAD_BYTES)
    finally:
        os.close(fd)


class _NotRegular(Exception):
    pass


_HOLE_SCAN = 64 << 20   # NUL bytes stored on disk read past to find a head of text (sparse holes cost nothing)


def _bare_head(f: Path, head: bytes) -> bytes:
    """The first HEAD_BYTES of `f` once its NUL runs are dropped: read on past the head (stepping over sparse holes)
    where the head is mostly hole, so a copytruncate'd log that starts with 1 MiB of NULs is still a log."""
    from ranktrace.analyzers.readers.text.holes import Holes, read_past_holes

    bare = head.replace(b"\x00", b"")
    if len(bare) >= HEAD_BYTES // 4 or len(head) < HEAD_BYTES:
        return bare
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return bare
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return bare
        with os.fdopen(fd, "rb", closefd=False) as fh:
            text, _passed, _scanned = read_past_holes(fh, HEAD_BYTES - 1, Holes(), scan=_HOLE_SCAN)
    except OSError:
        return bare
    finally:
        os.close(fd)
    return text[:HEAD_BYTES]


def _small_file(f: Path, limit: int) -> bytes:
    """A small file of ours (meta.json, system.json) read whole: opened non-blocking (a FIFO would wait forever),
    a plain file only, at most `limit` bytes; ValueError otherwise."""
    fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file (a FIFO, socket or device)")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return data


def _read_file(f: Path, readers: list[tuple[str, Any]], results: list[ReadResult], skipped: list[Skipped],
               reads: list[InputRead]) -> list[str]:
    try:
        head = _head(f)
    except _NotRegular:
        skipped.append(Skipped(str(f), None, "not a regular file (a FIFO, socket or device): not read, it could block "
                                             "forever"))
        return []
    except OSError as e:
        skipped.append(Skipped(str(f), None, f"cannot open: {e.strerror or e}"))
        return []
    if not head:
        skipped.append(Skipped(str(f), None, "empty file"))
        return []
    # NUL runs are holes (a crash, copytruncate): a JSON document with one is still JSON to the sniffers that ask,
    # and a log that starts with a hole longer than the head is judged by the text after it
    bare = _bare_head(f, head) if b"\x00" in head else head
    json_like = bare.lstrip()[:1] == b"{" or (  # "[2026-03-17 ... TP1] ..." / "[rank2]:" open a log, not JSON
        bare.lstrip()[:1] == b"[" and bare.lstrip()[1:].lstrip()[:1] in (b"{", b"[", b"]", b'"'))
    for name, mod in readers:
        if name in _JSON_ONLY and not json_like:
            continue
        try:
            if not mod.sniff(f, bare if json_like else head):
                continue
        except Exception:
            continue
        try:
            results.append(mod.read(f))
            reads.append(InputRead(str(f), (name,)))
            return [name]
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, f"{name}: {e.reason}"))
            return []
        except Exception as e:  # a reader bug must not lose the other files
            skipped.append(Skipped(str(f), None, f"{name} reader failed: {type(e).__name__}: {e}"))
            return []
    if _looks_binary(bare):
        skipped.append(Skipped(str(f), None, "binary content, not a format ranktrace reads (skipped)"))
        reads.append(InputRead(str(f), (), note="binary"))
        return []
    return _read_text(f, results, skipped, reads)


def _read_text(f: Path, results: list[ReadResult], skipped: list[Skipped], reads: list[InputRead]) -> list[str]:
    """Every family whose signatures occur in the text reads it (catalogue.scan)."""
    from ranktrace.analyzers.readers import catalogue
    from ranktrace.analyzers.readers.text import open_text

    try:
        doc = open_text(f)
    except ReaderError as e:
        skipped.append(Skipped(str(f), None, e.reason))
        return []
    skipped.extend(doc.notes)
    found = catalogue.scan(doc)
    claimed: list[str] = []
    ranks: set[int] = set()
    for name in found.families:
        mod = importlib.import_module(next(fam.module for fam in catalogue.FAMILIES if fam.name == name))
        try:
            res = mod.read_doc(doc)
        except ReaderError:
            continue  # its signatures were a coincidence: another family's text
        except Exception as e:  # a reader bug must not lose the other families or files
            skipped.append(Skipped(str(f), None, f"{name} reader failed: {type(e).__name__}: {e}"))
            continue
        results.append(res)
        claimed.append(name)
        for table in (res.events, res.stacks, res.observations):
            if table.num_rows:
                ranks.update(r for r in table["rank"].to_pylist() if r is not None)
    if not claimed and not _own_output_log(f):  # a job that printed nothing we read is no skipped input
        skipped.append(Skipped(str(f), None, "not a format ranktrace reads (skipped)"))
    reads.append(InputRead(str(f), tuple(claimed), tuple(sorted(ranks)), found.used, found.total))
    return claimed


def _own_output_log(f: Path) -> bool:
    """The job's output that trace run kept in its host dir (<host>/output.log)."""
    return f.name == "output.log" and _exists(f.parent / "meta.json")


def _looks_binary(head: bytes) -> bool:
    """Mostly control bytes once NUL runs (holes left by a crash) are set aside: a core, a pickle, an image."""
    data = head.replace(b"\x00", b"")
    if not data:
        return True
    ctrl = sum(1 for b in data[:8192] if b < 32 and b not in (9, 10, 13, 27))
    return ctrl > 0.1 * min(len(data), 8192)


def _read_host_dir(hd: Path, results: list[ReadResult], skipped: list[Skipped], files: list[Path],
                   window: own_records.Window) -> HostRun:
    """A ranktrace host directory: events.arrow (or the rings, for a live or unfinalized job), plus dumps/ and nccl/."""
    meta: dict[str, Any] | None = None
    mp = hd / "meta.json"
    if _exists(mp):
        try:
            if os.stat(mp).st_size > 64 << 20:
                raise ValueError("larger than 64 MiB")
            meta = json.loads(_small_file(mp, 64 << 20))  # never blocks on a FIFO (#31)
            if not isinstance(meta, dict) or not str(meta.get("schema", "")).startswith("ranktrace.meta/"):
                skipped.append(Skipped(str(mp), None, "not a ranktrace meta.json (schema missing)"))
                meta = None
            else:
                meta = checked_meta(meta, str(mp), skipped)
        except (OSError, ValueError, RecursionError) as e:
            skipped.append(Skipped(str(mp), None, f"corrupt meta.json ({e}); job status unknown"))
    else:
        skipped.append(Skipped(str(mp), None, "missing meta.json; job status unknown"))
    if meta is not None and (hd / "system.json").exists():   # trace run's machine facts (tracer/launch/sysfacts.py)
        try:
            system = json.loads(_small_file(hd / "system.json", 16 << 20))
            if isinstance(system, dict):
                meta = {**meta, "system": system}
        except (OSError, ValueError) as e:
            skipped.append(Skipped(str(hd / "system.json"), None, f"unreadable ({e})"))
    host = hd.name
    results.extend(own_records.read_own(hd, host, window, skipped))  # events.arrow, else the rings; windowed at scale
    if _isdir(hd / "samples") or _isdir(hd / "dumps"):
        # the monitor's periodic samples (stacks, /proc, GPU) and the RAS pairs its bursts saved; sampled stacks of
        # a job that completed cleanly are older than its end, so only their observations are kept then
        from ranktrace.analyzers.readers import ranktrace_samples

        exit_info = (meta or {}).get("exit") or {}
        clean = exit_info.get("exit_code") == 0 and not exit_info.get("killed_on_hang")
        got, problems = ranktrace_samples.read_host(hd, host=host, with_stacks=not clean)
        results.extend(got)
        skipped.extend(problems)
    for sub in ("dumps", "nccl", "logs"):
        if _isdir(hd / sub):
            files.extend(_walk(hd / sub, skipped))
    files.extend(_beside_own(hd, skipped))
    _read_host_nsys(hd, results, skipped)
    out_log = hd / "output.log"
    if out_log.is_file() and out_log.stat().st_size:  # the job's own output, kept by trace run (server-log phases)
        files.append(out_log)
    ended = bool(meta and meta.get("exit"))
    return HostRun(hd, meta, ended)


# what a host dir of ours holds besides the files in _OWN_FILES: read as ours by read_host_dir, never as logs
_HOST_ENTRIES = {"rings", "samples", "dumps", "nccl", "logs", "nsys", "nsys-rep", "agents", "output.log",
                 "events.index.arrow", "profile.json"}


def _beside_own(hd: Path, skipped: list[Skipped]) -> list[Path]:
    """Files a person put beside our own records (a folder copied off a node with its rings, the job's logs next to
    them): read like any folder's, so a rings/ subfolder never hides the logs beside it."""
    try:
        names = sorted(os.listdir(hd))
    except OSError:
        return []
    out: list[Path] = []
    for name in names:
        if name.startswith(".") or name in _OWN_FILES or name in _HOST_ENTRIES or name.upper().startswith("README"):
            continue
        p = hd / name
        if _isdir(p):
            out.extend(_walk(p, skipped))
        elif os.path.islink(p) and not _within(os.path.realpath(p), os.path.realpath(hd)):
            skipped.append(Skipped(str(p), None, f"a link out of {hd} (to {os.path.realpath(p)}): not followed; give "
                                                 "that file itself to read it"))
        elif not name.endswith((".ring", ".sock")):
            out.append(p)
    return out


def _read_host_nsys(hd: Path, results: list[ReadResult], skipped: list[Skipped]) -> None:
    """``trace run --nsys`` exports (``<host>/nsys/*.sqlite``): read as this host's, so their pids take the ranks of
    the rings (nsys names the machine its own way)."""
    if not (hd / "nsys").is_dir():
        return
    from ranktrace.analyzers.readers import nsys

    for export in sorted((hd / "nsys").glob("*.sqlite")):
        try:
            res = nsys.read(export)
        except ReaderError as e:
            skipped.append(Skipped(str(export), None, e.reason))
            continue
        for name in ("events", "observations", "stacks"):
            table = getattr(res, name)
            if table.num_rows and "host" in table.column_names:
                i = table.schema.get_field_index("host")
                table = table.set_column(i, "host", pa.repeat(pa.scalar(hd.name, pa.string()), table.num_rows))
                res = dataclasses.replace(res, **{name: table})
        results.append(res)


def _glob(d: Path, pattern: str, skipped: list[Skipped]) -> list[Path]:
    if not _exists(d):
        return []
    try:
        return [d / n for n in os.listdir(d) if Path(n).match(pattern)]
    except OSError as e:
        skipped.append(Skipped(str(d), None, f"cannot read folder: {e.strerror or e}"))
        return []


def _is(kind: Any) -> Any:
    return lambda v: isinstance(v, kind) and not (kind is int and isinstance(v, bool))


_INT, _STR, _BOOL = _is(int), _is(str), _is(bool)


def _opt(check: Any) -> Any:
    return lambda v: v is None or check(v)


def _list_of(check: Any) -> Any:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _dict_of(check: Any) -> Any:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


_SCALAR = lambda v: v is None or isinstance(v, (str, int, float, bool))  # noqa: E731
# What the analysis reads of meta.json, and the type it must have; other keys are kept as they are.
_META_TYPES: dict[str, Any] = {
    "run": _STR, "host": _STR, "hostname": _STR, "cwd": _STR, "command": _list_of(_STR),
    "env": _dict_of(_STR), "env_added": _dict_of(_STR), "versions": _dict_of(_SCALAR),
    "gpus": _list_of(lambda g: isinstance(g, dict)), "driver": _opt(_dict_of(_SCALAR)),
    "start_wall_ns": _opt(_INT), "end_wall_ns": _opt(_INT), "launcher_pid": _opt(_INT), "attached": _BOOL,
    "finalize_problems": _list_of(_STR), "hook_problems": _list_of(lambda h: isinstance(h, dict)),
    "launcher_lost": _opt(lambda v: isinstance(v, dict)),
}
_EXIT_TYPES: dict[str, Any] = {"returncode": _opt(_INT), "exit_code": _opt(_INT), "signal": _opt(_INT),
                               "signals_forwarded": _list_of(_INT), "killed_on_hang": _BOOL,
                               "interrupted": _BOOL, "stopped_wall_ns": _opt(_INT)}
_PID_TYPES: dict[str, Any] = {"rank": _opt(_INT), "world": _opt(_INT), "local_rank": _opt(_INT), "ppid": _opt(_INT),
                              "argv": _opt(_list_of(_STR)), "ring": _opt(_STR), "ops": _opt(_INT),
                              "exit_code": _opt(_INT), "signal": _opt(_INT)}


def checked_meta(meta: dict[str, Any], name: str, skipped: list[Skipped]) -> dict[str, Any]:
    """meta.json with every field the analysis reads of the type it expects: a field damaged (by hand, a tool, a
    disk) is dropped with one Skipped naming it, so no reader of meta.json meets a list where it wants a dict."""
    bad: list[str] = []
    out: dict[str, Any] = {}
    for key, value in meta.items():
        check = _META_TYPES.get(key)
        if check is not None and not check(value):
            bad.append(key)
            continue
        out[key] = value
    exit_info = meta.get("exit")
    if isinstance(exit_info, dict):
        fixed = {k: v for k, v in exit_info.items() if k not in _EXIT_TYPES or _EXIT_TYPES[k](v)}
        bad.extend(f"exit.{k}" for k in exit_info if k not in fixed)
        if exit_info and not any(fixed.get(k) is not None for k in ("returncode", "exit_code", "signal")):
            bad.append("exit")   # no status left in it: the job's fate is unknown, not "ended"
            fixed = {}
        out["exit"] = fixed or None
    elif exit_info is not None:
        bad.append("exit")
        out["exit"] = None
    pids = meta.get("pids")
    if pids is not None:
        good: dict[str, Any] = {}
        for pid, info in (pids.items() if isinstance(pids, dict) else ()):
            if not (isinstance(pid, str) and pid.isdigit() and isinstance(info, dict)):
                bad.append(f"pids.{str(pid)[:20]}")
                continue
            good[pid] = {k: v for k, v in info.items() if k not in _PID_TYPES or _PID_TYPES[k](v)}
            bad.extend(f"pids.{pid}.{k}" for k in info if k not in good[pid])
        if not isinstance(pids, dict):
            bad.append("pids")
        out["pids"] = good
    if bad:
        shown = ", ".join(sorted(set(bad))[:8]) + (" ..." if len(set(bad)) > 8 else "")
        skipped.append(Skipped(name, None, f"damaged meta.json fields not used: {shown}"))
    return out


def _fill_ranks(events: pa.Table, stacks: pa.Table, observations: pa.Table,
                hosts: list[HostRun]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Fill null ranks: pid -> rank from events of the same host, else the file name.

    Vectorised: the rank is decided once per distinct (host, pid, file) among the rows that lack one.
    """
    tables = (events, stacks, observations)
    if not any(t.num_rows and t["rank"].null_count for t in tables):
        return tables
    from ranktrace.analyzers.readers.common.ranks import rank_from_name

    ev = events
    # only rows that name their process: log lines without a pid would make (host, None) -> the highest rank any
    # file saw, and every other unattributed line would then be pinned on that rank
    known = ev.select(["host", "pid", "rank"]).filter(pc.and_(pc.is_valid(ev["rank"]), pc.is_valid(ev["pid"])))
    pid_rank: dict[tuple[Any, Any], int] = {}
    for row in known.group_by(["host", "pid"], use_threads=False).aggregate([("rank", "max")]).to_pylist():
        pid_rank[(row["host"], row["pid"])] = row["rank_max"]
    for h_run in hosts:  # meta.json's pid map covers processes whose ring was lost
        for pid, info in ((h_run.meta or {}).get("pids") or {}).items():
            if info.get("rank") is not None:
                pid_rank.setdefault((h_run.host_dir.name, int(pid)), info["rank"])
    pid_only = {p: r for (_h, p), r in pid_rank.items()}
    by_name: dict[str, int | None] = {}

    def rank_of(host: Any, pid: Any, fname: Any) -> int | None:
        r = pid_rank.get((host, pid)) if pid is not None else None
        if r is None and host is None and pid is not None:
            r = pid_only.get(pid)
        if r is None and fname:
            if fname not in by_name:
                by_name[fname] = rank_from_name(Path(fname).name)
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

    return fill(events), fill(stacks), fill(observations)
