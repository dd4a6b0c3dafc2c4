"""How long a silence must last before the watchdog calls it a hang: fixed (--hang-after) or adaptive (the default).

Pure: the monitor hands in what it saw (each rank's wait, its CPU, its cadence) and gets back a threshold and the
words for why. The adaptive rule (issue #30):

* **short path** — every rank of the world is here and parked: inside a collective, a set-up step (rendezvous,
  store, communicator init, IPC exchange), a lock or queue wait, or exited; none uses CPU; and the host is silent
  (no I/O, no busy child: the monitor only asks while it is). Nobody can end that wait from inside the job, so
  ``SHORT_S`` (or 3x the slowest gap the parked ranks showed in their phase) is enough. A rank in a timed sleep is
  not parked (a sleep ends by itself): the medium path.
* **medium path** — every rank is parked or asleep at 0% CPU, and some rank waits (for the sleepers): ``MEDIUM_S``
  (or 4x the cadence). Ranks that all sleep wait on nobody (a poll for a file, a timed back-off): the regular path.
* **otherwise** — some rank's wait is not known (no stack yet, a host sync with the GPU maybe at work, peers on other
  hosts): ``JOINED_S`` once the ranks joined their process group, ``STARTUP_S`` before (4x the cadence if longer).

Busy is never silence, so none of this runs while a rank computes, a child compiles, a file is read or a line printed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RankView", "Threshold", "Cadence", "decide", "SHORT_S", "MEDIUM_S", "JOINED_S", "STARTUP_S"]

SHORT_S = 8.0
MEDIUM_S = 20.0
JOINED_S = 60.0
STARTUP_S = 180.0


@dataclass(frozen=True)
class RankView:
    """One rank as the monitor sees it now."""

    rank: int
    parked: str | None      # what it waits in ("all_reduce", "init_process_group", "a lock or queue wait", "exited")
    asleep: bool            # in a timed sleep (time.sleep): waits, but ends by itself
    cpu_share: float        # of one core, lately
    joined: bool            # past its process group's rendezvous
    phase: str              # what the cadence is kept per


@dataclass(frozen=True)
class Threshold:
    seconds: float
    path: str               # short | medium | adaptive | startup | explicit
    why: str                # the evidence, in words


@dataclass
class Cadence:
    """Per rank and phase, the longest gap between two moments its ring moved: its own rhythm."""

    last: dict[int, tuple[str, float]] = field(default_factory=dict)    # rank -> (phase, when it last moved)
    longest: dict[tuple[int, str], float] = field(default_factory=dict)

    def moved(self, rank: int, phase: str, now: float) -> None:
        prev = self.last.get(rank)
        if prev is not None and prev[0] == phase:
            gap = now - prev[1]
            if gap > self.longest.get((rank, phase), 0.0):
                self.longest[(rank, phase)] = gap
        self.last[rank] = (phase, now)

    def gap(self, rank: int, phase: str) -> float:
        return self.longest.get((rank, phase), 0.0)


def _ranks_text(ranks: list[int]) -> str:
    from ranktrace.analyzers.verdict import compact_ranks

    return ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks)


def decide(views: list[RankView], world: int | None, cadence: Cadence, *, hang_after: float | None,
           startup_hang_after: float | None, still_share: float = 0.10) -> Threshold:
    """The threshold now. `hang_after` / `startup_hang_after`: the explicit overrides (None = adaptive)."""
    joined = bool(views) and all(v.joined or v.parked == "exited" for v in views)
    # --hang-after holds once the ranks joined, or while one is parked in a known wait (a wait is no slow start-up)
    if hang_after is not None and (joined or any(v.parked and v.parked != "exited" for v in views)):
        return Threshold(hang_after, "explicit", f"--hang-after {hang_after:g} s")
    if startup_hang_after is not None and not joined:
        return Threshold(startup_hang_after, "explicit", f"--startup-hang-after {startup_hang_after:g} s")
    slowest = max((cadence.gap(v.rank, v.phase) for v in views), default=0.0)
    seen = {v.rank for v in views}
    # a server that said it serves waits for requests by design: never the short or medium path (the analysis says
    # IDLE after the regular wait)
    serving = any(v.phase == "serving" for v in views)
    whole = not serving and world is not None and world > 0 and seen >= set(range(world))
    still = [v for v in views if v.cpu_share < still_share or v.parked == "exited"]
    if whole and views and len(still) == len(views):
        if all(v.parked for v in views):
            t = max(SHORT_S, 3 * slowest)
            waits = sorted({v.parked for v in views if v.parked})
            return Threshold(t, "short", "every rank parked (" + ", ".join(waits[:4]) + ") with no CPU, no I/O and "
                             "no busy child" + (f", cadence {slowest:.0f} s" if 3 * slowest > SHORT_S else ""))
        if all(v.parked or v.asleep for v in views) and any(v.parked and v.parked != "exited" for v in views):
            sleepers = sorted(v.rank for v in views if not v.parked)
            t = max(MEDIUM_S, 4 * slowest)
            return Threshold(t, "medium", f"{_ranks_text(sleepers)} asleep and the others parked, no CPU, no I/O")
    if serving:
        why = "the job says it serves (waiting for requests is no hang)"
    elif not whole:
        why = "not every rank of the world is seen here" if views else "no rank known yet"
    else:
        unknown = sorted(v.rank for v in views if not v.parked and not v.asleep)
        busy = sorted(v.rank for v in views if v.cpu_share >= still_share and v.parked != "exited")
        why = (f"{_ranks_text(unknown)} not in a known wait" if unknown else
               f"{_ranks_text(busy)} using CPU inside a wait" if busy else "ranks in waits that may end")
    base, path = (JOINED_S, "adaptive") if joined else (STARTUP_S, "startup")
    t = max(base, 4 * slowest)
    return Threshold(t, path, why + (f", cadence {slowest:.0f} s" if 4 * slowest > base else ""))
