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

Faults that a knob turns off (what `trace bisect` searches for; on CPU they stand in for GPU-only causes):

  p2p            each step, rank pairs (0,1), (2,3), ... hand activations over with send/recv while "P2P" is on;
                 at --fault-step the transfer of --fault-rank never lands (it stalls in p2p_copy) and its peer waits in
                 send/recv. P2P is on unless EXAMPLE_P2P=0, NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=LOC/NVL (this
                 "machine" has PCIe only, no NVLink); with P2P off the hand-over goes through an all_reduce and the
                 job finishes. Stands in for NCCL's P2P transport hanging on a bad PCIe topology.
  custom-ar      each step's all-reduce goes through custom_all_reduce: at --fault-step, --fault-rank hangs
                 registering its IPC buffers while the others wait in the all_reduce. --disable-custom-all-reduce
                 (the flag SGLang and vLLM have) uses the plain all_reduce and the job finishes.

--fault-rate P fires the planted fault (skip, p2p, custom-ar) in a fraction P of runs only (a flaky hang); with EXAMPLE_FAULT_COUNTER=FILE
the fraction is exact rather than random: run n of the runs that reach the fault (counted in FILE) fires when
ceil((n+1)*P) > ceil(n*P), so P=0.5 fires on runs 1, 3, 5, ... The spawning process decides once per run (not
under torchrun).

``--helpers`` gives every rank a helper process (a tokenizer / data worker of a serving engine) that imports
torch.distributed with the rank's RANK in its environment, as torchrun's workers pass it on, and then idles.

Runs its own ranks with torch.multiprocessing.spawn, or one rank per process under torchrun (RANK set).
Pass --timeout so a hung gloo collective raises after that many seconds instead of the default 30 minutes.
"""
from __future__ import annotations

import argparse
import datetime
import fractions
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
                            "compute", "slowload", "straggler", "p2p", "custom-ar"])
    p.add_argument("--fault-rank", type=int, default=None, help="rank that misbehaves (default: last rank)")
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--timeout", type=float, default=30.0, help="gloo collective timeout, seconds")
    p.add_argument("--hang-seconds", type=float, default=120.0, help="how long a stalled rank stays stalled")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--helpers", action="store_true", help="each rank starts an idle helper process (see above)")
    p.add_argument("--fault-rate", type=str, default="1",
                   help="fraction of runs in which the fault fires, e.g. 0.5 or 2/3 (see above; default 1)")
    p.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="all-reduce without the custom path (turns the custom-ar fault off)")
    args = p.parse_args(argv)
    try:
        rate = fractions.Fraction(args.fault_rate)
    except (ValueError, ZeroDivisionError):
        p.error(f"--fault-rate {args.fault_rate!r}: expected a number or a fraction in [0, 1]")
    if not 0 <= rate <= 1:
        p.error(f"--fault-rate {args.fault_rate!r}: expected a number or a fraction in [0, 1]")
    args.fault_rate = rate
    args.fault_fires = True
    return args


def p2p_on() -> bool:
    """The example's stand-in for NCCL's P2P transport: on unless turned off the ways NCCL's is."""
    return (os.environ.get("EXAMPLE_P2P", "1") != "0" and os.environ.get("NCCL_P2P_DISABLE", "0") != "1"
            and os.environ.get("NCCL_P2P_LEVEL", "").upper() not in ("LOC", "NVL", "0"))


def fault_armed(args: argparse.Namespace) -> bool:
    """Whether this launch can hit the planted fault at all (a knob may have turned it off)."""
    if args.fault == "p2p":
        return p2p_on()
    if args.fault == "custom-ar":
        return not args.disable_custom_all_reduce
    return args.fault != "none"


def fault_fires(args: argparse.Namespace) -> bool:
    """--fault-rate: random, or exact over consecutive runs with EXAMPLE_FAULT_COUNTER (see the module doc)."""
    rate = args.fault_rate
    if rate >= 1 or not fault_armed(args):
        return True
    path = os.environ.get("EXAMPLE_FAULT_COUNTER")
    if not path:
        import random

        return random.random() < rate
    import fcntl
    import math

    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
    return math.ceil((n + 1) * rate) > math.ceil(n * rate)


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


def p2p_copy(seconds: float) -> None:
    """Stands in for a P2P write (cudaMemcpyPeer over PCIe) that never completes."""
    time.sleep(seconds)


def exchange_activations(dist, torch, t, rank: int, world: int, args, at_fault: bool) -> None:
    """Hand activations to the pair peer: send/recv while P2P is on, else through an all_reduce (NCCL's fall-back
    to shared memory or the network)."""
    if not p2p_on():
        dist.all_reduce(t)
        return
    peer = rank ^ 1
    if peer >= world:
        return
    if at_fault and rank == args.fault_rank and args.fault_fires:
        p2p_copy(args.hang_seconds)  # its transfer never lands; the peer waits in send/recv
        return
    if rank % 2 == 0:
        dist.send(t, peer)
        dist.recv(t, peer)
    else:
        dist.recv(t, peer)
        dist.send(t, peer)


def register_ipc_buffers(seconds: float) -> None:
    """Stands in for a custom all-reduce registering its buffers over CUDA IPC, which hangs on this machine."""
    time.sleep(seconds)


def custom_all_reduce(dist, t, rank: int, args, at_fault: bool) -> None:
    """The serving engines' custom all-reduce: IPC-registered buffers, then the reduction."""
    if at_fault and rank == args.fault_rank and args.fault_fires:
        register_ipc_buffers(args.hang_seconds)
    dist.all_reduce(t)


def train_step(dist, torch, args, rank: int, step: int, x, tp_group, world_group) -> None:
    fault, frank = args.fault, args.fault_rank
    partial = x @ x.T  # this rank's shard of the layer
    at_fault = step == args.fault_step
    if fault == "p2p":
        exchange_activations(dist, torch, partial, rank, dist.get_world_size(), args, at_fault)
    if fault == "custom-ar" and not args.disable_custom_all_reduce:
        custom_all_reduce(dist, partial, rank, args, at_fault)
        return
    if fault == "skip" and at_fault and rank == frank and args.fault_fires:
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
        if args.fault_rate < 1:
            sys.exit("--fault-rate needs the example's own spawning (not torchrun): one decision per run")
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
    args.fault_fires = fault_fires(args)
    mp.spawn(_spawned, args=(args.world, args), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
