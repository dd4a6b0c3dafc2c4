"""The real-vLLM scenarios (issue #24): what each one does to a real `vllm serve` TP2 start-up, as a function of a
base folder. The tests run them up front, two at a time (each is mostly a wait), and read the runs.

    python -m tests.vllm_real.scenarios BASE [NAME...]    # run some by hand, print what ranktrace said
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from tests.vllm_real.harness import Run, start

#: held by a scenario whose live report a test times, from its fault until the hang is reported: no other scenario
#: starts a vLLM server meanwhile (two cores here; a second server's start-up is a minute of both cores), so what
#: the tests time (HANG_AFTER + LIVE_SLACK) is the watchdog, not a neighbour's imports
FAULT_WINDOW = threading.Lock()

HANG_AFTER = 10
#: a hung scenario ends when --on-hang kill ends it; past this the harness kills it itself (a wrong verdict)
HANG_DEADLINE = 200


def _fault_line(r: Run, seconds: float = 150) -> None:
    got = r.wait_line("[test-fault] rank", seconds)
    if got is not None:
        r.fault_at = got


def _until_reported(r: Run, seconds: float = HANG_AFTER + 40) -> None:
    """Waits for the first live hang/crash report (or the job's end): called inside FAULT_WINDOW."""
    r.wait_for(lambda: any(v["status"] in ("hang", "crashed") for _t, v in r.live) or not r.job_alive(), seconds)


def serving(base: Path) -> Run:
    """Healthy first: start-up, one completion (temperature 0), idle for longer than --hang-after (nothing may be
    reported as a hang, nothing killed). Then the fault is armed: rank 1 blocks before the first TP all-reduce of the
    next request while rank 0 spins in torch.ops._C.shm_allreduce; --on-hang kill ends it. (One server for both:
    each start-up costs a minute of this machine's two cores.)"""
    arm = base / "serving.arm"
    arm.unlink(missing_ok=True)
    r = start("serving", base, fault="first-request-ar", arm=arm)
    try:
        if r.wait_ready(240):
            r.complete()
            r.wait_for(lambda: False, HANG_AFTER + 12)
            r.notes.append(f"alive after idle: {r.alive()}")
            r.healthy_until = r.now()
            with FAULT_WINDOW:
                arm.touch()
                r.complete_async()
                _fault_line(r, 60)
                _until_reported(r)
        r.wait_exit(HANG_DEADLINE)
    finally:
        r.reap()
    return r


def untraced(base: Path) -> Run:
    """The same server and completion without ranktrace: the answer to compare with."""
    r = start("untraced", base, traced=False)
    try:
        if r.wait_ready(240):
            r.complete()
        r.stop(signal.SIGINT, 60)
    finally:
        r.reap()
    return r


def _fault(name: str) -> Callable[[Path], Run]:
    def run(base: Path) -> Run:
        r = start(name, base, fault=name)
        try:
            _fault_line(r)
            with FAULT_WINDOW:  # the fault is in start-up: no neighbour starts while its live report is timed
                _until_reported(r)
            r.wait_exit(HANG_DEADLINE)
        finally:
            r.reap()
        return r

    run.__doc__ = f"fault {name} planted in rank 1 (tests/vllm_real/faults.py); --on-hang kill ends it"
    return run


def _request_fault(name: str) -> Callable[[Path], Run]:
    def run(base: Path) -> Run:
        r = start(name, base, fault=name)
        try:
            if r.wait_ready(240):
                with FAULT_WINDOW:
                    r.complete_async()
                    _fault_line(r, 60)
                    _until_reported(r)
            r.wait_exit(HANG_DEADLINE)
        finally:
            r.reap()
        return r

    run.__doc__ = (f"fault {name} planted in rank 1 (tests/vllm_real/faults.py) below the hooked collective, armed "
                   f"by the first request; --on-hang kill ends it")
    return run


def stop_after_load(base: Path) -> Run:
    """SIGSTOP of VLLM::Worker_TP1 as soon as the weights are loaded (the rest of start-up waits for it)."""
    r = start("stop-after-load", base)
    try:
        if r.wait_line("Loading weights took", 240) is not None:
            r.wait_for(lambda: r.worker_pid() is not None, 10)
            r.signal_worker(signal.SIGSTOP)
        r.wait_exit(HANG_DEADLINE)
    finally:
        r.reap()
    return r


def stop_serving(base: Path) -> Run:
    """One completion answered, then SIGSTOP of VLLM::Worker_TP1 and a second request (rank 0 waits in its TP
    all-reduce for the stopped rank)."""
    r = start("stop-serving", base)
    try:
        if r.wait_ready(240):
            r.complete()
            with FAULT_WINDOW:
                r.signal_worker(signal.SIGSTOP)
                r.complete_async()
                _until_reported(r)
        r.wait_exit(HANG_DEADLINE)
    finally:
        r.reap()
    return r


def stopped_healthy(base: Path) -> Run:
    """A healthy server stopped from outside: one completion answered, a moment idle, then SIGTERM to trace run
    (what `timeout -s TERM`, `scancel` and a Kubernetes eviction send to the job's first process): trace run hands it
    to the job, vLLM shuts down. A stop, never a hang or a crash, and no rank blamed."""
    r = start("stopped-healthy", base)
    try:
        if r.wait_ready(240):
            r.complete()
            r.wait_for(lambda: False, 3)
            r.healthy_until = r.now()
        r.stop(signal.SIGTERM, 90)
    finally:
        r.reap()
    return r


def own_error(base: Path) -> Run:
    """vLLM refusing its own arguments at start-up (TP 3 does not divide 4 heads): CRASHED with vLLM's error."""
    r = start("own-error", base, extra_serve=("--tensor-parallel-size", "3"))
    try:
        r.wait_exit(180)
    finally:
        r.reap()
    return r


SCENARIOS: dict[str, Callable[[Path], Run]] = {   # the longest first: two at a time, they pack better
    "serving": serving,
    "stop-serving": stop_serving,
    "kill-loading": _fault("kill-loading"),
    "memory-profiling": _fault("memory-profiling"),
    "before-dist-init": _fault("before-dist-init"),
    "shm-setup": _fault("shm-setup"),
    "untraced": untraced,
    "own-error": own_error,
    "stopped-healthy": stopped_healthy,
}
#: run only when asked (RANKTRACE_VLLM_ALL=1, or by name): another SIGSTOP, at another moment; hangs planted inside
#: vLLM's own all-reduce / all-gather, below the hooked GroupCoordinator call (tests/test_vllm_captured.py re-reads
#: captured runs of them in CI)
EXTRA: dict[str, Callable[[Path], Run]] = {
    "stop-after-load": stop_after_load,
    "in-shm-allreduce": _request_fault("in-shm-allreduce"),
    "sleep-in-allreduce": _request_fault("sleep-in-allreduce"),
    "in-shm-allgather": _request_fault("in-shm-allgather"),
}


def run_all(base: Path, names: list[str] | None = None, workers: int = 2) -> dict[str, Run | BaseException]:
    """Each scenario once, `workers` at a time (at most two vLLM servers alive at once)."""
    every = {**SCENARIOS, **EXTRA}
    names = names or list(SCENARIOS) + (list(EXTRA) if os.environ.get("RANKTRACE_VLLM_ALL") == "1" else [])

    def one(name: str) -> tuple[str, Run | BaseException]:
        with FAULT_WINDOW:  # wait while a scenario times its live report
            pass
        try:
            return name, every[name](base)
        except Exception as e:  # raised in the test that reads this scenario, not in all of them
            return name, e

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, names))


def summary(r: Run) -> str:
    v = r.verdict or {}
    live = r.live[0] if r.live else None
    lv = live[1] if live else {}
    ranks = {k: (s.get("state"), s.get("phase"), s.get("where")) for k, s in (v.get("ranks") or {}).items()}
    op = v.get("operation") or {}
    return (f"{r.name}: rc={r.rc} ready={r.ready_at and round(r.ready_at)} fault={r.fault_at and round(r.fault_at)} "
            f"live@{live and round(live[0])}={lv.get('status')}/{lv.get('kind')} culprits={lv.get('culprit_ranks')} "
            f"| final={v.get('status')}/{v.get('kind')} culprits={v.get('culprit_ranks')} op={op.get('name')} "
            f"phase={op.get('phase')} ranks={ranks} answers={r.answers} notes={r.notes}")


if __name__ == "__main__":
    t0 = time.monotonic()
    got = run_all(Path(sys.argv[1]), sys.argv[2:] or None)
    for name, r in got.items():
        print(summary(r) if isinstance(r, Run) else f"{name}: {type(r).__name__}: {r}", flush=True)
    print(f"{time.monotonic() - t0:.0f} s")
