"""The window over a rank's own records (issue #19, tracer/formats/recordwindow.py): which records an
analysis keeps of a million must not change what it concludes.

* the one-rank shortcut and the general grouped selection keep the same records, on random op streams with
  everything a window must keep whatever its age (failed ops, enters never closed, p2p, async, both backends);
* the kept records are a superset of what every rule reads: pending ops, failed ones, open spans, each channel's
  last seq;
* a ring's never-written tail is not read, a torn or wrapped one still is.
"""
from __future__ import annotations

import numpy as np
import pytest

from ranktrace.analyzers.inputs import own_records
from ranktrace.analyzers.model import timeline
from ranktrace.tracer.formats import recordwindow as W
from ranktrace.tracer.formats.ringreader import written_slots


def _stream(rng: np.random.Generator, n_ops: int, rank: int = 0, p2p: bool = True) -> W.Records:
    """One rank's records: ops on two groups and (optionally) a p2p pair, enter+exit each, some failed, some never
    closed, some completed by a backend record, a few async; plus non-op records (syncs) and marks."""
    kind, cat, seq, group, send, peer, asyncs, span, keep, gloo = [], [], [], [], [], [], [], [], [], []
    counters: dict[tuple, int] = {}
    next_span = 1
    for _ in range(n_ops):
        roll = rng.random()
        if p2p and roll < 0.15:
            g, c, s = 2, 1, bool(rng.random() < 0.5)
            key = (g, s)
        elif roll < 0.25:  # a host sync: not an op
            kind += [0, 1]
            cat += [-1, -1]
            seq += [0, 0]
            group += [-1, -1]
            send += [False, False]
            peer += [-1, -1]
            asyncs += [False, False]
            span += [next_span, next_span]
            keep += [False, False]
            gloo += [False, False]
            next_span += 1
            continue
        else:
            g, c, s = int(rng.integers(0, 2)), 0, False
            key = (g,)
        counters[key] = counters.get(key, 0) + 1
        ending = rng.random()
        rows = [0] + ([2] if ending < 0.03 else [] if ending < 0.06 else [1]) + ([3] if rng.random() < 0.1 else [])
        for k in rows:
            kind.append(k)
            cat.append(c)
            seq.append(counters[key])
            group.append(g)
            send.append(s)
            peer.append(1 - rank if c == 1 else -1)
            asyncs.append(bool(rng.random() < 0.05))
            span.append(next_span if k in (0, 1, 2) else 0)
            keep.append(k == 2)
            gloo.append(g == 0)
        next_span += 1
    n = len(kind)
    t = np.cumsum(rng.integers(1, 1000, n)).astype(np.int64)
    ones = np.ones(n, dtype=bool)
    return W.Records(
        rank=np.full(n, rank, dtype=np.int64), kind=np.array(kind, dtype=np.int8),
        category=np.array(cat, dtype=np.int8), seq=np.array(seq, dtype=np.int64),
        seq_valid=np.array(cat, dtype=np.int8) >= 0, group=np.array(group, dtype=np.int64),
        groups=["0", "1", "pp"], is_send=np.array(send), name_valid=ones, peer=np.array(peer, dtype=np.int64),
        gloo=np.array(gloo), backend_valid=ones, no_completion=ones, source_valid=ones, async_op=np.array(asyncs),
        t=t, t_valid=ones, span=np.array(span, dtype=np.int64), proc=np.zeros(n, dtype=np.int64),
        keep=np.array(keep))


@pytest.mark.parametrize("seed", range(12))
def test_one_rank_shortcut_keeps_what_the_grouped_selection_keeps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rec = _stream(rng, int(rng.integers(50, 800)), p2p=seed % 3 != 0)
    rows = int(rng.integers(1, 200))
    keep = rec.keep | (rec.rank < 0) | ~rec.t_valid
    open_enter = W._open_enters(rec)
    keep |= open_enter
    cut = W._time_cut(rec, rows)
    is_op = (rec.category >= 0) & rec.seq_valid & (rec.rank >= 0)
    extra = frozenset({("0", 3), ("pp|0>1", 1)})
    fast = W._select_one_rank(rec, is_op, open_enter, cut, keep, extra)
    grouped = W._select_grouped(rec, is_op, open_enter, cut, keep, extra)
    assert fast is not None
    assert np.array_equal(fast.keep, grouped.keep)
    assert fast.dropped == grouped.dropped
    assert (fast.ops, fast.kept_ops) == (grouped.ops, grouped.kept_ops)


def test_every_op_a_rule_reads_is_kept_and_kept_whole() -> None:
    """Through timeline's own rules: the ops table of the kept records holds every pending op of the whole one,
    with the same flags, and each channel's last seq."""
    import pyarrow as pa

    rng = np.random.default_rng(7)
    rec = _stream(rng, 600, p2p=False)
    sel = W.select(rec, 20)
    assert 0 < int(sel.keep.sum()) < rec.n

    def table(mask: np.ndarray) -> pa.Table:
        kinds = np.array(["enter", "exit", "error", "complete", "mark"])
        idx = np.flatnonzero(mask)
        from ranktrace.tracer.formats import schema

        cols = {
            "rank": pa.array(rec.rank[idx].astype(np.int32)), "t_ns": pa.array(rec.t[idx]),
            "kind": pa.array(kinds[rec.kind[idx]]), "category": pa.array(np.where(rec.category[idx] == 0,
                                                                                 "collective", "sync")),
            "group": pa.array([rec.groups[g] if g >= 0 else None for g in rec.group[idx]]),
            "seq": pa.array(rec.seq[idx], mask=~rec.seq_valid[idx]), "name": pa.array(["all_reduce"] * idx.size),
            "backend": pa.array(np.where(rec.gloo[idx], "gloo", "nccl")), "source": pa.array(["events"] * idx.size),
            "async_op": pa.array(rec.async_op[idx]), "span_id": pa.array(rec.span[idx]), "pid": pa.array([1] * idx.size),
            "file": pa.array(["r"] * idx.size), "host": pa.array(["h"] * idx.size),
        }
        return pa.table({f.name: cols.get(f.name, pa.nulls(idx.size, f.type)) for f in schema.EVENTS},
                        schema=schema.EVENTS)

    whole, kept = timeline.build_ops(table(np.ones(rec.n, dtype=bool))), timeline.build_ops(table(sel.keep))

    def pending(ops: pa.Table) -> set:
        rows = ops.filter(pa.compute.and_(ops["issued"], pa.compute.invert(ops["completed"])))
        return set(zip(rows["chan"].to_pylist(), rows["seq"].to_pylist(), rows["errored"].to_pylist()))

    assert pending(whole) and pending(whole) == pending(kept)
    last = lambda ops: ops.group_by(["chan"]).aggregate([("seq", "max")]).sort_by("chan").to_pylist()  # noqa: E731
    assert last(whole) == last(kept)
    assert timeline.open_enter_rows(table(np.ones(rec.n, dtype=bool))).size == int((W._open_enters(rec)).sum())


def test_a_neverwritten_slots_tail_is_not_read() -> None:
    def reads_every_record(c: np.ndarray) -> bool:
        return not c[written_slots(c):].any()

    c = np.zeros(1000, dtype=np.uint64)
    c[:600] = np.arange(1, 601)
    assert written_slots(c) == 600
    full = np.arange(1, 1001, dtype=np.uint64)
    assert written_slots(full) == 1000
    wrapped = np.concatenate([np.arange(1001, 1301), np.arange(301, 1001)]).astype(np.uint64)
    assert written_slots(wrapped) == 1000
    torn = c.copy()
    torn[599] = 0          # the last record's writer died mid-write
    hole = c.copy()
    hole[300] = 0          # a dying thread's reserved slot, records committed after it by others
    for odd in (torn, hole):
        assert reads_every_record(odd)
    assert written_slots(np.zeros(8, dtype=np.uint64)) == 0


def test_window_rows_shared_out_over_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(own_records.ROWS_ENV, raising=False)
    hosts = []
    for h in range(4):
        d = tmp_path / f"h{h}" / "rings"
        d.mkdir(parents=True)
        for p in range(256):
            (d / f"{p}.ring").touch()
        hosts.append(d.parent)
    # 1,024 processes share the run's budget; a run of few keeps its ranks' latest records up to the cap
    assert own_records.rows_per_rank(hosts) == max(own_records.MIN_ROWS, own_records.ROW_BUDGET // 1024)
    assert own_records.rows_per_rank([]) == own_records.MAX_ROWS
    monkeypatch.setenv(own_records.ROWS_ENV, "3")
    assert own_records.rows_per_rank(hosts) == 3
