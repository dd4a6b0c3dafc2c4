"""Which of a rank's own records an analysis needs (issue #19): its latest ones and every op whose state any rule
reads (pending, failed, open, each channel's last), picked on numpy columns and ids before anything is decoded;
every op is kept or dropped whole, so each kept op reads as it would from all of its records.

An on-disk contract as much as a reader's rule: events.arrow's index (eventsindex.py) lists the records it keeps
whatever their age, and finalize writes it, so it lives here, numpy only, for both wings (issue #28)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Records", "Selection", "select", "labels_before", "channel_ranges", "SENDS", "KIND_CODES", "CATEGORY_CODES", "NO_COMPLETION_SOURCES",
           "BLOCKING_COMPLETE_BACKENDS"]

# the same sets as analyzers.timeline (tests/test_window.py holds them equal)
SENDS = ("send", "isend", "send_object_list")
KIND_CODES = {"enter": 0, "exit": 1, "error": 2, "complete": 3, "mark": 4}
CATEGORY_CODES = {"collective": 0, "p2p": 1}
NO_COMPLETION_SOURCES = ("nccl", "watchdog", "kineto", "events")
BLOCKING_COMPLETE_BACKENDS = ("gloo",)
_ENTER, _EXIT, _ERROR, _COMPLETE = 0, 1, 2, 3


@dataclass
class Records:
    """One rank's records as numpy columns (one entry per record; codes, never strings)."""

    rank: np.ndarray          # int64; -1: no rank (such records are all kept)
    kind: np.ndarray          # int8 KIND_CODES, -1 other
    category: np.ndarray      # int8 CATEGORY_CODES, -1 other
    seq: np.ndarray           # int64
    seq_valid: np.ndarray     # bool
    group: np.ndarray         # int64 index into `groups`, -1 null
    groups: list[str]         # group names
    is_send: np.ndarray       # bool: the name is a send (meaningful where name_valid)
    name_valid: np.ndarray    # bool
    peer: np.ndarray          # int64, -1 where null
    gloo: np.ndarray          # bool: the record's backend is a blocking-complete one (gloo)
    backend_valid: np.ndarray
    no_completion: np.ndarray  # bool: the record's source never reports completion
    source_valid: np.ndarray
    async_op: np.ndarray      # bool
    t: np.ndarray             # int64
    t_valid: np.ndarray
    span: np.ndarray          # int64, 0: none
    proc: np.ndarray          # int64: which process (file) of the rank wrote it
    keep: np.ndarray          # bool: kept whatever else (meta-region records, errors, marks, member carriers)
    name: np.ndarray | None = None      # int64 index into `strings` (-1 null): only to tell what a rank ran
    callsite: np.ndarray | None = None
    strings: list[str] | None = None

    @property
    def n(self) -> int:
        return int(self.rank.size)


@dataclass
class Selection:
    """What :func:`select` kept: a row mask, and what the dropped ops were (per channel: lowest and highest seq)."""

    keep: np.ndarray
    dropped: dict[str, tuple[int, int]] = field(default_factory=dict)
    ops: int = 0
    kept_ops: int = 0


def select(rec: Records, rows: int, extra: frozenset[tuple[str, int]] = frozenset()) -> Selection:
    """The records of `rec` to keep:

    * each rank's latest `rows` records (a window in time: what the timelines draw one by one);
    * every op (all its records: enter, exit, error, complete) that analyzers.timeline would not call completed
      (so the wait-for graph sees the same pending ops), that failed, that still has an enter without its exit (an
      open span), or that is its channel's last op or last issued op (so "completed because a later op followed"
      and each channel's last seq stay what they were);
    * every non-op record that is a meta-region record, an error, a mark, or the last of its group in its process
      (the one that carries the group's members: ``Records.keep``);
    * the ops asked for by (channel, seq) in `extra` (an op at another rank's pending head, which the wait-for
      graph compares).

    What was dropped is summarised per channel (lowest and highest seq), so a caller can tell whether an op it needs
    was among them."""
    keep = rec.keep | (rec.rank < 0) | ~rec.t_valid
    open_enter = _open_enters(rec)
    keep |= open_enter
    cut = _time_cut(rec, rows)
    is_op = (rec.category >= 0) & rec.seq_valid & (rec.rank >= 0)
    if not is_op.any():
        return Selection(keep | (rec.t >= cut))
    fast = _select_one_rank(rec, is_op, open_enter, cut, keep, extra)
    return fast if fast is not None else _select_grouped(rec, is_op, open_enter, cut, keep, extra)


def _select_grouped(rec: Records, is_op: np.ndarray, open_enter: np.ndarray, cut: np.ndarray, keep: np.ndarray,
                    extra: frozenset[tuple[str, int]]) -> Selection:
    """The general way: every op's records grouped (a sort), its flags reduced, timeline's completion rules."""
    ops = _Ops.of(rec, is_op, open_enter)
    # every record of a kept op is kept (each op reads as it would from all its records); the others by time
    op_of_row = np.full(rec.n, -1, dtype=np.int64)
    op_of_row[ops.order] = ops.op_of_sorted
    t_op = np.where(ops.has_enter_t, ops.t_enter, ops.t_min)
    keep_op = ops.needed(extra) | (t_op >= cut[ops.first])
    in_op = op_of_row >= 0
    keep_row = np.where(in_op, keep_op[np.maximum(op_of_row, 0)], keep | (rec.t >= cut))
    dropped: dict[str, tuple[int, int]] = {}
    gone = np.flatnonzero(~keep_op)
    if gone.size:
        chans, seqs = ops.chan[gone], ops.seq[gone]
        order = np.argsort(chans, kind="stable")
        chans, seqs = chans[order], seqs[order]
        starts = np.flatnonzero(np.concatenate(([True], chans[1:] != chans[:-1])))
        lo, hi = np.minimum.reduceat(seqs, starts), np.maximum.reduceat(seqs, starts)
        dropped = {ops.chan_names[int(c)]: (int(a), int(b)) for c, a, b in zip(chans[starts], lo, hi)}
    return Selection(keep_row, dropped, int(ops.count), int(np.count_nonzero(keep_op)))


def _select_one_rank(rec: Records, is_op: np.ndarray, open_enter: np.ndarray, cut: np.ndarray, keep: np.ndarray,
                     extra: frozenset[tuple[str, int]]) -> Selection | None:
    """The same selection without grouping the records (what one rank's own records allow): when all are one
    rank's, every op record's source never reports completion (ours: "events"), and (channel, seq) pairs fit a
    table, an op that is not its channel's last can only be pending by failing — so the ops every analysis needs
    are found from a few per-channel maxima and the failed and open records, and the rest by time, each with a
    flag per (channel, seq) instead of a sort. None when it does not apply (_select_grouped then)."""
    rows = np.flatnonzero(is_op)
    r = rec.rank[rows]
    if int(r.min()) != int(r.max()) or not bool(np.all(rec.no_completion[rows] & rec.source_valid[rows])):
        return None
    chan, names = _channels(rec, rows)
    seq = rec.seq[rows]
    s0 = int(seq.min())
    span = int(seq.max()) - s0 + 1
    if len(names) * span > 8 * rec.n + 4096:
        return None
    key = chan * span + (seq - s0)
    size = len(names) * span
    kind, t, t_valid = rec.kind[rows], rec.t[rows], rec.t_valid[rows]
    present = np.zeros(size, dtype=bool)
    present[key] = True
    issued = np.zeros(size, dtype=bool)
    issued[key[(kind == _ENTER) | (kind == _COMPLETE)]] = True
    need = np.zeros(size, dtype=bool)
    for c in range(len(names)):  # each channel's last op and last issued op
        for table in (present, issued):
            part = table[c * span:(c + 1) * span]
            if part.any():
                need[c * span + span - 1 - int(np.argmax(part[::-1]))] = True
    need[key[kind == _ERROR]] = True
    need[key[open_enter[rows]]] = True
    for name, sq in extra:
        if name in names and s0 <= sq < s0 + span:
            need[names.index(name) * span + sq - s0] = True
    # by time: an op is as old as its earliest enter (its earliest record when it has no enter with a time)
    early = t_valid & (t < cut[rows])
    enter_t = (kind == _ENTER) & t_valid
    has_enter = np.zeros(size, dtype=bool)
    has_enter[key[enter_t]] = True
    early_enter = np.zeros(size, dtype=bool)
    early_enter[key[enter_t & early]] = True
    early_any = np.zeros(size, dtype=bool)
    early_any[key[early]] = True
    recent = np.where(has_enter, ~early_enter, ~early_any)
    kept = present & (need | recent)
    keep_row = keep | (rec.t >= cut)
    keep_row[rows] = kept[key]
    dropped = {}
    gone = present & ~kept
    for c in range(len(names)):
        part = gone[c * span:(c + 1) * span]
        if part.any():
            dropped[names[c]] = (s0 + int(np.argmax(part)), s0 + span - 1 - int(np.argmax(part[::-1])))
    return Selection(keep_row, dropped, int(np.count_nonzero(present)), int(np.count_nonzero(kept)))


def _time_cut(rec: Records, rows: int) -> np.ndarray:
    """Per record: the time from which its rank's latest `rows` records start (-inf-like: none dropped)."""
    low = np.iinfo(np.int64).min
    if rows <= 0:  # no window at all: only what select keeps whatever its age (events.arrow's index)
        return np.full(rec.n, np.iinfo(np.int64).max, dtype=np.int64)
    timed = rec.t_valid & (rec.rank >= 0)
    if int(np.count_nonzero(timed)) <= rows:
        return np.full(rec.n, low, dtype=np.int64)
    r0, r1 = int(rec.rank.min()), int(rec.rank.max())
    ranks = [r1] if r0 == r1 or (r0 == -1 and not (rec.rank == -1).any()) else np.unique(rec.rank[timed])
    cut = np.full(rec.n, low, dtype=np.int64)
    for r in ranks:
        mine = timed if len(ranks) == 1 else timed & (rec.rank == r)
        t = rec.t[mine]
        if t.size > rows:
            at = np.partition(t, t.size - rows)[t.size - rows]
            if len(ranks) == 1:
                cut[rec.rank >= 0] = at
            else:
                cut[rec.rank == r] = at
    return cut


def _open_enters(rec: Records) -> np.ndarray:
    """Enter records whose span no exit/error of the same process closes (what timeline.open_enter_rows finds)."""
    has_span = rec.span != 0
    enters = np.flatnonzero(has_span & (rec.kind == _ENTER))
    out = np.zeros(rec.n, dtype=bool)
    if enters.size == 0:
        return out
    closes = np.flatnonzero(has_span & ((rec.kind == _EXIT) | (rec.kind == _ERROR)))
    if closes.size == 0:
        out[enters] = True
        return out
    key = _pack2(rec.proc, rec.span)
    k0, k1 = int(key.min()), int(key.max())
    if k1 - k0 < 8 * rec.n + 1024:  # span ids count up per process: a table of them, not a sort
        closed_at = np.zeros(k1 - k0 + 1, dtype=bool)
        closed_at[key[closes] - k0] = True
        closed = closed_at[key[enters] - k0]
    else:
        closed = np.isin(key[enters], key[closes])
    out[enters[~closed]] = True
    return out


def _pack2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One int64 per (a, b) pair, ordered as (a, b) (dense re-coding where the plain product would overflow)."""
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    a0, b0 = int(a.min()), int(b.min())
    width = int(b.max()) - b0 + 1
    if (int(a.max()) - a0 + 1) * width < 2**62:
        return (a - a0) * width + (b - b0)
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    return ai.astype(np.int64) * (int(bi.max()) + 1) + bi


def _group_rows(rank: np.ndarray, chan: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """A stable order of records by (rank, chan, seq). A process writes each channel's seqs in ascending order, so a
    stable sort by (rank, chan) alone — a radix sort of small codes — usually is one already; otherwise a sort of
    the packed key."""
    rc = _pack2(rank, chan)
    if int(rc.max(initial=0)) < 2**15:
        o = np.argsort(rc.astype(np.int16), kind="stable")  # radix sort
        s, r = seq[o], rc[o]
        if s.size < 2 or bool(np.all((s[1:] >= s[:-1]) | (r[1:] != r[:-1]))):
            return o
    return np.argsort(_pack2(rc, seq), kind="stable")


@dataclass
class _Ops:
    """The op records grouped per (rank, channel, seq), as analyzers.timeline.build_ops groups them."""

    count: int
    order: np.ndarray          # op records sorted by (rank, chan, seq), stably
    op_of_sorted: np.ndarray   # the op of each record in that order
    first: np.ndarray          # per op: its first record
    rank: np.ndarray
    chan: np.ndarray           # dense channel code
    chan_names: list[str]
    seq: np.ndarray
    issued: np.ndarray
    returned: np.ndarray
    errored: np.ndarray
    complete: np.ndarray
    async_op: np.ndarray
    gloo: np.ndarray
    no_completion: np.ndarray
    has_open: np.ndarray
    t_enter: np.ndarray
    has_enter_t: np.ndarray
    t_min: np.ndarray

    @classmethod
    def of(cls, rec: Records, is_op: np.ndarray, open_enter: np.ndarray) -> "_Ops":
        rows = np.flatnonzero(is_op)
        chan, chan_names = _channels(rec, rows)
        rank, seq = rec.rank[rows], rec.seq[rows]
        o = _group_rows(rank, chan, seq)
        ro, co, so = rank[o], chan[o], seq[o]
        new = np.concatenate(([True], (ro[1:] != ro[:-1]) | (co[1:] != co[:-1]) | (so[1:] != so[:-1])))
        starts = np.flatnonzero(new)
        op_sorted = np.cumsum(new) - 1
        order = rows[o]
        # one pass for every "any of its records" flag: each a bit of one byte per record, OR-ed per op
        kind = rec.kind
        enter_t = (kind == _ENTER) & rec.t_valid
        bits = (kind == _ENTER).view(np.uint8).copy()
        bits |= (kind == _EXIT).view(np.uint8) << 1
        bits |= (kind == _ERROR).view(np.uint8) << 2
        bits |= (kind == _COMPLETE).view(np.uint8) << 3
        bits |= rec.async_op.view(np.uint8) << 4
        bits |= open_enter.view(np.uint8) << 5
        bits |= enter_t.view(np.uint8) << 6
        bits |= rec.t_valid.view(np.uint8) << 7
        anyb = np.bitwise_or.reduceat(bits[order], starts)
        flag = [(anyb >> k) & 1 == 1 for k in range(8)]
        big = np.iinfo(np.int64).max
        t_enter = np.minimum.reduceat(np.where(enter_t, rec.t, big)[order], starts)
        if bool(np.all(flag[6] | ~flag[7])):  # every op with a time has an enter time: t_min is never read
            t_min = t_enter
        else:
            t_min = np.minimum.reduceat(np.where(rec.t_valid, rec.t, big)[order], starts)
        head = o[starts]
        first = order[starts]
        return cls(
            count=int(starts.size), order=order, op_of_sorted=op_sorted, first=first, rank=rank[head],
            chan=chan[head], chan_names=chan_names, seq=seq[head],
            issued=flag[0] | flag[3], returned=flag[1], errored=flag[2], complete=flag[3], async_op=flag[4],
            gloo=_first_valid(rec.backend_valid, rec.gloo, rec.group, order, starts, first),
            no_completion=_first_valid(rec.source_valid, rec.no_completion, rec.group, order, starts, first),
            has_open=flag[5], t_enter=t_enter, has_enter_t=flag[6], t_min=t_min)

    def needed(self, extra: frozenset[tuple[str, int]]) -> np.ndarray:
        """Ops every analysis reads, whatever their age: pending (timeline._completed), failed, open, each
        channel's last op and last issued op, and `extra`."""
        pair = np.concatenate(([True], (self.rank[1:] != self.rank[:-1]) | (self.chan[1:] != self.chan[:-1])))
        starts = np.flatnonzero(pair)
        which = np.cumsum(pair) - 1
        seq_max = np.maximum.reduceat(self.seq, starts)[which]
        low = np.iinfo(np.int64).min
        issued_max = np.maximum.reduceat(np.where(self.issued, self.seq, low), starts)[which]
        completed = self.complete | (self.returned & self.gloo & ~self.async_op)
        superseded = (self.seq < seq_max) & (self.gloo | self.no_completion)
        completed = (completed | superseded) & ~(self.errored & ~self.complete)
        need = (self.issued & ~completed) | self.errored | self.has_open | (self.seq == seq_max) | (
            self.issued & (self.seq == issued_max))
        if extra:
            names = {name: i for i, name in enumerate(self.chan_names)}
            for chan, seq in extra:
                c = names.get(chan)
                if c is not None:
                    need |= (self.chan == c) & (self.seq == seq)
        return need


def _first_valid(valid: np.ndarray, values: np.ndarray, group: np.ndarray, order: np.ndarray, starts: np.ndarray,
                 first: np.ndarray) -> np.ndarray:
    """Per op: `values` at its first record (in record order) where `valid`; False where none is. Where the value and
    its validity are a function of the record's group (a backend is its group's; our records' source is one), that
    is the op's first record's."""
    code = valid.view(np.uint8) + (valid & values).view(np.uint8)   # 0 none, 1 valid False, 2 valid True
    g = np.where(group < 0, 0, group + 1)
    of_group = np.zeros(int(g.max(initial=0)) + 1, dtype=np.uint8)
    of_group[g] = code
    if bool(np.array_equal(of_group[g], code)):
        return code[first] == 2
    pos = np.arange(order.size)
    m = np.minimum.reduceat(np.where(valid[order], pos, order.size), starts)
    return np.where(m < order.size, values[order[np.minimum(m, order.size - 1)]], False)


def _channels(rec: Records, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Dense channel code per op record, and the channel names (timeline._channels: a collective's channel is its
    group, null as ""; a p2p op's is ``group|src>dst``, a send's src being its own rank, a recv's its peer)."""
    names = list(rec.groups) + [""]       # the last one: null
    canon: dict[str, int] = {}
    remap = np.array([canon.setdefault(x, len(canon)) for x in names], dtype=np.int64)  # null and "" are one
    g = rec.group[rows]
    gcode = remap[np.where(g < 0, len(names) - 1, g)]
    base = list(canon)
    p2p = rec.category[rows] == 1
    if not p2p.any():
        present = np.zeros(len(base), dtype=bool)
        present[gcode] = True
        dense = np.cumsum(present) - 1
        return dense[gcode], [b for b, here in zip(base, present) if here]
    send = rec.is_send[rows]
    known = rec.name_valid[rows]
    rank, peer = rec.rank[rows], rec.peer[rows]
    src = np.where(known, np.where(send, rank, peer), -1)
    dst = np.where(known, np.where(send, peer, rank), -1)
    src, dst = np.where(p2p, src, -2), np.where(p2p, dst, -2)
    key = _pack2(_pack2(gcode, src + 2), dst + 2)
    _, first, dense = np.unique(key, return_index=True, return_inverse=True)
    chan_names = [f"{base[gcode[i]]}|{src[i]}>{dst[i]}" if p2p[i] else base[gcode[i]] for i in first]
    return dense.astype(np.int64).ravel(), chan_names


def labels_before(rec: Records, keep: np.ndarray) -> dict[int, tuple[np.ndarray, list[str | None], int]]:
    """What each rank ran before the records it keeps, for telling where its sequence departs from the others'
    (analyzers.diagnose.context.departures): per rank, its issued ops in issue order (enter time, then seq) up to
    its last dropped one, as codes into a table of "name @ call site" labels, and how many ops of those were kept
    anyway (pending, failed, ...: they come first among its kept ops in that order). `keep`: select's row mask.
    Needs ``name``, ``callsite`` and ``strings``."""
    is_op = (rec.category >= 0) & rec.seq_valid & (rec.rank >= 0)
    if not is_op.any() or rec.name is None or rec.callsite is None or rec.strings is None:
        return {}
    ops = _Ops.of(rec, is_op, _open_enters(rec))
    rows = ops.order
    starts = np.flatnonzero(np.concatenate(([True], ops.op_of_sorted[1:] != ops.op_of_sorted[:-1])))
    big = np.iinfo(np.int64).max

    def first_valid(codes: np.ndarray) -> np.ndarray:
        m = np.minimum.reduceat(np.where(codes[rows] >= 0, np.arange(rows.size), big), starts)
        return np.where(m < big, codes[rows[np.minimum(m, rows.size - 1)]], -1)

    width = len(rec.strings) + 1
    pair = (first_valid(rec.name) + 1) * width + (first_valid(rec.callsite) + 1)
    kept = keep[ops.first]
    out: dict[int, tuple[np.ndarray, list[str | None], int]] = {}
    issued = np.flatnonzero(ops.issued)
    for r in np.unique(ops.rank[issued]):
        mine = issued[ops.rank[issued] == r]
        t = np.where(ops.has_enter_t[mine], ops.t_enter[mine], big)
        order = mine[np.lexsort((ops.first[mine], ops.seq[mine], t))]
        dropped = np.flatnonzero(~kept[order])
        if dropped.size == 0:
            continue
        head = order[:int(dropped[-1]) + 1]
        pairs, codes = np.unique(pair[head], return_inverse=True)
        table = []
        for p in pairs.tolist():
            nm = rec.strings[p // width - 1] if p // width else None
            cs = rec.strings[p % width - 1] if p % width else ""
            table.append(f"{nm} @ {cs}" if cs else nm)
        out[int(r)] = (codes.astype(np.int64).ravel(), table, int(np.count_nonzero(kept[head])))
    return out


def channel_ranges(rec: Records) -> dict[str, tuple[int, int]]:
    """Per channel of `rec`'s ops: its lowest and highest seq (what a window over them could have dropped)."""
    is_op = (rec.category >= 0) & rec.seq_valid & (rec.rank >= 0)
    rows = np.flatnonzero(is_op)
    if rows.size == 0:
        return {}
    chan, names = _channels(rec, rows)
    seq = rec.seq[rows]
    out = {}
    for c, name in enumerate(names):
        mine = seq[chan == c]
        if mine.size:
            out[name] = (int(mine.min()), int(mine.max()))
    return out
