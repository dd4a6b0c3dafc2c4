"""One spelling per operation, whatever the source called it.

Flight Recorder says ``nccl:all_reduce``, NCCL's COLL lines ``AllReduce``, the watchdog ``ALLREDUCE``, Kineto
``nccl:all_reduce`` or ``allreduce``, our hooks ``all_reduce`` (the torch.distributed function name). The wait-for
engine compares names across ranks, so every reader maps to the canonical torch.distributed spelling here.
"""
from __future__ import annotations

import functools
import re

__all__ = ["canonical_op", "P2P_OPS", "COLLECTIVE_OPS"]

COLLECTIVE_OPS = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
        "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
        "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
        "all_reduce_coalesced", "all_gather_coalesced", "coalesced",
    }
)
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"})

_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather_into_tensor",
    "allgatherintotensorcoalesced": "all_gather_into_tensor",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter_tensor",
    "reducescattertensorcoalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all_single",
    "alltoallv": "all_to_all_single",
    "bcast": "broadcast",
    "sendrecv": "send",
    "allreducecoalesced": "all_reduce_coalesced",
    "allgathercoalesced": "all_gather_coalesced",
}


@functools.lru_cache(maxsize=8192)  # a few dozen spellings, each asked once per op of a trace
def canonical_op(raw: str) -> str:
    """Map any source's op spelling to the torch.distributed function name.

    >>> canonical_op("nccl:all_reduce"), canonical_op("AllReduce"), canonical_op("ALLREDUCE")
    ('all_reduce', 'all_reduce', 'all_reduce')
    >>> canonical_op("nccl:send 0->1"), canonical_op("ReduceScatter"), canonical_op("gloo:broadcast")
    ('send', 'reduce_scatter', 'broadcast')
    >>> canonical_op("nccl:_all_gather_base"), canonical_op("nccl:_reduce_scatter_base")
    ('all_gather_into_tensor', 'reduce_scatter_tensor')
    >>> canonical_op("_ALLGATHER_BASE"), canonical_op("ALLTOALL_BASE"), canonical_op("ALLREDUCE_COALESCED")
    ('all_gather_into_tensor', 'all_to_all_single', 'all_reduce_coalesced')
    """
    s = raw.strip()
    if ":" in s:  # backend prefix: nccl:, gloo:, xccl:, record_param_comms-style names
        s = s.split(":", 1)[1]
    s = s.split(" ", 1)[0]  # "send 0->1"
    # CamelCase (NCCL) -> snake_case; ALLCAPS (watchdog OpType) -> lower
    if any(c.islower() for c in s) and any(c.isupper() for c in s):
        s = re.sub(r"(?<!^)(?=[A-Z])", "_", s)
    s = s.lower().strip("_")
    if s in COLLECTIVE_OPS or s in P2P_OPS:
        return s
    squashed = s.replace("_", "")
    if squashed in _ALIASES:  # alias keys are written without underscores
        return _ALIASES[squashed]
    for name in COLLECTIVE_OPS | P2P_OPS:
        if name.replace("_", "") == squashed:
            return name
    return s
