"""Records -> the rows of docs/EVIDENCE.md: what each c10d statement says, in the common tables."""
from __future__ import annotations

from typing import Any

from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.torch_c10d.scan import (BareTimeout, BarrierVerdict, Collective, Desync, Fingerprint,
                                                         InitFailure, StoreBarrier, Terminated, TransportError,
                                                         WatchdogStuck)
from ranktrace.analyzers.readers.common.torch_text import Speaker, clip
from ranktrace.analyzers.readers.watchdog import OPTYPE_NAMES

__all__ = ["build", "op_name"]

_P2P = frozenset({"SEND", "RECV", "RECVANYSOURCE"})


def op_name(optype: str | None) -> str | None:
    if not optype:
        return None
    return OPTYPE_NAMES.get(optype) or canonical_op(optype)


def build(records: list[object], file: str, source: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(EVENTS rows, OBSERVATIONS rows) of the records of one input.

    Worked example (pytorch-152623, a desync report written by rank 0's watchdog)::

        [rank0]:[E515 ...] [Rank 0] Watchdog caught ... WorkNCCL(SeqNum=241, OpType=ALLREDUCE, ...)   (watchdog family)
                 - [0] Timeout at collective: ALLREDUCE, #315        -> joined_rank  r0 all_reduce 315  by=0
                     [7] finished collective #182, but didn't join collective #183 (count from 1)
                                                                     -> missing_rank r7 (op not shown) 183 by=0
                   #315 started ranks:
                     [0, 1, 2] started ALLREDUCE                     -> joined_rank  r0, r1, r2 all_reduce 315 by=0

    The desync numbers (#) count the collectives of the group from 1, as the report says; they are not the watchdog's
    SeqNum, so no EVENTS row is written for them.
    """
    b = _Builder(file, source)
    desync_ops = {(r.seq, r.state): r.optype for r in records if isinstance(r, Desync) and r.optype}
    waits: dict[tuple[int, str], StoreBarrier] = {}
    last_running: dict[int | None, tuple[Collective, int]] = {}
    for r in records:
        if isinstance(r, Fingerprint):
            b.fingerprint(r)
        elif isinstance(r, Collective):
            rank = r.who.global_rank
            prev = last_running.get(rank)
            last_running[rank] = (r, (prev[1] if prev else 0) + 1)
        elif isinstance(r, BarrierVerdict):
            b.barrier(r)
        elif isinstance(r, InitFailure):
            b.init(r)
        elif isinstance(r, StoreBarrier):
            key = (r.rank, r.key)
            if r.state == "done":
                waits.pop(key, None)
            elif r.state == "timed_out" or waits.get(key) is None or waits[key].state == "waiting":
                waits[key] = r
        elif isinstance(r, TransportError):
            b.transport(r)
        elif isinstance(r, WatchdogStuck):
            b.stuck(r)
        elif isinstance(r, Desync):
            b.desync(r, desync_ops)
        elif isinstance(r, Terminated):
            b.terminated(r)
        elif isinstance(r, BareTimeout):
            b.bare_timeout(r)
    for (col, n) in last_running.values():
        b.running(col, n)
    for sb in sorted(waits.values(), key=lambda s: s.line):
        b.store_barrier(sb)
    return b.events, b.obs


class _Builder:
    def __init__(self, file: str, source: str) -> None:
        self.file = file
        self.source = source
        self.events: list[dict[str, Any]] = []
        self.obs: list[dict[str, Any]] = []
        self.seen: set[tuple[Any, ...]] = set()

    def _obs(self, who: Speaker, line: int, kind: str, rank: int | None, name: str | None, value: int | None,
             detail: str, key: tuple[Any, ...] | None = None, group: str | None = None,
             about_speaker: bool = True) -> None:
        """One row; `about_speaker` False when the row is about a rank the message names, not its writer (then the
        writer's own pg_rank / log time would mislead)."""
        k = (kind, rank, name, value) + (key if key is not None else (detail,))
        if k in self.seen:
            return   # the same statement repeated (each rank's copy of an exception, a log and its exception)
        self.seen.add(k)
        facts = who.facts() if about_speaker else ""
        self.obs.append(dict(host=who.host, pid=who.pid, rank=rank, kind=kind, name=name, value=value,
                             group=group if group is not None else who.pg,
                             detail=f"{detail} {facts}".strip() if facts else detail,
                             source=self.source, file=self.file, line=line))

    def _event(self, who: Speaker, line: int, rank: int | None, col: Collective, error: str | None,
               detail: str) -> None:
        name = op_name(col.optype)
        if name is None:
            return
        facts = who.facts()
        self.events.append(dict(
            host=who.host, pid=who.pid, rank=rank, kind="enter", name=name,
            category="p2p" if col.optype in _P2P else "collective", group=who.pg, group_desc=who.pg_desc,
            seq=col.seq, shape=col.shape, dtype=col.dtype, error=error,
            detail=f"{detail} {facts}".strip(), source=self.source, file=self.file, line=line))

    # ---------------------------------------------------------------------------------------------------------------
    def fingerprint(self, r: Fingerprint) -> None:
        parts = [f"by={r.by}"]
        parts += [f"{k}={v}" for k, v in (("shape", r.shape), ("dtype", r.dtype), ("device", r.device)) if v]
        if r.differ:
            parts.append(f"differ={clip(r.differ, 200)}")
        if r.cut:
            parts.append("cut")
        self._obs(r.who, r.line, "fingerprint", r.rank, op_name(r.optype), r.seq, " ".join(parts),
                  key=(r.shape, r.dtype), about_speaker=False)

    def running(self, col: Collective, n: int) -> None:
        self._event(col.who, col.line, col.who.global_rank, col, None,
                    f"ProcessGroupWrapper 'Running collective' (last of {n} logged by this rank)")

    def barrier(self, r: BarrierVerdict) -> None:
        col = r.wrapped
        name = op_name(col.optype) if col else None
        via = " via=monitored_barrier" if col else ""
        if col is not None:
            rank = col.who.global_rank
            if rank is None:
                rank = r.by
            self._event(col.who, col.line, rank, col, f"monitoredBarrier before the collective failed: {clip(r.text)}",
                        "ProcessGroupWrapper collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL)")
        kind = "joined_rank" if r.joined else "missing_rank"
        for rank in r.ranks:
            detail = f"by={r.by}" if r.by is not None else "by=?"
            if r.timeout_ms is not None:
                detail += f" timeout_ms={r.timeout_ms}"
            detail += f"{via} {clip(r.text, 200)}"
            self._obs(r.who, r.line, kind, rank, name or "monitored_barrier", col.seq if col else None, detail,
                      key=(r.by,), about_speaker=False)

    def init(self, r: InitFailure) -> None:
        rank = r.who.global_rank
        if rank is None:
            rank = r.rank
        detail = clip(r.text)
        if r.retry:
            detail = "retrying (warning; the client tries again until its timeout): " + detail
        if r.rank is not None and r.rank != rank:
            detail += f" stated_rank={r.rank}"
        self._obs(r.who, r.line, "init_failure", rank, r.stage, r.timeout_s, detail)

    def store_barrier(self, r: StoreBarrier) -> None:
        head = ("timed out" if r.state == "timed_out" else "still waiting (last report)")
        detail = (f"store-based barrier {head}: key={r.key} num_workers_joined={r.joined} world_size={r.world_size}"
                  f" timeout_s={r.timeout_s}")
        self._obs(r.who, r.line, "init_failure", r.rank, "store_barrier", r.timeout_s, detail)

    def transport(self, r: TransportError) -> None:
        rank = r.who.global_rank
        detail = clip(r.text, 600)     # an NCCL error keeps its ncclXError and "Last error:" reasons
        if rank is None and r.rank is not None:
            rank = r.rank
        elif r.rank is not None and r.rank != rank:
            detail += f" stated_rank={r.rank}"
        self._obs(r.who, r.line, "transport_error", rank, r.name, r.timeout_ms, detail)

    def stuck(self, r: WatchdogStuck) -> None:
        self._obs(r.who, r.line, "watchdog_stuck", r.who.global_rank, r.name, r.seconds, clip(r.text, 200))

    def desync(self, r: Desync, ops: dict[tuple[int | None, str], str]) -> None:
        by = f"by={r.by}" if r.by is not None else "by=?"
        if r.state == "timed_out":
            for rank in r.ranks:
                self._obs(r.who, r.line, "joined_rank", rank, op_name(r.optype), r.seq,
                          f"{by} desync report: this rank timed out in collective #{r.seq} (count from 1)",
                          about_speaker=False)
            return
        if r.state in ("started", "finished"):
            for rank in r.ranks:
                self._obs(r.who, r.line, "joined_rank", rank, op_name(r.optype), r.seq,
                          f"{by} desync report snapshot: {r.state} {r.optype} #{r.seq}", about_speaker=False)
            return
        if r.state == "joined_not_finished":
            name = op_name(ops.get((r.seq, "started")))
            why = f"joined but did not finish collective #{r.seq} (count from 1)"
        elif r.state == "finished_not_joined":
            name = op_name(ops.get((r.seq, "started")) or ops.get((r.seq, "finished")))
            why = f"finished collective #{(r.seq or 1) - 1}, did not join collective #{r.seq} (count from 1)"
        else:
            name = None
            why = "never joined any collective"
        for rank in r.ranks:
            self._obs(r.who, r.line, "missing_rank", rank, name, r.seq, f"{by} desync report: {why}",
                      about_speaker=False)

    def terminated(self, r: Terminated) -> None:
        rank = r.who.global_rank
        if r.exc_type is not None:
            short = r.exc_type.rsplit("::", 1)[-1]
            self._obs(r.who, r.line, "rank_exit", rank, "signal", 6,
                      clip(f"abort: terminate called after throwing {r.exc_type}: {r.cause}"))
            self._obs(r.who, r.line, "exception", rank, short, None, clip(r.cause) if r.cause else "")
        else:
            self._obs(r.who, r.line, "rank_exit", rank, "signal", 6,
                      clip(f"abort: the NCCL heartbeat monitor terminated the process, due to {r.cause}"))

    def bare_timeout(self, r: BareTimeout) -> None:
        name = r.exc_type.rsplit(".", 1)[-1] if r.exc_type else "watchdog_timeout"
        self._obs(r.who, r.line, "exception", r.who.global_rank, name, None,
                  clip(r.text) + " (WorkNCCL details not in the input)")
