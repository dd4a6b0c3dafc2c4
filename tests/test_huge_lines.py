"""A 100 MB single-line file per reader is read in bounded time and memory (issue #16).

A 1 MB line never finished and a 100 KB vLLM log with one base64 line took 65 s. For every text family of the
catalogue and every structured reader, a real sample with one of its own lines stretched to 100 MB (that line's
signature kept in front, base64 after it: the reported shape) goes through the whole analysis (`sources.collect`,
sniffers, readers) in one child process; each file must take under PER_FILE_S, and the child's peak memory stays
under PEAK_MB. The NCCL log's own chunked reader (`nccl_log.read`, which reads big files directly, not through the
shared opener) and each structured reader's `sniff` + `read` are called directly too.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, trace_env

PER_FILE_S = 25.0
PEAK_MB = 3000
HUGE = 100 * 1000 * 1000
D = REPO / "tests" / "data" / "readers"

# family -> a real sample holding its signatures (the first line a signature matches is the one stretched)
TEXT_SAMPLES = {
    "pyspy": D / "pyspy" / "torchrun_prefixed.txt",
    "faulthandler": D / "faulthandler" / "fatal_and_repeat.txt",
    "gdb": D / "gdb" / "two_processes_cuda_gdb.txt",
    "watchdog": D / "watchdog" / "gen3_torch25.log",
    "nccl_log": D / "nccl" / "prefixes.log",
    "server_log": D / "server_log" / "sglang_dp_pp_ep_docker.log",
    "nvidia_smi": D / "nvidia_smi" / "h100_560_with_topo.txt",
    "fr_text": D / "fr_text" / "mismatch_current.txt",
    "nccl_ras": D / "ras" / "monitor.txt",
    "horovod": D / "horovod" / "stalled_ranks_mpirun.txt",
    "nccl_tests": D / "nccl_tests" / "alltoall_summary.txt",
    "ps_top": D / "ps_top" / "ps_aufx_defunct.txt",
    "env_versions": D / "env_versions" / "vllm_pip3_nccl.txt",
    "progress": None,  # synthesized below: a tqdm bar
    "torch_c10d": D / "torch_c10d" / "nccl849_monitored_barrier.txt",
    "torch_elastic": D / "torch_elastic" / "cppo6_root_cause.txt",
    "traceback": D / "traceback" / "pfedsd3_send_gloo.txt",
}
# structured reader -> (sample, the JSON string value to stretch)
JSON_SAMPLES = {
    "flight_recorder": (D / "flight_recorder" / "nccl_trace_rank_2.json", '"profiling_name": "'),
    "kineto": (D / "kineto" / "handmade_p2p_relative_time.json", '"name": "'),
    "nccl_ras": (D / "ras" / "json_2_29.json", '"'),
    "pyspy": (REPO.parent / "shared" / "data" / "local" / "torch-2.13-gloo-hang" / "pyspy_dump_rank0--json.txt",
              '"name": "'),
}

CHILD = r'''
import base64, json, os, resource, sys, time
from pathlib import Path
from ranktrace.analyzers.inputs import collect as sources
from ranktrace.analyzers.readers import catalogue
from ranktrace.analyzers.readers.text import text_of_bytes

work = Path(sys.argv[1]); plan = json.loads(sys.argv[2]); HUGE = int(sys.argv[3])
filler = base64.b64encode(os.urandom(HUGE * 3 // 4 + 3))[:HUGE]
out = {}

def timed(name, fn):
    t = time.perf_counter()
    err = None
    try:
        fn()
    except sources.InputError:
        pass   # nothing usable in the file is an answer too
    except Exception as e:
        err = f"{type(e).__name__}: {e}"[:300]
    out[name] = {"seconds": round(time.perf_counter() - t, 2), "error": err}

fams = {f.name: f for f in catalogue.FAMILIES}
for kind, name, sample, marker in plan:
    path = work / f"{kind}-{name}.txt"
    if kind == "text":
        if sample is None:   # progress: a tqdm bar line
            lines = [b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.0it/s]"]
        else:
            lines = Path(sample).read_bytes().splitlines()
        doc = text_of_bytes(sample or "x", b"\n".join(lines) + b"\n")
        hit = next((ln.no for ln in doc.lines if fams[name].signatures.match(ln.text)), 1)
        lines[hit - 1] = lines[hit - 1] + b" " + filler
        path.write_bytes(b"\n".join(lines) + b"\n")
    else:
        data = Path(sample).read_bytes()
        i = data.index(marker.encode()) + len(marker)
        path.write_bytes(data[:i] + filler + data[i:])
    timed(f"{kind}:{name}:collect", lambda: sources.collect([path]))
    if kind == "text" and name == "nccl_log":
        from ranktrace.analyzers.readers import nccl_log
        timed("nccl_log.read", lambda: nccl_log.read(path))
    if kind == "json":
        import importlib
        mod = importlib.import_module(f"ranktrace.analyzers.readers.{name}")
        head = path.open("rb").read(65536)
        timed(f"{name}.sniff+read", lambda: mod.sniff(path, head) and mod.read(path))
    path.unlink()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"files": out, "peak_mb": peak}))
'''


def test_a_100_mb_single_line_per_reader_is_read_in_bounded_time_and_memory(tmp_path: Path):
    plan = [("text", name, str(p) if p else None, None) for name, p in TEXT_SAMPLES.items()]
    plan += [("json", name, str(p), marker) for name, (p, marker) in JSON_SAMPLES.items() if p.exists()]
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), json.dumps(plan), str(HUGE)],
                         capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    files = got["files"]
    assert len(files) >= len(plan)
    slow = {k: v for k, v in files.items() if v["seconds"] > PER_FILE_S}
    crashed = {k: v for k, v in files.items() if v["error"]}
    assert not slow, json.dumps(files, indent=1)
    assert not crashed, json.dumps(crashed, indent=1)
    assert got["peak_mb"] < PEAK_MB, got


@pytest.mark.parametrize("size", [64 << 10, 1 << 20])
def test_a_vllm_log_with_one_base64_line_reads_as_fast_as_without(tmp_path: Path, size: int):
    """The reported vLLM case: a log with one long base64 line costs about what the log costs without it."""
    import base64
    import os
    import time

    from ranktrace.analyzers.inputs import collect as sources

    log = (D / "server_log" / "vllm_v1_vllmworker_tp4.log").read_bytes()
    plain = tmp_path / "plain.log"
    plain.write_bytes(log)
    cut = log.index(b"\n", len(log) // 2) + 1
    mixed = tmp_path / "b64.log"
    mixed.write_bytes(log[:cut] + b"INFO data: " + base64.b64encode(os.urandom(size))[:size] + b"\n" + log[cut:])
    t = time.perf_counter()
    sources.collect([plain])
    base = time.perf_counter() - t
    t = time.perf_counter()
    sources.collect([mixed])
    assert time.perf_counter() - t < base + 3.0
