"""Cost of reading a Flight Recorder pickle of many entries, against the unavoidable part: unpickling it.

#31: a 4 MB FR pickle of 2M references to one entry (pickle's memo stores a shared object once, 2 bytes a reference)
took 100 s and 7.3 GB: every reference was parsed and made rows. The reader now keeps, per process group, its first
500 and last 5,000 entries (chosen by identity, before any parsing) and cuts an entry's frames to 256 before any
per-frame work. This bench says what that costs.

Dumps, in torch's pickle layout (``version``, ``pg_config``, ``pg_status``, ``entries`` with tuples for
``process_group``, None for unknown times, ``frames``), written into /tmp:

* ``shared N``: one entry dict referenced N times, its frames one list of 300,000 frames (a few MB for any N);
* ``many N``: N distinct entries in one group, all sharing one 3-frame list (~130 bytes an entry).

Each in a fresh process (cold: nothing imported or cached from another run):

* baseline: unpickling the file with the reader's own no-globals unpickler, keeping nothing;
* reader: ``flight_recorder.read`` of the file;
* before (with ``--before DIR``): the same read with DIR first on PYTHONPATH, DIR holding a ``ranktrace`` tree of
  the code to compare with (e.g. ``git archive`` of the commit before the bound).

It prints seconds, peak RSS and rows of each, and the ratios reader / baseline and before / reader. Usage:
``python bench/bench_fr_bound.py [--before DIR] [shared:N | many:N ...]`` (default shared:200000 shared:2000000
many:200000 many:1000000). Files are removed after.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_BASE = r'''
import io, resource, sys, time
from ranktrace.analyzers.readers.flight_recorder.load import _NoGlobals
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    obj = _NoGlobals(io.BytesIO(f.read())).load()
print(len(obj["entries"]), round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
'''

_READ = r'''
import resource, sys, time
from pathlib import Path
from ranktrace.analyzers.readers import flight_recorder
t = time.perf_counter()
r = flight_recorder.read(Path(sys.argv[1]))
print(r.events.num_rows, round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
'''

TORCH = [{"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 3245},
         {"name": "wrapper", "filename": "/x/torch/distributed/c10d_logger.py", "line": 81}]
USER = {"name": "step", "filename": "train.py", "line": 61}


def _entry(i: int, frames: list[Any]) -> dict[str, Any]:
    return {"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce",
            "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1, "state": "completed", "is_p2p": False,
            "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
            "time_created_ns": 1795937452000000000 + i * 1000, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": 1795937452000000500 + i * 1000, "timeout_ms": 600000, "retired": True,
            "duration_ms": 0.5, "thread_name": "pt_main_thread", "frames": frames}


def write_dump(path: Path, kind: str, n: int) -> None:
    if kind == "shared":
        entries = [_entry(0, [*TORCH, *([TORCH[0]] * 300_000), USER])] * n
    else:
        frames = [*TORCH, USER]
        entries = [_entry(i, frames) for i in range(n)]
    doc = {"version": "2.10", "comm_lib_version": "2.21.5",
           "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
           "pg_status": {"0": {"last_enqueued_collective": n, "last_started_collective": n,
                               "last_completed_collective": n}},
           "entries": entries}
    path.write_bytes(pickle.dumps(doc, protocol=4))


def _run(code: str, path: Path, pythonpath: str | None = None) -> tuple[int, float, int]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir(), env=env, timeout=3600).stdout.split()
    return int(out[0]), float(out[1]), int(out[2])


def main(argv: list[str]) -> None:
    before = None
    if argv[:1] == ["--before"]:
        before, argv = argv[1], argv[2:]
    cases = [(a.split(":")[0], int(a.split(":")[1])) for a in argv] or [
        ("shared", 200_000), ("shared", 2_000_000), ("many", 200_000), ("many", 1_000_000)]
    print(f"{'dump':>16} {'MB':>6} | {'unpickle s':>10} {'MB':>6} | {'read s':>7} {'MB':>6} {'rows':>8} | "
          f"{'ratio':>5}" + (f" | {'before s':>8} {'MB':>6} {'rows':>8} {'x':>5}" if before else ""))
    for kind, n in cases:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "nccl_trace_rank_0"
            write_dump(path, kind, n)
            size = path.stat().st_size / 1e6
            _, bs, bm = _run(_BASE, path)
            rows, rs, rm = _run(_READ, path)
            line = (f"{kind + ' ' + format(n, ','):>16} {size:6.1f} | {bs:10.2f} {bm:6d} | {rs:7.2f} {rm:6d} "
                    f"{rows:8d} | {rs / max(bs, 0.01):5.1f}")
            if before:
                brows, bt, bmem = _run(_READ, path, before)
                line += f" | {bt:8.2f} {bmem:6d} {brows:8d} {bt / max(rs, 0.01):5.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
