"""Device check for issue #3 (CUDA graphs, NCCL): run on a machine with 1+ NVIDIA GPUs, from the repo root.

    python bench/device_check_graphs.py            # ~30-60 s; exit 0 when every check passes

What it does: starts a small NCCL job with ranktrace injected exactly as ``trace run`` injects it (tracer/rank/_inject
first on PYTHONPATH, RANKTRACE_DIR set), then reads the rings and prints what was recorded, plus PASS/FAIL checks.
World size 2 on two GPUs; with one GPU, world size 1 (NCCL refuses two ranks on one device). Each rank:
  1. all_reduce x3 (warm-up on a side stream, as CUDA-graph capture of NCCL requires),
  2. captures one all_reduce in ``torch.cuda.graph`` (graph 1) and replays it 5 times,
  3. captures one all_reduce through ``CUDAGraph.capture_begin/capture_end`` directly (graph 2), replays it twice,
  4. async all_reduce + ``Work.wait``, ``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``,
  5. a functional-collective all_reduce (issued in C++: ranktrace must report it as an untraced_ops gap),
  6. one more all_reduce and destroy_process_group.
Checks: captured ops carry capturing=true + graph_id and no seq; seq of real all_reduces is 1..N with no hole
(captures do not advance it); replays count 1..5 / 1..2 per graph; capture enter/exit pairs in the meta region; the
wait is a child of its op; the funcol gap is reported; the job's own exit status is 0. Only needs torch (CUDA
build) and numpy; not pyarrow/click.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60),
                            device_id=torch.device("cuda", rank))
    x = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(x)                      # seq 1-3
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        dist.all_reduce(x)                          # captured into graph 1: no seq
    for _ in range(5):
        g1.replay()                                 # replay seq 1-5 of graph 1
    torch.cuda.synchronize()
    g2 = torch.cuda.CUDAGraph()
    s2 = torch.cuda.Stream()
    with torch.cuda.stream(s2):
        g2.capture_begin()
        dist.all_reduce(x)                          # captured into graph 2
        g2.capture_end()
    torch.cuda.current_stream().wait_stream(s2)
    g2.replay()
    g2.replay()
    work = dist.all_reduce(x, async_op=True)        # seq 4
    work.wait()
    torch.cuda.synchronize()
    torch.cuda.current_stream().synchronize()
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()
    import torch.distributed._functional_collectives as funcol
    y = funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))  # C++-issued: a gap
    dist.all_reduce(y)                              # seq 5: the gap is reported before it
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


def _worker_entry(rank: int, world: int) -> None:
    worker(rank, world)


def run_job(trace_dir: Path, world: int) -> int:
    host = trace_dir / "host"
    (host / "rings").mkdir(parents=True)
    env = dict(os.environ)
    env["RANKTRACE_DIR"] = str(host)
    env["RANKTRACE_RING_SLOTS"] = "4096"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tracer" / "rank" / "_inject"), str(REPO)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["MASTER_PORT"] = str(s.getsockname()[1])
    code = ("import sys, torch.multiprocessing as mp; sys.path.insert(0, %r); import device_check_graphs as d; "
            "mp.spawn(d._worker_entry, args=(%d,), nprocs=%d)" % (str(Path(__file__).resolve().parent), world, world))
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=150).returncode


def read_rings(trace_dir: Path) -> dict[int, dict]:
    sys.path.insert(0, str(REPO))
    from ranktrace.tracer.formats import ringformat as rf
    from ranktrace.tracer.formats.ringreader import read_ring

    out: dict[int, dict] = {}
    for ring in sorted((trace_dir / "host" / "rings").glob("*.ring")):
        rc = read_ring(str(ring))
        ident = {}
        for m in rc.meta:
            if m.get("type") == "identity" and m.get("rank") is not None:
                ident = m
        rank = ident.get("rank")
        if rank is None:
            continue
        s = rc.strings
        ops = []
        for r in rc.slots:
            ops.append({
                "kind": rf.KINDS[r["kind"]], "category": rf.CATEGORIES[r["category"]], "name": s.get(int(r["name"])),
                "group": s.get(int(r["group"])), "seq": None if r["seq"] == rf.NONE_I64 else int(r["seq"]),
                "backend_seq": None if r["backend_seq"] == rf.NONE_I64 else int(r["backend_seq"]),
                "capturing": bool(r["flags"] & rf.FLAG_CAPTURING),
                "graph_id": None if r["graph_id"] == rf.NONE_I32 else int(r["graph_id"]),
                "span": int(r["span_id"]), "parent": int(r["parent_span_id"]),
            })
        events = [m for m in rc.meta if m.get("type") == "event"]
        notes = [m for m in rc.meta if m.get("type") in ("note", "hooks", "hook_problem")]
        out[rank] = {"ops": ops, "events": events, "notes": notes}
    return out


def check(rings: dict[int, dict], world: int) -> list[tuple[str, bool, str]]:
    results: list[tuple[str, bool, str]] = []

    def add(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, bool(ok), detail))

    add("every rank wrote a ring", sorted(rings) == list(range(world)), f"ranks {sorted(rings)}")
    for rank, r in sorted(rings.items()):
        enters = [o for o in r["ops"] if o["kind"] == "enter"]
        ar = [o for o in enters if o["name"] == "all_reduce"]
        captured = [o for o in ar if o["capturing"]]
        real = [o for o in ar if not o["capturing"]]
        add(f"rank {rank}: 2 captured all_reduces with graph ids 1, 2 and no seq",
            [(o["graph_id"], o["seq"]) for o in captured] == [(1, None), (2, None)],
            str([(o["graph_id"], o["seq"]) for o in captured]))
        add(f"rank {rank}: real all_reduces seq 1..5 (captures do not advance seq)",
            [o["seq"] for o in real] == [1, 2, 3, 4, 5], str([o["seq"] for o in real]))
        replays = [(o["graph_id"], o["seq"]) for o in enters if o["name"] == "replay"]
        add(f"rank {rank}: replays counted per graph", replays == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5),
                                                                  (2, 1), (2, 2)], str(replays))
        caps = [(e["kind"], e.get("graph_id")) for e in r["events"] if e.get("name") == "cuda_graph_capture"]
        add(f"rank {rank}: capture enter/exit pairs in the meta region",
            caps == [("enter", 1), ("exit", 1), ("enter", 2), ("exit", 2)], str(caps))
        waits = [o for o in enters if o["name"] == "wait"]
        async_span = next((o["span"] for o in real if o["seq"] == 4), None)
        add(f"rank {rank}: Work.wait is a child of its async all_reduce",
            any(w["parent"] == async_span for w in waits), f"waits {[(w['parent'], w['seq']) for w in waits]}")
        syncs = sorted({o["name"] for o in enters if o["category"] == "sync"})
        add(f"rank {rank}: host syncs recorded", {"cuda_synchronize", "stream_synchronize", "event_synchronize"}
            <= set(syncs), str(syncs))
        gaps = [e for e in r["events"] if e.get("name") == "untraced_ops"] + \
               [o for o in r["ops"] if o["name"] == "untraced_ops"]
        add(f"rank {rank}: the functional collective shows up as an untraced_ops gap", len(gaps) >= 1,
            "; ".join(str(g.get("detail") or g) for g in gaps))
        captured_exits = [o for o in r["ops"] if o["capturing"] and o["kind"] == "exit"]
        add(f"rank {rank}: no backend_seq read inside a capture",
            all(o["backend_seq"] is None for o in captured_exits), "")
    return results


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    world = 2 if torch.cuda.device_count() >= 2 else 1
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ranktrace-devcheck-") as tmp:
        trace_dir = Path(tmp)
        code = run_job(trace_dir, world)
        rings = read_rings(trace_dir)
        print(f"job exit status {code}, world {world}, {time.monotonic() - t0:.1f} s")
        for rank, r in sorted(rings.items()):
            print(f"--- rank {rank}")
            for e in r["events"]:
                print("  meta ", json.dumps({k: e.get(k) for k in ("kind", "name", "category", "graph_id", "span_id",
                                                                   "detail", "error") if e.get(k) is not None}))
            for o in r["ops"]:
                if o["kind"] in ("enter", "mark"):
                    print("  op   ", json.dumps(o))
            for n in r["notes"]:
                print("  note ", json.dumps(n)[:300])
        results = check(rings, world)
        results.insert(0, ("job exit status 0", code == 0, str(code)))
    print("--- checks")
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail and not ok else ""))
    failed = sum(1 for _n, ok, _d in results if not ok)
    print(f"{len(results) - failed}/{len(results)} checks passed in {time.monotonic() - t0:.1f} s")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
