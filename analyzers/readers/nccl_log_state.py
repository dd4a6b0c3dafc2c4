"""What one read of an NCCL log accumulates: communicators, identities, COLL row blocks and the shared helpers.

Why separate: the line parsers (``nccl_log_rare_lines``, ``nccl_log_coll``), the chunk walker
(``nccl_log_walk``) and the table builder (``nccl_log_tables``) all work on this state; ``_ReaderState`` is
their common base class, so each of them can live in its own module. The COLL row layout (``_META``, one int64
row per COLL line in blocks from Arrow's memory pool) is defined here too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_log_grammar import _P2P_RAW

@dataclass(slots=True)
class _Comm:
    """One communicator life inside one process (``(host, pid, comm pointer)`` until destroyed)."""

    idx: int
    host: str
    pid: int
    ptr: str
    group: str
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    init_seen: bool = False
    started: bool = False
    completed: bool = False         # its Init COMPLETE line was seen
    init_line: int | None = None
    info: dict[str, str] = field(default_factory=dict)
    n_coll: int = 0
    first_coll_line: int | None = None
    p2p: dict[tuple[int | None, int], int] = field(default_factory=dict)


#: Integers kept per COLL row (one ``(rows, 9)`` int64 block per chunk: no Python object outlives its chunk).
_META = ("line", "ii", "ci", "seq", "opc", "op", "dt", "count", "root")
_NMETA = len(_META)
_I63 = (1 << 63) - 1


def _block(rows: int) -> np.ndarray:
    """An uninitialised (rows, _NMETA) int64 block in Arrow's memory pool: once a block has become EVENTS rows and
    is dropped, the pool reuses its memory for the next rows (numpy's heap would keep it to itself)."""
    return np.frombuffer(pa.allocate_buffer(rows * _NMETA * 8), dtype=np.int64).reshape(rows, _NMETA)


class _ReaderState:
    """The state of one read and the helpers every part of the reader uses (see ``nccl_log``'s docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)
        self.skipped: list[Skipped] = []
        self.obs: list[dict[str, Any]] = []
        self.init_obs: list[tuple[dict[str, Any], _Comm]] = []
        self.comms: dict[tuple[str, int, str], _Comm] = {}
        self.all_comms: list[_Comm] = []
        self.tid_comm: dict[tuple[str, int, int], _Comm] = {}
        self.transport: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.hosts_by_pid: dict[int, list[str]] = {}
        self.idents: list[tuple[str, int, int, int | None]] = []
        self.ident_idx: dict[tuple[str, int, int, int | None], int] = {}
        # (text before " NCCL INFO", comm pointer) -> (ident index, communicator); cleared when comms change
        self.coll_cache: dict[tuple[bytes, bytes], tuple[int, _Comm, int]] = {}
        self.versions: dict[str, int] = {}
        self.init_done: set[tuple[str, int]] = set()               # processes with a communicator Init COMPLETE
        self.failures: set[tuple[Any, ...]] = set()                # (host, pid, kind, name) already reported
        self.fallback_noted: set[tuple[str, int, str]] = set()
        self.bad_utf8_line: int | None = None
        self.nul_bytes = 0
        self.nul_line: int | None = None
        self.torn = 0
        self.n_marker_lines = 0
        self.batches: list[np.ndarray] = []     # (rows, _NMETA) int64 blocks, one per chunk
        self.op_ids: dict[bytes, int] = {}

    # ---- helpers

    def _host(self, host: str, pid: int) -> str:
        known = self.hosts_by_pid.get(pid)
        if known is None:
            self.hosts_by_pid[pid] = [host]
            return host
        if host in known:
            return host
        for h in known:
            if host.endswith(h):
                return h
        known.append(host)
        return host

    def _torn(self, line: int, reason: str) -> None:
        self.torn += 1
        if self.torn <= 50:
            self.skipped.append(Skipped(self.file, line, reason))

    def _new_comm(self, host: str, pid: int, ptr: str) -> _Comm:
        c = _Comm(idx=len(self.all_comms), host=host, pid=pid, ptr=ptr, group=f"comm:{ptr}")
        self.comms[(host, pid, ptr)] = c
        self.all_comms.append(c)
        self.coll_cache.clear()
        return c

    def _p2p_by_op(self) -> np.ndarray:
        """Per op id: is it a p2p op (Send/Recv/...)?"""
        flags = np.zeros(len(self.op_ids), dtype=bool)
        for op, oi in self.op_ids.items():
            flags[oi] = op in _P2P_RAW
        return flags
