#!/usr/bin/env python3
"""A small tensor-parallel style job on gloo (CPU) that can be made to hang in the ways real 8-GPU jobs do.

Each step runs a sharded "layer": a local matmul on this rank's shard, an all_reduce of the partial sums over the
TP group, and every few steps an all_gather of a metric over the world. ``--fault`` plants one failure:

  none           clean run
  skip           --fault-rank skips the all_reduce at --fault-step, then stalls in its data loader
  mismatch       --fault-rank calls broadcast where the others call all_reduce (same position)
  die            --fault-rank exits (status 7) at --fault-step
  nojoin         --fault-rank never calls init_process_group (it "loads weights" forever)
  tp-skip        TP groups {0,1},{2,3}; rank 2 skips its TP all_reduce, then everyone meets in a world all_reduce
  recv-deadlock  ranks 0 and 1 both recv from each other while the others wait in a barrier
  queue          every rank blocks in a queue get (a server waiting for work that never comes)
  compute        a few collectives, then compute for --hang-seconds with none, then finish (not a hang)
  slowload       sleep --hang-seconds in "load_weights" before the first collective, then run normally
  straggler      --fault-rank computes for --hang-seconds at --fault-step (through several functions, so its stack
                 keeps changing) while the others wait in that step's all_reduce, then joins: slow, not a hang

``--helpers`` gives every rank a helper process (a tokenizer / data worker of a serving engine) that imports
torch.distributed with the rank's RANK in its environment, as torchrun's workers pass it on, and then idles.

Runs its own ranks with torch.multiprocessing.spawn, or one rank per process under torchrun (RANK set).
Pass --timeout so a hung gloo collective raises after that many seconds instead of the default 30 minutes.
"""
from __future__ import annotations

import argparse
import datetime
import os
import queue
import subprocess
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=4, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fault", default="none",
                   choices=["none", "skip", "mismatch", "die", "nojoin", "tp-skip", "recv-deadlock", "queue",
                            "compute", "slowload", "straggler"])
    p.add_argument("--fault-rank", type=int, default=None, help="rank that misbehaves (default: last rank)")
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--timeout", type=float, default=30.0, help="gloo collective timeout, seconds")
    p.add_argument("--hang-seconds", type=float, default=120.0, help="how long a stalled rank stays stalled")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--helpers", action="store_true", help="each rank starts an idle helper process (see above)")
    return p.parse_args(argv)


HELPER = "import time, torch.distributed\nwhile True:\n    time.sleep(1)  # a helper waiting for work\n"


def start_helper(rank: int, world: int) -> subprocess.Popen[bytes]:
    """A child process that shares the rank's RANK / WORLD_SIZE but never joins a process group."""
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
    return subprocess.Popen([sys.executable, "-c", HELPER], env=env, stdin=subprocess.DEVNULL)


def load_weights(seconds: float) -> None:
    """Stands in for a long weight load (mmap of a checkpoint) before the first collective."""
    time.sleep(seconds)


def next_batch(loader: "queue.Queue[int]", timeout: float) -> int:
    """A data loader that never delivers: the culprit of a 'skip' fault waits here."""
    return loader.get(timeout=timeout)


def wait_for_request(requests: "queue.Queue[int]", timeout: float) -> int:
    """A serving loop waiting for work: every rank blocks here in the 'queue' fault."""
    return requests.get(timeout=timeout)


def forward_chunk(torch, w):
    return torch.tanh(w @ w)


def backward_chunk(torch, w):
    return torch.sigmoid(w.T @ w)


def optimizer_chunk(torch, w):
    return w - 0.01 * torch.sign(w @ w.T)


def reduce_chunk(torch, w):
    return (w @ w).softmax(dim=-1)


def straggle(torch, seconds: float) -> None:
    """A rank that computes far longer than its peers (slow device, thermal throttle): busy, changing, not hung."""
    w = torch.randn(256, 256)
    chunks = (forward_chunk, backward_chunk, optimizer_chunk, reduce_chunk)
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        w = chunks[i % len(chunks)](torch, w)
        i += 1


def train_step(dist, torch, args, rank: int, step: int, x, tp_group, world_group) -> None:
    fault, frank = args.fault, args.fault_rank
    partial = x @ x.T  # this rank's shard of the layer
    at_fault = step == args.fault_step
    if fault == "skip" and at_fault and rank == frank:
        next_batch(queue.Queue(), args.hang_seconds)  # never issues this step's all_reduce
        return
    if fault == "straggler" and at_fault and rank == frank:
        straggle(torch, args.hang_seconds)
    if fault == "mismatch" and at_fault and rank == frank:
        dist.broadcast(partial, src=0, group=tp_group)
    elif fault == "tp-skip" and at_fault and rank == 2:
        pass  # skips its TP all_reduce, goes straight on to the world all_reduce below
    elif fault == "recv-deadlock" and at_fault:
        if rank in (0, 1):
            buf = torch.zeros(4)
            dist.recv(buf, src=1 - rank)  # both wait to receive: nobody sends
        else:
            dist.barrier()  # the others wait for everyone in a barrier
        return
    else:
        dist.all_reduce(partial, group=tp_group)
    if fault == "tp-skip" or step % 2 == 1:
        dist.all_reduce(partial.sum().reshape(1), group=world_group)


def run_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    if args.fault_rank is None:
        args.fault_rank = world - 1
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.fault == "nojoin" and rank == args.fault_rank:
        load_weights(args.hang_seconds)
        sys.exit(5)
    if args.fault == "slowload":
        load_weights(args.hang_seconds)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    helper = start_helper(rank, world) if args.helpers else None
    try:
        run_steps(dist, torch, args, rank, world)
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()


def run_steps(dist, torch, args: argparse.Namespace, rank: int, world: int) -> None:
    if args.fault == "tp-skip":
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        tp_group = groups[rank // 2]
    else:
        tp_group = None
    torch.manual_seed(rank)
    x = torch.randn(args.dim // world, args.dim)
    if args.fault == "compute":  # a few collectives, a long compute phase with none, then one more
        for _ in range(2):
            dist.all_reduce(x)
        deadline = time.monotonic() + args.hang_seconds
        while time.monotonic() < deadline:
            x = torch.tanh(x @ x.T @ x)
        dist.all_reduce(x)
        dist.destroy_process_group()
        return
    if args.fault == "queue":
        wait_for_request(queue.Queue(), args.hang_seconds)
        dist.destroy_process_group()
        return
    for step in range(args.steps):
        if args.fault == "die" and step == args.fault_step and rank == args.fault_rank:
            time.sleep(1.0)  # the others are inside this step's all_reduce by now
            os._exit(7)
        train_step(dist, torch, args, rank, step, x, tp_group, None)
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: one rank per process
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    import socket

    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if args.port:
        os.environ["MASTER_PORT"] = str(args.port)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(_spawned, args=(args.world, args), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
