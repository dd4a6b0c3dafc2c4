"""A small healthy torchrun job (gloo, CPU): every rank does STEPS all_reduces and a barrier, then exits 0; SIGUSR1 makes each rank print its Python stacks (faulthandler)."""
import os, sys, time
import faulthandler, signal
import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
faulthandler.register(signal.SIGUSR1, all_threads=True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(256)
for step in range(steps):
    dist.all_reduce(x)
    x /= world
    if step % 10 == 0 and rank == 0:
        print(f"step {step} ok", flush=True)
    time.sleep(0.01)
dist.barrier()
if rank == 0:
    print("training finished", flush=True)
dist.destroy_process_group()
