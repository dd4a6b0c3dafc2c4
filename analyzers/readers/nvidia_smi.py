"""Reader for saved ``nvidia-smi`` text output: the default status table and ``nvidia-smi topo -m``.

Why: what users paste or save next to a hung job is often just ``nvidia-smi`` (utilisation, memory, processes per
GPU) and ``nvidia-smi topo -m`` (how GPUs are connected). Neither proves a hang — a spinning NCCL kernel shows
100% utilisation, a hung gloo rank 0% (DESIGN §2) — but they place pids on GPUs, show which GPUs still hold memory
(a process that exited vs. one that is alive), and tell an NVLink box from a PCIe one. This reader turns both into
OBSERVATIONS (``source="nvidia_smi"``, ``file``, ``line`` = 1-based line of the row it came from).

Observation kinds (:data:`OBSERVATION_KINDS`):

* ``gpu_util`` — ``name`` = GPU index, ``value`` = GPU-Util %, ``detail`` = GPU model.
* ``gpu_memory`` — ``name`` = GPU index, ``value`` = MiB used, ``detail`` = ``"total <MiB> MiB"``.
* ``gpu_process`` — ``pid``, ``name`` = GPU index, ``value`` = MiB used by that process (null for ``N/A``),
  ``detail`` = process name (as printed: may be truncated with ``...``) and type (C, G, C+G).
* ``topology`` — one per matrix: ``detail`` = ``"nvlink"`` (every GPU pair is NV#), ``"pcie"`` (no pair is),
  ``"mixed"`` (some are) or ``"single_gpu"``; ``value`` = number of GPUs.
* ``topology_link`` — one per unordered GPU pair: ``name`` = ``"GPU0-GPU1"``, ``detail`` = the matrix cell
  (``NV4``, ``NV18``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ...), ``value`` = NVLink count for NV# else null.

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
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any, NamedTuple

from ranktrace.analyzers import schema
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.base import ReaderError, ReadResult, Skipped

__all__ = ["FORMAT", "sniff", "read", "read_doc", "FieldMap", "FIELD_MAP", "OBSERVATION_KINDS"]

FORMAT = "nvidia_smi"
SOURCE = "nvidia_smi"


class FieldMap(NamedTuple):
    """One raw field and where it goes (the reader's declared mapping, style.md point 3)."""

    raw: str
    column: str
    type: str
    default: Any
    since: str


FIELD_MAP: tuple[FieldMap, ...] = (
    FieldMap("GPU row: index", "OBSERVATIONS.name (gpu_util, gpu_memory)", "int", None, "all"),
    FieldMap("GPU row: Name", "OBSERVATIONS.detail (gpu_util)", "str, may be truncated", None, "all"),
    FieldMap("GPU row 2: 'used MiB / total MiB'", "OBSERVATIONS.value / detail (gpu_memory)", "MiB", None, "all"),
    FieldMap("GPU row 2: 'GPU-Util %'", "OBSERVATIONS.value (gpu_util)", "%", None, "all (N/A → row skipped)"),
    FieldMap("Processes row: GPU, PID, Type, Process name, Usage", "OBSERVATIONS gpu_process", "", None,
             "GI/CI columns: 470+"),
    FieldMap("header 'Driver Version: X'", "ReadResult.version", "str", None, "all"),
    FieldMap("timestamp line 'Tue Mar  4 10:15:02 2025'", "OBSERVATIONS.wall_ns", "local time", None, "all"),
    FieldMap("topo -m cell (GPUi row, GPUj column)", "OBSERVATIONS topology_link detail", "NV#|PIX|PXB|PHB|NODE|SYS",
             None, "NODE: 2018+"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "gpu_util": "name = GPU index, value = GPU-Util %, detail = GPU model",
    "gpu_memory": "name = GPU index, value = MiB used, detail = 'total N MiB'",
    "gpu_process": "pid, name = GPU index, value = MiB used (null for N/A), detail = process name and type",
    "topology": "detail = nvlink | pcie | mixed | single_gpu, value = number of GPUs",
    "topology_link": "name = 'GPUi-GPUj', detail = matrix cell (NV4, PIX, SYS, ...), value = NVLink count for NV#",
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_HEADER = re.compile(r"NVIDIA-SMI\s+(\S+)\s+Driver Version:\s*(\S+)(?:\s+CUDA Version:\s*(\S+))?")
_STAMP = re.compile(r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\w{3})\s+(\d{1,2}) (\d{2}:\d{2}:\d{2}) (\d{4})\s*$")
_GPU_ROW = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off|N/A)?\s*$")
_MEM = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_UTIL = re.compile(r"^\s*(\d+|N/A)%?\s")
_PROC = re.compile(r"^\|\s*(\d+)\s+(?:(N/A|\d+)\s+(N/A|\d+)\s+)?(\d+)\s+(C\+G|G\+C|M\+C|C|G|M)\s+(.*?)\s+"
                   r"(\d+MiB|N/A)\s*\|$")
_TOPO_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")
_SNIFF = re.compile(r"NVIDIA-SMI \S+\s+Driver Version|^\s*GPU0\s+(?:GPU1|NIC0|mlx5_0|CPU Affinity)"
                    r"|X    = Self|NV#  = Connection", re.MULTILINE)


def sniff(path: Path, head: bytes) -> bool:
    """True when the first bytes hold an nvidia-smi table header or a topo matrix header/legend."""
    return bool(_SNIFF.search(_ANSI.sub("", head.decode("utf-8", errors="replace"))))


def read(path: Path) -> ReadResult:
    """Read one saved nvidia-smi / topo output. Raises ReaderError when it cannot be read or holds neither."""
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
    parser = _Parser(str(path))
    lines = [_ANSI.sub("", ln).rstrip("\r") for ln in text.split("\n")]
    parser.parse(lines)
    if not parser.found:
        raise ReaderError(path, "no nvidia-smi table ('NVIDIA-SMI ... Driver Version') and no 'nvidia-smi topo -m' "
                                "matrix (header 'GPU0 GPU1 ...') found")
    return ReadResult(file=str(path), format=FORMAT, version=parser.version,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, parser.rows),
                      skipped=tuple(parser.skipped))


class _Parser:
    def __init__(self, file: str) -> None:
        self.file = file
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[Skipped] = []
        self.version: str | None = None
        self.found = False
        self.wall: int | None = None

    def _obs(self, line: int, kind: str, **kw: Any) -> None:
        self.rows.append(dict(kind=kind, wall_ns=self.wall, source=SOURCE, file=self.file, line=line, **kw))

    def parse(self, lines: list[str]) -> None:
        section = "none"              # none | gpus | mig | procs
        gpu: tuple[str, str, int] | None = None   # (index, model, line) waiting for its memory row
        i = 0
        while i < len(lines):
            line, n = lines[i], i + 1
            stripped = line.strip()
            if _STAMP.match(stripped):
                self.wall = _stamp(stripped)
            elif (h := _HEADER.search(line)) is not None:
                self.found = True
                self.version = f"driver {h.group(2)}" + (f", CUDA {h.group(3)}" if h.group(3) else "")
                section, gpu = "gpus", None
            elif "MIG devices:" in line:
                section, gpu = "mig", self._unfinished(gpu)
            elif "Processes:" in line:
                section, gpu = "procs", self._unfinished(gpu)
            elif (header := _topo_header(line)) is not None:
                self.found = True
                i = self._topo(header, lines, i)
                section = "none"
                continue
            elif section == "gpus" and stripped.startswith("|") and not stripped.startswith("|="):
                gpu = self._gpu_line(line, n, gpu)
            elif section == "procs" and stripped.startswith("|"):
                self._proc_line(line, n)
            i += 1

    def _gpu_line(self, line: str, n: int, gpu: tuple[str, str, int] | None) -> tuple[str, str, int] | None:
        cells = line.strip().strip("|").split("|")
        if len(cells) < 3:
            return gpu
        m = _GPU_ROW.match(cells[0])
        if m and not _MEM.search(line):
            self._unfinished(gpu)
            return (m.group(1), m.group(2).strip(), n)
        mem = _MEM.search(cells[1]) if len(cells) > 1 else None
        if gpu is None or mem is None:
            return gpu
        index, model, _ = gpu
        used, total = int(mem.group(1)), int(mem.group(2))
        self._obs(n, "gpu_memory", name=index, value=used, detail=f"total {total} MiB")
        util = _UTIL.match(cells[2] + " ")
        if util and util.group(1) != "N/A":
            self._obs(n, "gpu_util", name=index, value=int(util.group(1)), detail=model or None)
        elif util is None:
            self.skipped.append(Skipped(self.file, n, f"GPU {index}: no GPU-Util % in {cells[2].strip()!r}"))
        return None

    def _unfinished(self, gpu: tuple[str, str, int] | None) -> None:
        """A GPU row whose memory/utilisation row never came (torn output): say so."""
        if gpu is not None:
            self.skipped.append(Skipped(self.file, gpu[2], f"GPU {gpu[0]}: no memory/utilisation row after it"))
        return None

    def _proc_line(self, line: str, n: int) -> None:
        m = _PROC.match(line.strip())
        if m is None:
            body = line.strip().strip("|").strip()
            if body and body[0].isdigit():
                self.skipped.append(Skipped(self.file, n, f"unparsed process row: {body[:80]!r}"))
            return
        gpu, _gi, _ci, pid, ptype, name, usage = m.groups()
        value = None if usage == "N/A" else int(usage[:-3])
        self._obs(n, "gpu_process", pid=int(pid), name=gpu, value=value, detail=f"{name} (type {ptype})")

    def _topo(self, header: list[str], lines: list[str], start: int) -> int:
        """Read one matrix whose header is at ``start``; returns the index of the line after its last row."""
        gpu_cols = {j: int(g.group(1)) for j, tok in enumerate(header) if (g := _TOPO_GPU.match(tok))}
        links: dict[tuple[int, int], tuple[str, int]] = {}
        i = start + 1
        while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith("Legend"):
            cells = _split_topo(lines[i])
            row = _TOPO_GPU.match(cells[0]) if cells else None
            if row is None:  # NIC / mlx rows, or a torn line
                i += 1
                continue
            a = int(row.group(1))
            for j, b in gpu_cols.items():
                if j >= len(cells) or a == b:
                    continue
                cell = cells[j].strip()
                key = (min(a, b), max(a, b))
                if cell and cell != "X" and key not in links:
                    links[key] = (cell, i + 1)
            i += 1
        gpus = sorted(gpu_cols.values())
        for (a, b), (cell, n) in sorted(links.items()):
            nv = _NVLINK.match(cell)
            self._obs(n, "topology_link", name=f"GPU{a}-GPU{b}", detail=cell, value=int(nv.group(1)) if nv else None)
        if len(gpus) <= 1:
            kind = "single_gpu"
        else:
            nv_pairs = sum(1 for cell, _ in links.values() if _NVLINK.match(cell))
            kind = "nvlink" if nv_pairs == len(links) and links else ("pcie" if nv_pairs == 0 else "mixed")
        self._obs(start + 1, "topology", name="topo -m", detail=kind, value=len(gpus))
        return i


def _topo_header(line: str) -> list[str] | None:
    """The header cells of a topo matrix (first cell empty, aligned with the rows' label column), else None."""
    tokens = _split_topo(line)
    if len(tokens) >= 2 and tokens[0] == "" and tokens[1] == "GPU0":
        return tokens
    if len(tokens) >= 2 and tokens[0] == "GPU0" and (tokens[1] == "GPU1" or tokens[1].startswith(("CPU", "NIC",
                                                                                                   "mlx"))):
        return [""] + tokens  # copied without the leading tab
    return None


def _split_topo(line: str) -> list[str]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    parts = line.split()
    return ([""] + parts) if line[:1].isspace() else parts


def _stamp(text: str) -> int | None:
    try:
        t = _dt.datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000
