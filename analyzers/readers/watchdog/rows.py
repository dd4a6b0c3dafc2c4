"""Watchdog lines to rows: each timeout gets its process group (from its own line, a repeat of it, or the status
line of the same rank and sequence number), one ``enter`` per timed-out work, one ``watchdog_pg_status`` per
distinct counter set, and ``rank_space`` where a rank is only known inside its group."""
from __future__ import annotations

from typing import Any, cast

from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.watchdog.scan import Ctx, Status, Timeout, rank_key

__all__ = ["OPTYPE_NAMES", "build"]

#: torch ``opTypeToString`` spellings that ``canonical_op`` does not map by itself.
OPTYPE_NAMES: dict[str, str] = {
    "_ALLGATHER_BASE": "all_gather_into_tensor",
    "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
    "ALLTOALL_BASE": "all_to_all_single",
    "ALLTOALL": "all_to_all",
    "ALLGATHER_COALESCED": "all_gather_coalesced",
    "ALLREDUCE_COALESCED": "all_reduce_coalesced",
    "_ALLREDUCE_SPARSE": "all_reduce",
    "RECVANYSOURCE": "recv",
    "COALESCED": "coalesced",
}
_P2P_TYPES = frozenset({"SEND", "RECV", "RECVANYSOURCE"})


def _op_name(optype: str) -> str:
    return OPTYPE_NAMES.get(optype) or canonical_op(optype)


def build(file: str, timeouts: list[Timeout], statuses: list[Status],
          skipped: list[Skipped]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(EVENTS rows, OBSERVATIONS rows) of the lines read; notes on what cannot be aligned go to ``skipped``."""
    # 1. PG of each timeout: from its own line, a repeat of it with a PG prefix, or the status line of the same
    #    rank whose failed sequence number is this SeqNum.
    for t in timeouts:
        if t.ctx.pg is not None:
            continue
        key, seq = rank_key(t.ctx), t.f.get("seq")
        cands = [o.ctx for o in timeouts if o.ctx.pg is not None and rank_key(o.ctx) == key
                 and o.f.get("seq") == seq and o.f.get("optype") == t.f.get("optype")]
        if not cands and seq is not None:
            cands = [s.ctx for s in statuses if s.ctx.pg is not None and rank_key(s.ctx) == key
                     and s.failed_seq == int(seq)]
        if not cands and seq is not None and t.ctx.grank is not None:
            cands = [s.ctx for s in statuses if s.ctx.pg is not None and s.ctx.grank == t.ctx.grank
                     and s.ctx.pgrank == t.ctx.pgrank and s.failed_seq == int(seq)]
        if not cands:
            # the file names one process group only: a timeout that does not state its PG is in that one
            pgs = {(o.ctx.pg, o.ctx.pg_desc, o.ctx.pg_id)
                   for o in cast("list[Timeout | Status]", [*timeouts, *statuses]) if o.ctx.pg is not None}
            if len(pgs) == 1:
                pg, desc, pg_id = pgs.pop()
                t.ctx.pg, t.ctx.pg_desc, t.ctx.pg_id = pg, desc, pg_id
                continue
        if cands:
            src = cands[0]
            t.ctx.pg, t.ctx.pg_desc, t.ctx.pg_id = src.pg, src.pg_desc, src.pg_id
            if t.ctx.pgrank is None:
                t.ctx.pgrank = src.pgrank
    # 2. one event per (rank, PG, SeqNum, OpType): the exception text repeats the timeout line
    seen: set[tuple[Any, ...]] = set()
    events: list[dict[str, Any]] = []
    obs: list[dict[str, Any]] = []
    space_seen: set[tuple[Any, ...]] = set()
    no_pg_noted = False
    for t in timeouts:
        c = t.ctx
        k = (rank_key(c), c.pg, t.f.get("seq"), t.f["optype"])
        if k in seen:
            continue
        seen.add(k)
        optype = t.f["optype"]
        seq = int(t.f["seq"]) if "seq" in t.f else None
        started = max((s.started for s in statuses if s.started is not None and rank_key(s.ctx) == rank_key(c)
                       and s.ctx.pg == c.pg), default=None)
        state = "started" if seq is not None and started is not None and started >= seq else "scheduled"
        nin, nout = t.f.get("numel_in"), t.f.get("numel_out")
        if "shape" in t.f:
            shape: str | None = t.f["shape"]
        elif nin is not None:
            shape = f"[{nin}]" if nin == nout or nout is None else f"[{nin}]->[{nout}]"
        else:
            shape = None
        parts = [f"{k2}={t.f[k2]}" for k2 in ("timeout_ms", "numel_in", "numel_out") if k2 in t.f]
        if t.ran_ms:
            parts.append(f"ran_ms={t.ran_ms}")
        if c.pg_id is not None:
            parts.append(f"pg_id={c.pg_id}")
        if c.grank is not None and c.pgrank is not None:
            parts.append(f"pg_rank={c.pgrank}")
        if c.log_time:
            parts.append(f"log_time={c.log_time}")
        rank = c.grank if c.grank is not None else c.pgrank
        events.append(dict(
            host=c.host, pid=c.pid, rank=rank, kind="enter", name=_op_name(optype),
            category="p2p" if optype in _P2P_TYPES else "collective", group=c.pg, group_desc=c.pg_desc,
            backend="nccl", seq=seq, backend_seq=seq, shape=shape, state=state,
            error=(f"watchdog timeout: WorkNCCL(OpType={optype}) ran for {t.ran_ms or '?'} ms "
                   f"(timeout {t.f.get('timeout_ms', '?')} ms)") if t.error is None else
                  f"async exception: WorkNCCL(OpType={optype}) raised {t.error}",
            detail=" ".join(parts), source="watchdog", file=file, line=t.line))
        if seq is None:
            skipped.append(Skipped(file, t.line, "timeout without SeqNum (torch < 1.10): cannot align with "
                                                 "other ranks"))
        if c.pg is None and not no_pg_noted:
            no_pg_noted = True
            skipped.append(Skipped(file, t.line, "process group of the timed-out (or failed) work is not stated (no "
                                                 "PG status line with its sequence number): group left null"))
        _rank_space(obs, space_seen, c, file, t.line)
    # 3. PG status observations, one per distinct (rank, PG, counters)
    st_seen: set[tuple[Any, ...]] = set()
    for s in statuses:
        c = s.ctx
        k = (rank_key(c), c.pg, s.enq, s.comp, s.started, s.failed_seq)
        if k in st_seen:
            continue
        st_seen.add(k)
        detail = f"enqueued={s.enq} completed={s.comp}"
        if s.started is not None:
            detail += f" started={s.started}"
        if s.failed_seq is not None:
            detail += f" failed_seq={s.failed_seq}"
        detail += f" trigger={s.trigger}"
        if s.from_:
            detail += f" from={s.from_.replace(' ', '')}"
        if c.log_time:
            detail += f" log_time={c.log_time}"
        obs.append(dict(host=c.host, pid=c.pid, rank=c.grank if c.grank is not None else c.pgrank,
                        kind="watchdog_pg_status", name=s.trigger, group=c.pg, detail=detail, value=s.comp,
                        source="watchdog", file=file, line=s.line))
        _rank_space(obs, space_seen, c, file, s.line)
    return events, obs


def _rank_space(obs: list[dict[str, Any]], seen: set[tuple[Any, ...]], c: Ctx, file: str, line: int) -> None:
    """A rank known only as a PG rank: say in which space it lives."""
    if c.grank is not None or c.pgrank is None:
        return
    k = (c.pg, c.pgrank)
    if k in seen:
        return
    seen.add(k)
    space = "global" if c.pg_desc == "default_pg" else f"pg:{c.pg if c.pg is not None else 'unknown'}"
    obs.append(dict(host=c.host, pid=c.pid, rank=c.pgrank, kind="rank_space", group=c.pg, detail=space,
                    source="watchdog", file=file, line=line))
