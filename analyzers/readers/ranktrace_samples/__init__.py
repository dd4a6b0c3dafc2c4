"""ranktrace_samples: the monitor's periodic samples (``<run>/<host>/samples/{stacks,proc,gpu}.arrow``) and the RAS
answers its bursts saved, read into the common tables: what a burst cannot say (whether a stack kept changing before
the hang, a GPU's memory moving). Stages: :func:`read_table` (one Arrow file) -> :mod:`.stacks` / :mod:`.system` /
:mod:`.ras` (one kind of sample each)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult, Skipped
from ranktrace.analyzers.readers.ranktrace_samples.ras import ras_progress, ras_summary
from ranktrace.analyzers.readers.ranktrace_samples.stacks import MAX_SNAPSHOTS, read_stacks
from ranktrace.analyzers.readers.ranktrace_samples.system import read_gpu, read_proc

__all__ = ["FORMAT", "FIELD_MAP", "MAX_SNAPSHOTS", "sniff", "read", "read_table", "read_host", "ras_summary",
           "ras_progress"]

FORMAT = "ranktrace_samples"
_PREFIX = b"ranktrace.samples."

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("stacks.arrow sample rows (last MAX_SNAPSHOTS per pid) + their stack rows' frames",
              "frames, pid, tid, rank, wall_ns, t_ns, thread_name, thread_state", "STACKS, source pyspy", "-", "1"),
    ColumnMap("stacks.arrow sample_id, pid", "snapshot", "stacks.arrow[sample N pid P]", "-", "1"),
    ColumnMap("stacks.arrow changed per (pid, tid)", "OBSERVATIONS.kind=stack_change value detail",
              "s unchanged; samples, changes", "-", "1"),
    ColumnMap("proc.arrow thread rows (last 2 min): state, utime+stime, comm, wchan",
              "OBSERVATIONS.kind=thread_state name value detail", "letter, cpu ns", "-", "1"),
    ColumnMap("proc.arrow process rows: rss_bytes, vms, majflt, read/write_bytes, threads",
              "OBSERVATIONS.kind=proc_memory value detail", "bytes", "-", "1"),
    ColumnMap("gpu.arrow device rows: util_gpu, mem_used/total, power, clocks, ECC",
              "OBSERVATIONS.kind=gpu_util|gpu_memory|gpu_ecc value detail", "%, bytes", "-", "1"),
    ColumnMap("gpu.arrow process rows (last sample)", "OBSERVATIONS.kind=gpu_memory pid value", "bytes", "-", "1"),
    ColumnMap("gpu.arrow xid rows", "OBSERVATIONS.kind=gpu_xid value detail", "Xid number", "-", "1"),
    ColumnMap("dumps/<t>/ras.json|txt: two RAS answers", "OBSERVATIONS.kind=ras_progress group value detail",
              "1 moved, 0 stood still", "-", "NCCL 2.24"),
)


def sniff(path: Path, head: bytes) -> bool:
    return (head.startswith(b"\xff\xff\xff\xff") or head.startswith(b"ARROW1")) and _PREFIX in head


def read_table(path: Path) -> tuple[pa.Table, str, list[Skipped]]:
    """All complete batches of a samples file, its kind (stacks|proc|gpu) and what was cut."""
    skipped: list[Skipped] = []
    try:
        data = pa.memory_map(str(path))
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    with data:
        try:
            if data.read(6) == b"ARROW1":
                data.seek(0)
                reader: Any = ipc.open_file(data)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                sch = reader.schema
            else:
                data.seek(0)
                reader = ipc.open_stream(data)
                sch = reader.schema
                batches = []
                while True:
                    try:
                        batches.append(reader.read_next_batch())
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowInvalid) as e:
                        skipped.append(Skipped(str(path), len(batches),
                                               f"samples cut after {len(batches)} batch(es) (writer killed?): {e}"))
                        break
        except (OSError, pa.ArrowInvalid) as e:
            raise ReaderError(path, f"not an Arrow stream or file ({e})") from e
    name = (sch.metadata or {}).get(b"schema", b"").decode()
    if not name.startswith("ranktrace.samples."):
        raise ReaderError(path, "Arrow data without a ranktrace.samples schema")
    kind = name[len("ranktrace.samples."):].split("/")[0]
    return pa.Table.from_batches(batches, schema=sch), kind, skipped


def read(path: Path, host: str | None = None, with_stacks: bool = True) -> ReadResult:
    """Read one samples file (stacks, proc or gpu).

    * stacks: STACKS of the last ``MAX_SNAPSHOTS`` samples per process, one row per thread, ``wall_ns`` = when
      it was read, ``snapshot`` = ``stacks.arrow[sample N pid P]``, ``source`` = ``pyspy``, ``line`` = the row in
      the file; left out (``with_stacks=False``) for a job that completed cleanly (samples are older than the end,
      and stale stacks of a finished job would read as a rank still waiting). Plus ``stack_change`` per thread.
    * proc: ``thread_state`` per thread alive in the last two minutes of samples (``name`` = /proc state letter,
      ``value`` = CPU ns so far, ``detail`` comm, wchan, CPU ms in the last 10 s), ``proc_memory`` per process.
    * gpu: ``gpu_util`` per GPU (%), ``gpu_memory`` per GPU and per process on it (bytes), ``gpu_xid`` per Xid
      event, ``gpu_ecc`` when volatile uncorrected ECC errors are non-zero.

    Files are Arrow IPC streams; a batch cut by a killed writer ends the read (earlier batches kept, one Skipped).
    """
    path = Path(path)
    table, kind, skipped = read_table(path)
    host = host if host is not None else (path.parent.parent.name if path.parent.name == "samples" else None)
    file = str(path)
    if kind == "stacks":
        stacks, obs = read_stacks(table, host, file, with_stacks)
        return ReadResult(file, FORMAT, "1", stacks=stacks, observations=obs, skipped=tuple(skipped))
    if kind == "proc":
        return ReadResult(file, FORMAT, "1", observations=read_proc(table, host, file), skipped=tuple(skipped))
    if kind == "gpu":
        return ReadResult(file, FORMAT, "1", observations=read_gpu(table, host, file), skipped=tuple(skipped))
    raise ReaderError(path, f"unknown samples kind {kind!r}")


def read_host(host_dir: Path, *, host: str | None = None, with_stacks: bool = True
              ) -> tuple[list[ReadResult], list[Skipped]]:
    """Every samples file of a host dir, plus ``ras_progress`` from the RAS answers its bursts saved."""
    results: list[ReadResult] = []
    skipped: list[Skipped] = []
    host = host or host_dir.name
    files = {p.stem: p for p in sorted((host_dir / "samples").glob("*.arrows"))}
    files.update({p.stem: p for p in sorted((host_dir / "samples").glob("*.arrow"))})  # a sealed file wins
    for f in sorted(files.values()):
        try:
            results.append(read(f, host=host, with_stacks=with_stacks))
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, e.reason))
        except Exception as e:  # a reader bug must not lose the rest of the trace
            skipped.append(Skipped(str(f), None, f"{FORMAT} reader failed: {type(e).__name__}: {e}"))
    for f in sorted((host_dir / "dumps").glob("*/ras.*")):
        try:
            obs = ras_progress(f, host=host)
            if obs.num_rows:
                results.append(ReadResult(str(f), FORMAT, "1", observations=obs))
        except ReaderError as e:
            skipped.append(Skipped(str(f), None, e.reason))
        except Exception as e:
            skipped.append(Skipped(str(f), None, f"RAS progress failed: {type(e).__name__}: {e}"))
    return results, skipped
