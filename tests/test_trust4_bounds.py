"""#31, bounds (round 4): the reader-side leftovers. A NUL hole of any size in a text log (a sparse hole after a node
crash, the NULs a copytruncate'd log starts with) is stepped over and said once, the lines on both sides read; a
Kineto trace of many collectives keeps a bounded number of ops per group and says which it summarised, with the same
verdict. docs/SAFETY.md, "Bounds, per input", names these tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO

D = REPO / "tests" / "data" / "readers"
# real logs: a torch 2.5 watchdog log, and NCCL lines posted in a thread (nccl#147): one read by the opener, the other,
# once a hole makes it bigger than 32 MiB, streamed from disk by the NCCL reader
LOGS = [D / "watchdog" / "gen3_torch25.log", REPO / "tests" / "field" / "nccl-147" / "grep_logs.txt"]


def _sparse_with_hole(src: Path, dst: Path, hole: int, where: str) -> int:
    """`src` with a `hole`-byte sparse hole (written by seeking, nothing stored) at its start or at the line boundary
    nearest its middle; returns the hole's offset."""
    data = src.read_bytes()
    at = 0 if where == "lead" else data.index(b"\n", len(data) // 2) + 1
    with open(dst, "wb") as f:
        f.write(data[:at])
        f.seek(at + hole)
        f.write(data[at:])
    return at


def _rows(a) -> set[tuple]:
    ev = a.events
    return set(zip(ev["kind"].to_pylist(), ev["name"].to_pylist(), ev["line"].to_pylist(), ev["rank"].to_pylist()))


@pytest.mark.parametrize("where", ["lead", "mid"])
@pytest.mark.parametrize("hole", [1 << 20, 100 << 20], ids=["1MiB", "100MiB"])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_a_nul_hole_of_any_size_is_stepped_over_and_said_once(tmp_path: Path, log: Path, hole: int, where: str):
    """A hole over 64 KiB made the log "binary content" (a hole at its start) and dropped it; now the lines before
    and after it are read with their own line numbers, and one line says the hole."""
    clean = api.analyze([log], liveness=None)
    holed = tmp_path / log.name
    at = _sparse_with_hole(log, holed, hole, where)
    assert holed.stat().st_blocks * 512 < 1 << 20, "the hole is sparse: nothing of it is on disk"
    a = api.analyze([holed], liveness=None)
    assert holed.name in {Path(f).name for f in a.files}, [s.reason for s in a.skipped]
    assert _rows(a) == _rows(clean) and _rows(a), "every event of the clean log, at its own line"
    lines = {ln for _k, _n, ln, _r in _rows(a) if ln is not None}
    if where == "mid":
        cut_line = log.read_bytes()[:at].count(b"\n") + 1
        assert min(lines) < cut_line <= max(lines), "lines on both sides of the hole are read"
    said = [s.reason for s in a.skipped if "NUL" in s.reason]
    assert said == [f"{hole:,} bytes of NUL (a hole) at offset {at:,} skipped"], said


def test_nul_runs_stored_on_disk_are_dropped_and_counted(tmp_path: Path):
    """NULs written for real (not sparse) around and inside the text: each run is dropped as it is read; the first
    few are said one by one, the rest in one line."""
    log = LOGS[1]
    data = log.read_bytes()
    cuts = [i + 1 for i, b in enumerate(data) if b == 10][:8]
    out = bytearray()
    last = 0
    for c in cuts:
        out += data[last:c] + b"\0" * 70000
        last = c
    out += data[last:]
    p = tmp_path / log.name
    p.write_bytes(bytes(out))
    a = api.analyze([p], liveness=None)
    assert _rows(a) == _rows(api.analyze([log], liveness=None))
    said = [s.reason for s in a.skipped if "NUL" in s.reason]
    assert said[:3] == [f"70,000 bytes of NUL (a hole) at offset {c + 70000 * i:,} skipped"
                        for i, c in enumerate(cuts[:3])]
    rest = len(cuts) - 3
    assert rest > 0 and said[3:] == [f"and {rest} more NUL runs ({rest * 70000:,} bytes) skipped"]


# --- Kineto: a bounded number of ops per group -------------------------------------------------------------------

def _kineto_trace(path: Path, rank: int, n: int) -> None:
    """A torch.profiler trace in the layout the reader parses (distributedInfo + pg_config; per collective a
    record_param_comms cpu_op holding its nccl:<op> annotation and the cudaLaunchKernel, and the NCCL kernel with the
    same correlation): `n` collectives, every 10th a broadcast on group 1; the last, an all_reduce on group 0, was
    launched and its kernel never ended: the rank is stuck in it."""
    import json

    events = []
    for i in range(n):
        g = "1" if i % 10 == 9 else "0"
        op, coll = ("broadcast", "broadcast") if g == "1" else ("all_reduce", "allreduce")
        ts = 1000.0 + 100.0 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": 7, "ts": ts, "dur": 40.0,
             "args": {"Process Group Name": g, "Process Group Ranks": "[0, 1]", "Group size": 2, "dtype": "Float",
                      "In msg nelems": 1024, "Collective name": coll}},
            {"ph": "X", "cat": "user_annotation", "name": f"nccl:{op}", "pid": 7, "tid": 7, "ts": ts + 5, "dur": 30.0,
             "args": {}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": ts + 10,
             "dur": 5.0, "args": {"correlation": i + 1}},
        ]
        if i != n - 1:
            events.append({"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{coll}_RING_LL", "pid": 0, "tid": 40,
                           "ts": ts + 20, "dur": 50.0, "args": {"correlation": i + 1}})
    pgs = [{"pg_name": g, "pg_desc": d, "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}
           for g, d in (("0", "default_pg"), ("1", "tp_group"))]
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1711964646000000000,
                                "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                                    "pg_config": pgs}, "traceEvents": events}))


def _brief(a) -> tuple:
    v = a.verdict.to_dict()
    op = v["operation"] or {}
    return (v["status"], v["kind"], op.get("name"), op.get("group"), op.get("seq"), v["culprit_ranks"],
            v["waiting_ranks"], v["summary"])


def _last_seqs(a) -> dict:
    ev = a.events.filter(__import__("pyarrow.compute", fromlist=["x"]).equal(a.events["kind"], "enter"))
    out: dict = {}
    for r, g, s in zip(ev["rank"].to_pylist(), ev["group"].to_pylist(), ev["seq"].to_pylist()):
        out[(r, g)] = max(out.get((r, g), 0), s)
    return out


def test_a_kineto_trace_of_many_collectives_keeps_a_bounded_window_per_group(tmp_path: Path, monkeypatch):
    """2M collectives took 234 s and 12.7 GB (three rows kept per collective). Each group now keeps its first HEAD and
    last TAIL ops and counts the rest, in one line; the bound is made small here, the trace real in layout. The
    verdict on ranks stuck in their last all_reduce, and the seq of every group's last op, are those of the trace
    read whole."""
    from ranktrace.analyzers.readers.kineto import collect as window

    n = 400
    traces = [tmp_path / f"rank{r}.pt.trace.json" for r in (0, 1)]
    for r, p in enumerate(traces):
        _kineto_trace(p, r, n)
    whole = api.analyze(traces, liveness=None)
    assert not [s for s in whole.skipped if "bound" in s.reason]
    monkeypatch.setattr(window, "HEAD", 10)
    monkeypatch.setattr(window, "TAIL", 50)
    bounded = api.analyze(traces, liveness=None)
    for p in traces:
        (line,) = [s.reason for s in bounded.skipped if Path(s.file).name == p.name]
        assert line.startswith(f"{n:,} collectives: the first 10 and last 50 of each group are kept, ")
        assert f"{n - 60 - 40:,} in between only counted (group 0: {n - 60 - 40:,})" in line
        assert "the bound: 60 ops per group per trace" in line
    per_file = 3 + 3 * (60 + 40) - 1     # identity + 2 groups; enter, exit, complete per op; the stuck one no complete
    assert bounded.events.num_rows == 2 * per_file
    assert whole.events.num_rows == 2 * (3 + 3 * n - 1)
    assert _last_seqs(bounded) == _last_seqs(whole) and _last_seqs(whole)[(0, "0")] == n - n // 10
    assert _brief(bounded) == _brief(whole)


HTA = REPO.parent / "shared" / "data" / "external" / "HolisticTraceAnalysis" / "nccl_parser_config" / "nccl_data.json.gz"


@pytest.mark.skipif(not HTA.exists(), reason="the HTA sample traces are not in shared/data")
def test_a_plain_kineto_trace_with_a_pg_config_is_not_taken_for_a_flight_recorder_dump(tmp_path: Path):
    """A real trace (HTA's sample), un-gzipped: the "pg_config" of its distributedInfo made the Flight Recorder
    sniffer claim it, and the trace was dropped as "JSON object without Flight Recorder keys"."""
    import gzip

    p = tmp_path / "rank0.pt.trace.json"
    p.write_bytes(gzip.open(HTA).read())
    from ranktrace.analyzers.inputs import collect as sources

    got = sources.collect([p])
    assert got.formats == {str(p): ["kineto"]}, [s.reason for s in got.skipped]
    assert got.events.num_rows > 0
