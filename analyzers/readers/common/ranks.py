"""A global rank guessed from a name (file, process title) or a launcher's line prefix: most per-rank artifacts
(FR dumps, py-spy / gdb / faulthandler dumps) do not state it inside, but their file name (``nccl_trace_rank_3``),
process title (``scheduler_TP3``) or torchrun's ``[rank3]:`` does. Pure functions, no I/O."""
from __future__ import annotations

import re

__all__ = ["rank_from_name", "rank_from_prefix", "split_rank_prefix"]

# `rank` not preceded by a letter (so not `crank`, `localrank`) nor by `local_` / `local-`.
_RANK = re.compile(r"(?<![A-Za-z])(?<!local_)(?<!local-)rank[\s_\-=:]?(\d+)(-\d+)?(?!\d)", re.IGNORECASE)
_TP = re.compile(r"(?<![A-Za-z])tp[_\-]?(\d+)(-\d+)?(?!\d)", re.IGNORECASE)
_OTHER_DIMS = re.compile(r"(?<![A-Za-z])(?:pp|dp|ep|cp)[_\-]?(\d+)(?!\d)", re.IGNORECASE)

# Launcher line prefixes that carry the *global* rank.
_PREFIX_TORCHRUN = re.compile(r"^\s*\[rank(\d+)\]:")              # torchrun --tee / --log-line-prefix default
_PREFIX_OPENMPI = re.compile(r"^\s*\[\d+,(\d+)\]<std(?:out|err)>:")  # mpirun --tag-output: [job,rank]<stdout>:
_PREFIX_LOCAL = re.compile(r"^\s*\[[A-Za-z_]+(\d+)\]:")            # torchrun <2.x: [default3]: (local rank)


def rank_from_name(name: str) -> int | None:
    """Global rank named in a file or process name, or None when absent or ambiguous.

    >>> rank_from_name("fr_gloo_rank3.json"), rank_from_name("nccl_trace_rank_3"), rank_from_name("[rank3]:")
    (3, 3, 3)
    >>> rank_from_name("scheduler_TP3"), rank_from_name("tp1"), rank_from_name("TP1-3")
    (3, 1, None)
    >>> rank_from_name("pyspy_dump_pid5922.txt"), rank_from_name("local_rank2.log")
    (None, None)

    Rules (first that applies wins):

    1. An explicit ``rank`` marker: ``rank3``, ``rank_3``, ``rank-3``, ``Rank 3``, ``[rank3]:``, ``RANK=3``. Two
       different explicit ranks in one name (``rank0_to_rank3``) or a range (``rank0-3``) give None.
    2. A tensor-parallel marker: ``tp1``, ``TP3``, ``scheduler_TP3``. ``TP1-3`` is a *range* of TP ranks (one process
       serving several, or a log covering several) and gives None. TP is taken as the global rank only when no other
       parallel dimension (``PP``, ``DP``, ``EP``, ``CP``) with a non-zero index appears in the name; otherwise the TP
       index is only a rank inside a TP group and the result is None.

    Known limits:

    * ``local_rank3`` / ``[default3]:`` (torchrun's older ``role+local_rank`` prefix) are node-local ranks, not global:
      None. On one node they coincide, but we cannot know that from a name.
    * ``tp8`` in a name that means "TP size 8" (``llama_tp8.log``) is read as TP rank 8: names are only a hint and never
      override a rank stated inside the file.
    * With ``PP0_TP3`` we assume the usual pp-major layout (global = pp * tp_size + tp = tp when pp = 0).
    * Bare numbers (``trace_3``, ``pid5922``) are *not* ranks here: a Flight Recorder file's trailing number is, but a
      py-spy file's is usually a pid, so that rule belongs to the FR reader.
    """
    explicit = [(m.group(1), m.group(2)) for m in _RANK.finditer(name)]
    if explicit:
        if any(rng for _, rng in explicit):
            return None
        values = {int(v) for v, _ in explicit}
        return values.pop() if len(values) == 1 else None
    tps = [(m.group(1), m.group(2)) for m in _TP.finditer(name)]
    if not tps:
        return None
    if any(rng for _, rng in tps):
        return None  # TP1-3: a range of TP ranks, not one rank
    values = {int(v) for v, _ in tps}
    if len(values) != 1:
        return None
    if any(int(m.group(1)) != 0 for m in _OTHER_DIMS.finditer(name)):
        return None  # PP1_TP3: 3 is a rank inside a TP group, the global rank needs the TP size
    return values.pop()


def split_rank_prefix(line: str) -> tuple[int | None, str]:
    """Split a launcher prefix off a log line: (global rank or None, rest of the line).

    A node-local prefix (``[default3]:``) is removed but gives None. A line without a prefix comes back unchanged.

    >>> split_rank_prefix("[rank2]:Thread 5924 (idle): \\"MainThread\\"")
    (2, 'Thread 5924 (idle): "MainThread"')
    >>> split_rank_prefix("[1,3]<stderr>:  File \\"x.py\\", line 3 in f")
    (3, '  File "x.py", line 3 in f')
    """
    for pattern, is_global in ((_PREFIX_TORCHRUN, True), (_PREFIX_OPENMPI, True), (_PREFIX_LOCAL, False)):
        m = pattern.match(line)
        if m:
            return (int(m.group(1)) if is_global else None), line[m.end():]
    return None, line


def rank_from_prefix(line: str) -> int | None:
    """Global rank from a launcher prefix at the start of `line` (``[rank3]:``, ``[0,3]<stdout>:``), else None."""
    return split_rank_prefix(line)[0]
