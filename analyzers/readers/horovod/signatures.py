"""The lines of Horovod's stall inspector and shutdown errors, as its releases print them (the wordings are listed
above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "WARNING", "RANK_HEADER", "RANK_LINE", "PER_OP", "SHUTDOWN", "STALL_SHUTDOWN",
           "SHUTDOWN_TYPE", "INTERNAL_ERROR", "op_of_tensor", "tensor_before"]

# Wordings (``horovod/common/operations.cc`` before 0.17, ``stall_inspector.cc`` after):
#
# * the warning: ``One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and
#   are waiting for remainder of ranks for more than 60 seconds. This may indicate ...`` (prefixed by ``WARNING: ``
#   or a glog ``[<time>: W .../stall_inspector.cc:105] ``);
# * before 0.17, per op: ``Stalled ops:`` then ``<tensor> [ready ranks: 0, 7, 3]`` (or ``[missing ranks: 1]``, in
#   forks ``[stalled global rank: ...]``), on one line after the warning, one per line, or one per glog line;
# * from 0.17: ``Stalled ranks:`` (0.17 – 0.20) / ``Missing ranks:`` (0.21+) then one line per rank
#   ``<rank>[!]: [<tensor>, <tensor> ...]`` (``!``: that rank passed the shutdown time), and with
#   ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` ``One or more rank (marked by "!") is stalled for longer than N seconds.
#   Will shutdown.``;
# * ``Horovod has been shut down. This was caused by an exception on one of the ranks ...`` (the op error every rank
#   raises once one rank failed), with the framework's error type in front (``AbortedError (see above for
#   traceback): ``, ``Unknown: ``, ``tensorflow.python.framework.errors_impl.UnknownError: ``);
# * ``horovod.common.exceptions.HorovodInternalError: <message>`` (elastic Horovod).
#
# All patterns are anchored or literal-led and bounded (linear in the line).

#: line signatures for readers/catalogue.py (matched on each line's message, prefixes peeled)
CATALOGUE: tuple[str, ...] = (
    r".{0,200}?One or more tensors were submitted to be reduced",
    r".{0,200}?(?:Missing|Stalled) ranks:\s*$",
    r".{0,200}?Stalled ops:",
    r".{0,600}?\[(?:ready|missing|stalled(?: global)?) ranks?: ?\d",
    r".{0,300}?Horovod has been shut down",
    r".{0,200}?One or more rank \(marked by",
    r".{0,200}?HorovodInternalError: ",
)

WARNING = re.compile(r"One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks"
                     r" and are waiting for remainder of ranks for more than (\d{1,9}) seconds")
#: the header of the per-rank list; what follows it on the same line (a paste that lost its line ends) is read too
RANK_HEADER = re.compile(r"(?:Missing|Stalled) ranks:")
#: ``1: [a, b`` / ``4!: [a]`` at the start of a message
RANK_LINE = re.compile(r"\s{0,8}(\d{1,7})(!?): \[")
#: ``<tensor> [ready ranks: 0, 7, 3]``: found with finditer from the literal bracket (several ops on one line);
#: the tensor name is the word before it (``tensor_before``), so the walk stays linear in the line
PER_OP = re.compile(r"\[(?P<kind>ready|missing|stalled(?: global)?) ranks?: ?"
                    r"(?P<ranks>\d{1,7}(?:[, ]{1,3}\d{1,7}){0,4096})\s{0,4}(?P<close>\])?")
STALL_SHUTDOWN = re.compile(r"One or more rank \(marked by \"!\"\) is stalled for longer than (\d{1,9}) seconds")
SHUTDOWN = "Horovod has been shut down"
#: the error type printed in front of the shutdown message (searched in the 160 characters before it)
SHUTDOWN_TYPE = re.compile(r"([A-Za-z_][\w.]{0,120})(?: \(see above for traceback\))?: $")
INTERNAL_ERROR = "HorovodInternalError: "

_OPS = re.compile(r"(allreduce|allgather|broadcast|alltoall|reducescatter|reduce_scatter)", re.IGNORECASE)
_OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "broadcast": "broadcast",
             "alltoall": "all_to_all", "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter"}


def op_of_tensor(tensor: str) -> str | None:
    """The collective a Horovod tensor name was submitted to (the last op word in it), or None.

    >>> op_of_tensor("DistributedGradientTape_Allreduce/cond_163/HorovodAllreduce_AddN_103_0")
    'all_reduce'
    >>> op_of_tensor("HorovodBroadcast_conv_layer1_Conv_biases_0"), op_of_tensor("allgather.layer1.weight")
    ('broadcast', 'all_gather')
    >>> op_of_tensor("HorovodAlltoall_x_0"), op_of_tensor("grads_0") is None
    ('all_to_all', True)
    """
    last = None
    for m in _OPS.finditer(tensor[:1000]):
        last = m.group(1).lower()
    return _OP_NAMES.get(last) if last else None


def tensor_before(text: str, start: int) -> str | None:
    """The tensor name written just before position `start` (``name [ready ranks: ..]``), or None.

    >>> tensor_before("a [ready ranks: 1], allreduce.bn1.weight [ready ranks: 0]", 41)
    'allreduce.bn1.weight'
    """
    window = text[max(0, start - 401):start].rstrip(" ")
    cut = max(window.rfind(c) for c in " \t[],")
    name = window[cut + 1:]
    return name or None
