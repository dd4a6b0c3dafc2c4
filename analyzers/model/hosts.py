"""Which host each rank ran on, when a run spans hosts (issue #19): a verdict names the global rank and its host
("rank 37 on node-4"), and ranks are grouped by host rather than listed one by one.

A host is a ``<run>/<host>/`` directory of the run (its name: the --host-label, or hostname + boot id). It is shown
by its label, or by its plain hostname when that alone tells the run's hosts apart. The directories of several trace
runs on one machine (Slurm's one trace run per task: ``<host>.<localid>``) are one host. A rank's host is the directory
its own records (ring or events.arrow rows) or meta.json's pid -> rank map came from.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import HostRun
from ranktrace.analyzers.verdict import compact_ranks

__all__ = ["rank_hosts", "display_names", "where_text", "by_host"]


def display_names(hosts: Iterable[HostRun]) -> dict[str, str]:
    """Host dir name -> the name shown: its label, or its hostname when that tells the run's machines apart (the
    directories of several trace runs on one machine — Slurm tasks, ``<host>.<task>`` — are one host)."""
    hosts = list(hosts)
    plain: dict[str, tuple[str, str | None]] = {}
    for h in hosts:
        meta = h.meta or {}
        name = h.host_dir.name
        if meta.get("host_label"):
            plain[name] = (str(meta["host_label"]), None)
        elif meta.get("hostname") and name.startswith(f"{meta['hostname']}-"):
            plain[name] = (str(meta["hostname"]), str(meta.get("host_key") or re.sub(r"\.\d+$", "", name)))
        else:
            plain[name] = (name, None)
    machines: dict[str, set] = {}
    for shown, key in plain.values():
        machines.setdefault(shown, set()).add(key if key is not None else object())
    return {n: (shown if len(machines[shown]) == 1 else n) for n, (shown, _key) in plain.items()}


def rank_hosts(hosts: Iterable[HostRun], events: pa.Table) -> dict[int, str]:
    """Global rank -> the name its host is shown by; {} unless the run has two host dirs or more."""
    hosts = list(hosts)
    if len({h.host_dir.name for h in hosts}) < 2:
        return {}
    names = display_names(hosts)
    out: dict[int, str] = {}
    for h in hosts:
        for info in ((h.meta or {}).get("pids") or {}).values():
            if isinstance(info, Mapping) and info.get("rank") is not None:
                out.setdefault(int(info["rank"]), names[h.host_dir.name])
    if events.num_rows:
        ours = events.select(["host", "rank"]).filter(pc.and_(
            pc.fill_null(pc.equal(events["source"], "events"), False), pc.is_valid(events["rank"])))
        pairs = ours.group_by(["host", "rank"], use_threads=False).aggregate([])
        for host, rank in zip(pairs["host"].to_pylist(), pairs["rank"].to_pylist()):
            if host in names:
                out.setdefault(int(rank), names[host])
    return out


def by_host(ranks: Iterable[int], where: Mapping[int, str]) -> list[tuple[str | None, list[int]]]:
    """`ranks` grouped by host, hosts in the order of their lowest rank (None: host unknown)."""
    groups: dict[str | None, list[int]] = {}
    for r in sorted(set(ranks)):
        groups.setdefault(where.get(r), []).append(r)
    return sorted(groups.items(), key=lambda kv: kv[1][0])


def where_text(ranks: Iterable[int], where: Mapping[int, str], limit: int = 4) -> str:
    """'rank 37 on node-4' / 'ranks 32-39 on node-4, ranks 40-47 on node-5' / '... and 3 more hosts'; "" when no
    host is known."""
    groups = [(h, rs) for h, rs in by_host(ranks, where) if h is not None]
    if not groups:
        return ""
    parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {compact_ranks(rs)} on {h}" for h, rs in groups[:limit]]
    if len(groups) > limit:
        parts.append(f"and {len(groups) - limit} more hosts")
    return ", ".join(parts)

