"""A 1-rank gloo job that forks after its first collectives; the child starts its own group and issues ops.

The child's ring must name its ops correctly (the wrappers cache string ids from the parent's ring), and the
parent then exits through os._exit(status=...) — a keyword call form the tracer's wrapper must keep.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist


def run(port: int) -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=20))
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    run(free_port())
    pid = os.fork()
    if pid == 0:
        run(free_port())
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.stdout.flush()
    os._exit(status=11 if os.WEXITSTATUS(status) == 0 else 12)
