"""CustomAllreduce: an all-reduce over peer-mapped buffers (CUDA IPC in SGLang; the store here). Buffers used inside
a captured graph are registered with every peer when capture ends (register_graph_buffers)."""
from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from sglang.srt.server_args import faulty

logger = logging.getLogger(__name__)


class CustomAllreduce:
    def __init__(self, group, device, max_size: int = 8192 * 1024, server_args=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.ranks = dist.get_process_group_ranks(group)
        self.server_args = server_args
        self.capturing = False
        self.disabled = False
        self.graph_buffers: list[int] = []
        handles = [None] * self.world_size  # every rank's IPC handle of its buffer
        dist.all_gather_object(handles, {"rank": self.rank, "buffer": id(self)}, group=group)
        self.peers = handles

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        try:
            self.capturing = True
            yield
        finally:
            self.capturing = False
            if not self.disabled:
                self.register_graph_buffers()

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor:
        if self.capturing:
            self.graph_buffers.append(input.data_ptr())
        out = input.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def _get_graph_buffer_ipc_meta(self) -> tuple[list[int], list[int]]:
        if self.server_args is not None and faulty(self.server_args, "register-one", dist.get_rank()):
            time.sleep(self.server_args.hang_seconds)  # cudaIpcGetMemHandle that never returns on this rank
        return list(self.graph_buffers), list(range(len(self.graph_buffers)))

    def _open_ipc_handles(self, all_data: list) -> None:
        if self.server_args is not None and self.server_args.fault == "register-all":
            store = dist.distributed_c10d._get_default_store()  # cudaIpcOpenMemHandle of a peer mapping that hangs
            store.wait(["ipc-peer-mapped"], timedelta(seconds=self.server_args.hang_seconds))

    def register_graph_buffers(self) -> None:
        handle, offset = self._get_graph_buffer_ipc_meta()
        logger.info("Registering %d cuda graph addresses", len(offset))
        all_data = [[None, None] for _ in range(self.world_size)]
        all_data[self.rank] = [handle, offset]
        for i, rank in enumerate(self.ranks):
            dist.broadcast_object_list(all_data[i], src=rank, group=self.group, device="cpu")
        self._open_ipc_handles(all_data)
