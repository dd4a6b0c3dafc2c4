"""Typed Flight Recorder records (``FrEntry``, ``PgConfig``) from the raw dump dict: where FR's field names and
their quirks across versions and backends are known (tolerant coercion, gloo's unnamed default-group config)."""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PgConfig", "FrEntry", "to_int", "parse_entry", "pg_configs"]


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


def _time(v: Any) -> int | None:
    """FR discovery times: None in pickle, 0 in JSON mean unknown."""
    t = to_int(v)
    return t if t else None


def _sizes(v: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(v, (list, tuple)):
        return None
    out = []
    for s in v:
        if not isinstance(s, (list, tuple)) or not all(isinstance(d, int) for d in s):
            return None
        out.append(tuple(s))
    return tuple(out)


def _frames(v: Any) -> tuple[tuple[str, str, int], ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    out = []
    for fr in v:
        if isinstance(fr, dict):
            out.append((str(fr.get("name", "?")), str(fr.get("filename", "?")), to_int(fr.get("line")) or 0))
    return tuple(out)


def parse_entry(raw: Any, index: int) -> FrEntry | str:
    """A typed entry, or the reason it cannot be used."""
    if not isinstance(raw, dict):
        return f"entry {index} is a {type(raw).__name__}, not a dict"
    name = raw.get("profiling_name")
    if not isinstance(name, str) or not name:
        return f"entry {index} has no profiling_name"
    pg = raw.get("process_group")
    group = desc = None
    if isinstance(pg, (list, tuple)) and pg:
        group = str(pg[0])
        desc = str(pg[1]) if len(pg) > 1 and pg[1] is not None else None
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
        input_sizes=_sizes(raw.get("input_sizes")),
        input_dtypes=tuple(str(d) for d in dtypes) if isinstance(dtypes, (list, tuple)) else None,
        timeout_ms=to_int(raw.get("timeout_ms")),
        retired=raw.get("retired") if isinstance(raw.get("retired"), bool) else None,
        thread_name=str(raw["thread_name"]) if raw.get("thread_name") is not None else None,
        frames=_frames(raw.get("frames")),
    )


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v.strip()) if v.strip() else None
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple, set)) and all(isinstance(r, int) for r in v):
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
            name = str(cfg.get("name") or key or "")
            pc = PgConfig(name=name, desc=(str(cfg["desc"]) if cfg.get("desc") else None),
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
