"""A live ring is read through its tail index (issue #28, tracer/formats/ringwindow.py): its window and the older
records the index names, never the whole ring — and what the analysis keeps is exactly what a read of the whole
ring keeps.

* random op streams written by the real Recorder (two collective groups, a p2p pair, async ops completed out of
  order, failed ops, marks, host syncs, spans inside spans, several threads, an op a thread left open long before,
  a group used once at the start), in a ring that wraps and one that does not: the windowed read keeps the same
  event rows as the whole-ring read;
* rings the index cannot vouch for (version 1, an index that lags behind the slots, one that overflowed) are read
  whole, and still give the same rows;
* a 64-rank run: the reader, in a fresh process, reads (``rchar`` of /proc/self/io) no more than a bound
  proportional to the windows, a small part of the rings, and the verdict is the whole read's.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ranktrace.analyzers import api
from ranktrace.analyzers.inputs import own_records
from ranktrace.analyzers.readers.ranktrace_ring import rank_rings
from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.formats.ringwindow import MARGIN, SLACK, open_window
from ranktrace.tracer.rank.recorder import Recorder
from tests.helpers import PY, SCRIPTS, trace_env

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_analyze import write_rank  # noqa: E402  (the bench's writer: the real Recorder, one call a record)

ROWS = 400


def _random_ring(path: Path, seed: int, records: int, slots: int, nested: bool = False) -> None:
    """One rank's ring through Recorder.op: what the in-rank wrappers write, with everything a window must keep
    whatever its age somewhere in it."""
    rng = np.random.default_rng(seed)
    rec = Recorder(str(path), slots=slots, proctitle="python train.py")
    rec.meta({"type": "identity", "rank": 0, "world": 2, "source": "init_process_group"})
    for g in ("0", "1", "side", "once"):
        rec.meta({"type": "group", "name": g, "desc": g, "backend": "gloo", "ranks": [0, 1]})
    gid = {g: rec.intern(g) for g in ("0", "1", "side", "once")}
    nid = {n: rec.intern(n) for n in ("all_reduce", "broadcast", "barrier", "send", "recv", "synchronize", "step",
                                      "wait")}
    err = rec.intern("RuntimeError: boom")
    seq: dict[tuple, int] = {}

    def op(tid: int, name: str, group: str, kinds: tuple[str, ...], cat: str = "collective", peer: int | None = None,
           parent: int = 0, async_op: bool = False) -> int:
        key = (group, name if cat == "p2p" else "")
        seq[key] = seq.get(key, 0) + 1
        span = rec.new_span()
        for k in kinds:
            rec.op(k, cat, nid[name], tid=tid, group_id=gid[group], seq=seq[key], peer=peer, span_id=span,
                   parent_span_id=parent, async_op=async_op, error_id=err if k == "error" else 0)
        return span

    op(7, "barrier", "once", ("enter", "exit"))
    op(9, "barrier", "side", ("enter",))           # thread 9 stays in it: the op open since the start
    op(5, "all_reduce", "0", ("enter", "error"))   # an early failure
    pending: list[tuple[int, int, int]] = []       # async ops whose wait comes later: (span, seq, group)
    for _ in range(records // 2):
        roll = rng.random()
        tid = 5 if rng.random() < 0.8 else 6
        if roll < 0.1:
            op(tid, "send" if rng.random() < 0.5 else "recv", "0", ("enter", "exit"), cat="p2p", peer=1)
        elif roll < 0.2:
            span = rec.new_span()
            rec.op("enter", "sync", nid["synchronize"], tid=tid, span_id=span)
            rec.op("exit", "sync", nid["synchronize"], tid=tid, span_id=span)
        elif roll < 0.3:
            g = "1"
            span = op(tid, "broadcast", g, ("enter", "exit"), async_op=True)
            pending.append((span, seq[(g, "")], gid[g]))
            if len(pending) > 2 or rng.random() < 0.3:  # waited on, not always in issue order
                sp, sq, gg = pending.pop(int(rng.integers(0, len(pending))))
                rec.op("complete", "collective", nid["broadcast"], tid=tid, group_id=gg, seq=sq, span_id=sp)
        elif roll < 0.3003:  # errors and marks are rare: the index remembers the last TAIL_RARE of them
            rec.op("mark", "collective", nid["wait"], tid=tid, group_id=gid["0"])
        elif roll < 0.3006:
            op(tid, "all_reduce", "0", ("enter", "error"))
        elif nested and roll < 0.4:
            outer = rec.new_span()
            rec.op("enter", "user", nid["step"], tid=tid, span_id=outer)
            op(tid, "all_reduce", "0", ("enter", "exit"), parent=outer)
            rec.op("exit", "user", nid["step"], tid=tid, span_id=outer)
        else:
            op(tid, "all_reduce", "0", ("enter", "exit"))
    op(5, "all_reduce", "0", ("enter",))           # the hung op
    rec.close()


def _read(rings: list[Path], windowed: bool, monkeypatch: pytest.MonkeyPatch) -> rank_rings.HostRings:
    with monkeypatch.context() as m:
        if not windowed:
            m.setattr(rank_rings, "open_window", lambda path, rows: None)
        return rank_rings.read_host_rings(rings, "h", ROWS)


def _same_rows(a: rank_rings.HostRings, b: rank_rings.HostRings) -> None:
    assert (a.records, a.kept) == (b.records, b.kept)
    for ra, rb in zip(a.results, b.results, strict=True):
        assert ra.events.num_rows == rb.events.num_rows
        assert ra.events.drop_columns(["file"]).equals(rb.events.drop_columns(["file"]))


@pytest.mark.parametrize("seed,records,slots", [(1, 20_000, 1 << 15), (2, 30_000, 1 << 13), (3, 12_000, 1 << 14)])
def test_the_window_keeps_what_the_whole_ring_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int,
                                                    records: int, slots: int) -> None:
    ring = tmp_path / "1.ring"
    _random_ring(ring, seed, records, slots)
    win = open_window(str(ring), ROWS)
    assert win is not None and win.partial, "a ring with a tail index is read through it"
    assert len(win) < 4 * (ROWS + MARGIN + SLACK), "only the window and the records the index names"
    names = {int(i): s for i, s in win.contents.strings.items()}
    kept = {(names[int(g)], int(k)) for g, k in zip(win.field("group"), win.field("kind"))}
    if slots > records:  # (else the wrap took them)
        assert ("side", rf.KINDS.index("enter")) in kept, "the op thread 9 left open at the start is read"
        assert ("once", rf.KINDS.index("exit")) in kept, "a group's only op, long ago, is read whole"
        assert any(k == rf.KINDS.index("error") and names[int(g)] == "0" and t < win.field("t_ns")[-ROWS]
                   for g, k, t in zip(win.field("group"), win.field("kind"), win.field("t_ns"))), "old failures read"
    got, whole = _read([ring], True, monkeypatch), _read([ring], False, monkeypatch)
    _same_rows(got, whole)


def test_rings_the_index_cannot_vouch_for_are_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "base.ring"
    _random_ring(base, 4, 15_000, 1 << 15, nested=True)
    raw = base.read_bytes()
    whole = _read([base], False, monkeypatch)
    many = tmp_path / "many.ring"   # more errors than the index remembers, the oldest still in the ring
    rec = Recorder(str(many), slots=1 << 14)
    for i in range(4000):
        rec.op("enter", "collective", 0, tid=1, seq=i + 1, span_id=i + 1)
        rec.op("error" if i % 400 == 0 else "exit", "collective", 0, tid=1, seq=i + 1, span_id=i + 1)
    rec.close()
    assert open_window(str(many), ROWS) is None
    cases = {
        "v1": raw[:8] + struct.pack("<I", 1) + raw[12:],
        "lagging": raw[:rf.TAIL_ENTRIES_OFFSET] + bytes(rf.HEADER_SIZE - rf.TAIL_ENTRIES_OFFSET) + raw[rf.HEADER_SIZE:],
        "overflow": raw[:rf.TAIL_OFFSET + 8] + struct.pack("<I", rf.TAIL_OVERFLOW) + raw[rf.TAIL_OFFSET + 12:],
    }
    for name, data in cases.items():
        ring = tmp_path / f"{name}.ring"
        ring.write_bytes(data)
        assert open_window(str(ring), ROWS) is None, name
        _same_rows(_read([ring], True, monkeypatch), whole)
    # spans inside spans: an enclosing span the window does not show closing sends the read to the whole ring,
    # or the window holds it; the rows are the same either way
    _same_rows(_read([base], True, monkeypatch), whole)
    future = tmp_path / "v3.ring"
    future.write_bytes(raw[:8] + struct.pack("<I", 3) + raw[12:])
    with pytest.raises(Exception, match="ring version 3, this reader knows 1, 2"):
        open_window(str(future), ROWS)


_CHILD = """
import json, os, sys
from pathlib import Path
from ranktrace.analyzers.readers.ranktrace_ring.rank_rings import read_host_rings
rows, run = int(sys.argv[1]), Path(sys.argv[2])
def io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}
total = {"rchar": 0, "kept": 0, "records": 0, "windowed": 0}
first = sorted(run.iterdir())[0]
read_host_rings(sorted((first / "rings").glob("*.ring"))[:1], first.name, rows)  # its lazy imports: not counted
for hd in sorted(run.iterdir()):
    rings = sorted((hd / "rings").glob("*.ring"))
    a = io()
    got = read_host_rings(rings, hd.name, rows)
    b = io()
    total["rchar"] += b["rchar"] - a["rchar"]
    total["kept"] += got.kept
    total["records"] += got.records
    total["windowed"] += got.windowed
print(json.dumps(total))
"""


def test_a_64_rank_live_read_costs_its_windows_not_its_rings(tmp_path: Path) -> None:
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io here")
    ranks, pairs, slots = 64, 4_000, 1 << 14
    run = tmp_path / "run"
    for r in range(ranks):
        rings = run / f"node{r // 8}" / "rings"
        rings.mkdir(parents=True, exist_ok=True)
        write_rank(str(rings / f"{r}.ring"), r, ranks, pairs - 1, r != ranks - 1, slots, "recorder")
    for hd in run.iterdir():
        (hd / "meta.json").write_text(json.dumps({"schema": "ranktrace.meta/1", "host": hd.name, "exit": None}))
    rows = 512
    env = {**os.environ, own_records.ROWS_ENV: str(rows)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(rows), str(run)], capture_output=True, text=True,
                         env=env, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    meta = sum(_meta_used(p) for p in run.glob("*/rings/*.ring"))
    # a ring's window: its header page, the meta region it uses, its latest rows (and the margin before them)
    windows = ranks * (rf.HEADER_SIZE + (rows + MARGIN) * rf.SLOT_SIZE) + meta
    ring_bytes = sum(p.stat().st_size for p in run.glob("*/rings/*.ring"))
    assert got["records"] == ranks * (2 * (pairs - 1)) + ranks - 1, "every record counted, read or not"
    assert got["windowed"] == ranks, "every ring read through its tail index (a mapped whole ring shows no rchar)"
    assert got["rchar"] <= 1.5 * windows, (got, windows)
    assert got["rchar"] * 10 < ring_bytes, "a small part of the rings"
    # the verdict is the one a whole read gives
    os.environ[own_records.ROWS_ENV] = str(rows)
    try:
        windowed = api.analyze([run], liveness=None).verdict
    finally:
        del os.environ[own_records.ROWS_ENV]
    whole = api.analyze([run], liveness=None, whole=True).verdict
    assert (windowed.status, windowed.kind, list(windowed.culprit_ranks)) == ("hang", "missing_ranks", [ranks - 1])
    assert (whole.kind, list(whole.culprit_ranks), list(whole.waiting_ranks)) == (
        windowed.kind, list(windowed.culprit_ranks), list(windowed.waiting_ranks))
    assert windowed.operation == whole.operation


def _meta_used(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(rf.HEADER_SIZE)
        meta_size = rf.HEADER.unpack_from(head, 0)[5]
        data = f.read(meta_size)
    off = 0
    while off + rf.META_REC.size <= len(data):
        length = rf.META_REC.unpack_from(data, off)[0]
        if length == 0:
            break
        off += rf.META_REC.size + length
    return off


def _index_from_slots(path: Path) -> set[tuple[int, int, int, int]]:
    """What the tail index must hold, worked out from every slot: per key, the index + 1 of its last enter, end,
    complete and error-or-mark record."""
    from ranktrace.tracer.formats.ringreader import read_ring

    cols = read_ring(str(path)).columns()
    last: dict[int, list[int]] = {}
    for i in range(len(cols["commit"])):
        kind, cat = int(cols["kind"][i]), int(cols["category"][i])
        key = rf.tail_key(cat, int(cols["group"][i]), int(cols["peer"][i]), int(cols["name"][i]), int(cols["tid"][i]))
        vals = last.setdefault(key, [0, 0, 0, 0])
        vals[(rf.TAIL_FIELD[kind] - 8) // 8] = int(cols["commit"][i])
        if kind == rf.KINDS.index("error"):
            vals[3] = int(cols["commit"][i])
    return {tuple(v) for v in last.values()}  # type: ignore[misc]


def _index_on_disk(path: Path) -> set[tuple[int, int, int, int]]:
    head = path.read_bytes()[:rf.HEADER_SIZE]
    magic, flags, used, _ = rf.TAIL_HEAD.unpack_from(head, rf.TAIL_OFFSET)
    assert magic == rf.TAIL_MAGIC and not flags & rf.TAIL_OVERFLOW
    return {rf.TAIL_ENTRY.unpack_from(head, rf.TAIL_ENTRIES_OFFSET + k * rf.TAIL_ENTRY.size)[1:] for k in range(used)}


@pytest.mark.parametrize("fastpath", ["0", "1"])
def test_a_real_jobs_writers_keep_the_tail_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fastpath: str) -> None:
    """A real gloo job (tests/scripts/fastpath_job.py: every call shape the compiled path takes, and the ones it
    hands to Python), on the compiled path and on the Python wrappers: the index on disk is what its slots say."""
    monkeypatch.delenv("RANKTRACE_FASTPATH", raising=False)
    (tmp_path / "rings").mkdir()
    env = trace_env(RANKTRACE_DIR=str(tmp_path), RANKTRACE_FASTPATH=fastpath)
    env["PYTHONPATH"] = str(REPO / "tracer" / "rank" / "_inject") + ":" + env["PYTHONPATH"]
    res = subprocess.run([PY, str(SCRIPTS / "fastpath_job.py")], capture_output=True, text=True, timeout=120,
                         env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    assert counts["fastpath"] is (fastpath == "1")
    (ring,) = (tmp_path / "rings").glob("*.ring")
    assert _index_on_disk(ring) == _index_from_slots(ring)


def test_a_ring_reserves_what_its_expected_rate_needs_within_bounds(tmp_path: Path) -> None:
    from ranktrace.tracer.rank import recorder as R

    assert R.ring_slots({}) == R.DEFAULT_SLOTS
    assert R.ring_slots({R.RATE_ENV: "100"}) == 100 * R.DEFAULT_SECONDS
    assert R.ring_slots({R.RATE_ENV: "100", R.SECONDS_ENV: "60"}) == R.MIN_SLOTS   # a light rank: the floor
    assert R.ring_slots({R.RATE_ENV: "1e7"}) == R.MAX_SLOTS                         # a busy one: the bound
    assert R.ring_slots({R.RATE_ENV: "fast"}) == R.DEFAULT_SLOTS
    ring = tmp_path / "r.ring"
    R.Recorder(str(ring), slots=R.ring_slots({R.RATE_ENV: "100"})).close()
    st = ring.stat()   # what is reserved on disk: the header page, the meta region and 60,000 slots, no more
    assert st.st_blocks * 512 >= st.st_size == rf.META_OFFSET + R.DEFAULT_META_BYTES + 60_000 * rf.SLOT_SIZE


def test_the_monitors_first_look_at_a_ring_takes_its_newest_record_from_the_index(tmp_path: Path) -> None:
    from ranktrace.tracer.watch.ring_tail import RingTail

    ring = tmp_path / "r.ring"
    write_rank(str(ring), 0, 2, 10_000, True, 1 << 15, "recorder")   # 20,001 records, the last an open enter
    lagging = tmp_path / "lagging.ring"   # the same ring with its index emptied: every commit word is read
    raw = ring.read_bytes()
    lagging.write_bytes(raw[:rf.TAIL_ENTRIES_OFFSET] + bytes(rf.HEADER_SIZE - rf.TAIL_ENTRIES_OFFSET)
                        + raw[rf.HEADER_SIZE:])

    def rchar() -> int:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar"))

    got = {}
    for path in (ring, lagging):
        tail = RingTail(path)
        before = rchar()
        assert tail.update()
        got[path.name] = (tail.newest, dict(tail.group_seq), len(tail.open_ops), rchar() - before)
    assert got["r.ring"][:3] == got["lagging.ring"][:3] == (20_001, {"0": 5001, "1": 5000}, 1)
    assert got["r.ring"][3] * 10 < got["lagging.ring"][3], got
