"""Issue #30: when the watchdog calls a silence a hang, at its default (adaptive) settings.

Real jobs (tests/scripts/busy_job.py, 2 gloo ranks) at the default settings, two at a time: one parked for real (every
rank in a collective or a queue wait at 0% CPU: the short path reports it and --on-hang kill ends it, with no
"progress again" while it is being ended), one busy in every way the issue lists under torchrun (whose workers run
in sessions of their own): a non-Python compiler child, a straggler computing while its peer waits, a weight read
from the page cache — none of them an alarm. Asserted are kinds and what was said, not times. Below them: what a
busy child is called (real processes), the threshold rule's paths, and a watchdog pause that is no silence.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import PY, SCRIPTS, run_trace, trace_env

BUSY = SCRIPTS / "busy_job.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("detect")
    weights = base / "weights.bin"
    weights.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB, read back from the page cache in 8 MiB chunks
    plans = {
        "parked": (["--on-hang", "kill", "--", PY, str(BUSY), "parked", "--seconds", "300"], {}),
        "busy": (["--on-hang", "kill", "--", PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(BUSY),
                  "busy", "--seconds", "11"], {"RANKTRACE_TEST_WEIGHTS": str(weights)}),
    }

    def one(name: str) -> tuple[str, tuple]:
        args, env = plans[name]
        run = base / name
        try:
            return name, (run, run_trace(["run", "-o", str(run)] + args, timeout=150, env=trace_env(**env)))
        except Exception as e:  # raised in the test that reads this run
            return name, (run, e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, plans))


def ran(runs: dict[str, tuple], name: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run, res = runs[name]
    if isinstance(res, BaseException):
        raise res
    return run, res


def test_every_rank_parked_takes_the_short_path_and_is_killed_without_a_false_progress_line(runs):
    run, res = ran(runs, "parked")
    assert res.returncode == 3, res.stderr[-3000:]
    assert "hang suspected after" in res.stderr and "short threshold" in res.stderr, res.stderr[-3000:]
    assert "every rank parked" in res.stderr
    assert "progress again" not in res.stderr, res.stderr[-3000:]   # the kill's teardown is not the job moving on
    v = json.loads((run / "verdict.json").read_text())
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [1], [0])


def test_a_compiler_child_a_straggler_and_a_weight_read_are_busy_not_hung(runs):
    run, res = ran(runs, "busy")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "hang suspected" not in res.stderr and " s silent" not in res.stderr, res.stderr[-3000:]
    v = json.loads((run / "verdict.json").read_text())
    assert (v["status"], v["kind"]) == ("completed", "no_hang")


# --- what a busy child is called, on real processes ----------------------------------------------------------------
def _spinning_child(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """A Python parent in a session of its own whose child (a shell named `name`) burns a core: the parent stands
    for a torchrun worker, the child for its compiler."""
    exe = tmp_path / name
    shutil.copy("/bin/sh", exe)
    code = (f"import subprocess, sys\nsubprocess.run([{str(exe)!r}, '-c', 'while :; do :; done'])\n")
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


@pytest.mark.parametrize("comm, said", [("ptxas", "JIT build in a child (ptxas, "), ("sh", "a child at work (sh, ")])
def test_a_busy_child_in_another_session_is_the_rank_s_progress_and_says_what_it_is(tmp_path: Path, comm, said):
    from ranktrace.tracer.watch.activity import JobActivity, child_text

    parent = _spinning_child(tmp_path, comm)
    try:
        act = JobActivity(job_pid=os.getpid())  # the job's group is ours: the parent's session is not
        seen = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            look = act.look(time.monotonic(), {parent.pid}, quiet_s=0.0)
            if look.busy_child is not None:
                seen = look
                break
            time.sleep(0.5)
        assert seen is not None and seen.busy_child is not None, "a child at 100% of a core was not seen"
        assert seen.busy_child.comm == comm
        assert child_text(seen.busy_child).startswith(said)
        assert any(m.startswith(said) for m in seen.moved)
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()


def test_a_repeated_waiting_line_is_not_news_but_a_progress_bar_is(tmp_path: Path):
    from ranktrace.tracer.watch.activity import JobActivity

    log = tmp_path / "output.log"
    log.write_text("start\n")
    act = JobActivity(job_pid=None, log_path=log)
    assert act.look(0.0, set(), quiet_s=0.0).moved == []  # what was there before is not news
    with log.open("a") as f:
        f.write("[2026-12-02 10:00:01] Waiting in store based barrier (world_size=4, num_workers_joined=1) 10 s\n")
    assert act.look(1.0, set(), quiet_s=0.0).moved  # a first line is
    with log.open("a") as f:
        f.write("[2026-12-02 10:00:11] Waiting in store based barrier (world_size=4, num_workers_joined=1) 20 s\n")
    assert act.look(2.0, set(), quiet_s=0.0).moved == []
    with log.open("a") as f:
        f.write("loading shard 3/8\n")
    assert act.look(3.0, set(), quiet_s=0.0).moved
    # once every rank joined, a server's stats line is no progress of the ranks (vLLM's, every 10 s, hid a stopped
    # rank for a minute); it is read past all the same, so it is no news later either
    with log.open("a") as f:
        f.write("Engine 000: Avg prompt throughput: 0.7 tokens/s, Running: 1 reqs\n")
    assert act.look(4.0, set(), quiet_s=0.0, output_is_news=False).moved == []
    with log.open("a") as f:
        f.write("Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 1 reqs\n")
    assert act.look(5.0, set(), quiet_s=0.0, output_is_news=False).moved == []


# --- the threshold rule ----------------------------------------------------------------------------------------------
def _view(rank: int, parked: str | None = "all_reduce", *, asleep: bool = False, cpu: float = 0.0,
          joined: bool = True):
    from ranktrace.tracer.watch.threshold import RankView

    return RankView(rank, parked, asleep, cpu, joined, "")


def test_threshold_paths():
    from ranktrace.tracer.watch.threshold import Cadence, RankView, decide

    c = Cadence()
    auto = {"hang_after": None, "startup_hang_after": None}
    assert decide([_view(0), _view(1, "a lock or queue wait")], 2, c, **auto).path == "short"
    assert decide([_view(0), _view(1, "exited")], 2, c, **auto).path == "short"          # a dead peer ends nothing
    assert decide([_view(0), _view(1, None, asleep=True)], 2, c, **auto).path == "medium"  # a sleep ends by itself
    asleep = [_view(0, None, asleep=True), _view(1, None, asleep=True)]
    assert decide(asleep, 2, c, **auto).path == "adaptive"   # all asleep: nobody waits on anybody (a poll, a back-off)
    assert decide([_view(0), _view(1, cpu=0.9)], 2, c, **auto).path == "adaptive"          # spinning inside its wait
    assert decide([_view(0), _view(1, None)], 2, c, **auto).path == "adaptive"             # a wait nobody knows
    assert decide([_view(0), _view(1)], 4, c, **auto).path == "adaptive"                   # peers on another host
    serving = [RankView(0, "a lock or queue wait", False, 0.0, True, "serving"), _view(1)]
    assert decide(serving, 2, c, **auto).path == "adaptive"       # a server waits for requests by design
    assert decide([_view(0, joined=False), _view(1, None, joined=False)], 2, c, **auto).path == "startup"
    fixed = decide([_view(0), _view(1)], 2, c, hang_after=8.0, startup_hang_after=None)
    assert (fixed.path, fixed.seconds) == ("explicit", 8.0)
    # a rank's own cadence lengthens every path: one whose steps are 40 s apart is not parked after 8 s
    for t in (0.0, 40.0, 80.0):
        c.moved(0, "", t)
    slow = decide([_view(0), _view(1)], 2, c, **auto)
    assert slow.path == "short" and slow.seconds >= 3 * 40


# --- a watchdog pause is no silence -----------------------------------------------------------------------------
def test_a_stretch_the_watchdog_did_not_run_is_not_silence(tmp_path: Path):
    from ranktrace.tracer.watch.monitor import Monitor, MonitorOptions

    host = tmp_path / "run" / "host"
    (host / "rings").mkdir(parents=True)
    now = [1000.0]
    said: list[str] = []
    mon = Monitor(tmp_path / "run", host, MonitorOptions(samples=False, gpu=False), log=said.append,
                  show=said.append, clock=lambda: now[0])
    fired: list[float] = []
    mon.on_silence = lambda quiet, reason="silence", dumps=None: fired.append(quiet)  # type: ignore[method-assign]
    for _ in range(3):
        now[0] += 1.0
        mon.tick()
    now[0] += 3600.0  # suspended for an hour (or SIGSTOPped, or starved): nothing was watched meanwhile
    mon.tick()
    assert mon.silent_for() < 10 and not fired
    assert any("did not run for" in s for s in said)
    for _ in range(20):  # the silence after the pause still counts, second by second
        now[0] += 1.0
        mon.tick()
    assert mon.silent_for() >= 20
    mon.close()
