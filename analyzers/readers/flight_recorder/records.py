"""Typed Flight Recorder records (``FrEntry``, ``PgConfig``) from the raw dump dict: where FR's field names and
their quirks across versions and backends are known (tolerant coercion, gloo's unnamed default-group config)."""
from __future__ import annotations

import ast
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable

from ranktrace.tracer.formats.opnames import P2P_OPS, canonical_op

__all__ = ["PgConfig", "FrEntry", "Expander", "EntryWindow", "to_int", "text", "parse_entry", "pg_configs",
           "HEAD", "TAIL", "MAX_GROUPS", "SMALL_TAIL", "MAX_KEYS", "MAX_LOOKED", "MAX_FRAMES"]

# #31: what one dump may cost. A 400 KB pickle of 200k references to one entry took 7.5 s and 780 MB (2M: ~80 s),
# every entry parsed and turned into rows; a dump's entries are now windowed per process group before any parsing.
HEAD = 500            # first entries of a group (record order) kept
TAIL = 5000           # last entries of a group kept (torch's ring holds 2,000 by default: a real dump fits whole)
MAX_GROUPS = 64       # groups (and their p2p) given that window; the others keep their last SMALL_TAIL
SMALL_TAIL = 16
MAX_KEYS = 10_000     # past this many groups, the entries of a new group are only counted
MAX_LOOKED = 2_000_000  # entries of one dump looked at at all: the first and last million
MAX_FRAMES = 256      # frames of one entry looked at (the call site is the first outside torch)


# --------------------------------------------------------------------------------------------- typed records

@dataclass(frozen=True)
class PgConfig:
    """One ``pg_config`` item."""

    name: str
    desc: str | None
    ranks: tuple[int, ...] | None


@dataclass(frozen=True)
class FrEntry:
    """One FR entry, typed (raw dicts stay inside this module)."""

    index: int
    record_id: int | None
    pg_id: int | None
    group: str | None
    group_desc: str | None
    profiling_name: str
    collective_seq_id: int | None
    p2p_seq_id: int | None
    op_id: int | None
    is_p2p: bool | None
    state: str | None
    time_created_ns: int | None
    time_started_ns: int | None
    time_completed_ns: int | None
    duration_ms: float | None
    input_sizes: tuple[tuple[int, ...], ...] | None
    input_dtypes: tuple[str, ...] | None
    timeout_ms: int | None
    retired: bool | None
    thread_name: str | None
    frames: tuple[tuple[str, str, int], ...]


def to_int(v: Any) -> int | None:
    """int from int / numeric string; None for None, "", 0-as-unknown handled by callers."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


@dataclass
class _Kept:
    head: list[tuple[int, Any]] = field(default_factory=list)
    tail: deque[tuple[int, Any]] = field(default_factory=deque)
    count: int = 0
    head_cap: int = HEAD

    @property
    def middle(self) -> int:
        return self.count - len(self.head) - len(self.tail)


class EntryWindow:
    """The raw entries of one dump, per process group (collectives and p2p apart) its first HEAD and last TAIL in
    record order, the rest only counted: one cheap look per entry (its group, whether it is p2p), no parsing. FR
    writes each entry's own seq, so a kept entry's seq stays true whatever was left out."""

    def __init__(self) -> None:
        self.groups: dict[Hashable, _Kept] = {}
        self.total = 0
        self.uncounted_keys = 0          # entries of groups past MAX_KEYS: counted here only
        self.unlooked = (0, 0)           # (first index, count) of the entries past MAX_LOOKED: not looked at

    @staticmethod
    def key(raw: Any) -> Hashable:
        if not isinstance(raw, dict):
            return None
        pg = raw.get("process_group")
        g = text(pg[0]) if isinstance(pg, (list, tuple)) and pg else None
        name = raw.get("profiling_name")
        p2p = raw.get("is_p2p") is True or (isinstance(name, str) and canonical_op(name[:500]) in P2P_OPS)
        return (g, p2p)

    def _group(self, raw: Any) -> _Kept | None:
        key = self.key(raw)
        k = self.groups.get(key)
        if k is None and len(self.groups) < MAX_KEYS:
            small = len(self.groups) >= MAX_GROUPS
            k = self.groups[key] = _Kept(head_cap=0 if small else HEAD,
                                         tail=deque(maxlen=SMALL_TAIL if small else TAIL))
        return k

    def add_all(self, raw_entries: list[Any]) -> None:
        """Window every raw entry. One object referenced by many entries (a pickle's memo: 2 bytes an entry) is
        looked at once: its group is remembered by identity (for the first 4,096 objects)."""
        by_id: dict[int, _Kept | None] = {}
        n = self.total = len(raw_entries)
        half = MAX_LOOKED // 2
        looked: Any = enumerate(raw_entries)
        if n > MAX_LOOKED:
            self.unlooked = (half, n - 2 * half)
            looked = itertools.chain(enumerate(raw_entries[:half]), enumerate(raw_entries[n - half:], n - half))
        for index, raw in looked:
            i = id(raw)
            if i in by_id:
                k = by_id[i]
            else:
                k = self._group(raw)
                if len(by_id) < 4096:
                    by_id[i] = k
            if k is None:
                self.uncounted_keys += 1
                continue
            k.count += 1
            if len(k.head) < k.head_cap:
                k.head.append((index, raw))
            else:
                k.tail.append((index, raw))

    @property
    def summarised(self) -> int:
        return sum(k.middle for k in self.groups.values()) + self.uncounted_keys

    def kept(self) -> list[tuple[int, Any]]:
        """(index in the dump, raw entry) of every kept entry, in record order."""
        out = [item for k in self.groups.values() for item in (*k.head, *k.tail)]
        out.sort(key=lambda t: t[0])
        return out

    def note(self) -> str | None:
        """The one line saying which entries were only counted (None when none was)."""
        if not self.summarised and not self.unlooked[1]:
            return None
        middles = sorted(((k, v.middle) for k, v in self.groups.items() if v.middle), key=lambda kv: -kv[1])
        groups = ", ".join(f"{_key_text(k)}: {n:,}" for k, n in middles[:3])
        more = f" and {len(middles) - 3} more" if len(middles) > 3 else ""
        counted = self.summarised - self.uncounted_keys
        out = (f"{self.total:,} Flight Recorder entries: the first {HEAD:,} and last {TAIL:,} of each process group "
               f"are kept, {counted:,} in between only counted" + (f" ({groups}{more})" if groups else ""))
        if self.uncounted_keys:
            out += f"; {self.uncounted_keys:,} entries of groups past the first {MAX_KEYS:,} only counted"
        first, unlooked = self.unlooked
        if unlooked:
            out += (f"; entries {first:,}-{first + unlooked - 1:,} ({unlooked:,}) are not looked at, the first and "
                    f"last {MAX_LOOKED // 2:,} are")
        return (out + f"; the seq of a kept entry is FR's own and stays true (the bound: {HEAD + TAIL:,} entries per "
                      f"group per dump, {SMALL_TAIL} past the first {MAX_GROUPS} groups"
                      + (f", {MAX_LOOKED:,} entries looked at" if unlooked else "") + ")")


def _key_text(key: Hashable) -> str:
    """``group 0``, ``group 1 p2p``, ``entries that are no dict``: a window key as the note says it."""
    if not isinstance(key, tuple):
        return "entries that are no dict"
    group, p2p = key
    return (f"group {group}" if group is not None else "no group") + (" p2p" if p2p else "")


class Expander:
    """Turns one dump's raw values into typed ones, each shared object once (by identity), within a budget.

    A pickle stores a shared object once and refers to it by memo: 300 entries that share one 20000-frame list cost
    a few KB on disk, and expanding the list per entry costs gigabytes. Here a list seen before yields the same
    tuple again, and no more than BUDGET elements are expanded per dump in all (past it, frames and sizes are
    dropped, said once in ``note``)."""

    BUDGET = 2_000_000

    def __init__(self) -> None:
        self.left = self.BUDGET
        self.note: str | None = None
        self._memo: dict[tuple[str, int], Any] = {}
        self._keep: list[Any] = []   # the raw objects whose ids are keys (alive for the dump's read)

    def _take(self, n: int) -> bool:
        if n > self.left:
            self.left = 0
            self.note = (f"Flight Recorder dump expands past {self.BUDGET:,} frames/sizes (shared references): the "
                         "rest of its frames and sizes are not read")
            return False
        self.left -= n
        return True

    def cached(self, kind: str, v: Any, make: Any) -> Any:
        if not isinstance(v, (list, tuple, dict)):
            return make(v)
        key = (kind, id(v))
        if key not in self._memo:
            self._keep.append(v)
            self._memo[key] = make(v)
        return self._memo[key]

    def frames(self, v: Any) -> tuple[tuple[str, str, int], ...]:
        return self.cached("frames", v, self._frames)

    def sizes(self, v: Any) -> tuple[tuple[int, ...], ...] | None:
        return self.cached("sizes", v, self._sizes)

    def dtypes(self, v: Any) -> tuple[str, ...] | None:
        return self.cached("dtypes", v, lambda d: tuple(text(x) for x in d) if isinstance(d, (list, tuple)) and
                           self._take(len(d)) else None)

    def _frames(self, v: Any) -> tuple[tuple[str, str, int], ...]:
        if not isinstance(v, (list, tuple)):
            return ()
        v = v[:MAX_FRAMES]   # cut before any per-frame work: the call site is near the top
        if not self._take(len(v)):
            return ()
        return tuple(self.cached("frame", fr, _frame) for fr in v if isinstance(fr, dict))

    def _sizes(self, v: Any) -> tuple[tuple[int, ...], ...] | None:
        if not isinstance(v, (list, tuple)) or not self._take(len(v)):
            return None
        out = []
        for s in v:
            t = self.cached("dims", s, self._dims)
            if t is None:
                return None
            out.append(t)
        return tuple(out)

    def _dims(self, s: Any) -> tuple[int, ...] | None:
        if not isinstance(s, (list, tuple)) or not self._take(len(s)) or not all(isinstance(d, int) for d in s):
            return None
        return tuple(s)


def _frame(fr: dict[str, Any]) -> tuple[str, str, int]:
    return (text(fr.get("name", "?")), text(fr.get("filename", "?")), to_int(fr.get("line")) or 0)


def text(v: Any, limit: int = 500) -> str:
    """str() of a raw value, bounded: a string is cut at `limit`; a container is shown as a bounded repr, never
    expanded (a 2^40-leaf nest of shared lists is a few bytes of pickle)."""
    if isinstance(v, str):
        return v[:limit]
    if v is None or isinstance(v, (bool, int, float)):
        return str(v)[:limit]
    out: list[str] = []
    budget = [limit]

    def walk(x: Any, depth: int) -> None:
        if budget[0] <= 0:
            return
        if isinstance(x, (list, tuple)) and depth < 8:
            out.append("[")
            for i, y in enumerate(x):
                if i:
                    out.append(", ")
                budget[0] -= 2
                if budget[0] <= 0 or i >= 64:
                    out.append("...")
                    break
                walk(y, depth + 1)
            out.append("]")
        else:
            s = repr(x) if isinstance(x, str) else (str(x) if x is None or isinstance(x, (bool, int, float))
                                                      else f"<{type(x).__name__}>")
            s = s[:max(budget[0], 0)]
            budget[0] -= len(s)
            out.append(s)

    walk(v, 0)
    return "".join(out)[:limit]


def _time(v: Any) -> int | None:
    """FR discovery times: None in pickle, 0 in JSON mean unknown."""
    t = to_int(v)
    return t if t else None


def parse_entry(raw: Any, index: int, expand: Expander | None = None) -> FrEntry | str:
    """A typed entry, or the reason it cannot be used (`expand`: the dump's Expander, shared by its entries)."""
    x = expand if expand is not None else Expander()
    if not isinstance(raw, dict):
        return f"entry {index} is a {type(raw).__name__}, not a dict"
    name = raw.get("profiling_name")
    if not isinstance(name, str) or not name:
        return f"entry {index} has no profiling_name"
    pg = raw.get("process_group")
    group = desc = None
    if isinstance(pg, (list, tuple)) and pg:
        group = text(pg[0])
        desc = text(pg[1]) if len(pg) > 1 and pg[1] is not None else None
    dtypes = raw.get("input_dtypes")
    duration = raw.get("duration_ms")
    state = raw.get("state")
    return FrEntry(
        index=index,
        record_id=to_int(raw.get("record_id")),
        pg_id=to_int(raw.get("pg_id")),
        group=group,
        group_desc=desc,
        profiling_name=name[:500],
        collective_seq_id=to_int(raw.get("collective_seq_id")),
        p2p_seq_id=to_int(raw.get("p2p_seq_id")),
        op_id=to_int(raw.get("op_id")),
        is_p2p=raw.get("is_p2p") if isinstance(raw.get("is_p2p"), bool) else None,
        state=state[:40] if isinstance(state, str) else None,
        time_created_ns=_time(raw.get("time_created_ns")),
        time_started_ns=_time(raw.get("time_discovered_started_ns")),
        time_completed_ns=_time(raw.get("time_discovered_completed_ns")),
        duration_ms=float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
        input_sizes=x.sizes(raw.get("input_sizes")),
        input_dtypes=x.dtypes(dtypes),
        timeout_ms=to_int(raw.get("timeout_ms")),
        retired=raw.get("retired") if isinstance(raw.get("retired"), bool) else None,
        thread_name=text(raw["thread_name"]) if raw.get("thread_name") is not None else None,
        frames=x.frames(raw.get("frames")),
    )


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str):
        if len(v) > 1 << 20:
            return None
        try:
            v = ast.literal_eval(v.strip()) if v.strip() else None
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple, set)) and len(v) <= 1 << 20 and all(isinstance(r, int) for r in v):
        return tuple(v) if v else None
    return None


def pg_configs(raw: Any, entries: list[FrEntry]) -> dict[str, PgConfig]:
    """pg name -> config; gloo's unnamed ("") config is attached to the group the entries name without config."""
    out: dict[str, PgConfig] = {}
    unnamed: list[PgConfig] = []
    if isinstance(raw, dict):
        for key, cfg in raw.items():
            if not isinstance(cfg, dict):
                continue
            name = text(cfg.get("name") or key or "")
            pc = PgConfig(name=name, desc=(text(cfg["desc"]) if cfg.get("desc") else None),
                          ranks=_parse_ranks(cfg.get("ranks")))
            if name:
                out[name] = pc
            else:
                unnamed.append(pc)
    if len(unnamed) == 1:
        named_by_entries: dict[str, str | None] = {}
        for e in entries:
            if e.group is not None and e.group not in out:
                named_by_entries.setdefault(e.group, e.group_desc)
        default = [g for g, d in named_by_entries.items() if d == "default_pg"]
        target = default[0] if default else (next(iter(named_by_entries)) if len(named_by_entries) == 1 else None)
        if target is None and not named_by_entries and "0" not in out:
            target = "0"  # no entries at all: gloo's default group is named "0"
        if target is not None:
            u = unnamed[0]
            out[target] = PgConfig(name=target, desc=u.desc or named_by_entries.get(target) or "default_pg",
                                   ranks=u.ranks)
    return out
