"""A 2-rank gloo job that is busy (never hung) or parked for real, the ways issue #30 lists (run by
tests/test_detect.py and bench/bench_detect.py under `trace run`):

  jit-sh     after a few collectives rank 0's warm-up runs a non-Python child that burns a core for --seconds (a
             `sh` busy loop standing for ninja / nvcc / ptxas) while rank 1 waits for it in the next all_reduce
  compute    every rank computes for --seconds between two collectives (a long step, no collective in between)
  straggler  rank 1 computes --seconds longer than rank 0, which waits in the step's all_reduce
  read       rank 0 reads a file of --mib MiB (RANKTRACE_TEST_WEIGHTS) in chunks over --seconds, rank 1 waits
             (a weight load from page cache: read() moves no storage counter, only the file offset)
  serve      every rank says it serves (a SGLang-shaped log line) and waits for requests for --seconds, then ends
  parked     every rank waits in an all_gather rank 1 never joins: rank 1 sleeps (0% CPU) in a queue get; the
             whole job is parked in a collective or a known wait (the watchdog's short path)
  queue      every rank blocks in a queue get after init (nothing pending, no collective open)
  busy       the healthy kinds one after another, --seconds each, an all_reduce between: jit-sh, straggler, read
"""
from __future__ import annotations

import argparse
import datetime
import os
import queue
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def say(rank: int, text: str) -> None:
    print(f"[rank{rank}] {text}", flush=True)


def jit_build(seconds: float) -> None:
    """FlashInfer-style JIT: a non-Python compiler child at 100% of a core; the rank waits in subprocess."""
    try:
        subprocess.run(["sh", "-c", "while :; do :; done"], timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def compute(seconds: float) -> None:
    w = torch.randn(128, 128)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        w = torch.tanh(w @ w.T)


def read_weights(path: str, seconds: float) -> None:
    size = os.path.getsize(path)
    chunk = 8 << 20
    n = max(1, size // chunk)
    with open(path, "rb", buffering=0) as f:
        for _ in range(n):
            f.read(chunk)
            time.sleep(seconds / n)


def rank_main(rank: int, world: int, a: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=a.timeout))
    t = torch.ones(64)
    for _ in range(3):
        dist.all_reduce(t)
    say(rank, f"onset {time.time():.3f}")  # the moment the mode's long stretch starts (bench_detect reads it)
    if a.mode == "jit-sh" and rank == 0:
        jit_build(a.seconds)
    elif a.mode == "compute":
        compute(a.seconds)
    elif a.mode == "straggler" and rank == 1:
        compute(a.seconds)
    elif a.mode == "read" and rank == 0:
        read_weights(os.environ["RANKTRACE_TEST_WEIGHTS"], a.seconds)
    elif a.mode == "serve":
        say(rank, "The server is fired up and ready to roll!")
        try:
            queue.Queue().get(timeout=a.seconds)
        except queue.Empty:
            pass
    elif a.mode == "parked":
        if rank == 1:
            queue.Queue().get(timeout=a.seconds)  # never joins the all_gather below (raises Empty at the end)
        dist.all_gather([torch.zeros(64) for _ in range(world)], t)
    elif a.mode == "queue":
        queue.Queue().get(timeout=a.seconds)
    elif a.mode == "busy":
        if rank == 0:
            jit_build(a.seconds)
        dist.all_reduce(t)
        if rank == 1:
            compute(a.seconds)
        dist.all_reduce(t)
        if rank == 0:
            read_weights(os.environ["RANKTRACE_TEST_WEIGHTS"], a.seconds)
    dist.all_reduce(t)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["jit-sh", "compute", "straggler", "read", "serve", "parked", "queue", "busy"])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args()
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:  # under torchrun: one rank per process, own session
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a, int(os.environ["MASTER_PORT"]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, a, port), nprocs=2)


if __name__ == "__main__":
    sys.exit(main())
