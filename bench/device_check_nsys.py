"""Device check for issue #17 (`trace run --nsys`): run on a machine with 1+ NVIDIA GPUs, Nsight Systems and the
ranktrace dependencies (torch with CUDA, pyarrow, click; `nvtx` for ranktrace's own NVTX ranges), from the repo root.

    python bench/device_check_nsys.py          # ~1-3 min; exit 0 when every check passes, 2 when it cannot run

What it does: `trace run --nsys --hang-after 10 --on-hang kill` on a small NCCL job that hangs while a GPU kernel
is still running:
  * 2+ GPUs: 2 ranks do three all_reduces, then rank 1 skips the fourth (it sleeps) while rank 0's NCCL kernel
    spins waiting for it (the classic missing-rank hang);
  * 1 GPU: 1 rank does three all_reduces, then launches a kernel that spins for minutes (``torch.cuda._sleep``)
    and blocks in ``torch.cuda.synchronize`` (NCCL refuses two ranks on one device).
Checks (``check_run``, also run by tests/test_nsys_run.py against the stand-in nsys, GPU-only checks aside):
  1. trace run exits 3 (hang found, job killed); 2. the nsys report was written and exported before the kill
  (stderr order: stopping collection < exported < --on-hang kill); 3. meta.json records the session, stopped on
  the hang, and the export; 4. the export is an nsys SQLite the reader reads; 5. [GPU] it holds finished kernels
  and a launch with no completion (the spinning kernel is absent, not open); 6. [GPU, nvtx installed] ranktrace-
  domain NVTX ranges name the ops; 7. the verdict is a hang (2 GPUs: missing_ranks, culprit rank 1); 8. the
  export's processes take the ranks of the rings (fused into the same analysis).
Prints PASS/FAIL per check and the nsys version the session commands ran against.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

JOB = r'''
import datetime, os, sys, time
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, world):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600),
                            device_id=torch.device("cuda", rank))
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    if world == 1:
        torch.cuda._sleep(1 << 40)        # a kernel that spins for minutes
        torch.cuda.synchronize()          # the host blocks here
    elif rank == 1:
        time.sleep(600)                   # never issues the fourth all_reduce
    else:
        dist.all_reduce(x)                # its NCCL kernel waits for rank 1
        torch.cuda.synchronize()

if __name__ == "__main__":
    world = min(2, torch.cuda.device_count())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    mp.spawn(worker, args=(world,), nprocs=world, join=True)
'''


@dataclass
class Check:
    name: str
    ok: bool | None          # None: skipped
    detail: str = ""


def check_run(run_dir: Path, returncode: int, stderr: str, *, gpus: int, standin: bool = False) -> list[Check]:
    """What a `trace run --nsys ... --on-hang kill` of the hung job must have left. `standin`: the nsys was the
    test stand-in (no GPU, no kernels): the GPU-only checks are skipped."""
    import pyarrow.compute as pc

    from ranktrace.analyzers import api
    from ranktrace.analyzers.readers import nsys as nsys_reader

    out: list[Check] = [Check("trace run exits 3 (hang found, job killed)", returncode == 3, f"exit {returncode}")]
    order = [stderr.find(s) for s in ("nsys: stopping collection", "exported to", "--on-hang kill: SIGTERM sent")]
    out.append(Check("report written and exported before the kill", -1 not in order and order == sorted(order),
                     f"positions in stderr {order}"))
    hosts = [d for d in run_dir.iterdir() if d.is_dir()]
    meta = json.loads((hosts[0] / "meta.json").read_text()) if hosts else {}
    ns = meta.get("nsys") or {}
    out.append(Check("meta.json: session stopped on the hang, export recorded",
                     bool(ns.get("stopped_on_hang") and ns.get("export")), json.dumps(ns)[:300]))
    export = Path(ns.get("export") or run_dir / "missing.sqlite")
    try:
        res = nsys_reader.read(export)
        out.append(Check("the export is an nsys SQLite the reader reads", True, f"{res.version}"))
    except Exception as e:
        out.append(Check("the export is an nsys SQLite the reader reads", False, f"{type(e).__name__}: {e}"))
        res = None
    if standin:
        out.append(Check("[GPU] finished kernels and a launch with no completion", None, "stand-in nsys"))
        out.append(Check("[GPU] ranktrace NVTX ranges name the ops", None, "stand-in nsys"))
    elif res is not None:
        ev = res.events.to_pylist()
        done = [r for r in ev if r["kind"] == "complete"]
        pending = [r for r in ev if r["detail"] == nsys_reader.NO_COMPLETION]
        out.append(Check("[GPU] finished kernels and a launch with no completion", bool(done) and bool(pending),
                         f"{len(done)} finished, {len(pending)} without completion"))
        ranges = [r for r in ev if r["category"] in ("collective", "p2p") and r["kind"] == "enter"
                  and "kernel" not in (r["detail"] or "")]
        import importlib.util

        have_nvtx = importlib.util.find_spec("nvtx") is not None
        out.append(Check("[GPU] ranktrace NVTX ranges name the ops", bool(ranges) if have_nvtx else None,
                         f"{len(ranges)} op ranges" if have_nvtx else "python package nvtx not installed"))
    try:
        v = json.loads((run_dir / "verdict.json").read_text())
        ok = v["status"] == "hang" and (gpus < 2 or (v["kind"], v["culprit_ranks"]) == ("missing_ranks", [1]))
        out.append(Check("the verdict is the hang" + (" (missing_ranks, culprit 1)" if gpus >= 2 else ""), ok,
                         f"{v['status']} {v['kind']} culprits {v['culprit_ranks']}: {v['summary'][:160]}"))
    except (OSError, ValueError, KeyError) as e:
        out.append(Check("the verdict is the hang", False, f"verdict.json: {e}"))
    try:
        an = api.analyze([run_dir], liveness=None)
        ranks = sorted({r for r in an.events.filter(pc.equal(an.events["source"], "nsys"))["rank"].to_pylist()
                        if r is not None})
        out.append(Check("the export's processes take the ranks of the rings", bool(ranks), f"ranks {ranks}"))
    except Exception as e:
        out.append(Check("the export's processes take the ranks of the rings", False, f"{type(e).__name__}: {e}"))
    return out


def main() -> int:
    import importlib.util

    missing = [m for m in ("torch", "pyarrow", "click") if importlib.util.find_spec(m) is None]
    exe = shutil.which("nsys")
    if missing or exe is None:
        print(f"cannot run: {'missing ' + ', '.join(missing) if missing else ''} {'' if exe else 'nsys not on PATH'}")
        return 2
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("cannot run: no CUDA device")
        return 2
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"nsys: {exe}: {version}; GPUs: {gpus}")
    tmp = Path(tempfile.mkdtemp(prefix="device_check_nsys_"))
    job = tmp / "hang_job.py"
    job.write_text(JOB)
    run_dir = tmp / "run"
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "ranktrace.cli", "run", "--nsys", "--hang-after", "10",
                          "--startup-hang-after", "120", "--on-hang", "kill", "-o", str(run_dir), "--",
                          sys.executable, str(job)], capture_output=True, text=True, timeout=900, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    print(f"trace run: exit {res.returncode} after {time.time() - t0:.0f} s; trace in {run_dir}")
    print("\n".join(x for x in res.stderr.splitlines() if x.startswith("[ranktrace]")))
    checks = check_run(run_dir, res.returncode, res.stderr, gpus=gpus)
    for c in checks:
        print(f"{'SKIP' if c.ok is None else 'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    return 0 if all(c.ok is not False for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
