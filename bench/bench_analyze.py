"""Benchmark ``trace analyze`` as a user meets it: a fresh process, the first (cold) run, peak memory (issue #4, #19).

What it builds: a hung job of ``--ranks`` ranks spread over ``--hosts`` host directories (``<run>/<host>/``, 8 ranks
a host by default), every rank's ring in the real recorder format (tracer/rank/recorder.py, layout
tracer/formats/ringformat.py): identity, both group records and init_process_group enter/exit in the meta region, then
``--events`` op records, enter/exit pairs of all_reduce and broadcast alternating on two gloo groups ("0" =
default_pg, "1" = a second world group) with per-group seq and interned call sites / dtype / shape — what the
in-rank wrappers record. The last rank stops one op early, the others enter one more op and never leave it: the
verdict must be ``missing_ranks`` with that rank as the culprit (on the last host).

Writers: ``--writer recorder`` calls ``Recorder.op`` once per record (the rank's own code path, ~0.4 M records/s on
two cores); ``--writer numpy`` (default past 20 M records) creates the ring with the same Recorder (header, meta
region, strings) and writes the op slots as one numpy array in the same layout (``tests/test_bench_writer.py``
checks that both give the same bytes). One process per rank (its own pid, as in a job), at most ``--jobs`` at a
time; for small runs they stay alive until the end (a live job), for large ones they exit once written. Writers
never outlive the bench: they run in their own process group, die with it (PR_SET_PDEATHSIG, and a check of their
parent right after it is set), and the bench kills that group on any exit, SIGTERM and SIGINT included.

Two copies are analyzed: ``live/`` (rings only, meta.json without an exit: a job still hung) and ``fin/``
(``finalize_host_dir`` per host: events.arrow, and meta.json with the exit of an ``--on-hang kill`` run). Each
analysis runs in a **fresh child process** (``api.analyze([run], liveness=None)`` as ``trace analyze`` calls
it), ``--repeat`` times in that process: the first run is the cold figure a user sees (imports excluded, shown
apart), the median of the others the warm one. Per run: wall seconds, CPU seconds (user + system, getrusage of the
child) and the child's peak RSS (ru_maxrss) after it. The parent watches the child's RSS and kills it above
``--rss-cap`` GiB, so a bench of a build that does not scale reports that instead of taking the machine down.

``--impl DIR``: also analyze with another source tree (``git archive <commit> | tar -x -C DIR``), interleaved with
this one (old, new, old, new), so both meet the same machine load.

Usage: ``python bench/bench_analyze.py [--ranks 8] [--events 1000000] [--hosts H] [--repeat 3] [--modes live,fin]
[--keep DIR | --reuse DIR] [--impl DIR] [--profile]``. Exit status 1 when a verdict is wrong, 0 otherwise (time and
memory targets are printed, not enforced: they are per machine).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

__all__ = ["generate", "write_rank", "main"]

_GROUPS = (("0", "default_pg"), ("1", "dp_group"))
_NAMES = ("all_reduce", "broadcast")
_CALLSITES = ("/app/train.py:118 train_step", "/app/train.py:131 train_step", "/app/model.py:54 sync_params",
              "/app/model.py:77 sync_buffers")
PR_SET_PDEATHSIG = 1
GIB = 1 << 30


def host_name(h: int) -> str:
    return f"node{h:03d}-b0075eed"  # hostname + boot id, as hostinfo.host_key() makes it


# --- writing -----------------------------------------------------------------------------------------------------

def write_rank(ring: str, rank: int, world: int, pairs: int, open_last: bool, slots: int, writer: str,
               clock: Any = None, wall_clock: Any = None) -> None:
    """One rank's ring: meta records through the real Recorder, then `pairs` enter/exit pairs (and, if open_last, one
    enter more) — one ``Recorder.op`` call per record (``writer="recorder"``) or one numpy write of the same slots."""
    from ranktrace.tracer.rank.recorder import Recorder

    kw = {k: v for k, v in (("clock", clock), ("wall_clock", wall_clock)) if v is not None}
    rec = Recorder(ring, slots=slots, proctitle=f"python train.py rank{rank}", **kw)
    tid = 4242 if clock is not None else threading.get_native_id()
    pid = os.getpid()
    rec.meta({"type": "versions", "torch": "2.5.1", "python": "3.11.9"})
    span = rec.new_span()
    rec.meta({"type": "event", "kind": "enter", "name": "init_process_group", "category": "init", "t_ns": rec.clock(),
              "tid": tid, "span_id": span, "callsite": _CALLSITES[0], "backend": "gloo", "rank": rank, "world": world})
    rec.meta({"type": "identity", "rank": rank, "world": world, "source": "init_process_group", "local_rank": rank % 8,
              "pid": pid, "ppid": 1, "argv": ["train.py"]})
    for name, desc in _GROUPS:
        rec.meta({"type": "group", "name": name, "desc": desc, "backend": "gloo", "ranks": list(range(world))})
    rec.meta({"type": "event", "kind": "exit", "name": "init_process_group", "category": "init", "t_ns": rec.clock(),
              "tid": tid, "span_id": span})
    gids = [rec.intern(g) for g, _ in _GROUPS]
    nids = [rec.intern(n) for n in _NAMES]
    cids = [rec.intern(c) for c in _CALLSITES]
    dt, sh = rec.intern("float32"), rec.intern("[1024, 1024]")
    nb = 4 << 20
    total = pairs + (1 if open_last else 0)
    if writer == "recorder":
        op, new_span = rec.op, rec.new_span
        seq = [0, 0]
        for i in range(total):
            g = i & 1
            seq[g] += 1
            s = seq[g]
            name, cs, sp = nids[(i >> 1) & 1], cids[i & 3], new_span()
            op("enter", "collective", name, tid=tid, group_id=gids[g], callsite_id=cs, dtype_id=dt, shape_id=sh,
               seq=s, nbytes=nb, span_id=sp)
            if i < pairs:
                op("exit", "collective", name, tid=tid, group_id=gids[g], callsite_id=cs, dtype_id=dt, shape_id=sh,
                   seq=s, backend_seq=s, nbytes=nb, span_id=sp)
    else:
        _write_slots_numpy(rec, total, pairs, tid, gids, nids, cids, dt, sh, nb)
    rec.close()


def _write_slots_numpy(rec: Any, total: int, pairs: int, tid: int, gids: list[int], nids: list[int], cids: list[int],
                       dt: int, sh: int, nb: int) -> None:
    """The slots ``Recorder.op`` would write for the loop in write_rank, in one numpy write (ringformat layout)."""
    import numpy as np

    from ranktrace.tracer.formats import ringformat as rf
    from ranktrace.tracer.formats.ringreader import slot_dtype

    i = np.arange(total, dtype=np.int64)
    n = total + min(pairs, total)          # records: an enter per op, an exit for the first `pairs`
    op_of = np.repeat(i, np.where(i < pairs, 2, 1))
    is_exit = np.zeros(n, dtype=bool)
    is_exit[1:] = op_of[1:] == op_of[:-1]
    g = op_of & 1
    seq = (op_of >> 1) + 1                 # the per-group counter: op i is the (i // 2 + 1)-th on group i & 1
    first_span = rec.new_span()            # spans continue from the Recorder's own counter
    for _ in range(total - 1):
        rec.new_span()
    if n > rec.slots:
        raise ValueError("the numpy writer does not wrap: use more slots")
    arr = np.zeros(n, dtype=slot_dtype())
    arr["commit"] = np.arange(1, n + 1, dtype=np.uint64)
    arr["t_ns"] = np.array([rec.clock() for _ in range(n)], dtype=np.int64) if n <= 4096 else _clock_run(rec, n)
    arr["tid"] = tid
    arr["kind"] = np.where(is_exit, rf.KINDS.index("exit"), rf.KINDS.index("enter"))
    arr["category"] = rf.CATEGORIES.index("collective")
    arr["name"] = np.asarray(nids, dtype=np.uint32)[(op_of >> 1) & 1]
    arr["group"] = np.asarray(gids, dtype=np.uint32)[g]
    arr["callsite"] = np.asarray(cids, dtype=np.uint32)[op_of & 3]
    arr["dtype"] = dt
    arr["shape"] = sh
    arr["peer"] = rf.NONE_I32
    arr["graph_id"] = rf.NONE_I32
    arr["seq"] = seq
    arr["backend_seq"] = np.where(is_exit, seq, rf.NONE_I64)
    arr["nbytes"] = nb
    arr["span_id"] = first_span + op_of
    off = rec._ops_offset
    rec._buf[off:off + n * rf.SLOT_SIZE] = arr.tobytes()
    rec._next = iter(range(n, 1 << 62))
    for k, gid in enumerate(gids):  # the tail index, as Recorder.op keeps it: each group's last enter and exit
        mine = g == k
        for kind, field in ((0, rf.TAIL_FIELD[0]), (1, rf.TAIL_FIELD[1])):
            at = np.flatnonzero(mine & (is_exit == bool(kind)))
            entry = rec.tail.entry(rf.tail_key(0, gid, rf.NONE_I32, nids[0], tid))
            if at.size and entry >= 0:
                struct.pack_into("<Q", rec._buf, entry + field, int(at[-1]) + 1)


def _clock_run(rec: Any, n: int) -> Any:
    """n readings of the recorder's clock: read once, the ones after it 1.2 us apart (a real rank's loop)."""
    import numpy as np

    t0 = rec.clock()
    return t0 + np.arange(n, dtype=np.int64) * 1200


def _shared_clock(t0: int) -> Any:
    """Every rank's clock for the numpy writer: one monotonic base for the whole job, 1.2 us a reading (the cost
    of a real rank's loop), so the same collective happens at the same time on every rank, as in a real job (the
    writers themselves run one after the other)."""
    import itertools

    ticks = itertools.count(t0, 1200)
    return lambda: next(ticks)


def _writer_main(ring: str, rank: int, world: int, pairs: int, open_last: bool, slots: int, writer: str,
                 t0: int, parent: int, hold_fd: int, done_fd: int) -> None:
    """A writer process: die with the bench, write, say so, and (when held) wait for the bench to let go."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the bench died before PDEATHSIG was armed
        os._exit(1)
    try:
        write_rank(ring, rank, world, pairs, open_last, slots, writer,
                   clock=_shared_clock(t0) if writer == "numpy" else None)
        os.write(done_fd, b"x")
        if hold_fd >= 0:
            os.read(hold_fd, 1)  # returns (EOF) when the bench closes its end, or the bench's death kills us
    finally:
        os._exit(0)


class Writers:
    """The writer processes: one process group (led by an idle process that lives as long as the bench, so a group
    to join exists whichever writers have finished), killed as a group on any exit of the bench."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.hold_r, self.hold_w = os.pipe()
        self.done_r, self.done_w = os.pipe()
        self.codes: dict[int, int | None] = {}
        parent = os.getpid()
        leader = os.fork()
        if leader == 0:  # the group's leader: waits for the bench to let go (EOF) or die
            try:
                os.setpgid(0, 0)
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() == parent:
                    os.close(self.hold_w)
                    os.read(self.hold_r, 1)
            finally:
                os._exit(0)
        try:
            os.setpgid(leader, leader)
        except OSError:
            pass
        self.pgid, self.leader = leader, leader

    def start(self, *args: Any, hold: bool) -> None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, self.pgid)
            except OSError:
                os._exit(1)
            os.close(self.hold_w)
            os.close(self.done_r)
            _writer_main(*args, parent=parent, hold_fd=self.hold_r if hold else -1, done_fd=self.done_w)
        try:
            os.setpgid(pid, self.pgid)  # both sides set it: no race with the first kill
        except OSError:
            pass
        self.pids.append(pid)

    def wait_done(self, n: int, timeout: float) -> None:
        import select

        got, deadline = 0, time.monotonic() + timeout
        while got < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"writers: {got} of {n} finished within {timeout:.0f} s")
            r, _, _ = select.select([self.done_r], [], [], 1.0)
            if r:
                got += len(os.read(self.done_r, 4096))
            self.reap()
            failed = [p for p, code in self.codes.items() if code not in (0, None)]
            if failed:
                raise SystemExit(f"a writer process failed (pid {failed[0]}, status {self.codes[failed[0]]})")

    def reap(self) -> None:
        for pid in self.pids:
            if self.codes.get(pid) is None:
                try:
                    got, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    self.codes[pid] = 0
                    continue
                self.codes[pid] = None if got == 0 else os.waitstatus_to_exitcode(status)

    def running(self) -> int:
        self.reap()
        return sum(1 for p in self.pids if self.codes.get(p) is None)

    def close(self) -> None:
        """Let go of held writers and kill the whole group (idempotent)."""
        for fd in (self.hold_w, self.hold_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in [self.leader, *self.pids]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def generate(run_dir: Path, ranks: int, hosts: int, events: int, writer: str, jobs: int, hold: bool,
             writers: Writers, culprit: int | None = None) -> tuple[int, float]:
    """Rings of a hung job under run_dir/<host>/rings (the culprit: the last rank unless given); returns (records
    written, seconds)."""
    per_host = -(-ranks // hosts)
    pairs = events // 2  # the culprit writes pairs - 1 closed ops; every other rank one open enter more
    slots = max(1024, -(-(events + 16) // 32) * 32)  # sized to what a rank writes (a page holds 32 slots)
    culprit = ranks - 1 if culprit is None else culprit
    t0 = time.monotonic_ns()   # the job's shared clock base (numpy writer)
    started = 0
    began = time.perf_counter()
    for r in range(ranks):
        hd = run_dir / host_name(r // per_host)
        (hd / "rings").mkdir(parents=True, exist_ok=True)
        while not hold and writers.running() >= jobs:
            time.sleep(0.005)
        writers.start(str(hd / "rings" / f"rank{r:05d}.ring"), r, ranks, pairs - 1, r != culprit, slots, writer,
                      t0, hold=hold)
        started += 1
    writers.wait_done(started, timeout=3600)
    for ring in run_dir.glob("*/rings/rank*.ring"):  # named by pid, as a rank names its ring
        pid = _ring_pid(ring)
        ring.rename(ring.with_name(f"{pid}.ring"))
    return ranks * 2 * (pairs - 1) + (ranks - 1), time.perf_counter() - began


def _ring_pid(ring: Path) -> int:
    from ranktrace.tracer.formats import ringformat as rf

    with open(ring, "rb") as f:
        return rf.HEADER.unpack(f.read(rf.HEADER.size))[2]


def _meta(host: str, exit_: dict | None, pids: dict) -> dict:
    return {"schema": "ranktrace.meta/1", "run": "bench", "host": host, "hostname": host.rsplit("-", 1)[0],
            "command": ["python", "train.py"], "exit": exit_, "pids": pids, "versions": {}}


def prepare(root: Path, args: argparse.Namespace, writers: Writers) -> dict[str, Any]:
    from ranktrace.tracer.launch import finalize

    live, fin = root / "live", root / "fin"
    written, write_s = generate(live, args.ranks, args.hosts, args.events, args.writer, args.jobs, args.hold, writers,
                                getattr(args, "culprit", None))
    for hd in sorted(live.iterdir()):
        (hd / "meta.json").write_text(json.dumps(_meta(hd.name, None, {})))
    fin_s = 0.0
    if "fin" in args.modes:
        exit_ = {"returncode": -15, "exit_code": 143, "signal": 15, "signals_forwarded": [], "killed_on_hang": True}
        for hd in sorted(live.iterdir()):
            fd = fin / hd.name
            (fd / "rings").mkdir(parents=True)
            for ring in (hd / "rings").iterdir():  # read-only from here on: shared
                os.link(ring, fd / "rings" / ring.name)
            t0 = time.perf_counter()
            info = finalize.finalize_host_dir(fd)
            fin_s += time.perf_counter() - t0
            (fd / "meta.json").write_text(json.dumps(_meta(hd.name, exit_, info["pids"])))
    return {"written": written, "write_s": write_s, "finalize_s": fin_s}


# --- measuring (in a fresh child process) ------------------------------------------------------------------------

def _use_tree(root: Path) -> None:
    """Import ranktrace from another source tree (tracer/ and analyzers/ as ranktrace.tracer / .analyzers)."""
    import importlib.machinery
    import importlib.util

    roots = {"ranktrace": root / "ranktrace", "ranktrace.tracer": root / "tracer",
             "ranktrace.analyzers": root / "analyzers"}

    class Finder:
        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
            if name in roots:
                init = roots[name] / "__init__.py"
                return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(roots[name])])
            return None

    sys.meta_path.insert(0, Finder)


def _io() -> dict[str, int]:
    """This process's I/O counters (/proc/self/io: rchar, read_bytes), {} where the kernel does not show them."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f) if k in ("rchar", "read_bytes")}
    except (OSError, ValueError):
        return {}


def drop_caches() -> str | None:
    """Drop the page cache (clean pages only: sync first), so the next read comes from the disk; why not, if not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return None
    except OSError as e:
        return f"page cache not dropped ({e.strerror}): the first run may be warm"


def window_bytes(path: Path, kept_rows: int) -> int:
    """The bytes an analysis needs at least: every ring's header page and the meta region it uses, and a slot per
    record kept (``kept_rows`` event rows: op records plus the meta region's events, so a slight over-count)."""
    from ranktrace.tracer.formats import ringformat as rf

    total = kept_rows * rf.SLOT_SIZE
    for ring in path.glob("*/rings/*.ring"):
        with open(ring, "rb") as f:
            head = f.read(rf.HEADER_SIZE)
            meta_size = rf.HEADER.unpack_from(head, 0)[5]
            off = rf.META_OFFSET
            while off + rf.META_REC.size <= rf.META_OFFSET + meta_size:
                f.seek(off)
                length = rf.META_REC.unpack(f.read(rf.META_REC.size))[0]
                if length == 0:
                    break
                off += rf.META_REC.size + length
        total += off
    return total


def child(args: argparse.Namespace) -> int:
    """Analyze `args.path` --repeat times in this (fresh) process; one JSON line per run on stdout."""
    t0 = time.perf_counter()
    if args.impl:
        _use_tree(Path(args.impl[-1]))
    else:
        sys.path.insert(0, str(REPO))
    from ranktrace.analyzers import api

    print(json.dumps({"import_s": time.perf_counter() - t0, "impl": api.__file__}), flush=True)
    for i in range(args.repeat):
        io0 = _io()
        r0, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if args.profile and i == 0:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            a = api.analyze([Path(args.path)], liveness=None)
            pr.disable()
            pstats.Stats(pr, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
        else:
            a = api.analyze([Path(args.path)], liveness=None)
        wall = time.perf_counter() - t1
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        io1 = _io()
        v = a.verdict
        print(json.dumps({"wall": wall, "cpu": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
                          "maxrss": r1.ru_maxrss * 1024,
                          **{k: io1[k] - io0.get(k, 0) for k in io1}, "status": v.status, "kind": v.kind,
                          "culprits": list(v.culprit_ranks), "waiting": len(v.waiting_ranks),
                          "summary": v.summary, "events": a.events.num_rows, "ops": a.ops.num_rows}), flush=True)
        del a, v
    return 0


def measure(path: Path, repeat: int, impl: str | None, rss_cap: float, profile: bool,
            cold: bool = True) -> dict[str, Any]:
    """One fresh child analyzing `path` (the page cache dropped first when `cold`): its JSON lines, or why it did
    not finish (killed above the RSS cap)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--path", str(path), "--repeat", str(repeat)]
    if impl:
        cmd += ["--impl", impl]
    if profile:
        cmd += ["--profile"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def arm() -> None:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    not_cold = drop_caches() if cold else "page cache kept (--no-cold)"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=arm, start_new_session=True)
    peak, killed = 0, None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        while proc.poll() is None:
            rss = _rss(proc.pid)
            peak = max(peak, rss)
            if rss > rss_cap * GIB:
                killed = f"killed at {rss / GIB:.1f} GiB RSS (cap {rss_cap:g} GiB)"
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        reader.join(timeout=10)
    rows = [json.loads(x) for x in lines if x.startswith("{")]
    head = rows[0] if rows and "import_s" in rows[0] else {}
    runs = [r for r in rows if "wall" in r]
    return {"import_s": head.get("import_s"), "runs": runs, "not_cold": not_cold, "killed": killed or (
        None if proc.returncode == 0 else f"exit status {proc.returncode}"), "polled_peak": peak}


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _io_line(r: dict[str, Any], ranks: int, window: int) -> str:
    if "rchar" not in r:
        return "bytes read: /proc/self/io not readable"
    return (f"read {r['rchar'] / 1e9:.2f} GB (rchar), {r.get('read_bytes', 0) / 1e9:.2f} GB from disk (read_bytes) = "
            f"{r['rchar'] / ranks / 1e6:.2f} / {r.get('read_bytes', 0) / ranks / 1e6:.2f} MB a rank; "
            f"{max(r['rchar'], r.get('read_bytes', 0)) / max(1, window):.2f} x the windows kept "
            f"({window / 1e6:.1f} MB)")


def _report(label: str, m: dict[str, Any], n: int, culprit: int, target_s: float, target_gib: float,
            ranks: int = 1, path: Path | None = None) -> bool:
    runs = m["runs"]
    if not runs:
        print(f"  {label}: no result ({m['killed']}; peak seen {m['polled_peak'] / GIB:.2f} GiB)")
        return False
    cold = runs[0]
    good = all(r["kind"] == "missing_ranks" and r["culprits"] == [culprit] and r["status"] == "hang" for r in runs)
    line = (f"  {label}: cold {cold['wall']:.2f} s wall, {cold['cpu']:.2f} s CPU, peak {cold['maxrss'] / GIB:.2f} GiB "
            f"(+{m['import_s']:.2f} s imports) = {n / cold['wall'] / 1e6:.2f} M events/s "
            f"[{'within' if cold['wall'] <= target_s else 'OVER'} {target_s:g} s, "
            f"{'within' if cold['maxrss'] <= target_gib * GIB else 'OVER'} {target_gib:g} GiB]")
    if len(runs) > 1:
        warm = runs[1:]
        line += (f"; warm median {statistics.median(r['wall'] for r in warm):.2f} s wall, "
                 f"{statistics.median(r['cpu'] for r in warm):.2f} s CPU (runs "
                 f"{', '.join(format(r['wall'], '.2f') for r in runs)}), peak {runs[-1]['maxrss'] / GIB:.2f} GiB")
    print(line)
    window = window_bytes(path, cold["events"]) if path is not None else 0
    print(f"    cold {_io_line(cold, ranks, window)}" + (f" [{m['not_cold']}]" if m.get("not_cold") else ""))
    if len(runs) > 1:
        print(f"    warm {_io_line(runs[-1], ranks, window)}")
    print(f"    verdict: {cold['status']} {cold['kind']} culprit {cold['culprits']} ({cold['waiting']} waiting; "
          f"{cold['events']:,} event rows, {cold['ops']:,} op rows kept) -> {'ok' if good else 'WRONG'}")
    if m["killed"]:
        print(f"    {m['killed']}")
    return good


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000, help="records per rank (enter + exit)")
    ap.add_argument("--hosts", type=int, default=None, help="host directories (default: one per 8 ranks)")
    ap.add_argument("--repeat", type=int, default=3, help="analyses per fresh process (the first is the cold one)")
    ap.add_argument("--modes", default="live,fin", help="which copies to analyze: live, fin or both")
    ap.add_argument("--writer", choices=("recorder", "numpy"), default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="writer processes at a time")
    ap.add_argument("--hold", action=argparse.BooleanOptionalAction, default=None,
                    help="writers stay alive until the end (default: up to 64 ranks)")
    ap.add_argument("--target", type=float, default=None, help="seconds (default 3 up to 8M records, else 30)")
    ap.add_argument("--mem-target", type=float, default=None, help="GiB (default 2 up to 8M records, else 4)")
    ap.add_argument("--rss-cap", type=float, default=8.0, help="kill an analysis above this many GiB")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace dirs here and keep them")
    ap.add_argument("--reuse", type=Path, default=None, help="analyze the dirs a --keep run left there")
    ap.add_argument("--impl", action="append", default=[], help="also analyze with this source tree (repeatable)")
    ap.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True,
                    help="drop the page cache before each analysing process (root)")
    ap.add_argument("--profile", action="store_true", help="cProfile of the first analysis, on stderr")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, str(REPO))
    args.modes = [m for m in args.modes.split(",") if m]
    args.hosts = args.hosts or max(1, -(-args.ranks // 8))
    total = args.ranks * args.events
    args.writer = args.writer or ("recorder" if total <= 20_000_000 else "numpy")
    args.hold = args.ranks <= 64 if args.hold is None else args.hold
    target_s = args.target or (3.0 if total <= 8_000_000 else 30.0)
    target_gib = args.mem_target or (2.0 if total <= 8_000_000 else 4.0)
    culprit = args.ranks - 1
    writers = Writers()

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # the finally below kills the writers

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    root = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="bench_analyze_"))
    try:
        if args.reuse:
            info = json.loads((root / "bench.json").read_text())
            print(f"reusing {root}: {info['ranks']} ranks x ~{info['events']:,} records on {info['hosts']} host(s)")
            n, culprit = info["written"], info["ranks"] - 1
            target_s = args.target or (3.0 if n <= 8_000_000 else 30.0)   # the run's size, not the flags'
            target_gib = args.mem_target or (2.0 if n <= 8_000_000 else 4.0)
        else:
            if args.keep:
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
            d = prepare(root, args, writers)
            n = d["written"]
            (root / "bench.json").write_text(json.dumps({"ranks": args.ranks, "events": args.events,
                                                         "hosts": args.hosts, "written": n}))
            print(f"trace: {args.ranks} ranks x ~{args.events:,} records on {args.hosts} host(s) = {n:,} records "
                  f"in {root}")
            print(f"write ({args.writer} writer, {args.ranks} processes, {os.cpu_count()} cpus): {d['write_s']:.2f} s "
                  f"= {n / d['write_s'] / 1e6:.2f} M records/s")
            if "fin" in args.modes:
                print(f"finalize (rings -> events.arrow, {args.hosts} host(s)): {d['finalize_s']:.2f} s "
                      f"= {n / d['finalize_s'] / 1e6:.2f} M events/s")
        ok = True
        impls: list[str | None] = [*args.impl, None]
        for label in args.modes:
            path = root / label
            size = sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())
            print(f"analyze {label} ({size / 1e9:.2f} GB on disk = {size / max(1, n):.0f} bytes a record), each in a "
                  f"fresh process:")
            for impl in impls:
                m = measure(path, args.repeat, impl, args.rss_cap, args.profile and impl is None, args.cold)
                name = "this tree" if impl is None else impl
                ranks = json.loads((root / "bench.json").read_text())["ranks"] if (root / "bench.json").exists() else 1
                good = _report(name, m, n, culprit, target_s, target_gib, ranks, path)
                ok &= good or impl is not None  # another tree's wrong verdict is its own
        return 0 if ok else 1
    finally:
        writers.close()
        if not args.keep and not args.reuse:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
