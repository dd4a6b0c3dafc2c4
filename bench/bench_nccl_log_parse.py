"""Benchmark the NCCL debug-log reader: parse throughput in MB/s against plain line iteration, and peak memory.

Why: a hung job's NCCL_DEBUG=INFO,SUBSYS=INIT,COLL logs reach gigabytes; `analyzers.readers.nccl_log` must stream them
(bounded memory) at >= 100 MB/s. Absolute MB/s depends on the machine and its load, so the script also measures a
baseline in the same run (``for line in f: pass`` over the same file) and prints the ratio, and it prints CPU-time
MB/s next to wall-clock MB/s (on a shared machine the wall clock also counts other processes).

The generated log imitates a torchrun job of ``--ranks`` processes on one node sharing stdout (``[rankN]:``
prefixes), NCCL 2.21-style: a version line, Init START / COMPLETE, ring and transport lines per rank, then
iterations of AllReduce / AllGather / ReduceScatter / Broadcast and Send/Recv pairs with increasing hex
opCounts, TUNING lines from comm rank 0, and some program output (loss lines) in between.

Peak memory is measured in a fresh process (peak RSS, ``VmHWM``, after one read minus after the imports), so earlier
runs do not hide it. ``--sparse-gb N`` adds the big-file case: an N GB file that is mostly a sparse hole
(NUL bytes to a reader; this one drops them and seeks over holes) with one generated 8 MB block of log per GB, to
show that memory stays bounded however big the file (the output holds only the blocks' rows).

Usage: ``python bench/bench_nccl_log_parse.py [--size-mb 200] [--ranks 8] [--repeat 3] [--keep DIR] [--sparse-gb 10]``
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ranktrace.analyzers.readers import nccl_log  # noqa: E402

__all__ = ["generate", "make_sparse", "peak_memory", "main"]

_OPS = (("AllReduce", 7, 0.55), ("AllGather", 9, 0.2), ("ReduceScatter", 9, 0.15), ("Broadcast", 7, 0.1))


def generate(path: Path, size_mb: float, ranks: int, seed: int = 1) -> int:
    """Write a realistic NCCL INFO log of about ``size_mb`` MB to ``path``; returns the number of COLL lines."""
    rnd = random.Random(seed)
    host = "gpu-node-017"
    pids = [41230 + r for r in range(ranks)]
    comms = [f"0x{0x55d5f5a00000 + r * 0x1a2b30:x}" for r in range(ranks)]
    streams = [f"0x{0x55d5f7000000 + r * 0x11110:x}" for r in range(ranks)]
    comm_id = "0x7f3a9c21e04b5d18"
    target = int(size_mb * 1_000_000)
    out: list[str] = []
    written = 0
    n_coll = 0

    def pre(r: int, tid: int | None = None) -> str:
        return f"[rank{r}]:{host}:{pids[r]}:{tid or pids[r]} [{r}] NCCL INFO "

    for r in range(ranks):
        out.append(f"[rank{r}]:{host}:{pids[r]}:{pids[r]} [{r}] NCCL INFO Bootstrap : Using eth0:10.0.0.17<0>\n")
        out.append(pre(r) + "NCCL version 2.21.5+cuda12.4\n")
        out.append(pre(r, pids[r] + 11) + f"ncclCommInitRank comm {comms[r]} rank {r} nranks {ranks} cudaDev {r} "
                   f"nvmlDev {r} busId {0x18000 + r * 0x1000:x} commId {comm_id} - Init START\n")
    for r in range(ranks):
        for ch in range(4):
            nxt = (r + 1) % ranks
            out.append(pre(r, pids[r] + 23) + f"Channel {ch:02d}/0 : {r}[{r}] -> {nxt}[{nxt}] via P2P/IPC/read\n")
        out.append(pre(r, pids[r] + 11) + f"ncclCommInitRank comm {comms[r]} rank {r} nranks {ranks} cudaDev {r} "
                   f"nvmlDev {r} busId {0x18000 + r * 0x1000:x} commId {comm_id} - Init COMPLETE\n")
    text = "".join(out)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        written += len(text)
        opcount = 0
        step = 0
        while written < target:
            out = []
            for _ in range(50):
                op, dt, _w = rnd.choices(_OPS, weights=[w for *_, w in _OPS])[0]
                count = rnd.choice((1, 1024, 262144, 4194304, 16777216))
                for r in range(ranks):
                    out.append(pre(r) + f"{op}: opCount {opcount:x} sendbuff 0x7f{rnd.getrandbits(36):09x} "
                               f"recvbuff 0x7f{rnd.getrandbits(36):09x} count {count} datatype {dt} op 0 root 0 "
                               f"comm {comms[r]} [nranks={ranks}] stream {streams[r]}\n")
                    n_coll += 1
                out.append(pre(0) + f"{op}: {count * 4} Bytes -> Algo RING proto SIMPLE channel{{Lo..Hi}}={{0..3}}\n")
                opcount += 1
                if rnd.random() < 0.1:  # pipeline-style p2p pair
                    for r in range(ranks):
                        peer = (r + 1) % ranks if r % 2 == 0 else (r - 1) % ranks
                        kind = "Send" if r % 2 == 0 else "Recv"
                        out.append(pre(r) + f"{kind}: opCount {opcount:x} sendbuff 0x7f{rnd.getrandbits(36):09x} "
                                   f"recvbuff (nil) count 4096 datatype 9 op 0 root {peer} comm {comms[r]} "
                                   f"[nranks={ranks}] stream {streams[r]}\n")
                        n_coll += 1
                    opcount += 1
            step += 1
            out.append(f"[rank0]:step {step} loss {rnd.random() * 3:.4f} lr 3.0e-4 tokens/s {rnd.randint(9000, 12000)}\n")
            chunk = "".join(out)
            f.write(chunk)
            written += len(chunk)
    return n_coll


def make_sparse(path: Path, size_gb: float, ranks: int = 8, block_mb: float = 8.0) -> int:
    """A ``size_gb`` GB file that is a sparse hole except for one generated log block at the start of each GB.

    Returns the number of COLL lines in it. Only the blocks take disk space; the holes read back as NUL bytes.
    """
    block_path = path.with_suffix(".block")
    n_block = generate(block_path, block_mb, ranks)
    block = block_path.read_bytes()
    block_path.unlink()
    size = int(size_gb * 1e9)
    step = 1_000_000_000
    n = 0
    with open(path, "wb") as f:
        f.truncate(size)
        for off in range(0, size - len(block), step):
            f.seek(off)
            f.write(block)
            n += n_block
    return n


_PEAK = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from ranktrace.analyzers.readers import nccl_log


def hwm():  # peak RSS of this process image (VmHWM: unlike ru_maxrss, not inherited from the forking parent)
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


base = hwm()
t0, c0 = time.perf_counter(), time.process_time()
r = nccl_log.read({path!r})
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps(dict(base_mb=base, peak_mb=hwm(), wall=wall, cpu=cpu, rows=r.events.num_rows,
                      events_mb=r.events.get_total_buffer_size() / 2**20,
                      skipped=[s.reason for s in r.skipped][:3])))
"""


def peak_memory(path: Path) -> dict[str, object]:
    """Read ``path`` once in a fresh interpreter; its ru_maxrss before and after, time, rows (see ``_PEAK``)."""
    code = _PEAK.format(root=str(Path(__file__).resolve().parents[1]), path=str(path))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _time(fn, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeat`` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=200.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    ap.add_argument("--sparse-gb", type=float, default=0.0, help="also read a sparse file of this many GB")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / "nccl_bench.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        n_coll = generate(path, args.size_mb, args.ranks)
        size = path.stat().st_size
        mb = size / 1e6
        print(f"generated {mb:.1f} MB, {n_coll} COLL lines, {args.ranks} ranks in {time.perf_counter() - t0:.1f}s")

        def iterate() -> None:
            with open(path, "rb") as f:
                for _line in f:
                    pass

        result: dict[str, object] = {}

        def parse() -> None:
            result.clear()  # the previous result is freed before the next read
            result["r"] = nccl_log.read(path)

        iterate()  # warm the page cache
        base, _ = _time(iterate, args.repeat)
        t_parse, c_parse = _time(parse, args.repeat)
        r = result["r"]
        assert hasattr(r, "events")
        print(f"baseline `for line in f: pass`: {mb / base:8.1f} MB/s  (median of {args.repeat}: {base:.3f}s)")
        print(f"nccl_log.read:                  {mb / t_parse:8.1f} MB/s  (median of {args.repeat}: {t_parse:.3f}s "
              f"wall; {mb / c_parse:.1f} MB/s on CPU time)")
        print(f"ratio parse/baseline speed:     {base / t_parse:8.3f}  ({t_parse / base:.1f}x slower than iterating)")
        print(f"events: {r.events.num_rows}  observations: {r.observations.num_rows}  skipped: {len(r.skipped)}")
        result.clear()
        pm = peak_memory(path)
        print(f"peak memory (fresh process):    {pm['peak_mb'] - pm['base_mb']:8.1f} MB over {pm['base_mb']:.0f} MB "
              f"after imports; EVENTS table {pm['events_mb']:.0f} MB ({pm['rows']} rows)")
        if args.sparse_gb:
            sparse = Path(tmp) / "nccl_sparse.log"
            t0 = time.perf_counter()
            n_sparse = make_sparse(sparse, args.sparse_gb, args.ranks)
            gb = sparse.stat().st_size / 1e9
            print(f"sparse file: {gb:.1f} GB apparent, {n_sparse} COLL lines, made in {time.perf_counter() - t0:.1f}s")
            pm = peak_memory(sparse)
            print(f"sparse read: {gb * 1000 / pm['wall']:8.1f} MB/s ({pm['wall']:.1f}s wall, {pm['cpu']:.1f}s CPU); "
                  f"peak memory {pm['peak_mb'] - pm['base_mb']:.1f} MB over {pm['base_mb']:.0f} MB; rows {pm['rows']}; "
                  f"notes: {pm['skipped']}")
            sparse.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
