"""A healthy torchrun job (gloo, CPU) in which rank 0 saves a checkpoint for ~10 s at step 20 while the other ranks
wait for it in the next all_reduce; then every rank goes on to the end and exits 0."""
import os, sys, time, tempfile
import torch
import torch.distributed as dist


def save_checkpoint(state, path, seconds, blocked=False):
    # a slow filesystem: write the state in small chunks for `seconds` (blocked: one write that waits on the storage)
    if blocked:
        time.sleep(seconds)
        torch.save(state, path)
        return
    end = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < end:
            torch.save(state, f)
            f.flush()
            time.sleep(0.05)


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
blocked = len(sys.argv) > 3 and sys.argv[3] == "blocked"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(256)
for step in range(steps):
    dist.all_reduce(x)
    x /= world
    if step == 20 and rank == 0:
        save_checkpoint({"x": x, "step": step}, os.path.join(tempfile.gettempdir(), f"ckpt_{os.getpid()}.pt"), pause, blocked)
        print(f"checkpoint saved at step {step}", flush=True)
    time.sleep(0.01)
dist.barrier()
if rank == 0:
    print("training finished", flush=True)
dist.destroy_process_group()
