"""The ctypes-style NCCL binding (a stand-in: no libnccl). Its calls are plain functions of a "library" whose
collectives run as kernels on the stand-in GPU stream (replica_device) and meet through a TCPStore, so a returned
ncclAllReduce is enqueued, not done — as with NCCL."""
from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

import replica_device


@dataclass
class ncclUniqueId:
    internal: bytes = b""


@dataclass
class ncclComm:
    uid: str
    rank: int
    world_size: int
    store: object
    timeout: timedelta
    ops: int = 0
    broken_at: int | None = None   # the op whose kernel never arrives from this rank (a broken P2P link)
    lock: threading.Lock = field(default_factory=threading.Lock)


class NCCLLibrary:
    def __init__(self, so_file: str | None = None, hang_seconds: float = 600.0) -> None:
        self.timeout = timedelta(seconds=hang_seconds)

    def ncclGetUniqueId(self) -> ncclUniqueId:
        return ncclUniqueId(uuid.uuid4().hex.encode())

    def ncclCommInitRank(self, world_size: int, unique_id: ncclUniqueId, rank: int, *, stall: bool = False) -> ncclComm:
        """Bootstrap: every rank says it is there and waits for all the others (a rank whose network is broken
        never gets to say it: all of them wait here)."""
        uid = unique_id.internal.decode()
        store = dist.PrefixStore(f"nccl/{uid}", dist.distributed_c10d._get_default_store())
        if stall:
            time.sleep(self.timeout.total_seconds())
        store.set(f"rank{rank}", str(os.getpid()))
        store.wait([f"rank{r}" for r in range(world_size)], self.timeout)
        return ncclComm(uid, rank, world_size, store, self.timeout)

    def ncclAllReduce(self, sendbuff: torch.Tensor, recvbuff: torch.Tensor, count: int, datatype: str, op: str,
                      comm: ncclComm, stream: object) -> None:
        with comm.lock:
            comm.ops += 1
            n = comm.ops
        broken = comm.broken_at == n

        def kernel() -> None:
            if not broken:
                comm.store.set(f"ar{n}/r{comm.rank}", sendbuff.numpy().tobytes())
            keys = [f"ar{n}/r{r}" for r in range(comm.world_size)]
            comm.store.wait(keys, comm.timeout)  # a peer's data that never arrives: the kernel spins forever
            total = sum(torch.frombuffer(bytearray(comm.store.get(k)), dtype=sendbuff.dtype) for k in keys)
            recvbuff.copy_(total.reshape(recvbuff.shape))

        replica_device.launch(kernel)
