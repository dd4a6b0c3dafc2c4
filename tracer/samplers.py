"""Periodic samples of a running job, written to ``<run>/<host>/samples/{proc,stacks,gpu}.arrow`` (DESIGN §3).

Why these live next to the progress model: the monitor already has to read each rank's ring, its /proc counters and
(when quiet) its stacks to decide whether the job is progressing. The samplers are the same reads, kept: one read of
/proc serves both the progress decision and ``proc.arrow``; one non-blocking py-spy dump serves both the "did the
stack change" decision and ``stacks.arrow``; nothing is read twice for the same moment.

Files are Arrow IPC **streams** (``pyarrow.ipc.open_stream``), one record batch appended per flush (every few
seconds and at exit) and flushed to the OS, so a ``trace run`` that is SIGKILLed loses at most one flush interval;
a batch cut mid-write is the only unreadable part (readers keep the batches before it). The schema's metadata
says ``schema: ranktrace.samples.<name>/1``. Memory stays bounded: pending rows are flushed early past a cap, the
stack table forgets old stacks past a cap (they are re-emitted if seen again), vanished threads are forgotten.

* ``proc.arrow``: one ``process`` row per traced process per second (state, CPU, RSS/VMS, faults, I/O counters);
  ``thread`` rows per thread (state, wchan, CPU, faults, name) written when the thread changed since its last row
  and at least every ``THREAD_KEYFRAME_S`` seconds (a hung job's threads cost nothing after the first rows).
* ``stacks.arrow``: ``stack`` rows define a distinct stack once (``stack_id``, ``frames``); ``sample`` rows
  reference it per thread and sample, with the thread name, py-spy's idle/active state, and ``changed`` (the
  thread's stack differs from its previous sample; null on its first); ``error`` rows keep py-spy failures.
* ``gpu.arrow``: written by :mod:`tracer.gpu_sampler` rows (device / process / xid kinds).

:class:`RingTail` follows a live ring incrementally (new meta records and new op slots only) so the monitor can
tell progress, each rank's last sequence number per group and its phase without decoding whole rings each second.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.ipc as ipc

from tracer import ringformat as rf

__all__ = [
    "PROC_SCHEMA", "STACKS_SCHEMA", "GPU_SCHEMA", "SCHEMAS", "ArrowStreamLog", "ProcSampler", "ProcCounters",
    "StackSampler", "StackDump", "pyspy_dump", "RingTail", "THREAD_KEYFRAME_S",
]

THREAD_KEYFRAME_S = 30.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK_NS = 1_000_000_000 // _CLK_TCK
_ENTER = rf.KINDS.index("enter")
_COLLECTIVE = rf.CATEGORIES.index("collective")


def _schema(name: str, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema(fields, metadata={"schema": f"ranktrace.samples.{name}/1"})


PROC_SCHEMA = _schema("proc", [
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),         # sample time: wall clock, CLOCK_MONOTONIC
    ("kind", pa.string()),                                  # process | thread
    ("pid", pa.int64()), ("tid", pa.int64()),               # tid null on process rows
    ("rank", pa.int32()),
    ("comm", pa.string()),                                  # process comm / thread name (/proc/.../comm)
    ("state", pa.string()),                                 # R S D Z T t X I ...
    ("wchan", pa.string()),                                 # threads only; "0" or "" when the kernel hides it
    ("utime_ns", pa.int64()), ("stime_ns", pa.int64()),     # CPU time so far
    ("majflt", pa.int64()), ("minflt", pa.int64()),
    ("num_threads", pa.int32()),                            # process rows
    ("rss_bytes", pa.int64()), ("vms_bytes", pa.int64()),   # process rows
    ("rchar", pa.int64()), ("wchar", pa.int64()),           # process rows (/proc/PID/io; null when unreadable)
    ("read_bytes", pa.int64()), ("write_bytes", pa.int64()),
])

STACKS_SCHEMA = _schema("stacks", [
    ("kind", pa.string()),                                  # stack | sample | error
    ("stack_id", pa.int64()),
    ("frames", pa.list_(pa.string())),                      # stack rows: innermost first, "func (file:line)"
    ("sample_id", pa.int64()),                              # one round of dumps over all processes
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),
    ("pid", pa.int64()), ("tid", pa.int64()),               # tid = OS thread id (else py-spy's thread id)
    ("rank", pa.int32()),
    ("thread_name", pa.string()),
    ("thread_state", pa.string()),                          # idle | active | active+gil
    ("changed", pa.bool_()),                                # stack differs from this thread's previous sample
    ("trigger", pa.string()),                               # periodic | quiet | burst
    ("detail", pa.string()),                                # error rows: py-spy's message
])

GPU_SCHEMA = _schema("gpu", [
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),
    ("kind", pa.string()),                                  # device | process | xid
    ("gpu", pa.int32()), ("uuid", pa.string()), ("bus_id", pa.string()),
    ("pid", pa.int64()), ("rank", pa.int32()),              # process rows
    ("util_gpu", pa.int32()), ("util_mem", pa.int32()),     # percent
    ("mem_used", pa.int64()), ("mem_total", pa.int64()),    # bytes (process rows: that process's memory)
    ("power_mw", pa.int64()), ("sm_clock_mhz", pa.int32()), ("temperature_c", pa.int32()),
    ("pcie_tx_kbps", pa.int64()), ("pcie_rx_kbps", pa.int64()),
    ("nvlink_tx_kib", pa.int64()), ("nvlink_rx_kib", pa.int64()),  # cumulative counters, where available
    ("ecc_uncorrected", pa.int64()), ("ecc_corrected", pa.int64()),  # volatile counts
    ("xid", pa.int64()),                                    # xid rows
    ("detail", pa.string()),
])

SCHEMAS = {"proc": PROC_SCHEMA, "stacks": STACKS_SCHEMA, "gpu": GPU_SCHEMA}


class ArrowStreamLog:
    """Append-only Arrow IPC stream: rows buffered in memory, one record batch per :meth:`flush`.

    The file (with its schema) exists from construction on; every flush ends with an OS-level flush, so what was
    flushed survives the writer's death. Past ``max_pending`` rows a flush happens at once (bounded memory).
    """

    def __init__(self, path: Path, schema: pa.Schema, *, max_pending: int = 20000) -> None:
        self.path, self.schema, self.max_pending = path, schema, max_pending
        self._names = schema.names
        self._pending: dict[str, list[Any]] = {n: [] for n in self._names}
        self._n = 0
        self.rows_written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._writer = ipc.new_stream(self._file, schema)
        self._writer.write_batch(pa.record_batch([pa.array([], f.type) for f in schema], schema=schema))
        self._file.flush()  # the schema is on disk from the start: readers see an empty file, not a broken one

    def add(self, row: dict[str, Any]) -> None:
        for n in self._names:
            self._pending[n].append(row.get(n))
        self._n += 1
        if self._n >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        if not self._n or self._writer is None:
            return
        batch = pa.record_batch([pa.array(self._pending[n], f.type) for n, f in zip(self._names, self.schema)],
                                schema=self.schema)
        self._pending = {n: [] for n in self._names}
        self.rows_written += self._n
        self._n = 0
        self._writer.write_batch(batch)
        self._file.flush()

    def close(self) -> None:
        if self._writer is None:
            return
        try:
            self.flush()
            self._writer.close()
        finally:
            self._writer = None
            self._file.close()


# ------------------------------------------------------------------------------------------------------ /proc

def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ProcCounters:
    """What the progress model reads per process (DESIGN §2): storage I/O, major faults, RSS pages."""

    io: int          # read_bytes + write_bytes (not rchar/wchar: socket polling moves those forever)
    majflt: int
    rss_pages: int


def _stat_fields(stat: bytes) -> tuple[str, list[bytes]]:
    comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
    return comm, stat[stat.rindex(b")") + 2:].split()


class ProcSampler:
    """One /proc read per process (and its threads) per call; rows go to ``proc.arrow`` when a log is given."""

    def __init__(self, log: ArrowStreamLog | None, *, keyframe_s: float = THREAD_KEYFRAME_S) -> None:
        self.log, self.keyframe_s = log, keyframe_s
        self._threads: dict[tuple[int, int], tuple[tuple[Any, ...], float]] = {}  # last written key, when

    def sample(self, pids: Iterable[int], ranks: dict[int, int | None] | None = None,
               threads: bool = True) -> dict[int, ProcCounters]:
        """Counters per live pid (zombies and vanished processes are left out)."""
        wall, mono = time.time_ns(), time.monotonic_ns()
        now = mono / 1e9
        out: dict[int, ProcCounters] = {}
        seen: set[tuple[int, int]] = set()
        ranks = ranks or {}
        for pid in pids:
            stat = _read(f"/proc/{pid}/stat")
            if stat is None:
                continue
            try:
                comm, f = _stat_fields(stat)
                state = f[0].decode()
                if state in ("Z", "X"):
                    continue
                minflt, majflt = int(f[7]), int(f[9])
                utime, stime = int(f[11]), int(f[12])
                nthreads, vsize, rss = int(f[17]), int(f[20]), int(f[21])
            except (ValueError, IndexError):
                continue
            io: dict[bytes, int] = {}
            raw = _read(f"/proc/{pid}/io")
            if raw:
                for line in raw.splitlines():
                    k, _, v = line.partition(b":")
                    try:
                        io[k] = int(v)
                    except ValueError:
                        pass
            out[pid] = ProcCounters(io.get(b"read_bytes", 0) + io.get(b"write_bytes", 0), majflt, rss)
            if self.log is None:
                continue
            rank = ranks.get(pid)
            self.log.add({
                "wall_ns": wall, "t_ns": mono, "kind": "process", "pid": pid, "rank": rank, "comm": comm,
                "state": state, "utime_ns": utime * _TICK_NS, "stime_ns": stime * _TICK_NS, "majflt": majflt,
                "minflt": minflt, "num_threads": nthreads, "rss_bytes": rss * _PAGE, "vms_bytes": vsize,
                "rchar": io.get(b"rchar"), "wchar": io.get(b"wchar"), "read_bytes": io.get(b"read_bytes"),
                "write_bytes": io.get(b"write_bytes"),
            })
            if threads:
                self._sample_threads(pid, rank, wall, mono, now, seen)
        for key in [k for k in self._threads if k not in seen]:
            del self._threads[key]
        return out

    def _sample_threads(self, pid: int, rank: int | None, wall: int, mono: int, now: float,
                        seen: set[tuple[int, int]]) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for t in tids:
            base = f"/proc/{pid}/task/{t}"
            stat = _read(base + "/stat")
            if stat is None:
                continue
            try:
                comm, f = _stat_fields(stat)
                state = f[0].decode()
                minflt, majflt, utime, stime = int(f[7]), int(f[9]), int(f[11]), int(f[12])
            except (ValueError, IndexError):
                continue
            w = _read(base + "/wchan") if state != "R" else b""
            wchan = (w or b"").decode("ascii", "replace").strip()
            tid = int(t)
            key = (pid, tid)
            seen.add(key)
            sig = (comm, state, wchan, utime, stime, majflt)
            last = self._threads.get(key)
            if last is not None and last[0] == sig and now - last[1] < self.keyframe_s:
                continue
            self._threads[key] = (sig, now)
            self.log.add({  # type: ignore[union-attr]
                "wall_ns": wall, "t_ns": mono, "kind": "thread", "pid": pid, "tid": tid, "rank": rank, "comm": comm,
                "state": state, "wchan": wchan, "utime_ns": utime * _TICK_NS, "stime_ns": stime * _TICK_NS,
                "majflt": majflt, "minflt": minflt,
            })


# ----------------------------------------------------------------------------------------------------- stacks

@dataclass
class StackDump:
    """One non-blocking py-spy dump of one process: its JSON text, or why there is none."""

    pid: int
    wall_ns: int
    t_ns: int
    text: str | None = None
    error: str | None = None
    threads: list[dict[str, Any]] = field(default_factory=list)
    source: str = "pyspy"  # or "agent": the rank's own answer (tracer.agent), same JSON layout


def pyspy_dump(pyspy: str, pid: int, *, native: bool = False, timeout: float = 5.0) -> StackDump:
    """``py-spy dump --nonblocking --json`` of one process (never pauses it). Never raises.

    With `native`, py-spy refuses --nonblocking, so that one dump pauses the rank for its duration (0.1-0.75 s
    here): only hang-time bursts ask for it (--native-stacks), never periodic samples."""
    wall, mono = time.time_ns(), time.monotonic_ns()
    cmd = [pyspy, "dump", "--native", "--json", "--pid", str(pid)] if native else \
        [pyspy, "dump", "--nonblocking", "--json", "--pid", str(pid)]
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} did not answer within {timeout:.0f} s")
    except OSError as e:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} could not start: {e}")
    if res.returncode != 0 or not res.stdout.strip().startswith("["):
        msg = (res.stderr or res.stdout).strip().splitlines()
        text = msg[-1] if msg else f"exit {res.returncode}"
        if "Permission" in text or "ptrace" in text.lower():
            text += " (ptrace denied: set kernel.yama.ptrace_scope=0 or run as the job's user with CAP_SYS_PTRACE)"
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid} failed: {text}")
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        return StackDump(pid, wall, mono, error=f"py-spy dump of pid {pid}: unreadable JSON")
    return StackDump(pid, wall, mono, text=res.stdout, threads=threads if isinstance(threads, list) else [])


def dump_all(pyspy: str, pids: list[int], *, native: bool = False, timeout: float = 5.0) -> dict[int, StackDump]:
    """Dump every pid concurrently (eight ranks cost about one dump of wall time)."""
    if not pids:
        return {}
    if len(pids) == 1:
        return {pids[0]: pyspy_dump(pyspy, pids[0], native=native, timeout=timeout)}
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        dumps = list(pool.map(lambda p: pyspy_dump(pyspy, p, native=native, timeout=timeout), pids))
    return {d.pid: d for d in dumps}


def agent_dumps(host_dir: Path, pids: list[int], *, timeout: float = 1.0) -> dict[int, StackDump]:
    """Stacks of every pid that has an in-rank agent (tracer.agent), asked concurrently; no FR (cheap, periodic).
    For processes py-spy cannot read (ptrace denied, py-spy missing)."""
    from tracer import agent

    def one(pid: int) -> StackDump | None:
        sock = agent.socket_path(host_dir, pid)
        if not sock.exists():
            return None
        wall, mono = time.time_ns(), time.monotonic_ns()
        try:
            ans = agent.ask(sock, timeout, request=agent.STACKS_REQUEST)
        except (OSError, ValueError) as e:
            return StackDump(pid, wall, mono, error=f"in-rank agent of pid {pid} did not answer: {e}", source="agent")
        threads = ans.get("threads") if isinstance(ans.get("threads"), list) else []
        return StackDump(pid, wall, mono, text=json.dumps(threads), threads=threads, source="agent")

    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return {d.pid: d for d in pool.map(one, pids) if d is not None}


def frame_text(fr: dict[str, Any]) -> str | None:
    """One py-spy JSON frame as ``func (file:line)``, the way analyzers.readers.pyspy spells it."""
    if not isinstance(fr, dict) or not fr.get("name"):
        return None
    loc = fr.get("short_filename") or fr.get("filename") or fr.get("module") or "?"
    line = fr.get("line")
    return f"{fr['name']} ({loc}:{line})" if isinstance(line, int) and line > 0 else f"{fr['name']} ({loc})"


class StackSampler:
    """Records dumps into ``stacks.arrow``: each distinct stack once, then (thread, sample) references."""

    def __init__(self, log: ArrowStreamLog | None, *, max_stacks: int = 20000) -> None:
        self.log, self.max_stacks = log, max_stacks
        self._ids: dict[tuple[str, ...], int] = {}
        self._next_id = 0
        self._last: dict[tuple[int, int], int] = {}   # (pid, tid) -> stack_id of its previous sample
        self._sample = 0
        self.samples_taken = 0

    def _stack_id(self, frames: tuple[str, ...]) -> int:
        sid = self._ids.get(frames)
        if sid is not None:
            return sid
        if len(self._ids) >= self.max_stacks:
            self._ids.clear()  # bounded memory: forgotten stacks are written again when seen again
        self._next_id += 1
        sid = self._ids[frames] = self._next_id
        if self.log is not None:
            self.log.add({"kind": "stack", "stack_id": sid, "frames": list(frames)})
        return sid

    def record(self, dumps: dict[int, StackDump], ranks: dict[int, int | None], trigger: str) -> None:
        self._sample += 1
        self.samples_taken += 1
        seen_pids = set(dumps)
        for pid, d in sorted(dumps.items()):
            rank = ranks.get(pid)
            if d.error is not None:
                if self.log is not None and os.path.exists(f"/proc/{pid}"):  # not: a process that just ended
                    self.log.add({"kind": "error", "sample_id": self._sample, "wall_ns": d.wall_ns, "t_ns": d.t_ns,
                                  "pid": pid, "rank": rank, "trigger": trigger, "detail": d.error})
                continue
            for t in d.threads:
                if not isinstance(t, dict):
                    continue
                frames = tuple(s for s in (frame_text(fr) for fr in t.get("frames") or []) if s is not None)
                tid = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else t.get("thread_id")
                sid = self._stack_id(frames)
                key = (pid, int(tid) if isinstance(tid, int) else -1)
                prev = self._last.get(key)
                self._last[key] = sid
                state = "active+gil" if t.get("owns_gil") else ("active" if t.get("active") else "idle")
                if self.log is not None:
                    self.log.add({"kind": "sample", "stack_id": sid, "sample_id": self._sample, "wall_ns": d.wall_ns,
                                  "t_ns": d.t_ns, "pid": pid, "tid": key[1] if key[1] >= 0 else None, "rank": rank,
                                  "thread_name": t.get("thread_name"), "thread_state": state,
                                  "changed": None if prev is None else prev != sid, "trigger": trigger})
        for key in [k for k in self._last if k[0] not in seen_pids and not os.path.exists(f"/proc/{k[0]}")]:
            del self._last[key]


# ------------------------------------------------------------------------------------------------------ rings

@dataclass
class RingTail:
    """Follows one live ring: identity, groups, phase, newest op index and each group's last seq, incrementally.

    Each :meth:`update` reads only the meta records added since the last call and the op slots after the newest
    one seen (one small read when nothing happened). A ring that wrapped past what was seen is rescanned once.
    """

    path: Path
    pid: int = 0
    rank: int | None = None
    world: int | None = None
    newest: int = 0                 # highest committed op index + 1 seen so far
    meta_used: int = 0              # bytes of the meta region in use
    group_seq: dict[str, int] = field(default_factory=dict)    # group name -> last collective seq entered
    group_desc: dict[str, str] = field(default_factory=dict)
    phase: str | None = None        # last phase mark
    in_init: bool = False           # inside init_process_group / new_group
    exited: bool = False
    last_op: str | None = None
    _hdr: tuple[int, int, int] | None = None   # meta_size, slot_size, slots
    _strings: dict[int, str] = field(default_factory=lambda: {0: ""})
    _meta_off: int = 0
    _scanned: bool = False

    CHUNK = 256

    def progress(self) -> tuple[int, int]:
        return (self.newest, self.meta_used)

    def update(self) -> bool:
        """Read what is new; True when anything changed since the last call."""
        before = (self.newest, self.meta_used)
        try:
            with open(self.path, "rb") as f:
                if self._hdr is None:
                    head = f.read(rf.HEADER.size)
                    if len(head) < rf.HEADER.size:
                        return False
                    fields = rf.HEADER.unpack(head)
                    if fields[0] != rf.MAGIC:
                        return False
                    self.pid = fields[2]
                    self._hdr = (fields[5], fields[6], fields[7])
                    self._meta_off = rf.META_OFFSET
                self._read_meta(f)
                self._read_slots(f)
        except Exception:  # a ring cut or scribbled on: no progress from it this time, never an error upstream
            return False
        return (self.newest, self.meta_used) != before

    def _read_meta(self, f: Any) -> None:
        meta_size = self._hdr[0]  # type: ignore[index]
        end = rf.META_OFFSET + meta_size
        while self._meta_off + rf.META_REC.size <= end:
            f.seek(self._meta_off)
            head = f.read(rf.META_REC.size)
            if len(head) < rf.META_REC.size:
                return
            length, commit = rf.META_REC.unpack(head)
            if length == 0 or self._meta_off + rf.META_REC.size + length > end:
                return
            if commit != rf.META_COMMIT:
                # reserved, not yet committed: a writer is inside (retry next time) unless a later record exists
                nxt = self._meta_off + rf.META_REC.size + length
                f.seek(nxt)
                after = f.read(rf.META_REC.size)
                if len(after) < rf.META_REC.size or rf.META_REC.unpack(after)[0] == 0:
                    return
                self._meta_off = nxt
                continue
            body = f.read(length)
            self._meta_off += rf.META_REC.size + length
            self.meta_used = self._meta_off - rf.META_OFFSET
            try:
                self._meta_record(json.loads(body))
            except ValueError:
                continue

    def _meta_record(self, m: dict[str, Any]) -> None:
        t = m.get("type")
        if t == "str":
            self._strings[int(m["id"])] = m.get("v", "")
        elif t == "identity":
            if m.get("rank") is not None or self.rank is None:
                self.rank = m.get("rank")
                self.world = m.get("world", self.world)
        elif t == "group" and m.get("name") is not None:
            self.group_desc[str(m["name"])] = m.get("desc") or ""
        elif t == "event":
            if m.get("category") == "phase":
                if m.get("name") == "process_exit":
                    self.exited = True
                else:
                    self.phase = str(m.get("name"))
            elif m.get("category") == "init" and m.get("name") in ("init_process_group", "new_group"):
                self.in_init = m.get("kind") == "enter"

    def _read_slots(self, f: Any) -> None:
        import numpy as np

        meta_size, slot_size, slots = self._hdr  # type: ignore[misc]
        if slots <= 0 or slot_size < rf.SLOT.size:
            return
        ops = rf.META_OFFSET + meta_size
        words = slot_size // 8

        def raw_range(first: int, count: int) -> bytes:
            pos = first % slots
            n1 = min(count, slots - pos)
            f.seek(ops + pos * slot_size)
            data = f.read(n1 * slot_size)
            if count > n1:
                f.seek(ops)
                data += f.read((count - n1) * slot_size)
            return data

        def read_range(first: int, count: int) -> Any:
            """Slots [first, first+count) by ring position, as bytes (two reads across the wrap). Seqlock: the range
            is read a second time and a slot whose commit word changed in between (the writer was inside it) gets
            commit 0, so it is not applied; the next update reads it whole."""
            data = raw_range(first, count)
            again = raw_range(first, count)
            n = min(len(data), len(again)) // slot_size
            c1 = np.frombuffer(data, dtype="<u8", count=n * words)[::words]
            c2 = np.frombuffer(again, dtype="<u8", count=n * words)[::words]
            torn = np.flatnonzero(c1 != c2)
            if not torn.size:
                return data
            out = np.frombuffer(data, dtype="<u8", count=n * words).copy()
            out[torn * words] = 0
            return out.tobytes()

        if not self._scanned:
            self._full_scan(f, read_range)
            return
        count = min(self.CHUNK, slots)
        for _ in range(16):
            data = read_range(self.newest, count)
            commits = np.frombuffer(data, dtype="<u8", count=len(data) // slot_size * words)[::words]
            fresh = (commits > self.newest) & (commits <= self.newest + count)
            if not fresh.any():
                if len(commits) and int(commits.max()) > self.newest + count:  # lapped by the writer: rescan
                    self._full_scan(f, read_range)
                return
            top = int(commits[fresh].max())
            self._decode(data, self.newest, top)
            self.newest = top
            if not fresh.all():
                return
        self._full_scan(f, read_range)  # more than 16 chunks behind: jump to the newest

    def _full_scan(self, f: Any, read_range: Any) -> None:
        """Newest index from every commit word (first sight of a ring, or after falling behind a wrap)."""
        import numpy as np

        meta_size, slot_size, slots = self._hdr  # type: ignore[misc]
        words = slot_size // 8
        self._scanned = True
        f.seek(rf.META_OFFSET + meta_size)
        data = f.read(slots * slot_size)
        commits = np.frombuffer(data, dtype="<u8", count=len(data) // slot_size * words)[::words]
        top = int(commits.max()) if len(commits) else 0
        if top > self.newest:
            first = max(self.newest, top - min(self.CHUNK, slots))
            self._decode(read_range(first, top - first), first, top)
            self.newest = top

    def _decode(self, data: bytes, first: int, top: int) -> None:
        """Apply committed records with index in [first, top) found in `data` (slots from position first)."""
        import numpy as np

        dt = rf.slot_dtype()
        if self._hdr[1] != dt.itemsize:  # type: ignore[index]
            return
        arr = np.frombuffer(data, dtype=dt, count=len(data) // dt.itemsize)
        arr = arr[(arr["commit"] > first) & (arr["commit"] <= top)]
        if not len(arr):
            return
        arr = arr[np.argsort(arr["commit"], kind="stable")]
        enters = arr[arr["kind"] == _ENTER]
        if len(enters):
            self.last_op = self._strings.get(int(enters["name"][-1]), "?")
        coll = enters[(enters["category"] == _COLLECTIVE) & (enters["seq"] != rf.NONE_I64)]
        for gid, seq in zip(coll["group"].tolist(), coll["seq"].tolist()):   # in order: the last one wins
            self.group_seq[self._strings.get(gid, "?")] = seq
