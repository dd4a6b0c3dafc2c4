"""4 gloo ranks (mp.spawn): each sleeps in start-up first (so the watchdog samples start-up stacks), runs 3
all_reduces; then rank 3 leaves with sys.exit(7) and ranks 0-2 wait in the 4th all_reduce until gloo's 6 s
timeout raises there (they exit 1). The job exits 1 (mp.spawn's status)."""
import datetime
import os
import socket
import sys
import time


def rank_main(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    time.sleep(2.0)  # "loading weights"
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=6))
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 3:
        sys.exit(7)
    dist.all_reduce(t)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(rank_main, args=(4,), nprocs=4)
