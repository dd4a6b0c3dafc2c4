"""The second question of `trace compare`: what did NCCL decide? Per communicator and rank: transports per peer
(P2P/IPC, P2P/CUMEM, SHM, NET/IB, NVLS ...), channels, rings and trees, nodes and local ranks, algorithms and
protocols (TUNING lines), and what it was told (NCCL_* echo lines, the network, NVLS support, P2P disabled pairs).
Compared across the two runs and between the ranks of one run: a rank that chose another path than its peers is a
known precursor of hangs.

Communicator ids are random per run, so communicators are matched across runs by size and order of creation
("8-rank communicator 1"). Logs that name no communicator (excerpts without Init lines) count as one communicator
per file. Ranks are communicator ranks, as NCCL prints them."""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import Analysis, DecisionDiff

__all__ = ["RunDecisions", "CommView", "run_decisions", "decisions_diff", "odd_ranks"]

_KINDS = ("nccl_transport", "nccl_topology", "nccl_init_start", "nccl_init_complete", "nccl_setting", "nccl_tuning")
_COMM_SETTINGS = ("ring_pxn_gdr", "p2p_type")
_CHANNELS = re.compile(r"(?<!\d)(\d+) coll channels, (?:(\d+) collnet channels, )?(\d+) nvls channels, (\d+) p2p channels, "
                       r"(\d+) p2p channels per peer")
_SUMMARY = re.compile(r"nRanks (\d+) nNodes (\d+) localRanks (\d+)")
_DETAIL_NODES = re.compile(r"localRanks=(\d+).*nNodes=(\d+)")


@dataclass
class CommView:
    """One communicator of one run, as its NCCL lines describe it; `who` keys are "rank N" (or "pid P" when the
    line names no rank)."""

    key: str
    order: tuple[int, int]
    nranks: int | None = None
    label: str = ""
    rank_host: dict[int, str] = field(default_factory=dict)
    links: dict[tuple[int, int], set[str]] = field(default_factory=lambda: defaultdict(set))   # (rank, peer) -> kinds
    per_who: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))     # what -> who -> value
    tuning: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))             # op -> ALGO/PROTO
    evidence: dict[tuple[str, str], str] = field(default_factory=dict)                        # (what, who) -> where


@dataclass
class RunDecisions:
    comms: dict[str, CommView] = field(default_factory=dict)          # label -> view
    process: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # key -> process -> value
    process_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    evidence: dict[tuple[str, str], str] = field(default_factory=dict)
    logs: int = 0                                                       # NCCL log files read

    @property
    def empty(self) -> bool:
        return not self.comms and not self.process


def _where(r: dict[str, Any]) -> str:
    f = Path(r["file"]).name if r.get("file") else "?"
    return f"{f}:{r['line']}" if r.get("line") is not None else f


def _who(r: dict[str, Any]) -> str:
    return f"rank {r['rank']}" if r.get("rank") is not None else f"pid {r.get('pid')}"


def _channels(detail: str) -> str:
    m = _CHANNELS.search(detail or "")
    if not m:
        return detail
    coll, _collnet, nvls, p2p, per_peer = m.groups()
    return f"{coll} coll, {nvls} nvls, {p2p} p2p ({per_peer} per peer)"


def run_decisions(an: Analysis) -> RunDecisions:
    """What the NCCL lines of one run say, per communicator and per process."""
    out = RunDecisions()
    obs = an.observations
    if not obs.num_rows:
        return out
    sub = obs.filter(pc.and_(pc.equal(obs["source"], "nccl"), pc.is_in(obs["kind"], value_set=pa.array(_KINDS))))
    rows = sub.select(["kind", "name", "group", "rank", "host", "pid", "detail", "value", "file", "line"]).to_pylist()
    files = sorted({r["file"] or "" for r in rows})
    out.logs = len(files)
    findex = {f: i for i, f in enumerate(files)}
    proc_ranks: dict[tuple[Any, Any], set[int]] = defaultdict(set)
    comms: dict[str, CommView] = {}
    named: dict[tuple[Any, Any], set[str]] = defaultdict(set)   # (host, pid) -> the communicators it names
    for r in rows:
        if r["group"] and not r["group"].startswith("comm:"):
            named[(r["host"], r["pid"])].add(r["group"])

    def comm_of(r: dict[str, Any]) -> CommView:
        g = r["group"]
        if not g or g.startswith("comm:"):   # a line that names no communicator: its process's only one, if so
            mine = named.get((r["host"], r["pid"]), set())
            g = next(iter(mine)) if len(mine) == 1 else None
        key = g if g else f"unnamed:{r['file']}"
        c = comms.get(key)
        order = (findex.get(r["file"] or "", 0), r["line"] or 0)
        if c is None:
            c = comms[key] = CommView(key, order)
        elif order < c.order:
            c.order = order
        return c

    for r in rows:
        kind, name, detail = r["kind"], r["name"], r["detail"] or ""
        if r["rank"] is not None and r["pid"] is not None:
            proc_ranks[(r["host"], r["pid"])].add(int(r["rank"]))
        if kind == "nccl_setting" and name not in _COMM_SETTINGS:
            who = f"{r['host']}:{r['pid']}"
            key = name or "?"
            if key.startswith("nvls_multicast"):
                key = "nvls_multicast"
                prev = out.process[key].get(who)
                detail = detail if prev is None or prev == detail else "mixed"
            elif key == "p2p_disabled":
                prev = out.process[key].get(who)
                n = (int(prev.split()[0]) if prev else 0) + 1
                detail = f"{n} GPU pair{'s' if n > 1 else ''}"
            elif key == "cuda_driver":
                continue  # a fact of the machine (context), not a decision
            out.process[key][who] = detail
            out.evidence.setdefault((key, who), _where(r))
            continue
        c = comm_of(r)
        who = _who(r)
        if r["rank"] is not None and r["host"]:
            c.rank_host[int(r["rank"])] = r["host"]
        if kind in ("nccl_init_start", "nccl_init_complete"):
            if r["value"]:
                c.nranks = int(r["value"])
            m = _DETAIL_NODES.search(detail)
            if m:
                c.per_who["nodes"][who] = f"{m.group(2)} node(s), {m.group(1)} local ranks"
        elif kind == "nccl_transport" and name and "->" in name:
            src, dst = (int(x) for x in name.split("->"))
            me = int(r["rank"]) if r["rank"] is not None else src
            peer = dst if me == src else src
            c.links[(me, peer)].add(detail)
            c.evidence.setdefault(("transport", f"rank {me}"), _where(r))
        elif kind == "nccl_topology":
            if name == "channels":
                c.per_who["channels"][who] = _channels(detail)
                c.evidence.setdefault(("channels", who), _where(r))
            elif name == "summary":
                m = _SUMMARY.search(detail)
                if m:
                    c.nranks = c.nranks or int(m.group(1))
                    c.per_who["nodes"][who] = f"{m.group(2)} node(s), {m.group(3)} local ranks"
                    c.evidence.setdefault(("nodes", who), _where(r))
            elif name == "ring":
                c.per_who["ring"][who] = detail.split("ring0=", 1)[-1]
                c.evidence.setdefault(("ring", who), _where(r))
            elif name == "tree":
                c.per_who["tree"][who] = detail.split("tree0=", 1)[-1]
        elif kind == "nccl_setting":
            c.per_who[name][who] = detail
            c.evidence.setdefault((name, who), _where(r))
        elif kind == "nccl_tuning" and name:
            c.tuning[name].add(detail.split(" ", 1)[0])
            c.evidence.setdefault((f"algorithm {name}", who), _where(r))
    for (host, pid), ranks in proc_ranks.items():
        out.process_ranks[f"{host}:{pid}"] = tuple(sorted(ranks))
    counts: Counter[int | None] = Counter()
    for c in sorted(comms.values(), key=lambda c: c.order):
        counts[c.nranks] += 1
        size = f"{c.nranks}-rank communicator" if c.nranks else "communicator"
        c.label = f"{size} {counts[c.nranks]}"
        out.comms[c.label] = c
    return out


def _compact(ranks: list[int]) -> str:
    ranks = sorted(set(ranks))
    if not ranks:
        return ""
    out, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)


def _rank_of(who: str) -> int | None:
    return int(who[5:]) if who.startswith("rank ") else None


def _whos(whos: list[str]) -> tuple[tuple[int, ...], str]:
    ranks = [r for r in (_rank_of(w) for w in whos) if r is not None]
    others = sorted(w for w in whos if _rank_of(w) is None)
    text = ", ".join(([f"rank{'s' if len(ranks) > 1 else ''} {_compact(ranks)}"] if ranks else []) + others)
    return tuple(sorted(set(ranks))), text


def _rank_kinds(c: CommView) -> dict[str, str]:
    by: dict[str, set[str]] = defaultdict(set)
    for (me, _peer), kinds in c.links.items():
        by[f"rank {me}"] |= kinds
    return {w: ", ".join(sorted(k)) for w, k in by.items()}


def _majority(values: dict[str, str]) -> str | None:
    if not values:
        return None
    counts = Counter(values.values())
    return ", ".join(sorted(v for v, n in counts.items() if n == max(counts.values())))


def _process_value(d: RunDecisions, key: str) -> str | None:
    vals = d.process.get(key)
    if not vals:
        return None
    return "; ".join(sorted(set(vals.values())))


def decisions_diff(da: RunDecisions, db: RunDecisions) -> list[DecisionDiff]:
    """NCCL's decisions side by side (scope ``runs``): per matched communicator the transports each rank used, the
    channels, nodes/local ranks, ring, trees, ring PXN/GDR, P2P type and algorithms; per process what it was told.
    Every row carries `differs`; rows that differ come first."""
    rows: list[DecisionDiff] = []
    if da.empty and db.empty:
        return rows
    for label, ca, cb in _match(da, db):
        if ca is None or cb is None:
            rows.append(DecisionDiff("runs", label, "communicator", (), "present" if ca else None,
                                     "present" if cb else None, True))
            continue
        ka, kb = _rank_kinds(ca), _rank_kinds(cb)
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for who in sorted(set(ka) & set(kb), key=lambda w: (_rank_of(w) is None, _rank_of(w) or 0, w)):
            groups[(ka[who], kb[who])].append(who)
        for (va, vb), whos in sorted(groups.items(), key=lambda kv: (kv[0][0] == kv[0][1], kv[1][0])):
            ranks, text = _whos(whos)
            ev = tuple(x for x in (ca.evidence.get(("transport", whos[0])), cb.evidence.get(("transport", whos[0])))
                       if x)
            rows.append(DecisionDiff("runs", label, "transport", ranks, va, vb, va != vb, ev, text))
        all_a = ", ".join(sorted({k for ks in ca.links.values() for k in ks})) or None
        all_b = ", ".join(sorted({k for ks in cb.links.values() for k in ks})) or None
        if all_a or all_b:
            rows.append(DecisionDiff("runs", label, "transports used (all ranks seen)", (), all_a, all_b,
                                     all_a != all_b and bool(all_a and all_b)))
        for what in sorted(set(ca.per_who) | set(cb.per_who)):
            if what == "tree":
                continue   # each rank's tree differs by design; trees are compared between ranks of one run
            va, vb = _majority(ca.per_who.get(what, {})), _majority(cb.per_who.get(what, {}))
            if va is None and vb is None:
                continue
            ev = tuple(x for x in (_first_evidence(ca, what), _first_evidence(cb, what)) if x)
            rows.append(DecisionDiff("runs", label, what, (), va, vb, va != vb and va is not None and vb is not None,
                                     ev))
        for op in sorted(set(ca.tuning) | set(cb.tuning)):
            va = ", ".join(sorted(ca.tuning.get(op, ()))) or None
            vb = ", ".join(sorted(cb.tuning.get(op, ()))) or None
            rows.append(DecisionDiff("runs", label, f"algorithm {op}", (), va, vb,
                                     va != vb and va is not None and vb is not None))
    a_logged = any(k.startswith("NCCL_") for k in da.process)   # the log prints ENV lines: a missing one was unset
    b_logged = any(k.startswith("NCCL_") for k in db.process)
    for key in sorted(set(da.process) | set(db.process)):
        va, vb = _process_value(da, key), _process_value(db, key)
        if key.startswith("NCCL_"):   # an ENV echo line missing from a log that prints them: not set there
            va = va if va is not None or not a_logged else "(not set)"
            vb = vb if vb is not None or not b_logged else "(not set)"
        ev = tuple(x for x in (next((v for (k, _w), v in da.evidence.items() if k == key), None),
                               next((v for (k, _w), v in db.evidence.items() if k == key), None)) if x)
        rows.append(DecisionDiff("runs", "(every process)", key, (), va, vb,
                                 va != vb and va is not None and vb is not None, ev))
    rows.sort(key=lambda r: not r.differs)
    return rows


def _match(da: RunDecisions, db: RunDecisions) -> list[tuple[str, CommView | None, CommView | None]]:
    """Communicators of A and B paired: the same label (size and order of creation) first, then the rest in order
    of creation (an excerpt may not say a communicator's size); what is left has no partner."""
    left_a = [lab for lab in da.comms if lab not in db.comms]
    left_b = [lab for lab in db.comms if lab not in da.comms]
    out: list[tuple[str, CommView | None, CommView | None]] = [
        (lab, da.comms[lab], db.comms[lab]) for lab in da.comms if lab in db.comms]
    for la, lb in zip(left_a, left_b):
        out.append((f"{la} (A) / {lb} (B)", da.comms[la], db.comms[lb]))
    out += [(lab, da.comms[lab], None) for lab in left_a[len(left_b):]]
    out += [(lab, None, db.comms[lab]) for lab in left_b[len(left_a):]]
    return out


def _first_evidence(c: CommView, what: str) -> str | None:
    return next((v for (w, _who), v in c.evidence.items() if w == what), None)


def _link_class(c: CommView, me: int, peer: int) -> str:
    ha, hb = c.rank_host.get(me), c.rank_host.get(peer)
    if ha is None or hb is None:
        return "intra-node" if len(set(c.rank_host.values())) <= 1 else "unknown"
    return "intra-node" if ha == hb else "inter-node"


def odd_ranks(d: RunDecisions, scope: str) -> list[DecisionDiff]:
    """Ranks (or processes) of one run that decided differently from the others (scope ``within_a``/``within_b``):
    a link whose transport differs from the other links of its class (intra-node links are compared with
    intra-node links, inter-node with inter-node: NET across nodes is expected), channels, nodes/local ranks,
    ring PXN/GDR or P2P type that differ from the majority, and processes told different NCCL_* settings."""
    rows: list[DecisionDiff] = []
    for label, c in d.comms.items():
        by_class: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        for (me, peer), kinds in c.links.items():
            by_class[_link_class(c, me, peer)].append((me, peer, ", ".join(sorted(kinds))))
        for cls, links in by_class.items():
            counts = Counter(k for _m, _p, k in links)
            if len(counts) < 2:
                continue
            top, n_top = counts.most_common(1)[0]
            tie = list(counts.values()).count(n_top) > 1
            odd: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for me, peer, k in links:
                if k != top or tie:
                    odd[k].append((me, peer))
            for k, pairs in sorted(odd.items()):
                if k == top and not tie:
                    continue
                ranks = tuple(sorted({me for me, _p in pairs}))
                who = ", ".join(f"{me}->{p}" for me, p in sorted(pairs))
                ev = tuple(x for x in (c.evidence.get(("transport", f"rank {ranks[0]}")),) if x)
                rows.append(DecisionDiff(scope, label, f"transport ({cls} links)", ranks,
                                         "no majority" if tie else top, k, True, ev, f"links {who}"))
        for what, by_who in c.per_who.items():
            if what in ("ring",) or len(by_who) < 2:
                continue
            if what == "tree":
                continue
            counts = Counter(by_who.values())
            if len(counts) < 2:
                continue
            top, n_top = counts.most_common(1)[0]
            tie = list(counts.values()).count(n_top) > 1
            odd_who: dict[str, list[str]] = defaultdict(list)
            for who, v in by_who.items():
                if v != top or tie:
                    odd_who[v].append(who)
            for v, whos in sorted(odd_who.items()):
                ranks, text = _whos(whos)
                ev = tuple(x for x in (c.evidence.get((what, whos[0])),) if x)
                rows.append(DecisionDiff(scope, label, what, ranks, "no majority" if tie else top, v, True, ev, text))
    for key, by_proc in d.process.items():
        procs = set(d.process_ranks) | set(by_proc) if key.startswith("NCCL_") else set(by_proc)
        if len(procs) < 2:
            continue
        values = {p: by_proc.get(p, "(not set)") for p in procs}
        counts = Counter(values.values())
        if len(counts) < 2:
            continue
        top, n_top = counts.most_common(1)[0]
        tie = list(counts.values()).count(n_top) > 1
        for v in sorted(set(values.values())):
            if v == top and not tie:
                continue
            procs_v = sorted(p for p, x in values.items() if x == v)
            ranks = tuple(sorted({r for p in procs_v for r in d.process_ranks.get(p, ())}))
            text = ", ".join(f"{p} (rank{'s' if len(d.process_ranks.get(p, ())) > 1 else ''} "
                             f"{_compact(list(d.process_ranks[p]))})" if d.process_ranks.get(p) else p
                             for p in procs_v)
            ev = tuple(x for x in (d.evidence.get((key, procs_v[0])),) if x)
            rows.append(DecisionDiff(scope, "(every process)", key, ranks, "no majority" if tie else top, v, True, ev,
                                     text))
    return rows
