"""Benchmark ``trace compare`` at DESIGN §7 scale: two 8-rank x 1M-event traces (issue #17: under 5 s).

The traces are written as bench/bench_analyze.py writes them, through the real ``tracer.recorder.Recorder`` (one
process per rank) and finalized into events.arrow: A is hung with rank 7 missing the last op, B with rank 6 missing
it (so every rank's sequence is 1M events long and B departs from A at the very end, on ranks 6 and 7). Then:

* ``compare_paths(A, B)``: both analyses (run side by side, as `trace compare` runs them), each run's every op
  read from its events.arrow (compare.whole), plus the comparison: the figure the issue names, wall seconds, the
  first (cold) run and the median of ``--repeat``;
* the comparison step alone (``compare_analyses`` on the two analyses and their whole tables), i.e. what
  `trace compare` adds once everything is read;
* a baseline measured in the same run: reading one events.arrow into memory with pyarrow (absolute seconds depend on
  the machine and its load; the ratios do not so much).

Usage: ``python bench/bench_compare.py [--ranks 8] [--events 1000000] [--repeat 3] [--keep DIR]``.
Exit status 1 when the comparison is wrong (divergence not at the end of ranks 6 and 7), 0 otherwise; the 5 s target
is reported, not enforced (it is per machine).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analyze import Writers, host_name, prepare  # noqa: E402

from ranktrace.analyzers import api  # noqa: E402
from ranktrace.analyzers.compare import compare_analyses, compare_paths  # noqa: E402
from ranktrace.analyzers.compare.whole import run_tables  # noqa: E402


def _read_arrow(path: Path):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as src:
        return ipc.open_file(src).read_all()


def _timed(fn, repeat: int):
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return walls, statistics.median(cpus), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000, help="events per rank (enter + exit records)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--target", type=float, default=5.0, help="seconds trace compare should stay under (reported)")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace dirs here and keep them")
    args = ap.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_compare_"))
    if args.keep:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    made: list[dict] = []
    writers = Writers()
    try:
        for name, culprit in (("a", args.ranks - 1), ("b", args.ranks - 2)):
            spec = argparse.Namespace(ranks=args.ranks, hosts=1, events=args.events, writer="recorder",
                                      jobs=os.cpu_count() or 2, hold=False, modes=["fin"], culprit=culprit)
            d = prepare(root / name, spec, writers)  # the writers exit: finished, hung-and-killed traces
            d["fin"] = root / name / "fin"
            made.append(d)
        a, b = made[0]["fin"], made[1]["fin"]
        n = made[0]["written"]
        print(f"traces: 2 x {args.ranks} ranks x ~{args.events:,} events = 2 x {n:,} events in {root}")
        walls, cpu, cmp = _timed(lambda: compare_paths(a, b, liveness=None), args.repeat)
        total = statistics.median(walls)
        ra, rb = api.analyze([a], liveness=None), api.analyze([b], liveness=None)
        tables = (run_tables(ra, a, liveness=None), run_tables(rb, b, liveness=None))
        step_walls, step_cpu, _ = _timed(lambda: compare_analyses(ra, rb, str(a), str(b), tables=tables),
                                         args.repeat)
        step = statistics.median(step_walls)
        base_walls, _, tbl = _timed(lambda: _read_arrow(a / host_name(0) / "events.arrow"), args.repeat)
        base = statistics.median(base_walls)
        rows = tbl.num_rows
        del tbl
        print(f"baseline (pyarrow read of one events.arrow, {rows:,} rows): {base:.2f} s")
        print(f"trace compare A B (two analyses side by side + comparison): first run {walls[0]:.2f} s; "
              f"{total:.2f} s median (runs "
              f"{', '.join(f'{w:.2f}' for w in walls)}; cpu {cpu:.2f} s) = {total / base:.1f}x baseline, "
              f"{'within' if total <= args.target else 'OVER'} the {args.target:g} s target")
        print(f"  the comparison step alone: {step:.2f} s median (cpu {step_cpu:.2f} s) = {step / base:.2f}x baseline")
        divs = {d.rank: d for d in cmp.first_divergence}
        last = args.events // 2 - 1       # each rank's ops: pairs - 1 closed + 1 open (culprit: pairs - 1)
        ok = set(divs) == {args.ranks - 2, args.ranks - 1} and all(d.position == last for d in divs.values())
        print(f"  first divergence: {', '.join(f'rank {d.rank} op #{d.position}: A={d.a} B={d.b}' for d in divs.values())}"
              f" -> {'ok' if ok else 'WRONG'}")
        print(f"  verdicts: A {cmp.verdict_a.kind} {list(cmp.verdict_a.culprit_ranks)}, "
              f"B {cmp.verdict_b.kind} {list(cmp.verdict_b.culprit_ranks)}; latency rows {len(cmp.latency)}")
        return 0 if ok else 1
    finally:
        writers.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
