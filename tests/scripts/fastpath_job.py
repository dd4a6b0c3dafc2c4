"""One process, world size 1, gloo: every shape of call the compiled fast path handles (and some it hands back).

Run twice under the injected tracer, with RANKTRACE_FASTPATH=0 (pure-Python wrappers, the reference) and =1;
tests/test_fastpath.py compares the two rings record by record. Each call shape runs three times: the first
fills the Python caches (call site, shape), the later ones take the fast path. Prints {wrapper: [fast, slow]}.
"""
import json
import sys
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

fastpath = sys.modules["_ranktrace_tracer.rank.fastpath"]
state = sys.modules["_ranktrace_tracer.rank.inject"].state
raw_allreduce = ProcessGroup.allreduce.__wrapped__  # the unpatched builtin: an op Python-level tracing never sees


def counts(fn):
    for cell in getattr(fn, "__closure__", None) or ():
        inner = cell.cell_contents
        if getattr(inner, "__ranktrace__", False):
            fn = inner
    return [getattr(fn, "fast_calls", 0), getattr(fn, "slow_calls", 0)]


def main():
    """Every handle (group, work) is a local: none may outlive destroy_process_group (gloo aborts at exit then)."""
    pg = dist.group.WORLD
    t = torch.ones(4)

    for _ in range(3):
        dist.all_reduce(t)
    for _ in range(3):
        dist.all_reduce(t, group=pg)
    for _ in range(3):
        dist.all_reduce(t, async_op=True).wait()
    for _ in range(3):
        raw_allreduce(pg, [t]).wait()
        dist.all_reduce(t)  # the op before it is reported as untraced
    for _ in range(3):
        dist.all_reduce(torch.ones(2, 3))
    for _ in range(3):
        pg.allreduce([t]).wait()
    for _ in range(3):
        dist.broadcast(t, src=0)
    for _ in range(3):
        dist.barrier()
    for _ in range(3):
        try:
            dist.all_reduce(t, op="not an op")
        except Exception:
            pass
    for _ in range(2):
        out = [None]
        dist.all_gather_object(out, {"a": 1})  # the inner all_gather is not recorded again
    state.enabled = False
    dist.all_reduce(t)
    state.enabled = True

    def worker():
        for _ in range(3):
            dist.all_reduce(t)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    dist.all_reduce(t)

    return json.dumps({"all_reduce": counts(dist.all_reduce), "broadcast": counts(dist.broadcast),
                       "barrier": counts(dist.barrier), "ProcessGroup.allreduce": counts(ProcessGroup.allreduce),
                       "fastpath": fastpath.fastpath_available()})


dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
line = main()
dist.destroy_process_group()
print(line)
