"""A healthy torchrun job (gloo, CPU) profiled with torch.profiler: 20 all_reduces; each rank writes its Kineto trace."""
import os, sys
import torch
import torch.distributed as dist
from torch.profiler import profile, ProfilerActivity

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1024)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for step in range(20):
        y = torch.tanh(x * 2.0)
        dist.all_reduce(y)
        x = y / dist.get_world_size()
    dist.barrier()
prof.export_chrome_trace(os.path.join(out, f"rank{rank}.pt.trace.json"))
dist.destroy_process_group()
