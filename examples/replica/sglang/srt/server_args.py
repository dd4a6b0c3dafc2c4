"""The replica's server arguments (a few of SGLang's, plus the faults it can plant)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

FAULTS = ("none", "capture-stall", "enqueued-ar", "register-one", "register-all", "draft-sync", "comm-init", "die",
          "nojoin", "stale-jit-lock")


@dataclass
class ServerArgs:
    tp_size: int = 4
    port: int = 0
    load_seconds: float = 0.5
    jit_seconds: float = 0.0
    cuda_graph_bs: tuple = (1, 2, 4, 8)
    draft_graph_bs: tuple = (1, 2, 4)
    fault: str = "none"
    fault_rank: int = 3
    fault_bs: int = 4
    fault_step: int = 4
    hang_seconds: float = 600.0
    exit_after_ready: bool = True
    dist_timeout: float = 900.0


def prepare_server_args(argv: list[str]) -> ServerArgs:
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server", description=__doc__)
    p.add_argument("--tp-size", "--tp", type=int, default=4)
    p.add_argument("--port", type=int, default=0, help="torch.distributed rendezvous port (default: a free one)")
    p.add_argument("--load-seconds", type=float, default=0.5, help="how long 'loading weights' takes")
    p.add_argument("--jit-seconds", type=float, default=0.0,
                   help="kernel warm-up runs a CPU-busy child process this long (a JIT build: nvcc/ninja stand-in)")
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-rank", type=int, default=None, help="default: the last rank")
    p.add_argument("--fault-bs", type=int, default=4, help="batch size whose capture the fault hits")
    p.add_argument("--fault-step", type=int, default=4,
                   help="enqueued-ar: the pynccl all_reduce whose kernel never completes (4: the first warm-up of bs=4)")
    p.add_argument("--hang-seconds", type=float, default=600.0)
    p.add_argument("--serve", action="store_true", help="keep serving after start-up (default: shut down, exit 0)")
    a = p.parse_args(argv)
    return ServerArgs(tp_size=a.tp_size, port=a.port, load_seconds=a.load_seconds, jit_seconds=a.jit_seconds,
                      fault=a.fault, fault_rank=a.tp_size - 1 if a.fault_rank is None else a.fault_rank,
                      fault_bs=a.fault_bs, fault_step=a.fault_step, hang_seconds=a.hang_seconds,
                      exit_after_ready=not a.serve)


def faulty(server_args: ServerArgs, fault: str, rank: int) -> bool:
    return server_args.fault == fault and rank == server_args.fault_rank
