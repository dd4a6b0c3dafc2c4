"""A clean 2-rank gloo job touching every capture path of issue #3 once (tests/test_capture_coverage.py).

Each step prints nothing but its own marker; the test reads the trace. Steps, in order, on both ranks:
phase hook, ProcessGroup method calls (allreduce / broadcast / barrier / send+recv) with their Work.wait,
dist.all_reduce (traced once though it calls ProcessGroup.allreduce), async all_reduce + wait, batch_isend_irecv,
a _coalescing_manager block of two all_reduces, a functional collective (Python never sees it: an untraced_ops
mark must say so), then two Comm objects (hooked as collectives) called 2 and 1 times, and Stage.run, a method of
this script itself (hooked as ``__main__:Stage.run``: resolved once init_process_group runs in the spawned rank).
"""
import asyncio
import datetime
import inspect
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import coverage_lib


class Stage:
    """A class of the main script: in a spawned rank it is defined only after the tracer loaded."""

    def run(self, t: torch.Tensor) -> float:
        return float(t.sum())


def rank_main(rank: int, world: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    peer = 1 - rank
    assert coverage_lib.load_weights() == "loaded"
    assert inspect.iscoroutinefunction(coverage_lib.Scheduler.step)  # still a coroutine function once hooked
    assert asyncio.run(coverage_lib.Scheduler().step()) == "stepped"
    pg = dist.group.WORLD
    t = torch.ones(4)
    pg.allreduce([t]).wait()                              # PG method, handle waited
    pg.broadcast([t], dist.BroadcastOptions()).wait()
    pg.barrier().wait()
    if rank == 0:
        pg.send([torch.zeros(2)], peer, 0).wait()
    else:
        pg.recv([torch.zeros(2)], peer, 0).wait()
    dist.all_reduce(t)                                    # function hook: recorded once
    work = dist.all_reduce(t, async_op=True)              # async, waited later
    t2 = t * 2
    work.wait()
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(3), peer),
                                   dist.P2POp(dist.irecv, torch.zeros(3), peer)])
    for r in reqs:
        r.wait()
    a, b = torch.ones(2), torch.ones(3)
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    import torch.distributed._functional_collectives as funcol
    funcol.wait_tensor(funcol.all_reduce(t2, "sum", pg))  # issued in C++: only the backend counter sees it
    comms = [coverage_lib.Comm(pg), coverage_lib.Comm(pg)]
    comms[0].all_reduce(t)
    comms[1].all_reduce(t)
    comms[0].all_reduce(t)
    assert Stage().run(t) == float(t.sum())
    dist.barrier()
    # Drop every handle on the group before destroying it: a ProcessGroup or Work that outlives
    # destroy_process_group is torn down at interpreter exit, where gloo sometimes aborts (seen here without
    # ranktrace too: 1 run in 12 ended in SIGABRT).
    del comms, pg, work, reqs
    import gc

    gc.collect()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(rank_main, args=(2,), nprocs=2)
    sys.exit(0)
