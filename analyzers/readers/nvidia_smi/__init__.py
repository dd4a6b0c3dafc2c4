"""nvidia_smi: saved ``nvidia-smi`` status tables and ``nvidia-smi topo -m`` matrices, read into OBSERVATIONS: which
pids sit on which GPU, which GPUs still hold memory, an NVLink box or a PCIe one. Stages: :mod:`.status` (the
line walk and status tables) calling :mod:`.topo` (link matrices)."""
from __future__ import annotations

import re
from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.nvidia_smi.status import ANSI, Parser
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "sniff", "read", "read_doc", "FIELD_MAP", "OBSERVATION_KINDS"]

FORMAT = "nvidia_smi"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("GPU row: index", "OBSERVATIONS.name (gpu_util, gpu_memory)", "int", "null", "all"),
    ColumnMap("GPU row: Name", "OBSERVATIONS.detail (gpu_util)", "str, may be truncated", "null", "all"),
    ColumnMap("GPU row 2: 'used MiB / total MiB'", "OBSERVATIONS.value / detail (gpu_memory)", "MiB", "null", "all"),
    ColumnMap("GPU row 2: 'GPU-Util %'", "OBSERVATIONS.value (gpu_util)", "%", "null", "all (N/A → row skipped)"),
    ColumnMap("Processes row: GPU, PID, Type, Process name, Usage", "OBSERVATIONS gpu_process", "", "null",
              "GI/CI columns: 470+"),
    ColumnMap("header 'Driver Version: X'", "ReadResult.version", "str", "null", "all"),
    ColumnMap("timestamp line 'Tue Mar  4 10:15:02 2025'", "OBSERVATIONS.wall_ns", "local time", "null", "all"),
    ColumnMap("topo -m cell (GPUi row, GPUj column)", "OBSERVATIONS topology_link detail", "NV#|PIX|PXB|PHB|NODE|SYS",
              "null", "NODE: 2018+"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "gpu_util": "name = GPU index, value = GPU-Util %, detail = GPU model",
    "gpu_memory": "name = GPU index, value = MiB used, detail = 'total N MiB'",
    "gpu_process": "pid, name = GPU index, value = MiB used (null for N/A), detail = process name and type",
    "topology": "detail = nvlink | pcie | mixed | single_gpu, value = number of GPUs",
    "topology_link": "name = 'GPUi-GPUj', detail = matrix cell (NV4, PIX, SYS, ...), value = NVLink count for NV#",
}

_SNIFF = re.compile(r"NVIDIA-SMI \S+\s+Driver Version|^[ \t]{0,40}GPU0\s+(?:GPU1|NIC0|mlx5_0|CPU Affinity)"
                    r"|X    = Self|NV#  = Connection", re.MULTILINE)


def sniff(path: Path, head: bytes) -> bool:
    """True when the first bytes hold an nvidia-smi table header or a topo matrix header/legend."""
    return bool(_SNIFF.search(ANSI.sub("", head.decode("utf-8", errors="replace"))))


def read(path: Path) -> ReadResult:
    """Read one saved nvidia-smi / topo output. Raises ReaderError when it cannot be read or holds neither.

    Observation kinds (:data:`OBSERVATION_KINDS`):

    * ``gpu_util`` — ``name`` = GPU index, ``value`` = GPU-Util %, ``detail`` = GPU model.
    * ``gpu_memory`` — ``name`` = GPU index, ``value`` = MiB used, ``detail`` = ``"total <MiB> MiB"``.
    * ``gpu_process`` — ``pid``, ``name`` = GPU index, ``value`` = MiB used by that process (null for ``N/A``),
      ``detail`` = process name (as printed: may be truncated with ``...``) and type (C, G, C+G).
    * ``topology`` — one per matrix: ``detail`` = ``"nvlink"`` (every GPU pair is NV#), ``"pcie"`` (no pair is),
      ``"mixed"`` (some are) or ``"single_gpu"``; ``value`` = number of GPUs.
    * ``topology_link`` — one per unordered GPU pair: ``name`` = ``"GPU0-GPU1"``, ``detail`` = the matrix cell (``NV4``,
      ``NV18``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ...), ``value`` = NVLink count for NV# else null.

    Layouts handled: the pre-470 narrow table, the 470–550 table (``GPU  Name  Persistence-M``, processes with
    ``GI``/``CI`` columns) and the 555+ wide table (wider Bus-Id column); several snapshots in one file (``nvidia-smi
    -l``): each snapshot's rows carry its timestamp line (``Tue Mar  4 10:15:02 2025``, local time stored as if UTC)
    in ``wall_ns``. The topo matrix is read with tab separators (falling back to runs of spaces for copied text);
    ANSI underline codes in its header are stripped; NIC rows and columns are ignored.

    Bad input: unreadable file, or text with neither an nvidia-smi table nor a topo matrix → ReaderError. Rows that
    look like GPU rows but cannot be parsed → Skipped (never raises on a torn line).

    Known limits: MIG device tables are skipped; ``--query-gpu`` CSV and ``-q`` (long) outputs are not read; GPU
    indices are as ``nvidia-smi`` numbers them (PCI order, not ``CUDA_VISIBLE_DEVICES`` order).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    return _from_text(path, text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (tables are read from the raw lines)."""
    return _from_text(Path(doc.path), doc.raw_text())


def _from_text(path: Path, text: str) -> ReadResult:
    parser = Parser(str(path))
    lines = [ANSI.sub("", ln).rstrip("\r") for ln in text.split("\n")]
    parser.parse(lines)
    if not parser.found:
        raise ReaderError(path, "no nvidia-smi table ('NVIDIA-SMI ... Driver Version') and no 'nvidia-smi topo -m' "
                                "matrix (header 'GPU0 GPU1 ...') found")
    return ReadResult(file=str(path), format=FORMAT, version=parser.version,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, parser.rows),
                      skipped=tuple(parser.skipped))
