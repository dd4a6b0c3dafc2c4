"""The lines nccl-tests (``all_reduce_perf`` & co., ``src/common.cu``) prints, in the spellings of its releases,
and what their order means (listed above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "COMMAND", "STARTING", "VERSION", "PARAMS", "USING", "RANK", "TABLE_HEADER", "ROW_START",
           "OOB", "AVG_BW", "TEST_FAILURE", "TRAIL", "MPI_TAG", "BINARY_OPS", "op_of_binary", "op_of_columns"]

# ::
#
#     $ ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 2                        (the command, when pasted)
#     # nccl-tests version 2.20.0 (b4d5bee) nccl-headers=23102 nccl-library=23102       (2.14+)
#     # Collective test starting: all_reduce_perf                                       (2.14+)
#     # nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 ...
#     # Using devices
#     #  Rank  0 Group  0 Pid 1666603 on spark-d708 device  0 [000f:01:00] NVIDIA GB10   (2.11+: Group)
#     #   Rank  1 Pid   4479 on 4090-01-R02 device  1 [0xa1] NVIDIA GeForce RTX 4090     (2.0 – 2.10)
#        Rank  1 uses device  1 [0x08] Tesla M40 24GB                                    (1.x)
#     #       size         count      type   redop    root     time   algbw   busbw  #wrong     time ...
#     #      bytes             N    type      op     time  algbw  busbw      res     time ...          (1.x)
#             8192          2048     float     sum      -1    35.15    0.23    0.23       0    30.33 ...
#     # Out of bounds values : 0 OK
#     # Avg bus bandwidth    : 0.41
#     node1: Test NCCL failure common.cu:958 'internal error - please report this issue to the NCCL developers / '
#
# What the order means (``common.cu``): the device list, then communicator init (NCCL INFO lines when
# ``NCCL_DEBUG`` is set), then the table header (2.x prints it after init), then a warm-up of ``warmup iters`` ops at
# ``maxBytes`` and at ``minBytes`` before the first row, then per size the five size columns, the out-of-place and
# the in-place timing. So a table header with no row means the warm-up never finished, and a row that stops right
# after its size columns (or after the out-of-place part) was the op running when the output stopped.
#
# All patterns are anchored and bounded (linear in the line).

_TYPES = r"(?:float|half|double|int8|uint8|int32|uint32|int64|uint64|bfloat16|int|char|f8e4m3|f8e5m2|fp8\w{0,6})"
_REDOPS = r"(?:sum|prod|max|min|avg|none|mulsum|premulsum)"

#: line signatures for readers/catalogue.py (matched on each line's message, launcher prefixes peeled)
CATALOGUE: tuple[str, ...] = (
    r"\s{0,8}#\s{0,4}nThread \d{1,6} nGpus \d{1,6} minBytes \d",
    r"\s{0,8}#\s{0,4}nccl-tests version \d",
    r"\s{0,8}#\s{0,4}Collective test starting: \w",
    r"\s{0,8}#?\s{0,4}Using devices\s*$",
    r"\s{0,8}#?\s{0,4}Rank\s{1,4}\d{1,7}\s{1,4}(?:Group\s{1,4}\d{1,7}\s{1,4})?(?:Pid\s{1,8}\d{1,9}\s{1,4}on\s|uses device)",
    r"\s{0,8}#?\s{0,12}(?:size|bytes)\s{1,16}(?:count|N)\s{1,12}type\s{1,12}(?:redop|op)\s",
    r"\s{0,8}#\s{0,4}Out of bounds values\s{0,4}:",
    r"\s{0,8}#\s{0,4}Avg bus bandwidth\s{0,4}:",
    r"\s{0,16}\d{1,15}\s{1,16}\d{1,15}\s{1,16}" + _TYPES + r"\s{1,12}" + _REDOPS + r"\s",
    r".{0,200}?Test (?:NCCL|CUDA) failure \S{1,200}:\d",
    r".{0,200}?Test failure [\w./-]{1,200}\.cu:\d",
)

COMMAND = re.compile(r"(?:^|[\s/])(?P<bin>[a-z_]{3,30})_perf(?:_mpi)?(?:\s|$)")
STARTING = re.compile(r"\s{0,8}#\s{0,4}Collective test starting: (?P<bin>[a-z_]{3,30})_perf")
VERSION = re.compile(r"\s{0,8}#\s{0,4}nccl-tests version (\S{1,40})")
PARAMS = re.compile(r"\s{0,8}#\s{0,4}nThread (\d{1,6}) nGpus (\d{1,6}) minBytes (\d{1,20}) maxBytes (\d{1,20})")
USING = re.compile(r"\s{0,8}#?\s{0,4}Using devices\s*$")
RANK = re.compile(r"\s{0,8}#?\s{0,4}Rank\s{1,4}(?P<rank>\d{1,7})\s{1,4}(?:Group\s{1,4}\d{1,7}\s{1,4})?"
                  r"(?:Pid\s{1,8}(?P<pid>\d{1,9})\s{1,4}on\s{1,12}(?P<host>\S{1,128})\s{1,4}device|uses device)"
                  r"\s{1,4}(?P<dev>\d{1,4})")
TABLE_HEADER = re.compile(r"\s{0,8}#?\s{0,12}(?:size|bytes)\s{1,16}(?:count|N)\s{1,12}type\s{1,12}(?P<op>redop|op)\s"
                          r"(?P<rest>.{0,200})")
ROW_START = re.compile(r"\s{0,16}\d{1,15}(?:\s|$)")
OOB = re.compile(r"\s{0,8}#\s{0,4}Out of bounds values\s{0,4}:\s{0,4}(\d{1,12})\s{0,4}(OK|FAILED)?")
AVG_BW = re.compile(r"\s{0,8}#\s{0,4}Avg bus bandwidth\s{0,4}:\s{0,4}(\S{1,30})")
#: the test's own error line (common.h): ``<host>: Test NCCL failure common.cu:958 'internal error - ... / <last>'``
TEST_FAILURE = re.compile(r"Test (?P<what>NCCL|CUDA) failure (?P<where>\S{1,200}:\d{1,7}) "
                          r"'?(?P<msg>[^'\n]{0,300})")
#: the trail the test prints under its failure line, innermost call first (common.h's ``Test failure <file>:<line>``);
#: the last one is the test's own source (``all_reduce.cu:103``), which names the binary
TRAIL = re.compile(r".{0,200}?Test failure (?:[\w./-]{0,200}/)?(?P<src>\w{1,40})\.cu:\d{1,7}")
#: mpirun --tag-output's short ``[0]`` tag, written again at every write inside a row
MPI_TAG = re.compile(r"\[\d{1,6}\]")

#: the binary's name → the op it runs (``sendrecv_perf``: each rank sends to the next and receives)
BINARY_OPS: dict[str, str] = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "sendrecv": "send",
    "gather": "gather", "scatter": "scatter", "hypercube": "send",
}


def op_of_binary(binary: str) -> str | None:
    """``all_reduce`` (of ``all_reduce_perf``) → the op; None for a binary nccl-tests does not ship."""
    return BINARY_OPS.get(binary)


def op_of_columns(redop: str, root: str | None) -> tuple[str, str]:
    """(op, why) from a row's redop and root columns; the same columns fit more than one binary, so `why` says so.

    >>> op_of_columns("sum", "-1")[0], op_of_columns("none", "0")[0], op_of_columns("none", "-1")[0]
    ('all_reduce', 'broadcast', 'all_gather')
    """
    rooted = root is not None and root.lstrip("-").isdigit() and int(root) >= 0
    if redop == "none":
        if rooted:
            return "broadcast", f"redop=none root={root}: broadcast_perf (gather/scatter print the same)"
        return "all_gather", f"redop=none root={root}: all_gather_perf (alltoall_perf prints the same)"
    if rooted:
        return "reduce", f"redop={redop} root={root}: reduce_perf"
    return "all_reduce", (f"redop={redop} root={root}: all_reduce_perf (reduce_scatter_perf and sendrecv_perf "
                          "print the same)")
