"""The sample files' schemas and their append-only writer (``<run>/<host>/samples/{proc,stacks,gpu}.arrows``).

Files are Arrow IPC **streams** (``pyarrow.ipc.open_stream``), one record batch appended per flush (every few
seconds and at exit) and flushed to the OS, so a ``trace run`` that is SIGKILLed loses at most one flush interval;
a batch cut mid-write is the only unreadable part (readers keep the batches before it). The schema's metadata
says ``schema: ranktrace.samples.<name>/1``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["PROC_SCHEMA", "STACKS_SCHEMA", "GPU_SCHEMA", "SCHEMAS", "ArrowStreamLog"]


def _schema(name: str, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema(fields, metadata={"schema": f"ranktrace.samples.{name}/1"})


PROC_SCHEMA = _schema("proc", [
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),         # sample time: wall clock, CLOCK_MONOTONIC
    ("kind", pa.string()),                                  # process | thread | wait | lock | child
    ("pid", pa.int64()), ("tid", pa.int64()),               # tid null on process rows
    ("rank", pa.int32()),
    ("comm", pa.string()),                                  # process comm / thread name (/proc/.../comm)
    ("state", pa.string()),                                 # R S D Z T t X I ...
    ("wchan", pa.string()),                                 # threads only; "0" or "" when the kernel hides it
    ("utime_ns", pa.int64()), ("stime_ns", pa.int64()),     # CPU time so far
    ("majflt", pa.int64()), ("minflt", pa.int64()),
    ("num_threads", pa.int32()),                            # process rows
    ("rss_bytes", pa.int64()), ("vms_bytes", pa.int64()),   # process rows
    ("rchar", pa.int64()), ("wchar", pa.int64()),           # process rows (/proc/PID/io; null when unreadable)
    ("read_bytes", pa.int64()), ("write_bytes", pa.int64()),
    # host-side waits (tracer/watch/wait_probe.py; rows of kind wait | lock | child, null on the others):
    ("ppid", pa.int64()),                                   # child rows: its parent
    ("path", pa.string()),                                  # wait: fd target (pipe:[ino], a path); lock: the file
    ("peer_pid", pa.int64()),                               # wait: first writer / holder; lock: first holder
    ("detail", pa.string()),                                # k=v facts (syscall=, peers=, mtime_ns=, cmd= last)
])

STACKS_SCHEMA = _schema("stacks", [
    ("kind", pa.string()),                                  # stack | sample | error
    ("stack_id", pa.int64()),
    ("frames", pa.list_(pa.string())),                      # stack rows: innermost first, "func (file:line)"
    ("sample_id", pa.int64()),                              # one round of dumps over all processes
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),
    ("pid", pa.int64()), ("tid", pa.int64()),               # tid = OS thread id (else py-spy's thread id)
    ("rank", pa.int32()),
    ("thread_name", pa.string()),
    ("thread_state", pa.string()),                          # idle | active | active+gil
    ("changed", pa.bool_()),                                # stack differs from this thread's previous sample
    ("trigger", pa.string()),                               # periodic | quiet | burst
    ("detail", pa.string()),                                # error rows: py-spy's message
])

GPU_SCHEMA = _schema("gpu", [
    ("wall_ns", pa.int64()), ("t_ns", pa.int64()),
    ("kind", pa.string()),                                  # device | process | xid
    ("gpu", pa.int32()), ("uuid", pa.string()), ("bus_id", pa.string()),
    ("pid", pa.int64()), ("rank", pa.int32()),              # process rows
    ("util_gpu", pa.int32()), ("util_mem", pa.int32()),     # percent
    ("mem_used", pa.int64()), ("mem_total", pa.int64()),    # bytes (process rows: that process's memory)
    ("power_mw", pa.int64()), ("sm_clock_mhz", pa.int32()), ("temperature_c", pa.int32()),
    ("pcie_tx_kbps", pa.int64()), ("pcie_rx_kbps", pa.int64()),
    ("nvlink_tx_kib", pa.int64()), ("nvlink_rx_kib", pa.int64()),  # cumulative counters, where available
    ("ecc_uncorrected", pa.int64()), ("ecc_corrected", pa.int64()),  # volatile counts
    ("xid", pa.int64()),                                    # xid rows
    ("detail", pa.string()),
])

SCHEMAS = {"proc": PROC_SCHEMA, "stacks": STACKS_SCHEMA, "gpu": GPU_SCHEMA}


class ArrowStreamLog:
    """Append-only Arrow IPC stream: rows buffered in memory, one record batch per :meth:`flush`.

    The file (with its schema) exists from construction on; every flush ends with an OS-level flush, so what was
    flushed survives the writer's death. Past ``max_pending`` rows a flush happens at once (bounded memory).
    """

    def __init__(self, path: Path, schema: pa.Schema, *, max_pending: int = 20000) -> None:
        self.path, self.schema, self.max_pending = path, schema, max_pending
        self._names = schema.names
        self._pending: dict[str, list[Any]] = {n: [] for n in self._names}
        self._n = 0
        self.rows_written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._writer = ipc.new_stream(self._file, schema)
        self._writer.write_batch(pa.record_batch([pa.array([], f.type) for f in schema], schema=schema))
        self._file.flush()  # the schema is on disk from the start: readers see an empty file, not a broken one

    def add(self, row: dict[str, Any]) -> None:
        for n in self._names:
            self._pending[n].append(row.get(n))
        self._n += 1
        if self._n >= self.max_pending:
            self.flush()

    def flush(self) -> None:
        if not self._n or self._writer is None:
            return
        batch = pa.record_batch([pa.array(self._pending[n], f.type) for n, f in zip(self._names, self.schema)],
                                schema=self.schema)
        self._pending = {n: [] for n in self._names}
        self.rows_written += self._n
        self._n = 0
        self._writer.write_batch(batch)
        self._file.flush()

    def close(self) -> None:
        if self._writer is None:
            return
        try:
            self.flush()
            self._writer.close()
        finally:
            self._writer = None
            self._file.close()
