"""A scheduler process per TP rank: title and log prefix, the model worker (everything start-up does), then the
event loop."""
from __future__ import annotations

import logging
import sys

import setproctitle

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def configure_logger(prefix: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        stream=sys.stdout, force=True)


class Scheduler:
    def __init__(self, server_args: ServerArgs, port_args: dict, gpu_id: int, tp_rank: int) -> None:
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.speculative.eagle_worker import EAGLEWorker

        self.server_args, self.tp_rank = server_args, tp_rank
        self.requests = port_args["requests"]
        self.model_runner = ModelRunner(server_args, gpu_id, tp_rank, server_args.tp_size, port_args["nccl_port"])
        self.draft_worker = EAGLEWorker(server_args, self.model_runner)

    def event_loop_normal(self) -> None:
        """Wait for requests (here: only "shutdown")."""
        try:
            while True:
                if self.requests.recv() == "shutdown":
                    return
        except (KeyboardInterrupt, EOFError):  # Ctrl-C, or the server went away
            return


def run_scheduler_process(server_args: ServerArgs, port_args: dict, gpu_id: int, tp_rank: int, attn_cp_rank: int,
                          moe_dp_rank: int, moe_ep_rank: int, pp_rank: int, dp_rank, pipe_writer) -> None:
    prefix = f" TP{tp_rank}" if server_args.tp_size > 1 else ""
    setproctitle.setproctitle(f"sglang::scheduler{prefix.replace(' ', '_')}")
    configure_logger(prefix)
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
    pipe_writer.send({"status": "ready"})
    scheduler.event_loop_normal()
