"""Process groups as the ring knows them: each recorded once, counted per group, and watched for ops we never saw.

Part of TraceState (tracestate.py). The backend's own counter, read before and after every traced op, shows ops
Python never issued through us (DDP's reducer, functional collectives, compiled graphs) as `untraced_ops` marks.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from .recorder import Recorder
from .slotwriter import C_COLL, MARK, N32, N64, SlotWriter

__all__ = ["GroupBook", "GroupEntry", "counter_reader", "UNTRACED", "MAX_GAP_NOTES", "WORK_PURGE"]

UNTRACED = "untraced_ops"
MAX_GAP_NOTES = 32  # untraced_ops marks with a readable detail in the meta region; later ones go to op slots
WORK_PURGE = 4096   # weak work -> op entries kept before dead ones are swept

# (weakref to the pg, name id, name, member ranks, backend counter reader or None, backend is gloo)
GroupEntry = tuple


class GroupBook:
    """Groups, seq counters, backend-counter baselines and async Work handles of TraceState."""

    # from TraceState
    rec: Recorder
    put: SlotWriter
    c10d: Any
    name_id: Callable[[str], int]
    local: Any

    def init_groups(self) -> None:
        self.groups: dict[int, GroupEntry] = {}
        self.seq: dict[Any, int] = {}  # per group name, per (group, src, dst) for p2p, per --hook group
        self.bseq_last: dict[int, int] = {}  # group name id -> backend counter after our last op on it
        self.gap_notes = 0
        self.works: dict[int, tuple[Any, ...]] = {}

    def forget_groups(self) -> None:
        """In a forked child: group entries, counter baselines and handles are the parent's (seq counters stay:
        the child inherits the parent's position in every group)."""
        self.groups.clear()
        self.works.clear()
        self.bseq_last.clear()
        self.gap_notes = 0

    def group(self, pg: Any) -> GroupEntry:
        """Cached group entry of a ProcessGroup (see GroupEntry); records the group in the ring the first time."""
        hit = self.groups.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit
        c10d = self.c10d
        name = getattr(pg, "group_name", None) or str(id(pg))
        try:
            ranks = list(c10d.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        try:
            backend = str(c10d.get_backend(pg))
        except Exception:
            backend = None
        desc = getattr(pg, "group_desc", None)
        self.rec.meta({"type": "group", "name": name, "desc": desc, "backend": backend, "ranks": ranks})
        nid = self.rec.intern(name)
        reader = counter_reader(pg)
        # A weak reference: holding the ProcessGroup would keep it alive past destroy_process_group and make
        # gloo/NCCL tear it down at interpreter exit instead (seen here: std::terminate, SIGABRT).
        entry = (weakref.ref(pg), nid, name, ranks, reader, backend == "gloo")
        self.groups[id(pg)] = entry
        return entry

    def group_info(self, pg: Any) -> tuple[int, str, list[int] | None]:
        g = self.group(pg)
        return g[1], g[2], g[3]

    def check_gap(self, g: GroupEntry, pg: Any, callsite: int, tid: int) -> None:
        """Before a traced op: if the backend counter moved since the last traced op ended, someone issued ops we
        did not see — say so in the ring."""
        reader = g[4]
        if reader is None:
            return
        try:
            now = reader(pg)
        except Exception:
            return
        last = self.bseq_last.get(g[1])
        if last is not None and now > last:
            self.untraced(g, last, now, callsite, tid)
        self.bseq_last[g[1]] = now

    def untraced(self, g: GroupEntry, before: int, now: int, callsite: int, tid: int) -> None:
        """An untraced_ops mark: readable detail in the meta region for the first MAX_GAP_NOTES, then op-slot marks
        (backend_seq = the counter now) so a DDP loop's one gap per step never fills the meta region."""
        if self.gap_notes < MAX_GAP_NOTES:
            self.gap_notes += 1
            rec = self.rec
            rec.meta({"type": "event", "kind": "mark", "name": UNTRACED, "category": "collective", "group": g[2],
                      "t_ns": rec.clock(), "tid": tid, "backend_seq": now, "backend_seq_before": before,
                      "detail": f"backend_seq jumped from {before} to {now} on group {g[2]}: {now - before} op(s) "
                                f"issued outside Python (DDP reducer, functional collectives, compiled graphs)"})
        else:
            self.put(MARK, C_COLL, 0, self.name_id(UNTRACED), g[1], callsite, 0, 0, 0, N32, N32, N64, now, N64, 0,
                     0, tid)

    def rebaseline(self, check: bool) -> None:
        """Around init/destroy calls and graph captures (which issue ops of their own on existing groups): with
        check, report what moved since the last traced op; then take every live group's counter as the new base."""
        tid = self.local.tid
        for key, g in list(self.groups.items()):
            pg = g[0]()
            if pg is None:
                self.groups.pop(key, None)
                continue
            if check:
                self.check_gap(g, pg, 0, tid)
            elif g[4] is not None:
                try:
                    self.bseq_last[g[1]] = g[4](pg)
                except Exception:
                    self.bseq_last.pop(g[1], None)

    def register_work(self, work: Any, op: tuple[Any, ...]) -> None:
        """Remember which op a Work handle belongs to, weakly (Work objects take no attributes), for Work.wait."""
        works = self.works
        if len(works) >= WORK_PURGE:
            for k in [k for k, v in works.items() if v[0]() is None]:
                del works[k]
        try:
            works[id(work)] = (weakref.ref(work),) + op
        except TypeError:  # not weak-referenceable: do not risk a stale id match
            pass


def counter_reader(pg: Any) -> Callable[[Any], int] | None:
    """pg -> backend counter, or None when this group has none (then no backend_seq and no gap check)."""
    fn = getattr(type(pg), "_get_sequence_number_for_group", None)
    if fn is None:
        return None
    try:
        fn(pg)
    except Exception:
        return None
    return fn
