"""Records -> rows: ``rank_exit`` per worker that ended, ``completion`` when the agent says the group finished,
``init_failure`` (rendezvous) and ``transport_error`` (an agent that lost the rendezvous store)."""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.readers.common.torch_text import SIGNALS, clip, exit_kind
from ranktrace.analyzers.readers.torch_elastic.scan import Exit, Finished, RankMap, RendezvousFailure, Stopped

__all__ = ["build"]

_CONSEQUENCE = {"closing": "terminated_by=agent (torchelastic stops the other workers after one failed)",
                "spawn_term": "terminated_by=spawn (torch.multiprocessing stops the other processes)",
                "event_term": "terminated_by=agent (torchelastic's TERMINATED record: stopped after another failed)"}


def build(records: list[object], file: str, source: str, rdzv_timeout_s: int | None) -> list[dict[str, Any]]:
    """
    One worker is often reported several times (``failed (exitcode: -9) local_rank: 0 (pid: 484375)`` by the agent,
    then the same pid in ChildFailedError's table with its global rank): rows are merged per pid, keeping the global
    rank and the line that states most. A local rank becomes a global rank only through the agent's own "Rendezvous
    complete for workers" result in the same input (one such result; several agents' results do not say which node a
    line came from).

    Exit codes: negative = killed by that signal (``-9`` -> ``signal`` 9; ``-11`` -> ``segfault`` 11); a spawn
    "terminated with signal SIGKILL" the same; a positive code -> ``exit`` with that code.
    """
    maps = [r for r in records if isinstance(r, RankMap)]
    local_to_global: dict[int, int] = {}
    if len({(m.local_ranks, m.global_ranks) for m in maps}) == 1:
        local_to_global = dict(zip(maps[0].local_ranks, maps[0].global_ranks))
    obs: list[dict[str, Any]] = []
    exits: dict[object, dict[str, Any]] = {}
    seen: set[tuple[Any, ...]] = set()
    for r in records:
        if isinstance(r, Exit):
            row = _exit_row(r, local_to_global, file, source)
            key: object = ("pid", r.pid) if r.pid is not None else ("rank", row["rank"], r.how, r.line)
            old = exits.get(key)
            if old is None or _better(row, old):
                exits[key] = row
        elif isinstance(r, Finished):
            k = ("completion", r.who.host)
            if k not in seen:
                seen.add(k)
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=None, kind="completion", name="exit_ok",
                                detail=clip(r.text), source=source, file=file, line=r.line))
        elif isinstance(r, Stopped):
            k = ("stopped", r.who.host, r.signal)
            if k not in seen:
                seen.add(k)
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=None, kind="stopped", name="signal", value=r.signal,
                                detail=clip(r.text), source=source, file=file, line=r.line))
        elif isinstance(r, RendezvousFailure):
            k = ("rdzv", r.error, r.keep_alive)
            if k in seen:
                continue
            seen.add(k)
            if r.keep_alive:
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=None, kind="transport_error",
                                name="connection_closed", detail=clip("rendezvous keep-alive failed: " + r.text),
                                source=source, file=file, line=r.line))
            else:
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=None, kind="init_failure", name="rendezvous",
                                value=rdzv_timeout_s, detail=clip(r.text), source=source, file=file, line=r.line))
    obs.extend(sorted(exits.values(), key=lambda o: o["line"]))
    return obs


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """The row to keep of two for one pid: the one with a global rank, else the root cause, else the first."""
    if (new["rank"] is not None) != (old["rank"] is not None):
        return new["rank"] is not None
    return "root_cause=yes" in new["detail"] and "root_cause=yes" not in old["detail"]


def _exit_row(r: Exit, local_to_global: dict[int, int], file: str, source: str) -> dict[str, Any]:
    rank = r.rank
    parts: list[str] = []
    if rank is None and r.local_rank is not None and r.local_rank in local_to_global:
        rank = local_to_global[r.local_rank]
        parts.append("rank_from=rendezvous_result")
    if r.signal is not None:
        sig = SIGNALS.get(r.signal)
        name, value = ("segfault" if sig == 11 else "signal"), sig
    elif r.exitcode is not None:
        name, value = exit_kind(r.exitcode)
    elif r.how == "spawn_error":
        name, value = "exception", None
    else:
        name, value = "exit", None
    if r.how in _CONSEQUENCE:
        parts.append(_CONSEQUENCE[r.how])
    for k, v in (("pid", r.pid), ("local_rank", r.local_rank), ("exitcode", r.exitcode), ("signal", r.signal),
                 ("host", r.host)):
        if v is not None:
            parts.append(f"{k}={v}")
    if r.root_cause:
        parts.append("root_cause=yes")
    parts.append(f"via={r.how}")
    if r.text:
        parts.append(clip(r.text, 200))
    return dict(host=r.host or r.who.host, pid=r.pid, rank=rank, kind="rank_exit", name=name, value=value,
                detail=" ".join(parts), source=source, file=file, line=r.line)
