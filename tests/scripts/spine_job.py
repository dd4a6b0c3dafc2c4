"""A clean 4-rank gloo job touching every hooked path once (tests/test_run_spine.py shares it for many checks).

`from torch.distributed import all_reduce` is bound at import time, before ranktrace patches anything a user could
see; the job then runs collectives, object collectives, p2p pairs and a subgroup, prints to stdout and exits 0.
"""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import all_reduce  # early-bound reference

STEPS = 5


def rank_main(rank: int, world: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    t = torch.ones(8)
    for _ in range(STEPS):
        all_reduce(t)                       # early-bound
        dist.broadcast(t, src=0)            # module attribute
    out = [None] * world
    dist.all_gather_object(out, {"rank": rank})  # one op, though torch issues two inside
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
    if rank % 2 == 0:
        dist.send(torch.zeros(2), dst=rank + 1)
    else:
        buf = torch.zeros(2)
        dist.recv(buf, src=rank - 1)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    print("spine job starting", flush=True)
    sys.stderr.write("spine job stderr line\n")
    mp.spawn(rank_main, args=(4,), nprocs=4)
    sys.exit(int(os.environ.get("SPINE_EXIT", "0")))
