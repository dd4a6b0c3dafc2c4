"""4 ranks all_reduce in a loop; rank 2 SIGKILLs itself after op 6, mid-loop (its records must survive)."""
import datetime
import os
import signal
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=5))
    t = torch.ones(4)
    for i in range(40):
        if rank == 2 and i == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(rank_main, args=(4,), nprocs=4)
