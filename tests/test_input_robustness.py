"""Inputs that used to cost the whole analysis (issue #16): a small pickle that expands to gigabytes, NUL holes in
structured and directly-read files, an unreadable subdirectory, a FIFO, a cut .json.gz, a gzip bomb, a damaged
meta.json of our own. Each case: the analysis goes on, bounded, and says what it skipped."""
from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, trace_env

D = REPO / "tests" / "data" / "readers"
SHARED = REPO.parent / "shared" / "data" / "local" / "torch-2.13-gloo-hang"


def _analyze(paths: list[Path], timeout: float = 120, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run((prefix or []) + TRACE + ["analyze", "--json", "--no-snapshot", *map(str, paths)],
                          capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _no_bug(res: subprocess.CompletedProcess) -> None:
    assert "ranktrace bug" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]


# --- Flight Recorder pickle with shared references -------------------------------------------------------------

def _shared_reference_pickle() -> bytes:
    """~60 KB: 300 entries that all share one 20000-frame list, one 2000-tensor size list and a 2^40-leaf nested
    list as the group name (pickle's memo stores each shared object once; expanding them per entry costs
    gigabytes)."""
    frame = {"name": "all_reduce", "filename": "train.py", "line": 7}
    frames = [frame] * 20000
    sizes = [[1024, 1024]] * 2000
    dtypes = ["Float"] * 2000
    nest: list = ["g"]
    for _ in range(40):
        nest = [nest, nest]
    entries = [{"record_id": i, "pg_id": 0, "process_group": (nest, "default_pg"), "profiling_name": "gloo:all_reduce",
                "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1, "state": "scheduled",
                "input_sizes": sizes, "input_dtypes": dtypes, "output_sizes": sizes, "frames": frames,
                "thread_name": nest, "is_p2p": False} for i in range(300)]
    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": nest, "ranks": "[0, 1]"}},
                         "pg_status": {}, "entries": entries}, protocol=4)


READ_BOUNDED = r'''
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from pathlib import Path
from ranktrace.analyzers.readers import flight_recorder
t = time.perf_counter()
r = flight_recorder.read(Path(sys.argv[1]))
print(r.events.num_rows, round(time.perf_counter() - t, 2), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
print("|".join(s.reason for s in r.skipped))
'''


def test_a_small_pickle_of_shared_references_is_expanded_once_and_bounded(tmp_path: Path):
    data = _shared_reference_pickle()
    assert len(data) < 128 << 10
    p = tmp_path / "fr_rank0.pkl"
    p.write_bytes(data)
    res = subprocess.run([PY, "-c", READ_BOUNDED, str(p)], capture_output=True, text=True, env=trace_env(),
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    rows, seconds, peak_mb = res.stdout.split("\n")[0].split()
    assert int(rows) >= 300 and float(seconds) < 20 and int(peak_mb) < 1500, res.stdout


# --- NUL holes ----------------------------------------------------------------------------------------------------

def _with_hole(data: bytes, where: str, n: int = 4096) -> bytes:
    if where == "lead":
        return b"\0" * n + data
    at = min(len(data) // 3, 30000)
    cut = (data.find(b"\n", at) + 1) or (data.index(b",", at) + 1)   # a line boundary, or a one-line JSON's comma
    return data[:cut] + b"\0" * n + data[cut:]


STRUCTURED_SAMPLES = [
    ("flight_recorder", SHARED / "fr_gloo_rank0.json"),
    ("flight_recorder", D / "flight_recorder" / "nccl_trace_rank_2.json"),
    ("pyspy", REPO.parent / "shared" / "data" / "external" / "local-generated" / "py-spy-0.4.3" / "dump.json"),
    ("nccl_ras", D / "ras" / "json_2_29.json"),
]


@pytest.mark.parametrize("where", ["lead", "mid"])
@pytest.mark.parametrize("fmt,sample", STRUCTURED_SAMPLES, ids=lambda x: getattr(x, "name", x))
def test_a_nul_run_in_a_structured_input_is_a_hole_not_binary(tmp_path: Path, fmt: str, sample: Path, where: str):
    """A run of NUL bytes (a sparse hole after a node crash, a copytruncate'd file) used to make the JSON readers'
    sniffers call the whole file binary."""
    from ranktrace.analyzers.inputs import collect as sources

    clean = sources.collect([sample])
    p = tmp_path / sample.name
    p.write_bytes(_with_hole(sample.read_bytes(), where))
    got = sources.collect([p])
    assert got.formats.get(str(p)) == [fmt], (got.formats, got.skipped)
    n = lambda i: i.events.num_rows + i.stacks.num_rows + i.observations.num_rows  # noqa: E731
    assert n(got) >= n(clean) * (0.5 if where == "mid" else 1.0)
    assert any("NUL" in s.reason for s in got.skipped)


TEXT_READERS = [
    ("nccl_log", D / "nccl" / "prefixes.log"),
    ("watchdog", D / "watchdog" / "gen3_torch25.log"),
    ("pyspy", D / "pyspy" / "torchrun_prefixed.txt"),
    ("faulthandler", D / "faulthandler" / "fatal_and_repeat.txt"),
    ("gdb", D / "gdb" / "two_processes_cuda_gdb.txt"),
    ("fr_text", D / "fr_text" / "mismatch_current.txt"),
    ("nccl_ras", D / "ras" / "monitor.txt"),
]


@pytest.mark.parametrize("fmt,sample", TEXT_READERS, ids=lambda x: getattr(x, "name", x))
def test_a_nul_run_in_the_first_64k_of_a_text_log_is_read_around(tmp_path: Path, fmt: str, sample: Path):
    """The readers' own entry points (`sniff` / `read`, which a big NCCL log and other callers use) rejected a text
    log with a NUL run in its first 64 KiB as binary; the hole is dropped and the text on both sides read."""
    import importlib

    mod = importlib.import_module(f"ranktrace.analyzers.readers.{fmt}")
    clean = mod.read(sample)
    data = sample.read_bytes()
    cut = data.index(b"\n", len(data) // 4) + 1
    p = tmp_path / sample.name
    p.write_bytes(data[:cut] + b"\0" * 8192 + data[cut:])
    if hasattr(mod, "sniff"):
        assert mod.sniff(p, p.read_bytes()[:65536]), "the sniffer calls a log with a hole binary"
    got = mod.read(p)
    n = lambda r: r.events.num_rows + r.stacks.num_rows + r.observations.num_rows  # noqa: E731
    assert n(got) >= n(clean) - 2 and n(got) > 0


# --- folders: unreadable subdirectory, FIFO -----------------------------------------------------------------------

def _without_file_permission_override() -> list[str] | None:
    """A command prefix under which permission bits apply (root drops CAP_DAC_*), or None when none exists."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"] if setpriv else None


def test_an_unreadable_subdirectory_is_skipped_not_fatal(tmp_path: Path):
    prefix = _without_file_permission_override()
    if prefix is None:
        pytest.skip("root without setpriv: permission bits cannot be made to apply")
    logs = tmp_path / "logs"
    (logs / "secret").mkdir(parents=True)
    shutil.copy(D / "nccl" / "prefixes.log", logs / "prefixes.log")
    shutil.copy(D / "nccl" / "prefixes.log", logs / "secret" / "prefixes.log")
    (logs / "secret").chmod(0)
    try:
        res = _analyze([logs], prefix=prefix)
    finally:
        (logs / "secret").chmod(0o700)
    _no_bug(res)
    v = json.loads(res.stdout)
    assert res.returncode in (0, 3, 4) and v["status"] != "inconclusive" or v["culprit_ranks"] is not None
    assert any("secret" in (e.get("file") or "") and "ermission" in (e.get("detail") or "")
               for f in v["findings"] if f["kind"] == "input_skipped" for e in f["evidence"]), v["findings"]


def test_a_fifo_in_a_folder_or_as_the_argument_never_blocks(tmp_path: Path):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(D / "nccl" / "prefixes.log", logs / "prefixes.log")
    os.mkfifo(logs / "pipe")
    res = _analyze([logs], timeout=60)
    _no_bug(res)
    v = json.loads(res.stdout)
    assert any("pipe" in (e.get("file") or "") for f in v["findings"] for e in f["evidence"])
    res = _analyze([logs / "pipe"], timeout=60)
    _no_bug(res)
    assert res.returncode == 2 and "not a regular file" in res.stderr


# --- gzip: cut streams, bombs -------------------------------------------------------------------------------------

def _big_kineto(n_copies: int) -> bytes:
    src = json.loads(gzip.decompress((D / "kineto" / "torch2.13_gloo_rank0.pt.trace.json.gz").read_bytes()))
    base = [e for e in src["traceEvents"] if e.get("name") == "gloo:all_reduce"]
    events = []
    for k in range(n_copies):
        for e in base:
            e2 = copy.deepcopy(e)
            e2["ts"] = e["ts"] + k * 10_000
            e2["args"]["Concrete Inputs"] = ["x" * 200]
            events.append(e2)
    doc = dict(src, traceEvents=events)
    return json.dumps(doc).encode()


def test_a_cut_json_gz_keeps_everything_before_the_cut(tmp_path: Path):
    """A gzip stream cut short lost the last MiB decoded before the cut (a read that hits the end raised and took its
    whole chunk with it)."""
    from ranktrace.analyzers.readers import kineto

    raw = _big_kineto(4000)
    assert len(raw) > 3 << 20
    packed = gzip.compress(raw, compresslevel=1)
    cut = packed[: int(len(packed) * 0.95)]
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(cut)
    d = zlib.decompressobj(31)
    decoded = d.decompress(cut)            # all the bytes the cut stream still holds
    whole = decoded.count(b'"name": "gloo:all_reduce"') - 1
    r = kineto.read(p)
    # the ops before the cut: kept, or (past the bound on ops kept per group) counted, and their seq says how many
    got = max(s for k, s in zip(r.events["kind"].to_pylist(), r.events["seq"].to_pylist()) if k == "enter")
    assert got >= whole - 1, (got, whole)
    assert any("cut" in s.reason or "truncated" in s.reason.lower() for s in r.skipped)


def _bomb(path: Path, head: bytes, gib: int = 4) -> None:
    """`head` then `gib` GiB of spaces, one gzip member of ~4 MB. Built in a second: one 16 MiB block is deflated
    once after a full flush (no reference to what came before it), and its bytes are repeated."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    blk = b" " * (1 << 24)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(blk) + c.flush(zlib.Z_FULL_FLUSH)
    last = c.flush(zlib.Z_FINISH)
    n = gib * 64
    crc = zlib.crc32(head)
    for _ in range(n):
        crc = zlib.crc32(blk, crc)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03" + first)
        for _ in range(n):
            f.write(block)
        f.write(last + (crc & 0xFFFFFFFF).to_bytes(4, "little") + ((len(head) + n * len(blk)) & 0xFFFFFFFF).to_bytes(4, "little"))


@pytest.mark.parametrize("head", [b'{"schemaVersion": 1, "traceEvents": [', b"[rank0]: NCCL INFO hello\n"],
                         ids=["kineto", "text"])
def test_a_gzip_bomb_is_bounded_in_time(tmp_path: Path, head: bytes):
    p = tmp_path / "bomb.json.gz"
    _bomb(p, head)
    assert p.stat().st_size < 8 << 20
    t = time.monotonic()
    res = _analyze([p], timeout=120)
    assert time.monotonic() - t < 30, res.stderr[-2000:]
    _no_bug(res)


# --- our own meta.json, damaged -----------------------------------------------------------------------------------

WEIRD = [None, -1, "x", [1, "a", None], {"a": [1]}, True]


def _run_dir(tmp_path: Path) -> Path:
    """A small finished trace dir, made once by a real traced job."""
    run = tmp_path / "run"
    res = subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(run), "--", PY, "-c",
                                  "import torch, torch.distributed as dist\n"
                                  "dist.init_process_group('gloo', rank=0, world_size=1, "
                                  "init_method='tcp://127.0.0.1:0')\n"
                                  "t = torch.ones(2); dist.all_reduce(t); dist.destroy_process_group()\n"],
                         capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def test_a_damaged_meta_json_never_aborts_analyze_or_compare(tmp_path: Path):
    from ranktrace.analyzers import compare, api
    from ranktrace.tracer.watch import live

    run = _run_dir(tmp_path)
    host = next(d for d in run.iterdir() if d.is_dir())
    good = json.loads((host / "meta.json").read_text())
    pid = next(iter(good["pids"]))
    variants: list[dict] = []
    for key in list(good):
        for w in WEIRD:
            variants.append(dict(good, **{key: w}))
    n_top = len(variants)
    for key in ("returncode", "exit_code", "signal", "signals_forwarded", "killed_on_hang"):
        for w in WEIRD:
            variants.append(dict(good, exit=dict(good["exit"], **{key: w})))
    for key in ("rank", "world", "ppid", "argv", "ring", "ops"):
        for w in WEIRD:
            variants.append(dict(good, pids={pid: dict(good["pids"][pid], **{key: w}), "x": w}))
    variants += [[], "x", 3, None]
    failures = []
    for i, v in enumerate(variants):
        (host / "meta.json").write_text(json.dumps(v))
        try:
            a = api.analyze([run], liveness=live.liveness([run]))
            assert a.verdict.status in ("hang", "completed", "crashed", "idle", "inconclusive")
            if i < n_top and i % 2 == 0:
                compare.compare_paths(run, run, liveness=live.liveness([run]))
        except Exception as e:  # noqa: BLE001 - the test's whole point
            failures.append((i, json.dumps(v)[:200], f"{type(e).__name__}: {e}"))
    assert not failures, failures[:5]
    (host / "meta.json").write_text("{not json")
    res = _analyze([run])
    _no_bug(res)
    assert res.returncode != 2
