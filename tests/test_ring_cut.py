"""A ring truncated under its running rank never ends that rank (issue #31): someone's cleanup (`: > 1234.ring`, a
copytruncate rotation, a script that empties a folder) cut the file behind the rank's mapping, and the rank's next
record faulted with SIGBUS inside its own all_reduce (exit 135 where the untraced job exits 0). The ring guard
(tracer/rank/_ringguard.c) turns that fault into a ring lost: the job finishes as it would untraced, and the run is
not called a hang or a crash.

Real processes throughout: a 2-rank gloo job under `trace run`, its rings cut from outside while it runs; the same
with faulthandler enabled after the rings exist (torchrun's ``@record`` does that in main()), which used to put its
own SIGBUS handler, which ends the process, on top of ours.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import PY, TRACE, host_dir, trace_env

pytest.importorskip("ranktrace.tracer.rank._ringguard", reason="the ring guard is not compiled here (no C compiler)")

JOB = r"""
import faulthandler, os, sys, time
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def work(rank, cut, late_faulthandler):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
    t = torch.zeros(64)
    for _ in range(200):
        dist.all_reduce(t)
    if late_faulthandler:
        faulthandler.enable()
    open(f"{cut}.ready{rank}", "w").close()
    while not os.path.exists(cut):          # the test cuts the rings, then says so
        time.sleep(0.05)
    for _ in range(3000):                   # every record past the cut lands in pages beyond the file's end
        dist.all_reduce(t)
    dist.barrier()
    print(f"rank {rank} ok {float(t.sum()) == 0.0}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1], sys.argv[2] == "late"), nprocs=2)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_and_cut(tmp_path: Path, faulthandler_when: str) -> tuple[int, str, str, Path, list[Path]]:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    cut = tmp_path / "cut"
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run_dir), "--", PY, str(job), str(cut), faulthandler_when],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=trace_env(PORT=str(_free_port())), stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end and not all((tmp_path / f"cut.ready{r}").exists() for r in (0, 1)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        rings = sorted((host_dir(run_dir) / "rings").glob("*.ring"))
        assert rings, "no rings to cut"
        for ring in rings:  # what `: > ring` does, to every process's ring (the launcher's children alike)
            with open(ring, "r+b") as f:
                f.truncate(0)
        cut.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err, run_dir, rings


@pytest.mark.parametrize("faulthandler_when", ["never", "late"])
def test_rings_cut_under_running_ranks_never_end_them(tmp_path: Path, faulthandler_when: str):
    rc, out, err, run_dir, rings = _run_and_cut(tmp_path, faulthandler_when)
    assert "rank 0 ok True" in out and "rank 1 ok True" in out, (rc, err[-3000:])
    assert rc == 0, err[-3000:]
    assert "Bus error" not in err and "Fatal Python error" not in err, err[-3000:]
    assert all(r.stat().st_size == 0 or not r.exists() for r in rings if r.exists())  # nothing wrote the file again
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["status"] not in ("hang", "crashed"), (verdict["status"], verdict["kind"], verdict["summary"])
    assert verdict["culprit_ranks"] == [], verdict["summary"]
    # the job was traced and its records were lost: the verdict says so, never "no process of it was traced"
    assert "never loaded" not in verdict["summary"] and "was traced" in verdict["summary"], verdict["summary"]
    assert "cut to 0 bytes" in verdict["summary"], verdict["summary"]


def test_a_sigbus_that_is_not_a_rings_still_ends_the_process_as_it_always_did(tmp_path: Path):
    """The guard only takes faults inside its rings: any other mapping cut under a process is SIGBUS as before
    (faulthandler, when on, dumps the stacks once)."""
    script = tmp_path / "other.py"
    script.write_text(
        "import faulthandler, mmap, os, sys\n"
        "from ranktrace.tracer.rank.recorder import Recorder\n"
        "d = sys.argv[1]\n"
        "rec = Recorder(os.path.join(d, 'own.ring'))\n"
        "faulthandler.enable()\n"
        "p = os.path.join(d, 'other'); open(p, 'wb').write(bytes(65536))\n"
        "m = mmap.mmap(os.open(p, os.O_RDWR), 65536)\n"
        "os.truncate(p, 0)\n"
        "m[40000] = 1\n"
        "print('survived')\n")
    res = subprocess.run([PY, str(script), str(tmp_path)], capture_output=True, text=True, env=trace_env(),
                         timeout=60, cwd=tmp_path)
    assert res.returncode == -7 or res.returncode == 135, (res.returncode, res.stderr[-2000:])  # SIGBUS
    assert "survived" not in res.stdout
    assert res.stderr.count("Fatal Python error: Bus error") == 1, res.stderr[-2000:]
