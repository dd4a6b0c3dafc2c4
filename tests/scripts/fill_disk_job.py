"""2 gloo ranks; at FILL_AT ("start": before any collective, "middle": after 10 all_reduces) rank 0 fills the
filesystem of the directory given as argv[1] until ENOSPC, then every rank runs 3000 more all_reduces (enough to
touch pages of its ring never touched before) and prints "rank N ok". Exit 0 when nothing hurt the job."""
import datetime
import os
import socket
import sys

FILL_DIR = sys.argv[1]
FILL_AT = sys.argv[2] if len(sys.argv) > 2 else "middle"


def fill() -> None:
    try:
        with open(os.path.join(FILL_DIR, "filler"), "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
                f.flush()
    except OSError as e:
        print("disk full:", e.errno, flush=True)


def main(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    t = torch.ones(4)
    for _ in range(10):
        dist.all_reduce(t)
    dist.barrier()
    if rank == 0 and FILL_AT == "middle":
        fill()
    dist.barrier()
    for _ in range(3000):
        dist.all_reduce(t)
    dist.destroy_process_group()
    os.write(1, f"rank {rank} ok\n".encode())  # one write: the two ranks share the pipe


if __name__ == "__main__":
    if FILL_AT == "start":
        fill()  # before torch.distributed is imported anywhere: no ring can be made
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(main, args=(2,), nprocs=2)
