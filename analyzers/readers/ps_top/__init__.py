"""ps_top: process listings (``ps``, ``top``, ``htop``, ``pstree``, forests, nvidia-smi's process table) read into
``process`` rows: which ranks still run, which are zombies, which spin, which still hold GPU memory.
Stages: :mod:`.signatures` -> :mod:`.scan` (rows -> processes) -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.ps_top import rows, scan
from ranktrace.analyzers.readers.ps_top.signatures import CATALOGUE
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "CATALOGUE", "read_doc"]

FORMAT = "ps_top"
SOURCE = "ps_top"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("PID column / forest pid / pstree name(pid) / nvidia-smi PID", "OBSERVATIONS.pid", "int", "-", "all"),
    ColumnMap("STAT | S column ('Z' / '<defunct>' → defunct)", "OBSERVATIONS.name", "state letter", "null", "all"),
    ColumnMap("%CPU | CPU% | C column", "OBSERVATIONS.value", "int (rounded %)", "null", "all"),
    ColumnMap("CMD | COMMAND | ARGS | Command (redacted)", "OBSERVATIONS.detail cmd=", "str", "null", "all"),
    ColumnMap("PPID column | forest depth", "OBSERVATIONS.detail ppid=", "int", "null", "all"),
    ColumnMap("nvidia-smi GPU, Type, Usage", "OBSERVATIONS.detail gpu= type= mem=", "str", "-", "all"),
    ColumnMap("command / process title (rank_from_name)", "OBSERVATIONS.rank", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "process": "pid, name = state letter | defunct | null, value = cpu %, detail = pid=.. by=.. cmd=..",
}


def read_doc(doc: TextDoc) -> ReadResult:
    r"""The processes listed in `doc`. ReaderError when it holds no process row.

    Rows (``source="ps_top"``, ``file``, ``line`` = the process's row), one per process (several snapshots of one
    listing: the last): ``kind="process"``, ``pid``, ``name`` = ``defunct`` (state ``Z`` or ``<defunct>``) or the
    state letter (``R``, ``S``, ``D`` ...; null when the listing has no state column), ``value`` = CPU % rounded
    (null when not listed), ``detail`` = ``pid=.. [ppid=..] [gpu=.. type=.. mem=..] by=ps|top|forest|pstree|nvidia-smi
    cmd=<command, redacted>``, ``rank`` = the rank the command or process title names
    (``sglang::scheduler_TP3``, ``--rank 3``; common.ranks.rank_from_name), else null.

    Commands pass through ``tracer.redact`` (``--api-key X``, ``HF_TOKEN=..``, token-shaped values) and are cut at
    2000 characters. Known limits: ``ps`` columns with spaces inside (``lstart``) shift the row; a forest's parent is
    taken from the ``\_`` depth; a truncated nvidia-smi process name is kept as printed.
    """
    procs, skipped = scan.scan(doc)
    if not procs:
        raise ReaderError(doc.path, "no ps / top / pstree / nvidia-smi process row")
    return rows.result(doc.path, FORMAT, SOURCE, procs, skipped)
