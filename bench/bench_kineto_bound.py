"""Cost of reading a Kineto trace of many collectives, against the unavoidable part: decoding its JSON.

#31: a trace of 2M collectives took 141 s and 6 GB, one kept row (and one Python object per comm event) per
collective. The reader now keeps a bounded number of ops per group; this bench says what that costs, and how it scales.

For each size it writes a synthetic trace in the real Kineto layout the reader parses (``distributedInfo`` with
``pg_config``, per collective a ``record_param_comms`` cpu_op with a nested ``nccl:all_reduce`` annotation, the
``cudaLaunchKernel`` inside it and the NCCL kernel with the same ``correlation``; every 10th collective a broadcast
on a second group; the last all_reduce has no kernel: it never completed) into /tmp, then, each in a fresh process
(cold: nothing imported or cached from the other run):

* baseline: one pass of the reader's own JSON stream over the file, decoding every event and keeping none;
* reader: ``kineto.read`` of the file.

It prints seconds, peak RSS and kept rows of each, and the ratio reader / baseline (1.0: reading costs no more than
decoding). Usage: ``python bench/bench_kineto_bound.py [N ...]`` (default 200000 2000000). Files are removed after.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_BASE = r'''
import resource, sys, time
from ranktrace.analyzers.readers.kineto.stream import JsonStream
t = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as f:
    for _item in JsonStream(f).items():
        n += 1
print(n, 0, round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
'''

_READ = r'''
import resource, sys, time
from pathlib import Path
from ranktrace.analyzers.readers import kineto
t = time.perf_counter()
r = kineto.read(Path(sys.argv[1]))
bound = [s.reason for s in r.skipped if "bound" in s.reason]
print(r.events.num_rows, len(bound), round(time.perf_counter() - t, 2),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
'''


def write_trace(path: Path, n: int) -> None:
    """`n` collectives on rank 0 of 2 (see the module docstring), written as a stream: never held whole."""
    head = {"schemaVersion": 1, "baseTimeNanoseconds": 1711964646000000000,
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2, "pg_count": 2, "nccl_version": "2.21.5",
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                               "pg_size": 2, "ranks": [0, 1]},
                                              {"pg_name": "1", "pg_desc": "tp_group", "backend_config": "cuda:nccl",
                                               "pg_size": 2, "ranks": [0, 1]}]}}
    cpu = ('{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": 7, "ts": {ts:.3f}, '
           '"dur": 40.0, "args": {{"Process Group Name": "{g}", "Process Group Description": "{d}", '
           '"Process Group Ranks": "[0, 1]", "Group size": 2, "In msg nelems": 1024, "Out msg nelems": 1024, '
           '"dtype": "Float", "Collective name": "{c}", "Seq": {seq}}}}},\n'
           '{{"ph": "X", "cat": "user_annotation", "name": "nccl:{o}", "pid": 7, "tid": 7, "ts": {ts5:.3f}, '
           '"dur": 30.0, "args": {{}}}},\n'
           '{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": {ts10:.3f}, '
           '"dur": 5.0, "args": {{"correlation": {corr}}}}},\n')
    gpu = ('{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_{k}_RING_LL(ncclDevKernelArgsStorage<4096ul>)", '
           '"pid": 0, "tid": 40, "ts": {ts:.3f}, "dur": 100.0, "args": {{"correlation": {corr}, "stream": 40}}}},\n')
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        kernels = []
        seqs = {"0": 0, "1": 0}
        for i in range(n):
            g = "1" if i % 10 == 9 else "0"
            seqs[g] += 1
            op, coll, k = ("broadcast", "broadcast", "Broadcast") if g == "1" else ("all_reduce", "allreduce",
                                                                                 "AllReduce_Sum_f32")
            ts = 1000.0 + i * 100.0
            f.write(cpu.format(ts=ts, ts5=ts + 5, ts10=ts + 10, g=g, d="tp_group" if g == "1" else "default_pg",
                               c=coll, o=op, seq=seqs[g], corr=i + 1))
            if i != n - 1:  # the last collective (an all_reduce) never completed
                kernels.append(gpu.format(k=k, ts=ts + 20, corr=i + 1))
            if len(kernels) >= 10000:
                f.writelines(kernels)
                kernels.clear()
        f.writelines(kernels)
        f.write('{"ph": "i", "cat": "instant", "name": "end", "pid": 7, "tid": 7, "ts": 0, "s": "t"}\n]}\n')


def _run(code: str, path: Path) -> tuple[int, int, float, int]:
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    rows, bound, seconds, peak = out.stdout.split()
    return int(rows), int(bound), float(seconds), int(peak)


def main(sizes: list[int]) -> None:
    print(f"{'collectives':>12} {'file MiB':>9} {'decode s':>9} {'decode MB':>10} {'read s':>8} {'read MB':>8} "
          f"{'rows':>8} {'bound':>6} {'ratio':>6}")
    for n in sizes:
        fd, name = tempfile.mkstemp(prefix="ranktrace-bench-kineto-", suffix=".pt.trace.json", dir="/tmp")
        os.close(fd)
        path = Path(name)
        try:
            write_trace(path, n)
            _, _, base_s, base_mb = _run(_BASE, path)
            rows, bound, read_s, read_mb = _run(_READ, path)
            print(f"{n:>12,} {path.stat().st_size >> 20:>9} {base_s:>9.2f} {base_mb:>10} {read_s:>8.2f} {read_mb:>8} "
                  f"{rows:>8} {'yes' if bound else 'no':>6} {read_s / max(base_s, 0.01):>6.2f}", flush=True)
        finally:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [200_000, 2_000_000])
