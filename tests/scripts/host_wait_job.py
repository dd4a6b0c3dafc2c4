"""A gloo job whose ranks hang on the host, outside any collective, the ways issue #29 lists (run by
tests/test_host_waits.py under `trace run`):

  baton   every rank builds a torch C++ extension through torch.utils.cpp_extension.load; a start killed mid-build
          left the build's FileBaton lock behind (TORCH_EXTENSIONS_DIR/<name>/lock), so every rank waits in
          FileBaton.wait forever, at 0% CPU
  other   rank 1 blocks in fcntl.flock on HOST_WAIT_LOCK (another process holds it); rank 2 blocks reading a pipe
          from a child that never writes; rank 3 runs a thread that keeps the GIL while it sleeps in native code
          (ctypes.PyDLL does not release it), so its main thread never runs again; rank 0 waits for all three in an
          all_reduce
"""
from __future__ import annotations

import datetime
import fcntl
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, what: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    dist.all_reduce(torch.ones(4))
    if what == "baton":
        from torch.utils import cpp_extension

        print(f"rank {rank}: Loading JIT ops", flush=True)
        cpp_extension.load("fused_op", sources=[os.environ["HOST_WAIT_SRC"]])
    elif rank == 1:
        with open(os.environ["HOST_WAIT_LOCK"], "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
    elif rank == 2:
        child = subprocess.Popen(["sleep", "300"], stdout=subprocess.PIPE)
        child.stdout.read()  # type: ignore[union-attr]
    elif rank == 3:
        import ctypes
        import threading

        threading.Thread(target=ctypes.PyDLL(None).sleep, args=(300,), name="native_holder", daemon=True).start()
        time.sleep(0.5)
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    what = sys.argv[1]
    world = 2 if what == "baton" else 4
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, what, port), nprocs=world)
