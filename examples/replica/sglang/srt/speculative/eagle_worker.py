"""EAGLEWorker: the draft model of speculative decoding, with CUDA graphs of its own."""
from __future__ import annotations

import logging
import time
from typing import Any

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class EAGLEWorker:
    def __init__(self, server_args: ServerArgs, target_worker: Any) -> None:
        self.server_args = server_args
        self.model_runner = target_worker
        self.init_cuda_graphs()

    def init_cuda_graphs(self) -> None:
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

        logger.info("Capture draft cuda graph begin. This can take up to several minutes. avail mem=61.90 GB")
        t0 = time.monotonic()
        self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self)
        logger.info(f"Capture draft cuda graph end. Time elapsed: {time.monotonic() - t0:.2f} s. mem usage=0.01 GB.")
