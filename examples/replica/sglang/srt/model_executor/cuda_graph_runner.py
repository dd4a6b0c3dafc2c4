"""CudaGraphRunner: warm up and capture one CUDA graph per batch size, inside the TP group's graph_capture()."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

import replica_device
from sglang.srt.distributed.parallel_state import graph_capture
from sglang.srt.server_args import faulty


class CudaGraphRunner:
    def __init__(self, model_runner: Any) -> None:
        self.model_runner = model_runner
        self.capture_bs = list(model_runner.server_args.cuda_graph_bs)
        self.graphs: dict[int, Any] = {}
        self.capture()

    def capture(self) -> None:
        with graph_capture():
            for bs in reversed(self.capture_bs):
                if self.model_runner.tp_rank == 0:
                    print(f"Capturing batches (bs={bs} avail_mem=62.00 GB)", flush=True)
                self.graphs[bs], _ = self.capture_one_batch_size(bs, self.model_runner.forward)

    def capture_one_batch_size(self, bs: int, forward: Callable[[int], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        mr = self.model_runner
        graph = replica_device.new_graph()
        if faulty(mr.server_args, "capture-stall", mr.tp_rank) and bs == mr.server_args.fault_bs:
            time.sleep(mr.server_args.hang_seconds)  # e.g. an attention backend's capture-time init that never ends
        for _ in range(2):  # warm up
            torch.cuda.synchronize()
            mr.tp_group.barrier()
            forward(bs)
        torch.cuda.synchronize()
        mr.tp_group.barrier()
        with replica_device.graph(graph):
            out = forward(bs)
        return graph, out
