"""A host of many small ranks (issue #19: 64 CPU-inference or test ranks) costs the watchdog what one of 8 does: its
periodic samplers read ROUND processes a round, in turn, and every process within a few rounds; a burst still
reads all of them. Measured by bench/bench_monitor.py --light (64 ranks: 2.7 % of a core, 8 ranks: 2.5 %)."""
from __future__ import annotations

import os
import threading

from ranktrace.tracer.watch.monitor import Monitor
from ranktrace.tracer.watch.proc_sampler import ProcSampler


def test_rounds_take_every_process_in_turn() -> None:
    m = Monitor.__new__(Monitor)
    m._rounds = {}
    pids = list(range(100, 164))
    seen: list[int] = []
    for _ in range(8):
        got = m._next_round("stacks", pids)
        assert len(got) == Monitor.ROUND
        seen.extend(got)
    assert sorted(seen) == pids  # 64 pids in 8 rounds of 8, each once
    assert m._next_round("stacks", pids[:5]) == pids[:5]  # a small host: all of them every round


def _settled(tid: int, seconds: float = 5.0) -> None:
    """Until thread `tid` of this process sleeps (state S) with the same wait channel in reads 50 ms apart: a thread
    just started may still be on its way into the wait, and its changed state would rightly be written again."""
    import time

    def now() -> tuple[str, str]:
        stat = open(f"/proc/self/task/{tid}/stat").read()
        wchan = open(f"/proc/self/task/{tid}/wchan").read()
        return stat[stat.rindex(")") + 2], wchan

    end, last = time.monotonic() + seconds, None
    while time.monotonic() < end:
        got = now()
        if got[0] == "S" and got == last:
            return
        last = got
        time.sleep(0.05)


def test_threads_read_for_some_processes_keep_the_others_state() -> None:
    class Log:
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def add(self, row: dict) -> None:
            self.rows.append(row)

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    _settled(t.native_id)   # asleep in its wait: its state and wchan no longer change between two reads
    try:
        log = Log()
        s = ProcSampler(log)  # type: ignore[arg-type]
        me = os.getpid()
        s.sample([me], threads={me})
        idle = t.native_id
        assert [r for r in log.rows if r["kind"] == "thread" and r["tid"] == idle]
        log.rows.clear()
        s.sample([me], threads=set())      # this round reads other processes' threads: ours are not forgotten
        s.sample([me], threads={me})       # so the idle thread, unchanged, is not written again before the keyframe
        assert [r for r in log.rows if r["kind"] == "thread" and r["tid"] == idle] == []
    finally:
        stop.set()
        t.join()
