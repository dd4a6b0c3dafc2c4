"""Benchmark the monitor of ``trace run`` (issue #6): its CPU cost while sampling, and how fast a hang is reported.

1. **CPU cost at default sampling.** An idle-but-alive job: ``examples/tp_job.py --fault queue --world 8`` (every rank
   inits gloo, then blocks in a queue get for ``--hang-seconds``), under ``trace run --hang-after 600`` so no burst
   fires. Once all ranks are known from their rings, the trace-run process's own CPU time (utime+stime from
   ``/proc/<pid>/stat``) is read over a ``--idle-seconds`` window (default 30 s), and so is the CPU of its reaped
   children (``cutime+cstime``: the py-spy dumps; the job itself is not reaped until it ends). Target: own +
   children <= 2 % of one core. With ``--baseline`` the same job also runs under ``--no-monitor`` (the launcher's
   wait loop alone) for comparison.
2. **Time from last progress to printed verdict.** ``--fault skip --world 8`` under ``trace run --hang-after 5
   --on-hang kill``: the last op record any rank wrote (max ``t_ns`` in events.arrow, CLOCK_MONOTONIC) is the last
   progress; stderr lines are timestamped as they arrive. Reported: the delay beyond ``--hang-after`` until the
   early one-line picture (``N s silent: ...``) and until the verdict report.

Each measurement runs ``--repeat`` times; medians and ratios (to the target, to the baseline) are printed.
Usage: ``python bench/bench_monitor.py [--ranks 8] [--idle-seconds 30] [--repeat 3] [--hang-after 5] [--baseline]``
Exit status 1 when a hang run did not end in a verdict, 0 otherwise (targets are reported, not enforced).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.ipc as ipc  # noqa: E402

from ranktrace.tracer.watch.ring_tail import RingTail  # noqa: E402

EXAMPLE = REPO / "examples" / "tp_job.py"
TICK = os.sysconf("SC_CLK_TCK")
TARGET_CPU = 0.02


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RANKTRACE_DIR", None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def _ranks_known(run_dir: Path, n: int) -> bool:
    hosts = [d for d in run_dir.iterdir() if d.is_dir()] if run_dir.exists() else []
    if not hosts:
        return False
    known = 0
    for ring in (hosts[0] / "rings").glob("*.ring"):
        t = RingTail(ring)
        t.update()
        known += t.rank is not None
    return known >= n


def idle_cost(ranks: int, window: float, monitor: bool, light: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        run_dir = Path(tmp) / "run"
        job = ([sys.executable, str(REPO / "bench" / "light_ranks.py"), "--ranks", str(ranks), "--threads", "8",
                "--seconds", str(window + 40)] if light else
               [sys.executable, str(EXAMPLE), "--world", str(ranks), "--fault", "queue",
                "--hang-seconds", str(window + 40), "--timeout", "600"])
        cmd = [sys.executable, "-m", "ranktrace.cli", "run", "-o", str(run_dir), "--hang-after", "600",
               "--no-analyze"] + ([] if monitor else ["--no-monitor"]) + ["--", *job]
        proc = subprocess.Popen(cmd, env=_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not _ranks_known(run_dir, ranks):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the job did not start its ranks")
                time.sleep(0.5)
            time.sleep(3.0)  # past the ranks' start-up
            own0, ch0 = _cpu(proc.pid)
            t0 = time.monotonic()
            time.sleep(window)
            own1, ch1 = _cpu(proc.pid)
            dt = time.monotonic() - t0
        finally:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
    return {"own": (own1 - own0) / dt, "children": (ch1 - ch0) / dt, "total": (own1 - own0 + ch1 - ch0) / dt}


def hang_delay(ranks: int, hang_after: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "ranktrace.cli", "run", "-o", str(run_dir), "--hang-after", str(hang_after),
               "--on-hang", "kill", "--", sys.executable, str(EXAMPLE), "--world", str(ranks), "--steps", "6",
               "--fault", "skip", "--hang-seconds", "300", "--timeout", "300"]
        proc = subprocess.Popen(cmd, env=_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        lines: list[tuple[float, str]] = []

        def read() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                lines.append((time.monotonic(), line.rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=180)
        finally:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        reader.join(timeout=10)
        hosts = [d for d in run_dir.iterdir() if d.is_dir()]
        with pa.memory_map(str(hosts[0] / "events.arrow")) as src:
            ev = ipc.open_file(src).read_all()
        ops = ev.filter(pc.is_in(ev["kind"], value_set=pa.array(["enter", "exit"])))
        last = pc.max(ops["t_ns"]).as_py() / 1e9
    early = next((t for t, ln in lines if " s silent" in ln), None)
    verdict = next((t for t, ln in lines if early is not None and t >= early and not ln.startswith("[ranktrace]")
                    and ln.strip()), None)
    if early is None or verdict is None:
        raise RuntimeError("no verdict was printed:\n" + "\n".join(ln for _t, ln in lines[-20:]))
    return {"early": early - last - hang_after, "verdict": verdict - last - hang_after}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hang-after", type=float, default=5.0)
    p.add_argument("--baseline", action="store_true", help="also measure trace run --no-monitor")
    p.add_argument("--skip-idle", action="store_true")
    p.add_argument("--skip-hang", action="store_true")
    p.add_argument("--light", action="store_true",
                   help="idle cost with small ranks (bench/light_ranks.py: no torch, 8 idle threads each), so a host "
                        "of 64 ranks fits a small machine")
    a = p.parse_args(argv)
    status = 0
    print(f"machine: {os.cpu_count()} CPUs; {a.ranks} {'light ' if a.light else ''}ranks; repeat {a.repeat}")
    if not a.skip_idle:
        runs = [idle_cost(a.ranks, a.idle_seconds, True, a.light) for _ in range(a.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"idle job, default sampling, {a.idle_seconds:.0f} s window (CPU as % of one core):")
        for r in runs:
            print(f"  run: own {r['own']:.2%}  children (py-spy) {r['children']:.2%}  total {r['total']:.2%}")
        print(f"  median: own {med['own']:.2%}  children {med['children']:.2%}  total {med['total']:.2%}  "
              f"ratio to the {TARGET_CPU:.0%} target: own {med['own'] / TARGET_CPU:.2f}, "
              f"total {med['total'] / TARGET_CPU:.2f}")
        if a.baseline:
            base = [idle_cost(a.ranks, a.idle_seconds, False, a.light) for _ in range(a.repeat)]
            bmed = statistics.median(r["total"] for r in base)
            print(f"  --no-monitor baseline: median total {bmed:.2%}; monitor adds {med['total'] - bmed:.2%} "
                  f"(ratio {med['total'] / bmed:.1f}x)" if bmed > 0 else f"  --no-monitor baseline: {bmed:.2%}")
    if not a.skip_hang:
        delays = []
        for _ in range(a.repeat):
            try:
                delays.append(hang_delay(a.ranks, a.hang_after))
            except RuntimeError as e:
                print(f"  hang run failed: {e}")
                status = 1
        if delays:
            print(f"skip fault, --hang-after {a.hang_after:g}: seconds from the last op record, beyond hang-after:")
            for d in delays:
                print(f"  run: early line +{d['early']:.2f} s  verdict +{d['verdict']:.2f} s")
            me = statistics.median(d["early"] for d in delays)
            mv = statistics.median(d["verdict"] for d in delays)
            print(f"  median: early line +{me:.2f} s, verdict +{mv:.2f} s "
                  f"(verdict at {(a.hang_after + mv) / a.hang_after:.2f}x hang-after)")
    return status


if __name__ == "__main__":
    sys.exit(main())
