"""Detection speed and false alarms of `trace run` at its default settings (issue #30). Not run in CI.

Every examples/tp_job.py fault and every examples/replica scenario runs under `trace run --on-hang kill` with no
--hang-after (the adaptive default); the time from the onset to the first live verdict and that verdict's kind are
printed, then median and max. The onset is the fault's own marker: the last record any rank wrote before the
verdict (the moment the job went silent: the culprit's last call, the others' entry into the op they wait in, an
exit mark), read from the run's events.arrow. Healthy runs (long compute steps, a non-Python JIT child, a
straggler, a weight read, idle serving) count false alarms: a live HANG verdict or exit code 3.

    python bench/bench_detect.py                   # everything (about 20 minutes on 2 cores)
    python bench/bench_detect.py --only skip,queue --scale 0.25   # a few, healthy durations x0.25

--scale shortens the healthy runs' durations (the report says so); --world sets tp_job's ranks (default 4).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TP_JOB = REPO / "examples" / "tp_job.py"
BUSY = REPO / "tests" / "scripts" / "busy_job.py"
REPLICA = REPO / "examples" / "replica"
HEADLINE = re.compile(r"^(HANG|IDLE|CRASHED|COMPLETED|INCONCLUSIVE|STOPPED|INTERRUPTED)\s+·\s+(\w+)")


@dataclass
class Scenario:
    name: str
    healthy: bool
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 400.0
    stop_after: float | None = None   # a server: SIGTERM to trace run after this long (it forwards it to the job)


@dataclass
class Outcome:
    name: str
    healthy: bool
    rc: int
    seconds: float
    first_verdict: float | None = None        # wall time of the first live "N s silent" line
    status: str | None = None
    kind: str | None = None
    onset: float | None = None
    decided_by: str | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def delay(self) -> float | None:
        return None if self.first_verdict is None or self.onset is None else self.first_verdict - self.onset

    @property
    def false_alarm(self) -> bool:
        return self.healthy and (self.rc == 3 or self.status == "HANG")


def tp_faults(world: int) -> list[Scenario]:
    base = [PY, str(TP_JOB), "--world", str(world), "--steps", "6", "--timeout", "900", "--hang-seconds", "900"]
    faults = ["skip", "mismatch", "die", "nojoin", "tp-skip", "recv-deadlock", "queue", "p2p", "custom-ar"]
    return [Scenario(f"tp:{f}", False, base + ["--fault", f]) for f in faults]


def replica_faults() -> list[Scenario]:
    env = {"PYTHONPATH": os.pathsep.join([str(REPLICA), str(REPO)])}
    plans = {"enqueued-ar": ["--fault-step", "4"], "capture-stall": ["--fault-rank", "2"], "register-one": [],
             "register-all": [], "draft-sync": ["--fault-rank", "1"], "comm-init": [], "die": ["--fault-rank", "2"],
             "nojoin": [], "stale-jit-lock": []}
    out = []
    for fault, extra in plans.items():
        e = dict(env)
        if fault == "stale-jit-lock":
            e["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="bench_detect_ext_")
        out.append(Scenario(f"replica:{fault}", False,
                            [PY, "-m", "sglang.launch_server", "--tp", "4", "--fault", fault, *extra], e))
    return out


def healthy(scale: float, weights: Path) -> list[Scenario]:
    def s(x: float) -> str:
        return f"{x * scale:.0f}"

    env_rep = {"PYTHONPATH": os.pathsep.join([str(REPLICA), str(REPO)])}
    return [
        Scenario("ok:compute-80s", True, [PY, str(BUSY), "compute", "--seconds", s(80)]),
        Scenario("ok:jit-sh-60s", True, [PY, str(BUSY), "jit-sh", "--seconds", s(60)]),
        Scenario("ok:jit-sh-60s-torchrun", True, [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                                 str(BUSY), "jit-sh", "--seconds", s(60)]),
        Scenario("ok:straggler-57s", True, [PY, str(BUSY), "straggler", "--seconds", s(57)]),
        Scenario("ok:tp-straggler-57s", True, [PY, str(TP_JOB), "--world", "4", "--steps", "6", "--fault",
                                              "straggler", "--hang-seconds", s(57), "--timeout", "900"]),
        Scenario("ok:weight-read", True, [PY, str(BUSY), "read", "--seconds", s(40)],
                 {"RANKTRACE_TEST_WEIGHTS": str(weights)}),
        Scenario("ok:replica-jit-60s", True, [PY, "-m", "sglang.launch_server", "--tp", "4", "--jit-seconds", s(60)],
                 env_rep),
        # SGLang-shaped: schedulers in their event loop after "fired up and ready to roll"; ended by the timer below
        Scenario("ok:replica-serve-idle-180s", True, [PY, "-m", "sglang.launch_server", "--tp", "4", "--serve"],
                 env_rep, stop_after=float(s(180))),
    ]


def onset_of(run: Path, before: float) -> float | None:
    """Wall time of the last record any rank wrote before `before` (the first verdict)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc

    best = None
    for f in run.glob("*/events.arrow"):
        with pa.memory_map(str(f)) as src:
            t = ipc.open_file(src).read_all().select(["wall_ns"])
        w = t.column("wall_ns")
        w = pc.filter(w, pc.less(w, int(before * 1e9)))
        if len(w):
            m = pc.max(w).as_py() / 1e9
            best = m if best is None else max(best, m)
    return best


def run_one(sc: Scenario, base: Path) -> Outcome:
    run = base / sc.name.replace(":", "_")
    env = dict(os.environ, **sc.env)
    env.pop("RANKTRACE_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (sc.env.get("PYTHONPATH", str(REPO)),
                                                    os.environ.get("PYTHONPATH", "")) if p)
    cmd = [PY, "-m", "ranktrace.cli", "run", "-o", str(run), "--on-hang", "kill", "--", *sc.argv]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    out = Outcome(sc.name, sc.healthy, 0, 0.0)
    timer = threading.Timer(sc.timeout, lambda: os.killpg(proc.pid, 9))
    timer.start()
    stop = threading.Timer(sc.stop_after, lambda: proc.send_signal(15)) if sc.stop_after else None
    if stop is not None:
        stop.start()
    pending_kind = False
    assert proc.stderr is not None
    for line in proc.stderr:
        now = time.time()
        line = line.rstrip("\n")
        out.lines.append(line)
        if "hang suspected after" in line and out.decided_by is None:
            why = line.split("(", 1)[-1]
            out.decided_by = why[:-1] if why.endswith(")") else why
        if " s silent" in line and out.first_verdict is None:
            out.first_verdict = now
            pending_kind = True
        elif pending_kind and HEADLINE.match(line):
            m = HEADLINE.match(line)
            assert m
            out.status, out.kind = m.group(1), m.group(2)
            pending_kind = False
    out.rc = proc.wait()
    timer.cancel()
    if stop is not None:
        stop.cancel()
    out.seconds = time.time() - t0
    if out.first_verdict is not None:
        try:
            out.onset = onset_of(run, out.first_verdict)
        except Exception as e:  # a run cut before finalize: said, not fatal
            print(f"  {sc.name}: no onset ({type(e).__name__}: {e})")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated scenario names or prefixes (tp:, replica:, ok:)")
    p.add_argument("--scale", type=float, default=1.0, help="healthy durations x this (1 = as the issue says)")
    p.add_argument("--weights-mib", type=int, default=2048, help="size of the weight file the read run reads")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--json", type=Path, default=None, help="also write every outcome here")
    a = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench_detect_"))
    weights = base / "weights.bin"
    scenarios = tp_faults(a.world) + replica_faults() + healthy(a.scale, weights)
    if a.only:
        keys = [k for k in a.only.split(",") if k]
        scenarios = [s for s in scenarios if any(s.name == k or s.name.startswith(k) for k in keys)]
    if any(s.name == "ok:weight-read" for s in scenarios):
        with open(weights, "wb") as f:  # written once; the read comes from the page cache, as a warm reload does
            chunk = os.urandom(1 << 20)
            for _ in range(a.weights_mib):
                f.write(chunk)
    results = []
    for sc in scenarios:
        r = run_one(sc, base)
        results.append(r)
        d = f"{r.delay:5.1f} s" if r.delay is not None else "   -   "
        print(f"{r.name:28} rc={r.rc:<3} {d}  {r.status or '-'} {r.kind or ''}  ({r.seconds:.0f} s run)"
              + (f"  [{r.decided_by}]" if r.decided_by else "") + ("  FALSE ALARM" if r.false_alarm else ""),
              flush=True)
    faults = [r for r in results if not r.healthy]
    delays = [r.delay for r in faults if r.delay is not None]
    if faults:
        ended = [f"{r.name} (rc {r.rc})" for r in faults if r.first_verdict is None and r.rc not in (3, -9)]
        missed = [r.name for r in faults if r.delay is None and r.rc in (3, -9)]
        print(f"\nfaults: {len(faults)}, reported live: {len(delays)}"
              + (f", ended on their own before any silence (a crash, not a hang): {', '.join(ended)}" if ended else "")
              + (f", missed: {', '.join(missed)}" if missed else ""))
        if delays:
            print(f"onset -> first verdict: median {statistics.median(delays):.1f} s, max {max(delays):.1f} s")
    ok = [r for r in results if r.healthy]
    if ok:
        print(f"healthy runs: {len(ok)}, false alarms: {sum(r.false_alarm for r in ok)}"
              + (f" (durations x{a.scale:g})" if a.scale != 1 else ""))
    if a.json:
        a.json.write_text(json.dumps([{k: getattr(r, k) for k in ("name", "healthy", "rc", "seconds", "status",
                                                                   "kind", "decided_by")} | {"delay": r.delay}
                                      for r in results], indent=1))
    print(f"runs kept in {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
