"""A small torchrun job (gloo, CPU) for false-alarm / true-positive captures.

argv: STEPS [SLEEP_S] ; env FH=usr1 registers faulthandler on SIGUSR1, FH=once:N dumps every thread's stack once N s in, FH=later:N arms dump_traceback_later(N, repeat)
(N seconds without re-arming -> all threads' stacks on stderr; re-armed every step unless HANG_RANK stalls);
HANG_RANK=r makes rank r stop calling collectives at HANG_STEP (it sleeps), so the others wait in all_reduce.
"""
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
fh = os.environ.get("FH", "")
hang_rank = int(os.environ.get("HANG_RANK", "-1"))
hang_step = int(os.environ.get("HANG_STEP", "100"))
if fh == "usr1":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
later = float(fh.split(":")[1]) if fh.startswith("later:") else 0.0
if fh.startswith("once:"):  # one dump N s in, whatever the job is doing then
    faulthandler.dump_traceback_later(float(fh.split(":")[1]), repeat=False, exit=False)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(512)
for step in range(steps):
    if later:
        faulthandler.dump_traceback_later(later, repeat=False, exit=False)
    if rank == hang_rank and step == hang_step:
        print(f"[rank{rank}] loading the next shard", flush=True)
        time.sleep(3600)
    dist.all_reduce(x)
    x /= world
    if step % 20 == 0:
        print(f"[rank{rank}] step {step}/{steps} loss {float(x[0]):.4f}", flush=True)
    time.sleep(pause)
if later:
    faulthandler.cancel_dump_traceback_later()
dist.barrier()
if rank == 0:
    print("done: all steps finished", flush=True)
dist.destroy_process_group()
