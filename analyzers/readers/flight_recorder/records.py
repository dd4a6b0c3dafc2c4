"""Typed Flight Recorder records (``FrEntry``, ``PgConfig``) from the raw dump dict: where FR's field names and
their quirks across versions and backends are known (tolerant coercion, gloo's unnamed default-group config)."""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PgConfig", "FrEntry", "Expander", "to_int", "text", "parse_entry", "pg_configs"]


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
        if not isinstance(v, (list, tuple)) or not self._take(len(v)):
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
    return FrEntry(
        index=index,
        record_id=to_int(raw.get("record_id")),
        pg_id=to_int(raw.get("pg_id")),
        group=group,
        group_desc=desc,
        profiling_name=name,
        collective_seq_id=to_int(raw.get("collective_seq_id")),
        p2p_seq_id=to_int(raw.get("p2p_seq_id")),
        op_id=to_int(raw.get("op_id")),
        is_p2p=raw.get("is_p2p") if isinstance(raw.get("is_p2p"), bool) else None,
        state=raw.get("state") if isinstance(raw.get("state"), str) else None,
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
