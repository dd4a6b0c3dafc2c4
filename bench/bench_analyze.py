"""Benchmark ``trace analyze`` at DESIGN §7 scale: 8 ranks x 1M events, finalized and live (issue #4).

What it builds: one host directory written through the real ``tracer.recorder.Recorder`` (one process per rank,
so pids differ as in a job), each rank running enter/exit pairs of all_reduce and broadcast alternately on two
gloo groups ("0" = default_pg, "1" = a second 8-rank group) with per-group seq, interned call sites / dtype /
shape, an identity record, both group records and init_process_group enter/exit marks — the shape
the in-rank wrappers (tracer/rank) record. It is a hang: the last rank (7 of 8) stops one op early, the others enter
one more op and never leave it, so the verdict must be ``missing_ranks`` with that rank as the culprit.

Two copies are analyzed: ``fin/`` (``tracer.finalize.finalize_host_dir`` -> events.arrow, meta.json with the
exit of an ``--on-hang kill`` run) and ``live/`` (rings only, no exit: a job still hung). Each is timed with
``analyzers.facade.analyze([run_dir], liveness=None)``, median of ``--repeat``. Absolute seconds depend on the machine and
its load, so a baseline is measured in the same run: reading events.arrow into memory with pyarrow (a copying
read, not a zero-copy map) — the printed ratio is analyze time / baseline time. Each analyze line also gives every
run's wall time (the first one in a process pays for fresh memory, which costs a lot in some VMs) and the CPU time.

Usage: ``python bench/bench_analyze.py [--ranks 8] [--events 1000000] [--repeat 3] [--keep DIR] [--profile]``
Exit status 1 when a verdict is wrong, 0 otherwise (the time target is reported, not enforced: it is per machine).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.ipc as ipc  # noqa: E402

from ranktrace.analyzers import facade  # noqa: E402
from ranktrace.tracer.launch import finalize  # noqa: E402
from ranktrace.tracer.rank.recorder import Recorder  # noqa: E402

__all__ = ["generate", "main"]

HOST = "bench-node0-0000"
_GROUPS = (("0", "default_pg"), ("1", "dp_group"))
_NAMES = ("all_reduce", "broadcast")
_CALLSITES = ("/app/train.py:118 train_step", "/app/train.py:131 train_step", "/app/model.py:54 sync_params",
              "/app/model.py:77 sync_buffers")


def _write_rank(rings: str, rank: int, world: int, pairs: int, open_last: bool, slots: int, done, stop) -> None:
    """One rank's ring through the real Recorder: `pairs` enter/exit pairs, then (if open_last) one enter more.

    Then the process stays alive ("hung") until `stop` is set, so the live copy is analyzed as a running job."""
    rec = Recorder(os.path.join(rings, f"{os.getpid()}.ring"), slots=slots, proctitle=f"python train.py rank{rank}")
    tid = threading.get_native_id()
    rec.meta({"type": "versions", "torch": "2.5.1", "python": sys.version.split()[0]})
    span = rec.new_span()
    rec.meta({"type": "event", "kind": "enter", "name": "init_process_group", "category": "init", "t_ns": rec.clock(),
              "tid": tid, "span_id": span, "callsite": _CALLSITES[0], "backend": "gloo", "rank": rank, "world": world})
    rec.meta({"type": "identity", "rank": rank, "world": world, "source": "init_process_group", "local_rank": rank,
              "pid": os.getpid(), "ppid": os.getppid(), "argv": ["train.py"]})
    for name, desc in _GROUPS:
        rec.meta({"type": "group", "name": name, "desc": desc, "backend": "gloo", "ranks": list(range(world))})
    rec.meta({"type": "event", "kind": "exit", "name": "init_process_group", "category": "init", "t_ns": rec.clock(),
              "tid": tid, "span_id": span})
    gids = [rec.intern(g) for g, _ in _GROUPS]
    nids = [rec.intern(n) for n in _NAMES]
    cids = [rec.intern(c) for c in _CALLSITES]
    dt, sh = rec.intern("float32"), rec.intern("[1024, 1024]")
    nb = 4 << 20
    op, new_span = rec.op, rec.new_span
    seq = [0, 0]
    total = pairs + (1 if open_last else 0)
    for i in range(total):
        g = i & 1
        seq[g] += 1
        s = seq[g]
        name, cs, span = nids[(i >> 1) & 1], cids[i & 3], new_span()
        op("enter", "collective", name, tid=tid, group_id=gids[g], callsite_id=cs, dtype_id=dt, shape_id=sh, seq=s,
           nbytes=nb, span_id=span)
        if i < pairs:
            op("exit", "collective", name, tid=tid, group_id=gids[g], callsite_id=cs, dtype_id=dt, shape_id=sh,
               seq=s, backend_seq=s, nbytes=nb, span_id=span)
    done.release()
    stop.wait()
    rec.close()


def generate(run_dir: Path, ranks: int, events: int, culprit: int) -> tuple[int, float, object]:
    """Write the rings of a hung job under run_dir/HOST/rings; returns (events written, seconds, stop function).

    The writer processes stay alive until the stop function is called."""
    rings = run_dir / HOST / "rings"
    rings.mkdir(parents=True)
    pairs = events // 2  # ranks != culprit: pairs - 1 closed ops + 1 open enter; culprit: pairs - 1 closed ops
    slots = 1 << max(10, (events + 16).bit_length())
    ctx = mp.get_context("fork")
    done, stop = ctx.Semaphore(0), ctx.Event()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_write_rank, args=(str(rings), r, ranks, pairs - 1, r != culprit, slots, done, stop),
                         daemon=True) for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        while not done.acquire(timeout=1.0):
            if any(q.exitcode not in (None, 0) for q in procs):
                stop.set()
                raise SystemExit("a writer process failed")
    dt = time.perf_counter() - t0
    written = ranks * 2 * (pairs - 1) + (ranks - 1)

    def finish() -> None:
        stop.set()
        for p in procs:
            p.join()

    return written, dt, finish


def _meta(exit_: dict | None, pids: dict) -> dict:
    return {"schema": "ranktrace.meta/1", "run": "bench", "host": HOST, "hostname": os.uname().nodename,
            "command": ["python", "train.py"], "exit": exit_, "pids": pids, "versions": {}}


def prepare(root: Path, ranks: int, events: int, culprit: int) -> dict:
    live = root / "live"
    written, write_s, finish = generate(live, ranks, events, culprit)
    (live / HOST / "meta.json").write_text(json.dumps(_meta(None, {})))
    fin = root / "fin"
    (fin / HOST / "rings").mkdir(parents=True)
    for ring in (live / HOST / "rings").iterdir():  # the rings are read-only from here on: share them
        os.link(ring, fin / HOST / "rings" / ring.name)
    t0 = time.perf_counter()
    info = finalize.finalize_host_dir(fin / HOST)
    fin_s = time.perf_counter() - t0
    exit_ = {"returncode": -15, "exit_code": 143, "signal": 15, "signals_forwarded": [], "killed_on_hang": True}
    (fin / HOST / "meta.json").write_text(json.dumps(_meta(exit_, info["pids"])))
    return {"live": live, "fin": fin, "written": written, "write_s": write_s, "finalize_s": fin_s, "finish": finish}


def _timed(fn, repeat: int) -> tuple[list[float], float, object]:
    """Wall seconds of each run, the median CPU seconds (user + system) per run, and the last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return walls, statistics.median(cpus), out


def _read_arrow(path: Path) -> pa.Table:
    with pa.OSFile(str(path), "rb") as f:
        return ipc.open_file(f).read_all()


def _profile(run_dir: Path, top: int) -> None:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    facade.analyze([run_dir], liveness=None)
    pr.disable()
    print(f"--- profile: {run_dir.name} ---")
    pstats.Stats(pr).sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000, help="events per rank (enter + exit records)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--target", type=float, default=3.0, help="seconds analyze should stay under (reported)")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace dirs here and keep them")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one analyze of each")
    args = ap.parse_args(argv)
    culprit = args.ranks - 1
    if args.keep:
        if args.keep.exists():
            shutil.rmtree(args.keep)
        args.keep.mkdir(parents=True)
        root = args.keep
    else:
        root = Path(tempfile.mkdtemp(prefix="bench_analyze_"))
    d: dict = {}
    try:
        d = prepare(root, args.ranks, args.events, culprit)
        n = d["written"]
        print(f"trace: {args.ranks} ranks x ~{args.events:,} events = {n:,} events in {root}")
        print(f"write (real Recorder, {args.ranks} processes, {os.cpu_count()} cpus): {d['write_s']:.2f} s "
              f"= {n / d['write_s'] / 1e6:.2f} M events/s")
        print(f"finalize (rings -> events.arrow): {d['finalize_s']:.2f} s = {n / d['finalize_s'] / 1e6:.2f} M events/s")
        arrow = d["fin"] / HOST / "events.arrow"
        runs = {label: _timed(lambda label=label: facade.analyze([d[label]], liveness=None), args.repeat)
                for label in ("fin", "live")}
        # the baseline runs last, so that its memory does not pre-warm the analyses
        walls, _cpu, tbl = _timed(lambda: _read_arrow(arrow), args.repeat)
        base_s = statistics.median(walls)
        print(f"baseline (pyarrow read of events.arrow, {arrow.stat().st_size / 1e6:.0f} MB, {tbl.num_rows:,} rows): "
              f"{base_s:.3f} s = {tbl.num_rows / base_s / 1e6:.1f} M events/s")
        del tbl
        ok = True
        for label, (walls, cpu, res) in runs.items():
            v = res.verdict
            secs = statistics.median(walls)
            good = v.kind == "missing_ranks" and tuple(v.culprit_ranks) == (culprit,) and v.status == "hang"
            ok &= good
            print(f"analyze {label:4s}: {secs:.2f} s median (runs {', '.join(f'{w:.2f}' for w in walls)}; "
                  f"cpu {cpu:.2f} s) = {n / secs / 1e6:.2f} M events/s, {secs / base_s:.1f}x baseline, "
                  f"{'within' if secs <= args.target else 'OVER'} the {args.target:g} s target")
            print(f"  verdict: {v.status} {v.kind} culprit {list(v.culprit_ranks)} waiting {list(v.waiting_ranks)} "
                  f"-> {'ok' if good else 'WRONG'}")
        if args.profile:
            for label in ("fin", "live"):
                _profile(d[label], 30)
        return 0 if ok else 1
    finally:
        if "finish" in d:
            d["finish"]()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
