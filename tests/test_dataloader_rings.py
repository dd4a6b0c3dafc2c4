"""DataLoader workers keep no ring once they are gone (issue #31): every Python process that imports torch gets a
ring, reserved in full on disk when it is made, and each epoch of a spawn DataLoader starts new workers; 10 epochs of
4 workers kept 370 MB of rings under the run folder for the job's whole life. A worker that recorded no collective
now removes its ring as it exits; the job itself (a real gloo rank with a real spawn DataLoader under `trace run`)
counts the rings left before it ends.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import PY, TRACE, trace_env

JOB = r"""
import os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 8
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.full((4,), float(i))

if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
    rings = os.path.join(os.environ["RANKTRACE_DIR"], "rings")
    total = torch.zeros(4)
    for epoch in range(3):
        for batch in DataLoader(Slow(), batch_size=2, num_workers=2, multiprocessing_context="spawn"):
            total += batch.sum(0)
        dist.all_reduce(total)
        time.sleep(0.5)     # the epoch's workers are gone by now
        print(f"epoch {epoch} rings {len([r for r in os.listdir(rings) if r.endswith('.ring')])}", flush=True)
    print("sum", float(total.sum()), flush=True)
    dist.destroy_process_group()
"""


def _port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_dataloader_workers_that_recorded_nothing_leave_no_ring(tmp_path: Path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    run_dir = tmp_path / "run"
    res = subprocess.run(TRACE + ["run", "-o", str(run_dir), "--", PY, str(job), _port()], capture_output=True,
                         text=True, env=trace_env(), timeout=240, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = [int(ln.split()[-1]) for ln in res.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(counts) == 3, res.stdout
    assert counts == [1, 1, 1], f"rings left after each epoch (the rank's own is 1): {counts}"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["status"] == "completed", verdict["summary"]
