"""The wait-for graph and its culprits (DESIGN §5 culprit rule). Pure: ops in, graph and culprits out.

Worked example (TP groups {0,1} and {2,3}; rank 2 skipped its TP all_reduce, then everyone met in a world one)::

    channel "tp1"  seq 4: rank 3 issued all_reduce, rank 2 never did        -> edge 3 -> 2
    channel "world" seq 5: ranks 0,1,2 issued all_reduce, rank 3 never did  -> edges 0,1,2 -> 3
    strongly connected components: {2,3} (a cycle), {0}, {1};  sink component: {2,3}
    cycle broken by departure from the majority's (op, call site) sequence: at position 8 ranks 0,1,3 ran
    "all_reduce @ step.py:40" and rank 2 ran "all_reduce @ step.py:44"  -> culprit 2
    operation = the op on the edge *into* the culprit: tp1 seq 4 all_reduce (what rank 3 waits for)

For each channel and each rank with a pending op (issued, not completed):
  1. ``p`` = the rank's *lowest* pending seq on the channel (everything later waits behind it);
  2. missing = members whose last issued seq on the channel is below ``p``: edges rank -> missing;
  3. at every such ``p``, compare what the issuers issued: different op / dtype / size -> the minority are
     ``collective_mismatch`` culprits;
  4. if nobody is missing and all agree, the op is stuck below the Python level (transport, GPU stream):
     ranks that completed it are fine, the others are stuck there.
Example with watchdog lines (NCCL completes in order): ranks 0,1,3 time out at seq 43, rank 2 at 42 -> edges
0,1,3 -> 2 (rank 2 never issued 43); rank 2 is stuck at 42 with nobody missing -> rank 2 is the sink.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["PendingOp", "Edge", "Mismatch", "Stuck", "WaitForGraph", "build_graph", "sink_components",
           "break_cycles", "Departure", "departures", "MatchState", "compare_issuers"]


class MatchState(Enum):
    """How the ranks that issued one (channel, seq) compare."""

    MATCHED = "matched"              # same op, dtype and size everywhere
    OP_MISMATCH = "op_mismatch"      # e.g. broadcast vs all_reduce
    DTYPE_MISMATCH = "dtype_mismatch"
    SIZE_MISMATCH = "size_mismatch"  # gloo: silently wrong results; NCCL: may hang or corrupt
    UNDECIDED = "undecided"          # not enough fields to compare


@dataclass(frozen=True)
class PendingOp:
    """One rank's view of the op at the head of a channel."""

    rank: int
    chan: str
    seq: int
    name: str
    group: str | None
    group_desc: str | None
    category: str
    peer: int | None
    dtype: str | None
    shape: str | None
    nbytes: int | None
    callsite: str | None
    completed: bool
    errored: bool
    error: str | None
    source: str | None
    file: str | None
    line: int | None
    returned: bool = True   # the call came back to its caller (for NCCL and hooked backends: enqueued, DESIGN §2)


@dataclass(frozen=True)
class Edge:
    waiter: int
    waits_on: int
    op: PendingOp  # the waiter's op: what it waits for


@dataclass(frozen=True)
class Mismatch:
    chan: str
    seq: int
    state: MatchState
    minority: tuple[int, ...]
    majority: tuple[int, ...]
    ops: tuple[PendingOp, ...]


@dataclass(frozen=True)
class Stuck:
    """All members issued the same op; some or all never completed it."""

    chan: str
    seq: int
    not_completed: tuple[int, ...]
    completed: tuple[int, ...]
    ops: tuple[PendingOp, ...]


@dataclass(frozen=True)
class Unknown:
    """`rank` has no record left on the channel (its ring wrapped past them): whether it issued `op` is unknown."""

    rank: int
    op: PendingOp  # the op another rank waits in


@dataclass
class WaitForGraph:
    edges: list[Edge] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    stuck: list[Stuck] = field(default_factory=list)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    unknown: list[Unknown] = field(default_factory=list)

    def successors(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for e in self.edges:
            out.setdefault(e.waiter, set()).add(e.waits_on)
            out.setdefault(e.waits_on, set())
        return out


def _chan_members(ops: pa.Table, world: int | None) -> dict[str, tuple[int, ...]]:
    """Members of each channel: group_ranks from the groups' records, p2p pairs, else the ranks seen on it."""
    members: dict[str, set[int]] = {}
    seen = ops.select(["chan", "rank"]).group_by(["chan", "rank"], use_threads=False).aggregate([]).to_pylist()
    for r in seen:
        members.setdefault(r["chan"], set()).add(r["rank"])
    return {c: tuple(sorted(m)) for c, m in members.items()}


def build_graph(ops: pa.Table, group_ranks: dict[str, tuple[int, ...]], world: int | None,
                wrapped: frozenset[int] = frozenset()) -> WaitForGraph:
    """Wait-for graph from the OPS table (analyzers.timeline) and each group's member ranks.

    `wrapped`: ranks whose ring lost its oldest records. Such a rank with no record at all on a channel may have
    issued the op others wait in long ago: it becomes an Unknown, not an edge (a rank with a record left on the
    channel below the op really stopped there — the wrap only ever loses older records)."""
    g = WaitForGraph()
    if ops.num_rows == 0:
        return g
    keys3 = ops.select(["rank", "chan", "seq"])
    pending = keys3.filter(pc.and_(ops["issued"], pc.invert(ops["completed"])))
    if pending.num_rows == 0:
        return g
    # 1. each rank's lowest pending seq per channel, and its last issued seq per channel
    heads = pending.group_by(["rank", "chan"], use_threads=False).aggregate([("seq", "min")])
    last = keys3.filter(ops["issued"]).group_by(["rank", "chan"], use_threads=False).aggregate([("seq", "max")])
    last_by: dict[str, dict[int, int]] = {}
    for r in last.to_pylist():
        last_by.setdefault(r["chan"], {})[r["rank"]] = r["seq_max"]
    head_by: dict[str, dict[int, int]] = {}
    for r in heads.to_pylist():
        head_by.setdefault(r["chan"], {})[r["rank"]] = r["seq_min"]
    # 2. the ops at every (channel, head seq), from every rank that issued them (in ops order)
    wanted = {(c, p) for c, by_rank in head_by.items() for p in by_rank.values()}
    near = ops.filter(pc.and_(pc.is_in(ops["seq"], value_set=pa.array(sorted({p for _c, p in wanted}), pa.int64())),
                              pc.is_in(ops["chan"], value_set=pa.array(sorted(head_by), pa.string()))))
    keep = [(c, p) in wanted for c, p in zip(near["chan"].to_pylist(), near["seq"].to_pylist())]
    by_key: dict[tuple[str, int], list[PendingOp]] = {}
    of_rank: dict[tuple[str, int, int], PendingOp] = {}   # (chan, seq, rank) -> that rank's first op there
    for r in near.filter(pa.array(keep, pa.bool_())).to_pylist():
        o = PendingOp(r["rank"], r["chan"], r["seq"], r["name"], r["group"], r["group_desc"], r["category"],
                      r["peer"], r["dtype"], r["shape"], r["nbytes"], r["callsite"], bool(r["completed"]),
                      bool(r["errored"]), r["error"], r["source"], r["file"], r["line"], bool(r["returned"]))
        by_key.setdefault((r["chan"], r["seq"]), []).append(o)
        of_rank.setdefault((r["chan"], r["seq"], r["rank"]), o)
    seen_members: dict[str, tuple[int, ...]] = {}
    for chan in sorted(head_by):
        heads_c = head_by[chan]
        sample = by_key[(chan, min(heads_c.values()))][0]
        if sample.category == "p2p":
            src_dst = chan.rsplit("|", 1)[-1].split(">")
            members = tuple(sorted({int(x) for x in src_dst if x.lstrip("-").isdigit() and int(x) >= 0}))
        else:
            members = group_ranks.get(sample.group or "", ()) or _default_members(sample, world)
            if not members:  # the ranks seen on the channel (computed only when needed: a pass over all ops)
                seen_members = seen_members or _chan_members(ops, world)
                members = seen_members[chan]
        g.members[chan] = members
        last_c = last_by.get(chan, {})
        stuck_at: dict[int, list[int]] = {}
        # each member's last issued seq on the channel, once: a head's missing members are one comparison
        member_arr = np.asarray(members, dtype=np.int64)
        member_last = np.asarray([last_c.get(m, 0) for m in members], dtype=np.int64)
        for rank, p in sorted(heads_c.items()):
            op = of_rank[(chan, p, rank)]
            missing = [int(m) for m in member_arr[member_last < p] if m != rank]
            unknown = [m for m in missing if m in wrapped and m not in last_c]
            for m in missing:
                if m in unknown:
                    g.unknown.append(Unknown(m, op))
                else:
                    g.edges.append(Edge(rank, m, op))
            if not missing:
                stuck_at.setdefault(p, []).append(rank)
        for p in sorted(set(heads_c.values())):
            issued = sorted(by_key[(chan, p)], key=lambda o: o.rank)
            state, minority, majority = compare_issuers(issued)
            if state not in (MatchState.MATCHED, MatchState.UNDECIDED):
                g.mismatches.append(Mismatch(chan, p, state, minority, majority, tuple(issued)))
            elif p in stuck_at:
                stuck_here = set(stuck_at[p])
                done = tuple(m for m in members if m not in stuck_here and last_c.get(m, 0) >= p
                             and heads_c.get(m, p + 1) > p)
                g.stuck.append(Stuck(chan, p, tuple(stuck_at[p]), done, tuple(issued)))
    return g


def _default_members(op: PendingOp, world: int | None) -> tuple[int, ...]:
    if world and (op.group_desc == "default_pg" or op.group in ("0", "default_pg")):
        return tuple(range(world))
    return ()


# Ops whose per-rank input sizes differ legitimately (uneven all_to_all splits in MoE, gather/scatter roots,
# pickled objects): never a SIZE mismatch.
VARIABLE_SIZE_OPS = frozenset({"all_to_all", "all_to_all_single", "gather", "scatter", "all_gather_object",
                               "gather_object", "scatter_object_list", "broadcast_object_list", "coalesced",
                               "batch_isend_irecv"})


def compare_issuers(ops: Iterable[PendingOp]) -> tuple[MatchState, tuple[int, ...], tuple[int, ...]]:
    """Compare what each rank issued at one (channel, seq): state, minority ranks, majority ranks.

    p2p ops are not compared (a send meets a recv by design). A tie gives every side as 'minority'.
    """
    ops = [o for o in ops if o.category != "p2p"]
    if len(ops) < 2:
        return MatchState.UNDECIDED, (), tuple(o.rank for o in ops)
    checks = [(MatchState.OP_MISMATCH, lambda o: o.name), (MatchState.DTYPE_MISMATCH, lambda o: o.dtype)]
    if not any(o.name in VARIABLE_SIZE_OPS for o in ops):
        checks.append((MatchState.SIZE_MISMATCH, lambda o: o.nbytes if o.nbytes is not None else o.shape))
    for state, key in checks:
        values = [key(o) for o in ops]
        if any(v is None for v in values):
            continue
        counts = Counter(values)
        if len(counts) == 1:
            continue
        top, n = counts.most_common(1)[0]
        if list(counts.values()).count(n) > 1:  # tie: nobody is the minority
            return state, tuple(sorted(o.rank for o in ops)), ()
        return (state, tuple(sorted(o.rank for o in ops if key(o) != top)),
                tuple(sorted(o.rank for o in ops if key(o) == top)))
    return MatchState.MATCHED, (), tuple(sorted(o.rank for o in ops))


def sink_components(succ: dict[int, set[int]]) -> list[tuple[int, ...]]:
    """Strongly connected components with no edge leaving them (Tarjan, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    comps: list[tuple[int, ...]] = []
    counter = 0
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(tuple(sorted(comp)))
    comp_of = {v: c for c in comps for v in c}
    sinks = []
    for c in comps:
        if all(comp_of[w] == c for v in c for w in succ.get(v, ())):
            # a lone node that waits on nobody and nobody waits on is not part of the hang
            if len(c) == 1 and not succ.get(c[0]) and not any(c[0] in s for s in succ.values()):
                continue
            sinks.append(c)
    return sorted(sinks)


@dataclass(frozen=True)
class Departure:
    rank: int
    position: int | None   # first position where the rank's (op, call site) differs from the majority's
    ran: str | None
    majority: str | None


def departures(sequences: dict[int, list[str]]) -> dict[int, Departure]:
    """Where each rank's op sequence first departs from what most ranks ran at the same position.

    A position where no value is held by more than half of the ranks that reached it counts as a departure for
    all of them. A sequence that merely ends early (the rank is blocked) is not a departure.
    """
    out: dict[int, Departure] = {}
    longest = max((len(s) for s in sequences.values()), default=0)
    majority: list[str | None] = []
    for i in range(longest):
        vals = [s[i] for s in sequences.values() if len(s) > i]
        top, n = Counter(vals).most_common(1)[0]
        majority.append(top if n * 2 > len(vals) else None)
    for r, seq in sequences.items():
        pos = next((i for i, v in enumerate(seq) if v != majority[i]), None)
        out[r] = Departure(r, pos, seq[pos] if pos is not None else None,
                           majority[pos] if pos is not None else None)
    return out


def break_cycles(component: tuple[int, ...], deps: dict[int, Departure]) -> tuple[tuple[int, ...], float]:
    """Culprits inside one sink component and the confidence. Singletons are their own culprit."""
    if len(component) == 1:
        return component, 0.9
    positions: dict[int, int] = {r: p for r in component if r in deps and (p := deps[r].position) is not None}
    if not positions:
        return component, 0.4
    first = min(positions.values())
    culprits = tuple(sorted(r for r, p in positions.items() if p == first))
    return culprits, (0.8 if len(culprits) == 1 else 0.5)
