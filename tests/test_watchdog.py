"""The live watchdog in `trace run` and `trace attach`, on real 4-rank gloo jobs that really hang.

Gloo timeouts are set far beyond the test, so only ranktrace can end these hangs (--on-hang kill).
"""
from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, PY, REPO, TRACE, run_trace, trace_env


def job(fault: str, *extra: str) -> list[str]:
    return ["--", PY, str(EXAMPLE), "--world", "4", "--steps", "6", "--fault", fault, "--timeout", "300", *extra]


# Jobs that only run and are then read: once, up front, two at a time (most of each is a wait); each test reads its
# own. The ones that time themselves or act while the job runs stay on their own below.
WATCHED: dict[str, tuple[list[str], dict[str, str]]] = {
    "nopyspy": (["--hang-after", "4", "--on-hang", "kill"] + job("skip", "--hang-seconds", "300"),
                {"RANKTRACE_PYSPY": "0"}),
    "nojoin": (["--hang-after", "4", "--startup-hang-after", "6", "--on-hang", "kill"]
               + job("nojoin", "--hang-seconds", "300"), {}),
    "compute": (["--hang-after", "4", "--on-hang", "kill"] + job("compute", "--hang-seconds", "9"), {}),  # 2x, and more
    "slowload": (["--hang-after", "3", "--startup-hang-after", "40", "--on-hang", "kill"]
                 + job("slowload", "--hang-seconds", "8"), {}),
}


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("watched")

    def one(name: str) -> tuple[str, tuple]:
        args, env = WATCHED[name]
        run = base / name / "r"
        try:
            return name, (run, run_trace(["run", "-o", str(run)] + args, env=trace_env(**env)))
        except Exception as e:  # raised in the test that reads this run, not in all of them
            return name, (run, e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, WATCHED))


def ran(watched: dict[str, tuple], name: str) -> tuple:
    run, res = watched[name]
    if isinstance(res, BaseException):
        raise res
    return run, res


def test_skip_is_caught_live_killed_and_explained(tmp_path: Path):
    run = tmp_path / "r"
    t0 = time.monotonic()
    # --helpers: every rank also has an idle helper process with its RANK (a serving engine's tokenizer, say)
    res = run_trace(["run", "-o", str(run), "--hang-after", "5", "--on-hang", "kill"] + job("skip", "--hang-seconds",
                                                                                              "300", "--helpers"))
    elapsed = time.monotonic() - t0
    assert res.returncode == 3, res.stderr[-2000:]
    assert elapsed < 5 + 10 + 20  # hang-after + 10 s, plus start-up of 4 ranks on 2 cores
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[ranktrace]")]
    early = next(ln for ln in lines if "s silent:" in ln)
    assert "ranks 0-2 in all_reduce group 0 seq 5" in early
    assert "exit code 3 is ranktrace's" in lines[-1]
    v = json.loads((run / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "missing_ranks", [3],
                                                                                 [0, 1, 2])
    assert (v["operation"]["name"], v["operation"]["group"], v["operation"]["seq"]) == ("all_reduce", "0", 5)
    culprit_stack = [e for f in v["findings"] for e in f["evidence"] if e["source"] == "pyspy" and e["rank"] == 3]
    assert culprit_stack and "next_batch" in culprit_stack[0]["detail"]
    dumps = list(run.glob("*/dumps/*/pyspy-*.json"))
    assert len(dumps) >= 8  # ranks and helpers
    # each rank's state and stack are its own process's, not its helper's (which shares its RANK but issues no op)
    states = {r: (s["state"], len(s["pids"])) for r, s in v["ranks"].items()}
    assert states == {"0": ("in_collective", 2), "1": ("in_collective", 2), "2": ("in_collective", 2),
                      "3": ("blocked_other", 2)}
    assert "next_batch" in " ".join(v["ranks"]["3"]["stack"]) and "(<string>:3)" not in v["stack_tree"]  # helper loop
    # ranks 0-2 wait inside ranktrace's Work.wait wrapper: the dumps keep its frame, what a person reads does not
    # (an innermost "tracer/rank/wrap_work.py" frame reads as if ranktrace were what hangs)
    assert any("tracer/rank/wrap_work.py" in p.read_text() for p in dumps)
    shown = [v["stack_tree"]] + [f for s in v["ranks"].values() for f in s["stack"]] + [
        e["detail"] for f in v["findings"] for e in f["evidence"] if e["source"] == "pyspy"]
    assert not [t for t in shown if "tracer/" in t] and "wrapper frames are left out" in v["stack_tree"]
    assert all(v["ranks"][r]["stack"][0].startswith("all_reduce (") for r in "012")
    # report.html beside verdict.json: ranks 0-2's all_reduce seq 5 drawn open (red, to the end), none for rank 3
    page = (run / "report.html").read_text()
    open_bars = re.findall(r'<rect [^>]*class="open"><title>rank (\d+): ([^<]*)</title>', page)
    assert sorted(r for r, _ in open_bars) == ["0", "1", "2"], open_bars
    assert all(t.startswith("all_reduce group=0 seq=5 · never returned") for _, t in open_bars)
    from ranktrace.analyzers.report.words import plain  # the page says host states in words

    assert ">rank 3 *</text>" in page and html.escape(plain(v["summary"])) in page
    # "where" is the program's own innermost frame, past threading/queue and ranktrace's own wrapper
    assert v["ranks"]["3"]["where"].startswith("next_batch (tp_job.py:")
    assert all(v["ranks"][r]["where"].startswith("train_step (tp_job.py:") for r in "012")


def test_snapshot_of_a_hung_run_before_the_watchdog_would_report(tmp_path: Path):
    """`trace snapshot RUN` on a job that hangs while the watchdog still waits (--hang-after 300): a burst now, the
    verdict printed (exit 3), verdict.json and report.html refreshed, the job left running; on a dir whose job is
    gone: one line, exit 2."""
    run = tmp_path / "r"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run), "--hang-after", "300", "--no-analyze"]
                            + job("skip", "--hang-seconds", "300"), env=trace_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the rings alone (no burst) show ranks 0-2 inside seq 5
            time.sleep(0.5)
            out = run_trace(["analyze", "--no-snapshot", "--json", str(run)]).stdout if run.exists() else ""
            if out.startswith("{") and json.loads(out)["culprit_ranks"] == [3]:
                break
        else:
            raise AssertionError("the job never hung")
        res = run_trace(["snapshot", "--json", str(run)])
        assert res.returncode == 3, res.stderr[-2000:]
        v = json.loads(res.stdout)
        assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "missing_ranks", [3],
                                                                                     [0, 1, 2])
        assert list(run.glob("*/dumps/*/pyspy-*.json")) or list(run.glob("*/dumps/*/agent-*.json"))
        assert json.loads((run / "verdict.json").read_text())["culprit_ranks"] == [3]
        assert 'class="open"' in (run / "report.html").read_text()
        assert proc.poll() is None  # a snapshot never ends the job
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # trace run forwards it to the job's own process group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    res = run_trace(["snapshot", str(run)])
    assert res.returncode == 2 and "no live traced job here" in res.stderr


def test_without_py_spy_the_in_rank_agents_give_stacks_and_flight_recorder(watched):
    """Where ptrace is denied (RANKTRACE_PYSPY=0 stands in for it: py-spy is never run), each rank answers the
    burst itself: its Python stacks and its Flight Recorder."""
    run, res = ran(watched, "nopyspy")
    assert res.returncode == 3, res.stderr[-2000:]
    assert "py-spy not found or turned off" in res.stderr
    burst = next(run.glob("*/dumps/*/"))
    assert not list(burst.glob("pyspy-*.json"))
    assert len(list(burst.glob("agent-*.json"))) >= 4 and len(list(burst.glob("fr-rank*-pid*.json"))) == 4
    v = json.loads((run / "verdict.json").read_text())
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [3], [0, 1, 2])
    assert {r: s["state"] for r, s in v["ranks"].items()} == {
        "0": "in_collective", "1": "in_collective", "2": "in_collective", "3": "blocked_other"}
    culprit = [e for f in v["findings"] for e in f["evidence"] if e["source"] == "agent" and e["rank"] == 3]
    assert culprit and "next_batch" in culprit[0]["detail"]
    assert len([i for i in v["inputs"] if "/fr-rank" in i]) == 4  # every rank's Flight Recorder was read
    assert not [f for f in v["findings"] if f["kind"] == "input_skipped"]
    # the watchdog's periodic stack samples came from the agents too (its stack-progress signal keeps working)
    import pyarrow.ipc as ipc

    with open(next(run.glob("*/samples/stacks.arrow")), "rb") as f:  # sealed into an IPC file when the run ended
        rows = ipc.open_file(f).read_all().to_pylist()
    sampled = {r["rank"] for r in rows if r["kind"] == "sample" and r["thread_name"] == "MainThread"}
    assert sampled >= {0, 1, 2, 3}


def test_rank_that_never_joins_is_an_init_hang(watched):
    run, res = ran(watched, "nojoin")
    assert res.returncode == 3
    v = json.loads((run / "verdict.json").read_text())
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("init_hang", [3], [0, 1, 2])


def test_long_compute_without_collectives_is_not_a_hang(watched):
    run, res = ran(watched, "compute")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "silent" not in res.stderr
    v = json.loads((run / "verdict.json").read_text())
    assert (v["status"], v["kind"]) == ("completed", "no_hang")


def test_long_weight_load_before_the_first_collective_is_not_a_hang(watched):
    run, res = ran(watched, "slowload")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "silent" not in res.stderr


def test_attach_to_a_hung_torchrun_job_started_without_ranktrace(tmp_path: Path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    env.pop("PYTHONPATH", None)
    env.pop("RANKTRACE_DIR", None)
    port = str(29400 + os.getpid() % 500)
    job_proc = subprocess.Popen([PY, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", port,
                                 str(EXAMPLE), "--fault", "skip", "--timeout", "300", "--hang-seconds", "300"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        v: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(3)
            res = subprocess.run(TRACE + ["attach", "--json", "-o", str(tmp_path), str(job_proc.pid)],
                                 capture_output=True, text=True, env=trace_env(), timeout=60)
            v = json.loads(res.stdout) if res.stdout.startswith("{") else {}
            if v.get("culprit_ranks") == [3]:
                break
        assert res.returncode == 3
        assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "missing_ranks", [3],
                                                                                     [0, 1, 2])
        assert v["operation"]["name"] == "all_reduce" and "next_batch" in v["summary"]
    finally:
        # torchrun starts its workers in sessions of their own: kill every descendant, not only its group
        from ranktrace.tracer.launch.attach import descendants

        for pid in reversed(descendants([job_proc.pid])):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job_proc.wait(timeout=10)


def test_trace_dir_deleted_under_a_running_monitor(tmp_path: Path):
    """The trace dir vanishes mid-run: one line each for what could not be written, no traceback, and the job's
    own exit status still comes through (gloo times out after 8 s, mp.spawn exits 1)."""
    import shutil

    run = tmp_path / "r"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run), "--hang-after", "3"] +
                            ["--", PY, str(EXAMPLE), "--world", "2", "--steps", "6", "--fault", "skip", "--timeout",
                             "8", "--hang-seconds", "300"],
                            env=trace_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list(run.glob("*/rings/*.ring")):
            time.sleep(0.2)
        time.sleep(1.0)
        shutil.rmtree(run)
        _out, err = proc.communicate(timeout=90)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # the job's own traceback (its frames pass through our wrappers) but none from trace run itself
    for ours in ("ranktrace/cli.py", "tracer/launch/launcher.py", "tracer/watch/monitor.py", "tracer/watch/proc_sampler.py",
                 "tracer/watch/stack_sampler.py", "tracer/watch/ring_tail.py", "tracer/watch/sample_log.py", "tracer/launch/meta.py"):
        assert ours not in err, err[-3000:]
    assert proc.returncode == 1, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("[ranktrace] job exited with status 1")


def test_a_pid_reused_since_the_ring_was_written_is_not_taken_for_a_rank(tmp_path: Path):
    """`trace analyze` on the dir of a run whose launcher was SIGKILLed (no exit in meta.json): a ring's pid that
    now belongs to a process started after the ring must not be dumped and read as a rank."""
    from ranktrace.tracer.launch import hostinfo
    from ranktrace.tracer.watch import live
    from ranktrace.tracer.rank.recorder import Recorder

    host = tmp_path / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    (host / "meta.json").write_text(json.dumps({"schema": "ranktrace.meta/1", "hostname": os.uname().nodename,
                                                "exit": None}))
    owner = subprocess.Popen([PY, "-c", "import sys, time\nfrom ranktrace.tracer.rank.recorder import Recorder\n"
                              "Recorder(sys.argv[1] + '/rings/%d.ring' % __import__('os').getpid(), slots=16)\n"
                              "print('ready', flush=True); time.sleep(60)", str(host)],
                             stdout=subprocess.PIPE, text=True, cwd=REPO, env=trace_env())
    stranger = None
    try:
        assert owner.stdout.readline().strip() == "ready"
        Recorder(str(host / "rings" / "99999999.ring"), slots=16).close()  # a pid that does not exist
        time.sleep(1.6)
        stranger = subprocess.Popen(["sleep", "60"])  # started after every ring: stands for a reused pid
        os.link(host / "rings" / f"{owner.pid}.ring", host / "rings" / f"{stranger.pid}.ring")
        assert live.live_pids(host) == [owner.pid]
        assert live.live_pids(tmp_path / "elsewhere-0000") == []
        # `trace attach` writes no rings: its meta.json pids count if they started before the attach
        attached = tmp_path / "attach-0000"
        attached.mkdir()
        (attached / "meta.json").write_text(json.dumps({
            "schema": "ranktrace.meta/1", "hostname": os.uname().nodename, "exit": None, "attached": True,
            "start_wall_ns": time.time_ns() - 1_300_000_000, "pids": {str(owner.pid): {}, str(stranger.pid): {}}}))
        assert live.live_pids(attached) == [owner.pid]
        # killed and not yet reaped (its parent, this test, has not waited): a zombie is no live rank
        owner.kill()
        deadline = time.monotonic() + 10
        while b") Z " not in Path(f"/proc/{owner.pid}/stat").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.live_pids(host) == [] and live.live_pids(attached) == []
    finally:
        for p in (owner, stranger):
            if p is not None:
                p.kill()
                p.wait()


def test_a_rank_spinning_inside_an_open_collective_is_waiting_not_progressing(tmp_path: Path):
    """vLLM's CPU all-reduce (torch.ops._C.shm_allreduce) and custom all-reduce on GPUs busy-wait inside the call:
    the CPU runs, the stack stays put. An open collective span older than --hang-after with the same stack in every
    quiet sample is a wait: the watchdog reports it and --on-hang kill ends it (a busy rank outside any collective
    stays progress: test_long_compute_without_collectives_is_not_a_hang)."""
    (tmp_path / "spincomm.py").write_text(
        "class Comm:\n"
        "    def all_reduce(self, x):\n"
        "        if x == 2:\n"
        "            while True:  # the peer never arrives: a busy-wait on a flag it would set\n"
        "                pass\n"
        "        return x\n")
    (tmp_path / "main.py").write_text(
        "import spincomm\nc = spincomm.Comm()\nc.all_reduce(1)\nc.all_reduce(2)\n")
    env = trace_env(PYTHONPATH=f"{tmp_path}:{trace_env()['PYTHONPATH']}", RANK="0", WORLD_SIZE="1")
    t0 = time.monotonic()
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--hang-after", "3", "--on-hang", "kill", "--hook",
                     "spincomm:Comm.all_reduce=collective", "--", PY, str(tmp_path / "main.py")], env=env,
                    cwd=tmp_path, timeout=90)
    took = time.monotonic() - t0
    assert res.returncode == 3, res.stderr[-3000:]
    # the live line says where the rank sits: inside the hooked all_reduce, seq 2
    assert re.search(r"\d+ s silent: rank 0 in Comm.all_reduce group hook:Comm.all_reduce#0 seq 2", res.stderr), \
        res.stderr[-3000:]
    assert "hang detected and the job terminated (--on-hang kill)" in res.stderr
    assert took < 40, took
    # and the verdict says so: the rank is inside the hooked all_reduce it never returned from
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["operation"]["seq"]) == ("hang", "stuck_in_collective", 2), v["summary"]
    assert "never returned from it" in v["summary"], v["summary"]
