"""#31, bounds (round 4): a Flight Recorder dump of many entries, or of entries that all share one list (pickle's memo
stores a shared object once: 2 bytes an entry), keeps a bounded window of entries per process group and cuts the
frames of an entry before any per-frame work; a plain Kineto trace is read up to a byte bound. Each says so in one
line naming the bound, and the verdict on a normal dump is unchanged. docs/SAFETY.md, "Bounds, per input", names
these tests."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import flight_recorder as fr
from ranktrace.analyzers.readers.flight_recorder import records
from tests.helpers import REPO
from tests.test_trust4_bounds import _brief, _kineto_trace, _last_seqs

GLOO = REPO.parent / "shared" / "data" / "local" / "torch-2.13-gloo-hang"
TORCH_FRAMES = [{"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 3245},
                {"name": "wrapper", "filename": "/x/torch/distributed/c10d_logger.py", "line": 81}]
USER_FRAME = {"name": "step", "filename": "train.py", "line": 61}


def _entry(i: int, seq: int, frames: list[dict[str, Any]], group: tuple[str, str] = ("0", "default_pg"),
           state: str = "completed") -> dict[str, Any]:
    """One entry as torch's pickle dump writes it (tuples for process_group, None for unknown times)."""
    return {"record_id": i, "pg_id": int(group[0]), "process_group": group, "profiling_name": "nccl:all_reduce",
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "state": state, "is_p2p": False,
            "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
            "time_created_ns": 1795937452000000000 + i * 1000, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": 1795937452000000500 + i * 1000 if state == "completed" else None,
            "timeout_ms": 600000, "retired": state == "completed", "duration_ms": 0.5, "thread_name": "pt_main_thread",
            "frames": frames}


def _dump(entries: list[Any], world: int = 4) -> bytes:
    last = {"0": 0, "1": 0}
    for e in entries:
        if isinstance(e, dict) and e.get("state") == "completed":
            last[e["process_group"][0]] = max(last[e["process_group"][0]], e["collective_seq_id"])
    ranks = str(list(range(world)))
    return pickle.dumps({
        "version": "2.10", "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks},
                      "1": {"name": "1", "desc": "tp_group", "ranks": ranks}},
        "pg_status": {g: {"last_enqueued_collective": v, "last_started_collective": v, "last_completed_collective": v}
                      for g, v in last.items()},
        "entries": entries}, protocol=4)


def _many_entries_dumps(tmp_path: Path, n: int) -> list[Path]:
    """4 ranks, `n` all_reduces each (every 10th on group 1), one shared frames list; the newest one of group 0 never
    completes on ranks 0-2, and rank 3 never issued it: rank 3 is the one behind (`n` leaves it on group 0)."""
    frames = [*TORCH_FRAMES, USER_FRAME]
    out = []
    for rank in range(4):
        seqs = {"0": 0, "1": 0}
        entries = []
        for i in range(n):
            g = ("1", "tp_group") if i % 10 == 9 else ("0", "default_pg")
            seqs[g[0]] += 1
            entries.append(_entry(i, seqs[g[0]], frames, g))
        entries[-1]["state"] = "scheduled"   # group 0's last all_reduce: issued, never completed
        entries[-1]["retired"] = False
        if rank == 3:
            entries.pop()
        p = tmp_path / f"nccl_trace_rank_{rank}"
        p.write_bytes(_dump(entries))
        out.append(p)
    return out


def _enters(res: Any) -> list[dict[str, Any]]:
    return [r for r in res.events.to_pylist() if r["kind"] == "enter"]


def test_a_flight_recorder_dump_of_many_entries_keeps_a_bounded_window_per_group(tmp_path: Path, monkeypatch):
    """Every entry was parsed and made rows (a 4.6 MB pickle of 2M references to one entry: 81 s, 7.3 GB, 4M rows).
    Each process group now keeps its first HEAD and last TAIL entries in record order and counts the rest in one
    line; the bound is made small here, the dumps real in layout. The verdict, and the seq of every group's last
    entry, are those of the dumps read whole."""
    n = 401                  # group 0: 361 entries (rank 3: 360), group 1 (every 10th): 40
    g0 = n - n // 10
    dumps = _many_entries_dumps(tmp_path, n)
    whole = api.analyze(dumps, liveness=None)
    assert not [s for s in whole.skipped if "bound" in s.reason]
    monkeypatch.setattr(records, "HEAD", 10)
    monkeypatch.setattr(records, "TAIL", 50)
    bounded = api.analyze(dumps, liveness=None)
    for p in dumps:
        behind = p.name.endswith("3")
        total, middle = n - behind, g0 - behind - 60
        (line,) = [s.reason for s in bounded.skipped if Path(s.file).name == p.name and "bound" in s.reason]
        assert line.startswith(f"{total:,} Flight Recorder entries: the first 10 and last 50 of each process group "
                               "are kept, ")
        # group 1's 40 entries fit its window: only group 0 has entries between head and tail
        assert f"{middle:,} in between only counted (group 0: {middle:,})" in line
        assert "the bound: 60 entries per group per dump" in line
        res = fr.read(p)
        assert len(_enters(res)) == 60 + 40
        assert [r["line"] for r in _enters(res)][-1] == total - 1   # the entry's true place in the dump
    assert _last_seqs(bounded) == _last_seqs(whole)
    assert _last_seqs(whole)[(0, "0")] == g0 and _last_seqs(whole)[(3, "0")] == g0 - 1
    assert _brief(bounded) == _brief(whole)
    assert whole.verdict.to_dict()["culprit_ranks"] == [3]


def test_a_dump_of_a_million_references_to_one_entry_is_read_within_the_default_bound(tmp_path: Path):
    """A 2 MB pickle: one entry dict referenced a million times, its frames one shared list of 300,000 frames (the
    memo stores each once). It took ~40 s and ~3.5 GB (every reference parsed into rows; bench/bench_fr_bound.py);
    now the window is chosen by identity before any parsing, and an entry's frames are cut to MAX_FRAMES before any
    per-frame work."""
    frames = [*TORCH_FRAMES, *([TORCH_FRAMES[0]] * 300_000), USER_FRAME]   # the user frame lies past the cut
    one = _entry(0, 1, frames)
    data = _dump([one] * 1_000_000)
    assert len(data) < 4 << 20
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(data)
    res = fr.read(p)
    rows = _enters(res)
    assert len(rows) == records.HEAD + records.TAIL == 5_500
    assert rows[-1]["line"] == 999_999 and rows[0]["line"] == 0
    assert {r["callsite"] for r in rows} == {None}            # train.py is frame 300,002: never looked at
    assert len(records.parse_entry(one, 0).frames) == records.MAX_FRAMES
    (line,) = [s.reason for s in res.skipped if "bound" in s.reason]
    assert line.startswith("1,000,000 Flight Recorder entries: the first 500 and last 5,000 of each process group")
    assert "994,500 in between only counted (group 0: 994,500)" in line
    assert not [s for s in res.skipped if "expands past" in s.reason]   # the cut frames fit the budget
    dump = [o for o in res.observations.to_pylist() if o["kind"] == "fr_dump"][0]
    assert "entries=5500 entries_in_dump=1000000" in dump["detail"]


def test_a_dump_past_two_million_entries_is_looked_at_only_at_both_ends(tmp_path: Path, monkeypatch):
    """Past MAX_LOOKED entries only the first and last half are looked at (one 2-byte reference an entry: 128M of
    them fit the 256 MiB file bound); the newest entries, those a hang is read from, are among them."""
    monkeypatch.setattr(records, "MAX_LOOKED", 1000)
    entries = [_entry(i, i + 1, TORCH_FRAMES) for i in range(3000)]
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(_dump(entries))
    res = fr.read(p)
    seqs = [r["seq"] for r in _enters(res)]
    assert seqs == list(range(1, 501)) + list(range(2501, 3001))
    (line,) = [s.reason for s in res.skipped if "bound" in s.reason]
    assert "entries 500-2,499 (2,000) are not looked at, the first and last 500 are" in line
    assert "1,000 entries looked at" in line


@pytest.mark.skipif(not GLOO.exists(), reason="the real gloo dumps are not in shared/data")
@pytest.mark.parametrize("ext", ["pkl", "json"])
def test_a_normal_dump_is_read_whole_and_its_verdict_is_unchanged(ext: str):
    """The real torch 2.13 gloo dumps (11 entries a rank, rank 3 one all_reduce behind) are far inside every bound:
    nothing is left out, nothing said, and the verdict is the one they always had."""
    dumps = [GLOO / f"fr_gloo_rank{r}.{ext}" for r in range(4)]
    for p in dumps:
        res = fr.read(p)
        assert res.skipped == ()
        assert len(_enters(res)) == (10 if p.name.startswith("fr_gloo_rank3") else 11)
    a = api.analyze(dumps, liveness=None)
    assert not [s for s in a.skipped if "bound" in s.reason or "Flight Recorder entries" in s.reason]
    assert _brief(a) == BRIEF_GLOO


# the verdict the reader gave these dumps before #31's bound (pickle and JSON alike)
BRIEF_GLOO = ("hang", "missing_ranks", "all_reduce", "0", 11, [3], [0, 1, 2],
              "Ranks 0-2 are waiting in all_reduce (group 0/default_pg, seq 11) for rank 3, which never issued it.")


def test_a_plain_kineto_trace_past_the_byte_bound_is_read_up_to_it(tmp_path: Path, monkeypatch):
    """A plain (not gzip) trace had no byte bound: its time grew with its size. It is now read up to
    kineto.MAX_PLAIN_BYTES (made small here: half of the trace), the events before the
    bound used and one line naming the file's size and the bound."""
    from ranktrace.analyzers.readers import kineto

    p = tmp_path / "rank0.pt.trace.json"
    _kineto_trace(p, 0, 200)
    size = p.stat().st_size
    whole = kineto.read(p)
    assert not [s for s in whole.skipped if "bound" in s.reason]
    monkeypatch.setattr(kineto, "MAX_PLAIN_BYTES", size // 2)
    cut = kineto.read(p)
    (line,) = [s.reason for s in cut.skipped if "bound" in s.reason]
    assert line.startswith(f"read up to {size // 2:,} bytes of its {size:,} bytes (the bound for a plain trace, ")
    assert line.endswith("the rest is not read")
    assert not [s for s in cut.skipped if "truncated" in s.reason]   # not said to be a cut file: it is not
    enter = lambda r: [x for x in r.events.to_pylist() if x["kind"] == "enter"]  # noqa: E731
    assert 0 < len(enter(cut)) < len(enter(whole))
    # what was read is the whole trace's first part, seq and all
    got, first = [(x["name"], x["seq"]) for x in enter(cut)], [(x["name"], x["seq"]) for x in enter(whole)]
    assert got == first[:len(got)]
