"""The analysis model, built once from the readers' records before any rule runs: each rule is a function of a
``Model`` alone, with no files, environment or process table (which processes are alive comes in as
``values.Liveness``; records the window left out come through ``records.MoreRecords``, asked here and nowhere
else). The inputs are never changed: clock alignment and a widened window make new tables."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model import clocks, hosts, hoststate, phases as phases_mod, timeline, waitfor
from ranktrace.analyzers.model.records import MAX_WORLD, Inputs, MoreRecords, Prefixes
from ranktrace.analyzers.model.values import JobStatus, Liveness, OpenSpan
from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.schema import RING_WRAPPED

__all__ = ["Model", "build_model", "JobStatus"]


@dataclass(frozen=True)
class Model:
    """What every rule reads, and nothing else: the job's events, its ops and the wait-for graph between ranks, each
    rank's latest stack and host-side state, its phase, and how the job itself ended. Built by ``build_model``."""

    inputs: Inputs                 # the readers' records as merged (clock-aligned where a run spans hosts)
    events: pa.Table               # tracer.formats.schema.EVENTS: every reader's events, plus NCCL RAS's as events
    ops: pa.Table                  # timeline.build_ops: one row per (rank, channel, seq) op, issued/returned/completed
    graph: waitfor.WaitForGraph    # who waits on whom at each rank's pending head
    group_ranks: dict[str, tuple[int, ...]]  # process group name -> its member ranks (global numbering)
    world: int | None              # the job's world size, the largest any input states (None: nobody said)
    observed_ranks: set[int]       # ranks some input says something about: the only ones a verdict may blame
    open_spans: list[OpenSpan]     # calls entered and never left, every rank's
    stacks: dict[int, hoststate.RankStack]   # rank -> its latest stack (hang-time dump or our own sample)
    host_states: dict[int, str]    # rank -> hoststate.classify of that stack ("in_collective", "lock_wait", ...)
    phases: dict[int, str]         # rank -> the phase it is in now (or was in last)
    job: JobStatus                 # how the job ended, from our own meta.json, and who was alive
    open_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # of open_spans in events
    rank_pids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    unranked_pids: tuple[int, ...] = ()   # traced processes that imported torch.distributed but never got a rank
    anon_stacks: list[hoststate.RankStack] = field(default_factory=list)  # processes dumped with no rank at all
    ledger: list[Any] = field(default_factory=list)           # analyzers.phases: every rank's start-up phases
    current: dict[int, Any] = field(default_factory=dict)     # rank -> the PhaseEntry it is in now (or last)
    roles: dict[int, str] = field(default_factory=dict)       # rank -> "DP1 TP3 EP3"
    as_of_ns: int | None = None                               # when the evidence was looked at (open phases end here)
    rank_exits: dict[int, str] = field(default_factory=dict)  # how a rank's process ended, when it recorded it
    exits_after_stop: frozenset[int] = frozenset()  # ranks whose recorded exit came after the job was stopped
    rank_hosts: dict[int, str] = field(default_factory=dict)   # a run across hosts: rank -> host (analyzers.hosts)
    host_clocks: dict[str, clocks.HostClock] = field(default_factory=dict)  # host dir name -> its clock
    # rank -> where its op sequence departs from the majority's; built only when the wait-for graph has a cycle
    departures: dict[int, waitfor.Departure] = field(default_factory=dict)

    def open_by_rank(self) -> dict[int, OpenSpan]:
        """Innermost (latest) open span per rank, preferring the rank's main process."""
        out: dict[int, OpenSpan] = {}
        for s in self.open_spans:
            if s.rank is not None:
                out[s.rank] = s
        return out

    def observations(self, kind: str) -> list[dict[str, Any]]:
        obs = self.inputs.observations
        if obs.num_rows == 0:
            return []
        return obs.filter(pc.equal(obs["kind"], kind)).to_pylist()



def _departures(ops: pa.Table, more: MoreRecords | None) -> dict[int, waitfor.Departure]:
    """Per-rank (op, call site) sequences in issue order, compared with the majority (cycle breaking).

    Built only when the wait-for graph has a cycle. The same answer as ``waitfor.departures`` on the per-rank label
    lists, vectorised: majority label per position by counting (position, label) pairs. Where the window left a
    rank's earlier ops out, they are asked for through `more`.
    """
    ops = ops.select(["rank", "t_enter", "seq", "name", "callsite"]).filter(ops["issued"]).sort_by(
        [("rank", "ascending"), ("t_enter", "ascending"), ("seq", "ascending")])
    if ops.num_rows == 0:
        return {}
    if ops["rank"].null_count or ops["name"].null_count:  # None ranks or names: the plain version
        seqs: dict[int, list[str]] = {}
        for r, n, c in zip(ops["rank"].to_pylist(), ops["name"].to_pylist(), ops["callsite"].to_pylist()):
            seqs.setdefault(r, []).append(f"{n} @ {c}" if c else n)
        return waitfor.departures(seqs)
    with_site = pc.fill_null(pc.not_equal(ops["callsite"], ""), False)  # "name @ callsite", or the name alone
    label = pc.if_else(with_site, pc.binary_join_element_wise(ops["name"], ops["callsite"], " @ "), ops["name"])
    enc = pc.dictionary_encode(label)
    labels = enc.chunk(0).dictionary.to_pylist() if enc.num_chunks else []
    code = np.asarray(pa.chunked_array([c.indices for c in enc.chunks], pa.int32()).to_numpy(), dtype=np.int64)
    rank = np.asarray(ops["rank"].to_numpy(), dtype=np.int64)
    prefixes = more.earlier_ops() if more is not None else {}
    if prefixes:  # ranks' earlier ops were left out of the window: put them in front
        rank, code, labels = _with_earlier_ops(rank, code, labels, prefixes)
    return _majority_departures(rank, code, labels)


def _with_earlier_ops(rank: np.ndarray, code: np.ndarray, labels: list[str | None],
                      prefixes: Prefixes) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Each rank's full sequence: what it ran before its window (records.Prefixes: codes into a table of their own,
    and how many of its kept ops are among them) followed by its kept ops from there on."""
    table: dict[str | None, int] = {x: i for i, x in enumerate(labels)}
    ranks, codes = [], []
    starts = np.flatnonzero(np.concatenate(([True], rank[1:] != rank[:-1])))
    for a, b in zip(starts.tolist(), np.append(starts[1:], len(rank)).tolist()):
        r = int(rank[a])
        mine = code[a:b]
        got = prefixes.get(r)
        if got is not None:
            pcodes, ptable, n_kept = got
            remap = np.array([table.setdefault(x, len(table)) for x in ptable], dtype=np.int64)
            mine = np.concatenate([remap[pcodes], mine[n_kept:]])
        ranks.append(np.full(len(mine), r, dtype=np.int64))
        codes.append(mine)
    return np.concatenate(ranks), np.concatenate(codes), list(table)


def _majority_departures(rank: np.ndarray, code: np.ndarray,
                         labels: list[str | None]) -> dict[int, waitfor.Departure]:
    """_departures' counting, on (rank, label code) per op, ranks sorted and each rank's ops in order."""
    starts = np.flatnonzero(np.concatenate(([True], rank[1:] != rank[:-1])))  # ranks are sorted
    length = np.diff(np.append(starts, len(rank)))
    pos = np.arange(len(rank)) - np.repeat(starts, length)  # position in the rank's own sequence
    # how many ranks ran each label at each position; the majority needs more than half of those there
    pair, counts = np.unique(pos * len(labels) + code, return_counts=True)
    pair_pos, pair_code = pair // len(labels), pair % len(labels)
    reached = np.bincount(pos)
    best = np.zeros(len(reached), dtype=np.int64)
    np.maximum.at(best, pair_pos, counts)
    win = (counts == best[pair_pos]) & (counts * 2 > reached[pair_pos])
    majority = np.full(len(reached), -1, dtype=np.int64)
    majority[pair_pos[win]] = pair_code[win]
    off = np.where(code != majority[pos], pos, len(reached))
    first_off = np.minimum.reduceat(off, starts)
    out: dict[int, waitfor.Departure] = {}
    for r, start, p in zip(rank[starts].tolist(), starts.tolist(), first_off.tolist()):
        if p >= len(reached):
            out[r] = waitfor.Departure(r, None, None, None)
        else:
            m = int(majority[p])
            out[r] = waitfor.Departure(r, p, labels[int(code[start + p])], labels[m] if m >= 0 else None)
    return out


def _ras_events(obs: pa.Table) -> pa.Table:
    """NCCL RAS per-rank op counts -> the same op rows the wait-for engine reads (no second matcher).

    A rank at count c has issued op c of that communicator; ranks at the highest count cannot complete it until
    the others catch up, and every op below a rank's count has completed on it.
    """
    if obs.num_rows == 0:
        return schema.empty(schema.EVENTS)
    ras = obs.filter(pc.equal(obs["kind"], "ras_op_count")).to_pylist()
    rows: list[dict[str, Any]] = []
    by_comm: dict[str, list[dict[str, Any]]] = {}
    for r in ras:
        if r["rank"] is not None and r["value"] is not None:
            by_comm.setdefault(r["group"] or "", []).append(r)
    for comm, rs in by_comm.items():
        top = max(r["value"] for r in rs)
        ranks = sorted({r["rank"] for r in rs})
        for r in rs:
            base = {"rank": r["rank"], "name": r["name"] or "collective", "category": "collective", "group": comm,
                    "group_ranks": ranks, "backend": "nccl", "seq": r["value"], "source": "ras", "file": r["file"],
                    "line": r["line"], "detail": f"RAS op count {r['value']}"}
            rows.append({**base, "kind": "enter"})
            if r["value"] < top:
                rows.append({**base, "kind": "complete"})
    return schema.table_from_rows(schema.EVENTS, rows)


def _job_status(inputs: Inputs, liveness: Liveness | None) -> JobStatus:
    """The job's fate from meta.json; which processes are alive from `liveness` alone. A host dir the capture side
    did not look at (liveness None: an offline analysis; another machine's) leaves the state unknown."""
    if not inputs.hosts:
        return JobStatus(False, False, None, None)
    ended = all(h.ended for h in inputs.hosts)
    codes = [(h.meta or {}).get("exit") or {} for h in inputs.hosts]
    exit_code = max((int(x) for c in codes if (x := c.get("exit_code")) is not None), default=None)
    sig = next((c.get("signal") for c in codes if c.get("signal")), None)
    seen = [None if liveness is None else liveness.pids_at(h.host_dir) for h in inputs.hosts]
    known = all(pids is not None for pids in seen)
    live = sorted({p for pids in seen if pids for p in pids}) if not ended else []
    killed = any(c.get("killed_on_hang") for c in codes)
    interrupted = min((c["interrupted_wall_ns"] for c in codes if c.get("interrupted")
                       and isinstance(c.get("interrupted_wall_ns"), int)), default=None)
    lost = [(h.meta or {}).get("launcher_lost") for h in inputs.hosts if not h.ended]
    lost_ns = min((x.get("wall_ns") or 0 for x in lost if isinstance(x, dict)), default=None)
    stopped = min((c["stopped_wall_ns"] for c in codes if isinstance(c.get("stopped_wall_ns"), int)), default=None)
    stop = stopped if stopped is not None else interrupted
    return JobStatus(True, ended, exit_code, sig, tuple(live), known, killed, interrupted, lost_ns,
                     None if stop is None else stop - STOP_SLACK_NS)


def _group_ranks(events: pa.Table) -> dict[str, tuple[int, ...]]:
    """Each group's member ranks, from the last event row that carries both the group and its ranks."""
    if events.num_rows == 0:
        return {}
    rows = np.flatnonzero(np.asarray(pc.and_(pc.is_valid(events["group"]), pc.is_valid(events["group_ranks"]))
                                     .to_numpy(), dtype=bool))
    if rows.size == 0:
        return {}
    enc = pc.dictionary_encode(events["group"])  # one dictionary shared by all chunks
    indices = pa.chunked_array([c.indices for c in enc.chunks], pa.int32())
    codes = np.asarray(pc.fill_null(indices, -1).to_numpy(), dtype=np.int64)[rows]
    last = np.full(len(enc.chunk(0).dictionary), -1, dtype=np.int64)
    np.maximum.at(last, codes, rows)  # list columns cannot be aggregated: find each group's last row by index
    table = events.select(["group", "group_ranks"])
    out: dict[str, tuple[int, ...]] = {}
    for r in pa.concat_tables([table.slice(int(i), 1) for i in last if i >= 0]).to_pylist():
        if r["group_ranks"]:
            out[r["group"]] = tuple(r["group_ranks"])
    return out


def _op_pids(events: pa.Table, rank_pids: dict[int, set[int]]) -> dict[int, int]:
    """rank -> the pid that issued its latest op (collective, p2p, init records): its real process now — not a
    helper that inherited RANK (those may write a ring too, but issue nothing), and not the dead first attempt of
    an elastic restart. Only ranks with several pids are looked at (a pass over their events alone: most jobs have
    none)."""
    shared = sorted(p for pids in rank_pids.values() if len(pids) > 1 for p in pids)
    if not events.num_rows or not shared:
        return {}
    mine = events.filter(pc.is_in(events["pid"], value_set=pa.array(shared, pa.int64())))
    ops = mine.filter(pc.and_(pc.is_valid(mine["rank"]),
                              pc.is_in(mine["category"], value_set=pa.array(["collective", "p2p", "init"]))))
    if not ops.num_rows:
        return {}
    latest = ops.group_by(["rank", "pid"], use_threads=False).aggregate([("t_ns", "max")])
    best: dict[int, tuple[int, int]] = {}
    for r, p, t in zip(latest["rank"].to_pylist(), latest["pid"].to_pylist(), latest["t_ns_max"].to_pylist()):
        t = t if t is not None else -1
        if r not in best or t > best[r][1]:
            best[r] = (p, t)
    return {r: p for r, (p, _t) in best.items()}


def _wrapped(events: pa.Table) -> frozenset[int]:
    """Ranks whose ring wrapped (readers.ranktrace_ring's ring_wrapped mark)."""
    if not events.num_rows:
        return frozenset()
    marks = events.filter(pc.equal(events["kind"], "mark"))  # few rows: the name test runs on those alone
    marks = marks.filter(pc.equal(marks["name"], RING_WRAPPED))
    return frozenset(r for r in marks["rank"].to_pylist() if r is not None)


def build_model(inputs: Inputs, liveness: Liveness | None, more: MoreRecords | None = None) -> Model:
    """Everything the rules need, once. `liveness`: which processes the capture side saw alive (None: nobody
    looked, so an unfinished run's state is unknown). `more`: how to ask for our own records the window left out
    (None: what `inputs` holds is all there is)."""
    events = schema.concat(schema.EVENTS, [inputs.events, _ras_events(inputs.observations)])
    host_clocks = clocks.estimate(events)  # a run across hosts: every wall time on one clock (none for one host)
    if host_clocks:
        events = clocks.align(events, host_clocks)
        inputs = dataclasses.replace(inputs, stacks=clocks.align(inputs.stacks, host_clocks),
                                     observations=clocks.align(inputs.observations, host_clocks))
    ops = timeline.build_ops(events)
    wanted = more.wanted(ops) if more is not None else frozenset()
    if wanted:  # an op the wait-for graph compares lay outside the window of a rank's records: read again with it
        again = more.with_ops(wanted)  # type: ignore[union-attr]
        inputs = dataclasses.replace(inputs, events=again.events, window=again.window)
        events = clocks.align(schema.concat(schema.EVENTS, [inputs.events, _ras_events(inputs.observations)]),
                              host_clocks)
        ops = timeline.build_ops(events)
    group_ranks = _group_ranks(events)
    worlds = [w for w in (inputs.world_size,) if w]
    if events.num_rows and events["world"].null_count < events.num_rows:
        worlds.append(pc.max(events["world"]).as_py())
    for h in inputs.hosts:
        for info in ((h.meta or {}).get("pids") or {}).values():
            if info.get("world"):
                worlds.append(info["world"])
    init_worlds = events.select(["detail"]).filter(pc.and_(pc.equal(events["name"], "init_process_group"),
                                                           pc.is_valid(events["detail"])))
    for d in init_worlds["detail"].to_pylist():
        for part in d.split(", "):
            if part.startswith("world=") and part[6:].lstrip("-").isdigit() and int(part[6:]) > 0:
                worlds.append(int(part[6:]))
    worlds = [w for w in worlds if isinstance(w, int) and 0 < w <= MAX_WORLD]  # beyond: a damaged field, not a job
    world = max(worlds) if worlds else None
    observed: set[int] = set()
    for t in (events, inputs.stacks, inputs.observations):
        if t.num_rows and t["rank"].null_count < t.num_rows:
            observed.update(pc.unique(t["rank"].drop_null()).to_pylist())
    rank_pids: dict[int, set[int]] = {}
    unranked: set[int] = set()
    job = _job_status(inputs, liveness)
    ring_rank: dict[int, int | None] = {}
    if events.num_rows:
        pr = events.select(["pid", "rank"]).filter(pc.equal(events["source"], "events")).group_by(
            ["pid"], use_threads=False).aggregate([("rank", "max")])
        for pid, rank in zip(pr["pid"].to_pylist(), pr["rank_max"].to_pylist()):
            ring_rank[pid] = rank
            if rank is not None:
                rank_pids.setdefault(rank, set()).add(pid)
            else:
                unranked.add(pid)
    for h in inputs.hosts:  # the rings' rank wins (a DP replica's ranks are moved apart: analyzers/model/dpworlds.py)
        for pid, info in ((h.meta or {}).get("pids") or {}).items():
            if info.get("rank") is not None and ring_rank.get(int(pid)) in (None, info["rank"]):
                rank_pids.setdefault(info["rank"], set()).add(int(pid))
    parents: set[int] = set()
    if job.traced:
        for h in inputs.hosts:  # processes with a ring but no rank (a launcher, or a rank that never initialised)
            for pid, info in ((h.meta or {}).get("pids") or {}).items():
                if info.get("rank") is None:
                    unranked.add(int(pid))
                elif info.get("ppid"):
                    parents.add(int(info["ppid"]))
    unranked -= parents  # mp.spawn / torchrun parents are launchers, not ranks
    stacks = hoststate.latest_stacks(_current_stacks(inputs.stacks, events), _op_pids(events, rank_pids))
    host_states = {r: hoststate.classify(s.frames, s.thread_state) for r, s in stacks.items()}
    open_rows = timeline.open_enter_rows(events)
    as_of = _as_of_ns(inputs, liveness, events)
    ledger = phases_mod.build_ledger(events, as_of)
    current = phases_mod.current_phases(ledger)
    phase_names = timeline.last_phase(events)
    phase_names.update({r: p.name for r, p in current.items()})
    graph = waitfor.build_graph(ops, group_ranks, world, _wrapped(events))
    cycle = any(len(c) > 1 for c in waitfor.sink_components(graph.successors())) if graph.edges else False
    return Model(
        inputs=inputs, events=events, ops=ops, graph=graph, departures=_departures(ops, more) if cycle else {},
        group_ranks=group_ranks, world=world, observed_ranks=observed, open_spans=timeline.open_spans(events, open_rows),
        stacks=stacks, host_states=host_states, phases=phase_names, job=job, open_rows=open_rows,
        rank_pids={r: tuple(sorted(p)) for r, p in rank_pids.items()}, unranked_pids=tuple(sorted(unranked)),
        anon_stacks=hoststate.unranked_stacks(inputs.stacks) if not stacks else [],
        ledger=ledger, current=current, roles=_roles(events), as_of_ns=as_of,
        rank_exits=_rank_exits(events, _op_pids(events, rank_pids)),
        exits_after_stop=_exits_after(events, job.ended_from_outside_ns),
        rank_hosts=hosts.rank_hosts(inputs.hosts, events), host_clocks=host_clocks,
    )


def _as_of_ns(inputs: Inputs, liveness: Liveness | None, events: pa.Table) -> int | None:
    """The time the evidence describes: when the capture side looked, else the run's end, else its last event."""
    if liveness is not None and not all(h.ended for h in inputs.hosts):
        return int(liveness.checked_at * 1e9)
    ends = [(h.meta or {}).get("end_wall_ns") for h in inputs.hosts]
    if ends and all(ends):
        return max(int(e) for e in ends if e)
    if events.num_rows and events["wall_ns"].null_count < events.num_rows:
        return pc.max(events["wall_ns"]).as_py()
    return None


def _roles(events: pa.Table) -> dict[int, str]:
    if events.num_rows == 0:
        return {}
    ids = events.filter(pc.equal(events["kind"], "identity"))
    return {r["rank"]: r["detail"] for r in ids.select(["rank", "detail"]).to_pylist()
            if r["rank"] is not None and r["detail"]}


def _current_stacks(stacks: pa.Table, events: pa.Table) -> pa.Table:
    """Stack samples that still say where a rank is: a sample taken before the rank's latest own record (an op,
    a phase, its exit) is history (the watchdog samples ranks from start-up on: an importlib tree long gone), never
    its state now. Dumps with no time are kept."""
    if stacks.num_rows == 0 or events.num_rows == 0 or stacks["wall_ns"].null_count == stacks.num_rows:
        return stacks
    own = events.filter(pc.and_(pc.is_valid(events["rank"]), pc.is_valid(events["wall_ns"])))
    if own.num_rows == 0:
        return stacks
    last = own.group_by(["rank"], use_threads=False).aggregate([("wall_ns", "max")])
    latest = dict(zip(last["rank"].to_pylist(), last["wall_ns_max"].to_pylist()))
    ranks, walls = stacks["rank"].to_pylist(), stacks["wall_ns"].to_pylist()
    keep = [w is None or r is None or r not in latest or w >= latest[r] for r, w in zip(ranks, walls)]
    return stacks if all(keep) else stacks.filter(pa.array(keep, pa.bool_()))


_EXIT_CODE = re.compile(r"exit code (-?\d+)|os\._exit\((?:status=)?(-?\d+)")


#: how long before trace run's own record of a stop the signal may already have reached the job. A scheduler's or a
#: terminal's signal reaches every process at once, and trace run stamps it when its Python handler runs, after
#: its main thread gets back to Python: a rank's exit mark 6 ms "before the stop" was the stop's doing.
STOP_SLACK_NS = 2_000_000_000


def _exits_after(events: pa.Table, stop_ns: int | None) -> frozenset[int]:
    """Ranks whose every process_exit mark came at or after `stop_ns` (trace run forwarded a stop, or --on-hang
    kill): they exited because the job was stopped; their state at the hang is what the verdict shows."""
    if stop_ns is None or events.num_rows == 0:
        return frozenset()
    marks = events.filter(pc.and_(pc.equal(events["name"], "process_exit"), pc.is_valid(events["rank"])))
    before: set[int] = set()
    after: set[int] = set()
    for r, w in zip(marks["rank"].to_pylist(), marks["wall_ns"].to_pylist()):
        (after if w is not None and w >= stop_ns else before).add(r)
    return frozenset(after - before)


def _rank_exits(events: pa.Table, op_pid: dict[int, int]) -> dict[int, str]:
    """rank -> how its process ended, from its ring's process_exit marks (an exit code when one was recorded);
    a rank's helper processes (same RANK, no ops) do not speak for it."""
    if events.num_rows == 0:
        return {}
    marks = events.filter(pc.and_(pc.equal(events["name"], "process_exit"), pc.is_valid(events["rank"])))
    if marks.num_rows == 0:
        return {}
    issuers = events.filter(pc.and_(pc.is_valid(events["rank"]), pc.is_in(
        events["category"], value_set=pa.array(["collective", "p2p", "init"]))))
    own = {(r, p) for r, p in zip(issuers["rank"].to_pylist(), issuers["pid"].to_pylist())}
    out: dict[int, tuple[int, str]] = {}
    for r, p, d in zip(marks["rank"].to_pylist(), marks["pid"].to_pylist(), marks["detail"].to_pylist()):
        if (r, p) not in own or (op_pid.get(r) is not None and op_pid[r] != p):
            continue
        m = _EXIT_CODE.search(d or "")
        text = f"exit code {m.group(1) or m.group(2)}" if m else (d or "exited")
        score = 2 if m else 1
        if r not in out or score > out[r][0]:
            out[r] = (score, text)
    return {r: t for r, (_s, t) in out.items()}
