"""ModelRunner: torch.distributed, weights, KV cache, kernel warm-up, CUDA graphs — the start-up of one rank."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import torch

import replica_device
from sglang.srt.distributed.parallel_state import (get_tp_group, init_distributed_environment,
                                                   initialize_model_parallel)
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
from sglang.srt.server_args import ServerArgs, faulty

logger = logging.getLogger(__name__)
HIDDEN = 256
JIT_BUILD = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end:\n" \
            "    sum(i * i for i in range(10000))  # compiling...\n"


class ModelRunner(ModelRunnerKVCacheMixin):
    def __init__(self, server_args: ServerArgs, gpu_id: int, tp_rank: int, tp_size: int, nccl_port: int) -> None:
        self.server_args, self.gpu_id, self.tp_rank, self.tp_size = server_args, gpu_id, tp_rank, tp_size
        self.nccl_port = nccl_port
        replica_device.install()
        if faulty(server_args, "nojoin", tp_rank):
            time.sleep(server_args.hang_seconds)  # never reaches torch.distributed (stuck before it)
        self.init_torch_distributed()
        self.initialize()

    def init_torch_distributed(self) -> None:
        logger.info("Init torch distributed begin.")
        init_distributed_environment(world_size=self.tp_size, rank=self.tp_rank, local_rank=self.gpu_id,
                                     distributed_init_method=f"tcp://127.0.0.1:{self.nccl_port}", backend="gloo",
                                     timeout=self.server_args.dist_timeout)
        initialize_model_parallel(tensor_model_parallel_size=self.tp_size, server_args=self.server_args)
        self.tp_group = get_tp_group()
        logger.info("Init torch distributed ends. mem usage=0.00 GB")

    def initialize(self) -> None:
        self.load_model()
        self.init_memory_pool()
        self.kernel_warmup()
        self.init_device_graphs()

    def load_model(self) -> None:
        logger.info("Load weight begin. avail mem=79.10 GB")
        time.sleep(self.server_args.load_seconds)
        self.weight = torch.ones(HIDDEN, HIDDEN) / HIDDEN
        logger.info("Load weight end. type=ReplicaForCausalLM, dtype=torch.float32, avail mem=62.50 GB")

    def kernel_warmup(self) -> None:
        """FlashInfer / sgl-kernel JIT: a child process compiles (CPU-busy) while this rank waits for it; with the
        stale-jit-lock fault, torch's cpp_extension finds the build lock a killed start left and waits for it."""
        if self.server_args.fault == "stale-jit-lock":
            import replica_jit
            from torch.utils import cpp_extension

            logger.info(f"Loading JIT ops: {replica_jit.NAME} (torch cpp_extension)")
            cpp_extension.load(replica_jit.NAME, sources=[replica_jit.source()])
        if self.server_args.jit_seconds > 0:
            logger.info(f"JIT compiling the sampling kernels (ninja), {self.server_args.jit_seconds:.0f} s")
            subprocess.run([sys.executable, "-c", JIT_BUILD, str(self.server_args.jit_seconds)], check=True,
                           env=dict(os.environ, PYTHONPATH=""))

    def forward(self, bs: int) -> torch.Tensor:
        hidden = torch.ones(bs, HIDDEN) @ self.weight
        self.tp_group.all_reduce(hidden[:, :8].sum(1))      # a small one: custom all-reduce while capturing
        self.tp_group.all_reduce(hidden)                    # TP all-reduce of the layer output (pynccl in capture)
        if faulty(self.server_args, "die", self.tp_rank) and self.tp_group.pynccl_comm.comm.ops >= 6:
            os._exit(1)
        return hidden

    def init_device_graphs(self) -> None:
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

        logger.info("Capture cuda graph begin. This can take up to several minutes. avail mem=62.00 GB")
        t0 = time.monotonic()
        self.graph_runner = CudaGraphRunner(self)
        logger.info(f"Capture cuda graph end. Time elapsed: {time.monotonic() - t0:.2f} s. mem usage=0.05 GB.")
