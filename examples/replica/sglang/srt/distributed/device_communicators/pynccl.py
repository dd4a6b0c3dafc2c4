"""PyNcclCommunicator: NCCL through the ctypes binding (pynccl_wrapper), enabled only inside graph capture."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist

from sglang.srt.distributed.device_communicators.pynccl_wrapper import NCCLLibrary, ncclUniqueId
from sglang.srt.server_args import faulty


class PyNcclCommunicator:
    def __init__(self, group, device, library_path: str | None = None, server_args=None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.nccl = NCCLLibrary(library_path, hang_seconds=server_args.hang_seconds if server_args else 600.0)
        uid = self.nccl.ncclGetUniqueId() if self.rank == 0 else ncclUniqueId(b"0" * 32)
        tensor = torch.frombuffer(bytearray(uid.internal), dtype=torch.uint8)
        dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)
        self.unique_id = ncclUniqueId(bytes(tensor.tolist()))
        stall = server_args is not None and faulty(server_args, "comm-init", dist.get_rank())
        self.comm = self.nccl.ncclCommInitRank(self.world_size, self.unique_id, self.rank, stall=stall)
        if server_args is not None and faulty(server_args, "enqueued-ar", dist.get_rank()):
            self.comm.broken_at = server_args.fault_step
        self.disabled = True

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", stream=None) -> None:
        if self.disabled:
            return
        self.nccl.ncclAllReduce(tensor, tensor, tensor.numel(), str(tensor.dtype), op, self.comm, stream)

    @contextlib.contextmanager
    def change_state(self, enable: bool | None = None) -> Iterator[None]:
        old = self.disabled
        if enable is not None:
            self.disabled = not enable
        try:
            yield
        finally:
            self.disabled = old
