"""A p2p deadlock is a wait cycle (issue #16): two ranks each in recv from the other wait on each other, neither
departs from the other, and the verdict contract's kind for that is ``wait_cycle`` — not missing_ranks, whose advice
("look at what rank N does instead of recv") does not fit."""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import PY, run_trace

RECV_RECV = r'''
import datetime, os, socket
import torch, torch.distributed as dist, torch.multiprocessing as mp
def rank_main(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=5))
    t = torch.ones(4)
    dist.all_reduce(t)
    buf = torch.zeros(4)
    dist.recv(buf, src=1 - rank)   # both wait for the other to send first
if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(rank_main, args=(2,), nprocs=2)
'''


def test_two_ranks_each_in_recv_from_the_other_is_a_wait_cycle(tmp_path: Path):
    run_dir = tmp_path / "run"
    job = tmp_path / "recv_recv.py"  # a file: mp.spawn's children import their function from it
    job.write_text(RECV_RECV)
    res = run_trace(["run", "-o", str(run_dir), "--", PY, str(job)], timeout=180)
    assert res.returncode != 0, res.stderr[-2000:]
    v = json.loads((run_dir / "verdict.json").read_text())
    assert (v["kind"], v["culprit_ranks"]) == ("wait_cycle", [0, 1]), v["summary"]
    assert v["operation"]["name"] == "recv"
    assert "wait on each other" in v["summary"]
    main = [f for f in v["findings"] if f["kind"] == "wait_cycle"]
    assert main and main[0]["confidence"] <= 0.5
    steps = " ".join(v["next_steps"])
    assert "send" in steps and "order" in steps and "instead of recv" not in steps, v["next_steps"]
