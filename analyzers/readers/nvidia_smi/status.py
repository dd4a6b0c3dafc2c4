"""The nvidia-smi status table (pre-470 narrow, 470–550, 555+ wide; several snapshots of ``nvidia-smi -l``): per GPU
its utilisation and memory, per process its GPU and memory, each snapshot's timestamp on its rows."""
from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nvidia_smi.topo import read_topo, topo_header

__all__ = ["SOURCE", "ANSI", "Parser"]

SOURCE = "nvidia_smi"

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_HEADER = re.compile(r"NVIDIA-SMI\s+(\S+)\s+Driver Version:\s*(\S+)(?:\s+CUDA Version:\s*(\S+))?")
_STAMP = re.compile(r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\w{3})\s+(\d{1,2}) (\d{2}:\d{2}:\d{2}) (\d{4})\s*$")
_GPU_ROW = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off|N/A)?\s*$")
_MEM = re.compile(r"(?<!\d)(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_UTIL = re.compile(r"^\s*(\d+|N/A)%?\s")
_PROC = re.compile(r"^\|\s*(\d+)\s+(?:(N/A|\d+)\s+(N/A|\d+)\s+)?(\d+)\s+(C\+G|G\+C|M\+C|C|G|M)\s+(.*?)\s+"
                   r"(\d+MiB|N/A)\s*\|$")


class Parser:
    """Walks the lines once: status tables (GPU rows, process rows, the timestamp of each snapshot) and, through
    :mod:`.topo`, topo matrices; ``rows`` are the OBSERVATIONS."""

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
            elif (header := topo_header(line)) is not None:
                self.found = True
                i = read_topo(header, lines, i, self._obs)
                section = "none"
                continue
            elif section in ("gpus", "none") and stripped.startswith("|") and not stripped.startswith("|="):
                # "none": a table pasted without nvidia-smi's banner; only a GPU row followed by its memory row counts
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
        self.found = True
        self._obs(n, "gpu_memory", name=index, value=used, detail=f"total {total} MiB")
        util = _UTIL.match(cells[2] + " ")
        if util and util.group(1) != "N/A":
            self._obs(n, "gpu_util", name=index, value=int(util.group(1)), detail=model or None)
        elif util is None:
            self.skipped.append(Skipped(self.file, n, f"GPU {index}: no GPU-Util % in {cells[2].strip()!r}"))
        return None

    def _unfinished(self, gpu: tuple[str, str, int] | None) -> tuple[str, str, int] | None:
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
        self.found = True  # a process table is readable without the banner above it
        self._obs(n, "gpu_process", pid=int(pid), name=gpu, value=value, detail=f"{name} (type {ptype})")


def _stamp(text: str) -> int | None:
    try:
        t = _dt.datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None
    return int(t.timestamp()) * 1_000_000_000
