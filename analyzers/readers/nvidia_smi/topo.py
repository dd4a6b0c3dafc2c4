"""``nvidia-smi topo -m``: the GPU link matrix (tab separated, or runs of spaces for copied text; NIC rows and columns
ignored) as one ``topology_link`` row per GPU pair and one ``topology`` summary (nvlink, pcie, mixed, single_gpu)."""
from __future__ import annotations

import re
from typing import Any, Protocol

__all__ = ["Emit", "topo_header", "read_topo"]

_TOPO_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")


class Emit(Protocol):
    """Where a matrix's rows go: one OBSERVATIONS row of `kind` at input line `line`."""

    def __call__(self, line: int, kind: str, **kw: Any) -> None: ...


def topo_header(line: str) -> list[str] | None:
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


def read_topo(header: list[str], lines: list[str], start: int, emit: Emit) -> int:
    """Read one matrix whose header is at ``start`` (``emit`` its rows); returns the index of the line after its last
    row."""
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
        emit(n, "topology_link", name=f"GPU{a}-GPU{b}", detail=cell, value=int(nv.group(1)) if nv else None)
    if len(gpus) <= 1:
        kind = "single_gpu"
    else:
        nv_pairs = sum(1 for cell, _ in links.values() if _NVLINK.match(cell))
        kind = "nvlink" if nv_pairs == len(links) and links else ("pcie" if nv_pairs == 0 else "mixed")
    emit(start + 1, "topology", name="topo -m", detail=kind, value=len(gpus))
    return i
