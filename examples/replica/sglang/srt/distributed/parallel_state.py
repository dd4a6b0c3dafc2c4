"""Process groups: torch.distributed (gloo here; NCCL in SGLang) and the TP GroupCoordinator with its communicators."""
from __future__ import annotations

import contextlib
import datetime
from typing import Iterator

import torch
import torch.distributed as dist

from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce
from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator

_TP: "GroupCoordinator | None" = None
CUSTOM_AR_MAX_NUMEL = 64  # small tensors take the custom all-reduce, larger ones pynccl (torch.distributed outside capture)


class GroupCoordinator:
    def __init__(self, group_ranks: list[list[int]], local_rank: int, torch_distributed_backend: str,
                 use_pynccl: bool, use_custom_allreduce: bool, group_name: str, server_args=None) -> None:
        self.unique_name = group_name
        self.rank = dist.get_rank()
        self.ranks = group_ranks[0]
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(self.rank)
        self.device_group = dist.new_group(self.ranks, backend=torch_distributed_backend)  # NCCL in SGLang
        self.cpu_group = dist.new_group(self.ranks, backend="gloo")
        self.pynccl_comm = PyNcclCommunicator(group=self.cpu_group, device="cpu", server_args=server_args) \
            if use_pynccl else None
        self.ca_comm = CustomAllreduce(group=self.cpu_group, device="cpu", server_args=server_args) \
            if use_custom_allreduce else None

    @contextlib.contextmanager
    def graph_capture(self, graph_capture_context=None) -> Iterator[None]:
        ca = self.ca_comm.capture() if self.ca_comm is not None else contextlib.nullcontext()
        with ca, self.pynccl_comm.change_state(enable=True):
            yield graph_capture_context

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.ca_comm is not None and input_.numel() <= CUSTOM_AR_MAX_NUMEL and self.ca_comm.capturing:
            return self._all_reduce_out_place(input_)
        self._all_reduce_in_place(input_)
        return input_

    def _all_reduce_out_place(self, input_: torch.Tensor) -> torch.Tensor:
        return self.ca_comm.custom_all_reduce(input_)

    def _all_reduce_in_place(self, input_: torch.Tensor) -> None:
        if self.pynccl_comm is not None and not self.pynccl_comm.disabled:
            self.pynccl_comm.all_reduce(input_)
        else:
            dist.all_reduce(input_, group=self.device_group)

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)


def get_tp_group() -> GroupCoordinator:
    assert _TP is not None, "tensor model parallel group is not initialized"
    return _TP


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str, local_rank: int,
                                 backend: str = "gloo", timeout: float = 900.0) -> None:
    dist.init_process_group(backend=backend, init_method=distributed_init_method, world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout))


def initialize_model_parallel(tensor_model_parallel_size: int, server_args=None) -> None:
    global _TP
    _TP = GroupCoordinator([list(range(tensor_model_parallel_size))], dist.get_rank(), "gloo", use_pynccl=True,
                           use_custom_allreduce=True, group_name="tp", server_args=server_args)


@contextlib.contextmanager
def graph_capture() -> Iterator[None]:
    with get_tp_group().graph_capture() as ctx:
        yield ctx
