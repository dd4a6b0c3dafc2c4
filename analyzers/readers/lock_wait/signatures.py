"""The `filelock` library's debug lines (``filelock/_api.py``, 3.x: what Triton's autotune cache, DeepSpeed's
kernel caches, Hugging Face downloads and FlashInfer's JIT take before they write), as compiled patterns."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "LOCK"]

# _api.py's messages (filelock 3.0 - 3.16), each "<verb> lock <id> on <path>":
#   "Attempting to acquire lock 140192009925296 on /home/u/.triton/autotune/Fp16Matmul_2d_kernel.pickle.lock"
#   "Lock 140192009925296 acquired on /home/u/.triton/autotune/Fp16Matmul_2d_kernel.pickle.lock"
#   "Lock 140192009925296 not acquired on /home/u/...lock, waiting 0.05 seconds ..."
#   "Timeout on acquiring lock 140192009925296 on /home/u/...lock"
#   "Attempting to release lock 140192009925296 on ..." / "Lock 140192009925296 released on ..."
# literal-led, bounded: linear in the line
CATALOGUE: tuple[str, ...] = (
    r".{0,400}?(?:Attempting to (?:acquire|release) lock|Timeout on acquiring lock) \d{1,24} on \S",
    r".{0,400}?Lock \d{1,24} (?:acquired|not acquired|released) on \S",
)

LOCK = re.compile(r"(?P<what>Attempting to acquire|Attempting to release|Timeout on acquiring|Lock) (?:lock )?"
                  r"(?P<id>\d{1,24}) (?:(?P<how>acquired|not acquired|released) )?on (?P<path>[^\s,]{1,1000})")
