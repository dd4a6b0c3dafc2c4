"""The bound on what a Kineto trace keeps (#31: 2M collectives took 234 s and 12.7 GB, one kept op and three rows
each). What the analysis asks of a trace is, per group, the collectives around its end (which were issued, which
completed, where the ranks part), how many there were, and where the window began: so per group the first HEAD and
last TAIL ops are kept as ops, the ones in between only counted, and the seq of a kept op still counts them all."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Hashable

__all__ = ["HEAD", "TAIL", "MAX_GROUPS", "Window", "Kept"]

HEAD = 500            # first ops of a group kept
TAIL = 5000           # last ops of a group kept
MAX_GROUPS = 64       # groups (and p2p pairs) given that window; the others keep their last SMALL_TAIL
SMALL_TAIL = 16
MAX_KEYS = 10_000     # past this many, the ops of a new group are only counted


@dataclass
class Kept:
    """What one group (a key of the reader's own, before the trace's process-group table is known) kept."""

    head: list[tuple[float, int, Any]] = field(default_factory=list)   # max-heap by (-ts, -index)
    tail: list[tuple[float, int, Any]] = field(default_factory=list)   # min-heap by (ts, index)
    count: int = 0
    head_cap: int = HEAD
    tail_cap: int = TAIL

    @property
    def middle(self) -> int:
        return self.count - len(self.head) - len(self.tail)


class Window:
    """Ops pushed in any order; every group keeps its HEAD earliest and TAIL latest (by start time) and counts the
    rest, so at any moment head <= middle <= tail in time."""

    def __init__(self) -> None:
        self.groups: dict[Hashable, Kept] = {}
        self.uncounted_keys = 0          # ops of groups past MAX_KEYS: counted here only

    def add(self, key: Hashable, ts: float, index: int, op: Any) -> None:
        k = self.groups.get(key)
        if k is None:
            if len(self.groups) >= MAX_KEYS:
                self.uncounted_keys += 1
                return
            small = len(self.groups) >= MAX_GROUPS
            k = self.groups[key] = Kept(head_cap=0 if small else HEAD, tail_cap=SMALL_TAIL if small else TAIL)
        k.count += 1
        item: tuple[float, int, Any] = (ts, index, op)
        if len(k.tail) < k.tail_cap:
            heapq.heappush(k.tail, item)
            return
        if k.tail_cap and (ts, index) > k.tail[0][:2]:
            item = heapq.heapreplace(k.tail, item)   # the tail's earliest moves on towards the head
        if k.head_cap == 0:
            return
        neg = (-item[0], -item[1], item[2])
        if len(k.head) < k.head_cap:
            heapq.heappush(k.head, neg)
        elif neg[:2] > k.head[0][:2]:                # earlier than the head's latest: that one goes to the middle
            heapq.heapreplace(k.head, neg)

    def kept(self) -> list[tuple[Hashable, list[Any], list[Any], int]]:
        """(key, head ops, tail ops, ops between them) per group, head and tail in time order."""
        out = []
        for key, k in self.groups.items():
            head = [op for _ts, _i, op in sorted((-a, -b, op) for a, b, op in k.head)]
            tail = [op for _ts, _i, op in sorted(k.tail, key=lambda t: t[:2])]
            out.append((key, head, tail, k.middle))
        return out

    @property
    def summarised(self) -> int:
        return sum(k.middle for k in self.groups.values()) + self.uncounted_keys
