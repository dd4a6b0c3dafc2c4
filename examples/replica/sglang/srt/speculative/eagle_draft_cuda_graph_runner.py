"""EAGLEDraftCudaGraphRunner: the draft model's CUDA graphs, one per number of sequences."""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

import replica_device
from sglang.srt.distributed.parallel_state import graph_capture
from sglang.srt.server_args import faulty


class EAGLEDraftCudaGraphRunner:
    def __init__(self, eagle_worker: Any) -> None:
        self.eagle_worker = eagle_worker
        self.model_runner = eagle_worker.model_runner
        self.capture_bs = list(eagle_worker.server_args.draft_graph_bs)
        self.graphs: dict[int, Any] = {}
        self.capture()

    def capture(self) -> None:
        with graph_capture():
            for bs in reversed(self.capture_bs):
                self.graphs[bs], _ = self.capture_one_batch_size(bs, self.model_runner.forward)

    def capture_one_batch_size(self, num_seqs: int, forward: Callable[[int], torch.Tensor]) -> tuple[Any, Any]:
        mr = self.model_runner
        graph = replica_device.new_graph()
        if faulty(mr.server_args, "draft-sync", mr.tp_rank) and num_seqs == min(mr.server_args.fault_bs, 4):
            never = threading.Event()
            replica_device.launch(never.wait)  # a draft kernel that never finishes (a bad tree-mask index, say)
        for _ in range(2):
            torch.cuda.synchronize()
            mr.tp_group.barrier()
            forward(num_seqs)
        torch.cuda.synchronize()
        mr.tp_group.barrier()
        with replica_device.graph(graph):
            out = forward(num_seqs)
        return graph, out
