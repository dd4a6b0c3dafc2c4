"""Many small ranks on one host, for measuring the watchdog's cost per rank (issue #19: "a host with 64 small ranks,
CPU inference or tests"): run under ``trace run``, each rank is a Python process without torch that writes its
ring the way a rank's recorder does (tracer/rank/recorder.py: identity, a group, a few collectives), starts
``--threads`` idle threads (a torch rank has its gloo/OMP threads), then waits for work that never comes.

Usage: ``trace run -- python bench/light_ranks.py --ranks 64 --threads 8 --seconds 60`` (bench/bench_monitor.py
--light runs it).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rank_main(rank: int, world: int, threads: int, seconds: float) -> None:
    from ranktrace.tracer.rank.recorder import Recorder

    rings = Path(os.environ["RANKTRACE_DIR"]) / "rings"
    rec = Recorder(str(rings / f"{os.getpid()}.ring"), slots=1024, proctitle=f"light rank {rank}")
    rec.meta({"type": "identity", "rank": rank, "world": world, "source": "light_ranks", "pid": os.getpid()})
    rec.meta({"type": "group", "name": "0", "desc": "default_pg", "backend": "gloo", "ranks": list(range(world))})
    tid = threading.get_native_id()
    gid, nid = rec.intern("0"), rec.intern("all_reduce")
    for seq in range(1, 4):
        span = rec.new_span()
        rec.op("enter", "collective", nid, tid=tid, group_id=gid, seq=seq, span_id=span)
        rec.op("exit", "collective", nid, tid=tid, group_id=gid, seq=seq, span_id=span)
    stop = threading.Event()
    for _ in range(threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    time.sleep(seconds)  # waiting for work that never comes
    rec.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=rank_main, args=(r, a.ranks, a.threads, a.seconds)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
