"""Host-side waits named (issue #29): what a rank that sits at 0% CPU waits for, from the watchdog's /proc samples.

Real processes throughout: a lock file left by a process SIGKILLed while it held torch's FileBaton, a flock another
live process holds, a pipe whose only writer never writes. The sampler's facts (tracer/watch/wait_probe.py, rows in
samples/proc.arrows) are checked as a person would check them by hand (`fuser`, `/proc/locks`, `ls -l`), then whole
2- and 3-rank gloo jobs under `trace run` must get a verdict that names the lock, its age, its holder, the pipe."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.ipc as ipc

from tests.helpers import PY, REPO, SCRIPTS, TRACE, kill_group, trace_env

_HOLD = ("import fcntl, sys, time\nf = open(sys.argv[1], 'w')\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('held', "
         "flush=True)\ntime.sleep(120)\n")
_KILLED_BUILD = ("import os, sys, time\nfrom torch.utils.file_baton import FileBaton\n"
                 "assert FileBaton(sys.argv[1]).try_acquire()\nprint('building', flush=True)\ntime.sleep(120)\n")


def _stale_lock(ext_root: Path, name: str = "fused_op") -> Path:
    """A cpp_extension build lock left the way it happens: a start that took torch's FileBaton was SIGKILLed."""
    (ext_root / name).mkdir(parents=True)
    lock = ext_root / name / "lock"
    p = subprocess.Popen([PY, "-c", _KILLED_BUILD, str(lock)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "building"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert lock.exists()
    return lock


def _holder(path: Path) -> subprocess.Popen:
    p = subprocess.Popen([PY, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_the_sampler_names_the_lock_its_holder_and_the_pipe_writer(tmp_path: Path) -> None:
    from ranktrace.analyzers.readers import ranktrace_samples
    from ranktrace.tracer.watch.proc_sampler import ProcSampler
    from ranktrace.tracer.watch.sample_log import PROC_SCHEMA, ArrowStreamLog

    exts = tmp_path / "torch_extensions"
    stale = _stale_lock(exts)
    held = tmp_path / "cache.lock"
    held.touch()
    holder = _holder(held)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(exts))
    procs = [subprocess.Popen([PY, "-c", f"import fcntl\nfcntl.flock(open({str(held)!r}, 'w'), fcntl.LOCK_EX)"]),
             subprocess.Popen([PY, "-c", "import subprocess\np = subprocess.Popen(['sleep', '60'], "
                                         "stdout=subprocess.PIPE)\np.stdout.read()"]),
             subprocess.Popen([PY, "-c", "import os, time\nwhile os.path.exists(os.environ['TORCH_EXTENSIONS_DIR'] + "
                                         "'/fused_op/lock'):\n    time.sleep(0.1)"], env=env)]
    try:
        time.sleep(1.0)
        log = ArrowStreamLog(tmp_path / "samples" / "proc.arrows", PROC_SCHEMA)
        sampler = ProcSampler(log, probe_every_s=0.3)
        ranks = {p.pid: i for i, p in enumerate(procs)}
        spent = []
        for _ in range(4):
            t0 = time.perf_counter()
            sampler.sample(list(ranks), ranks)
            spent.append(time.perf_counter() - t0)
            time.sleep(0.4)
        log.close()
        rows = ipc.open_stream(open(tmp_path / "samples" / "proc.arrows", "rb")).read_all().to_pylist()
        obs = ranktrace_samples.read(tmp_path / "samples" / "proc.arrows").observations.to_pylist()
    finally:
        for p in (*procs, holder):
            p.kill()
            p.wait()
    assert max(spent) < 0.5, spent           # a round has a time limit: the watchdog is never held up
    waits = {r["rank"]: r for r in rows if r["kind"] == "wait"}
    assert waits[0]["path"] == str(held) and waits[0]["peer_pid"] == holder.pid, waits[0]   # /proc/locks' holder
    assert "syscall=flock" in waits[0]["detail"]
    sleep = next(r for r in rows if r["kind"] == "child" and r["rank"] == 1)
    assert sleep["comm"] == "sleep" and sleep["ppid"] == procs[1].pid
    assert waits[1]["path"].startswith("pipe:[") and waits[1]["peer_pid"] == sleep["pid"]   # the pipe's writer
    lock = next(o for o in obs if o["kind"] == "lock_file" and o["rank"] == 2)
    assert lock["name"] == str(stale) and "holders=- " in lock["detail"] and "openers=- " in lock["detail"]
    assert lock["value"] >= 0 and abs(lock["value"] - (time.time() - stale.stat().st_mtime)) < 10   # its age, s


def test_a_process_whose_proc_files_vanish_or_cannot_be_read_is_said_not_raised() -> None:
    from ranktrace.tracer.watch import wait_probe

    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    index = wait_probe.ProcIndex(wait_probe.Deadline(0.2))
    w = wait_probe.wait_fact(gone.pid, "S", index)
    assert w.syscall is None and "unreadable" in w.note
    assert wait_probe.lock_facts(gone.pid, index, {})[1].startswith("its environment is unreadable")
    spent = wait_probe.Deadline(0.0)
    assert not spent.left("x") and spent.missed == {"x"}
    cut = wait_probe.ProcIndex(spent)
    assert cut.procs() == {} and "time limit" in cut.note()    # nothing read past the time limit, and it says so


def _run(tmp_path: Path, what: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    run = tmp_path / "run"
    res = subprocess.run(TRACE + ["run", "-o", str(run), "--hang-after", "5", "--startup-hang-after", "5",
                                  "--on-hang", "kill", "--", PY, str(SCRIPTS / "host_wait_job.py"), what],
                         capture_output=True, text=True, timeout=150, env=trace_env(**env), stdin=subprocess.DEVNULL,
                         cwd=REPO)
    return res, json.loads((run / "verdict.json").read_text())


def test_ranks_waiting_on_a_stale_jit_build_lock_get_its_path_age_and_no_holder(tmp_path: Path) -> None:
    exts = tmp_path / "torch_extensions"
    lock = _stale_lock(exts)
    src = tmp_path / "fused_op.cpp"
    src.write_text("int fused_op() { return 1; }\n")
    res, v = _run(tmp_path, "baton", TORCH_EXTENSIONS_DIR=str(exts), HOST_WAIT_SRC=str(src))
    assert res.returncode == 3, res.stderr[-3000:]
    assert (v["status"], v["kind"], v["operation"]["name"]) == ("hang", "blocked_outside_collective", "file_lock")
    assert v["culprit_ranks"] == [0, 1], v["summary"]
    assert str(lock) in v["summary"] and "age " in v["summary"], v["summary"]
    assert "no live process holds it or builds" in v["summary"] and "stale lock" in v["summary"]
    assert any(f"rm {lock}" in s for s in v["next_steps"]), v["next_steps"]
    for r in ("0", "1"):
        assert v["ranks"][r]["blocked"] == "lock_wait", v["ranks"][r]
        assert str(lock) in v["ranks"][r]["blocked_detail"] and "stale" in v["ranks"][r]["blocked_detail"]
    assert str(lock) in res.stderr   # what trace run printed says it too


_LIVE_BUILD = ("import os, subprocess, sys\nfrom torch.utils.file_baton import FileBaton\n"
               "assert FileBaton(sys.argv[1]).try_acquire()\nprint('building', flush=True)\n"
               "subprocess.run(['ninja', '-C', sys.argv[2], '-j1'], stdout=subprocess.DEVNULL)\n")


def test_ranks_waiting_on_a_lock_whose_live_owner_compiles_get_no_alarm(tmp_path: Path) -> None:
    """The same wait, but the start that holds the lock is alive and building (ninja running the compiler one object
    after another, as cpp_extension does): progress, however long it takes — no hang, nobody blamed."""
    exts = tmp_path / "torch_extensions"
    (exts / "fused_op").mkdir(parents=True)
    lock = exts / "fused_op" / "lock"
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text("rule cxx\n  command = c++ -O2 -c $in -o $out\n" + "".join(
        f"build o{i}.o: cxx s{i}.cc\n" for i in range(400)))
    for i in range(400):
        (build / f"s{i}.cc").write_text(f"#include <vector>\nint f{i}() {{ std::vector<int> v({i}); return v.size(); }}\n")
    owner = subprocess.Popen([PY, "-c", _LIVE_BUILD, str(lock), str(build)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    src = tmp_path / "fused_op.cpp"
    src.write_text("int fused_op() { return 1; }\n")
    run = tmp_path / "run"
    job = subprocess.Popen(TRACE + ["run", "-o", str(run), "--hang-after", "5", "--startup-hang-after", "5", "--on-hang",
                                    "report", "--", PY, str(SCRIPTS / "host_wait_job.py"), "baton"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env=trace_env(TORCH_EXTENSIONS_DIR=str(exts), HOST_WAIT_SRC=str(src)),
                           stdin=subprocess.DEVNULL, cwd=REPO)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "building"
        deadline = time.time() + 90
        while not (run / "verdict.json").exists() and time.time() < deadline and job.poll() is None:
            time.sleep(0.5)
        v = json.loads((run / "verdict.json").read_text())
    finally:
        kill_group(job)
        kill_group(owner)
        job.wait()
        owner.wait()
    assert v["status"] != "hang" and v["culprit_ranks"] == [], v["summary"]
    note = next(f for f in v["findings"] if f["kind"] == "lock_held_by_build")
    assert str(lock) in note["summary"] and f"pid {owner.pid}" in note["summary"] and "not a hang" in note["summary"]
    assert "not a hang" in v["summary"] and "Nothing pending" not in v["summary"], v["summary"]  # the headline too
    for r in ("0", "1"):
        assert v["ranks"][r]["blocked"] == "lock_wait" and "ninja (pid" in v["ranks"][r]["blocked_detail"]
        assert "builds: progress" in v["ranks"][r]["blocked_detail"]


def test_ranks_in_flock_reading_a_silent_pipe_or_starved_of_the_gil_are_named_with_what_they_wait_for(tmp_path: Path) -> None:
    held = tmp_path / "shared.lock"
    held.touch()
    holder = _holder(held)
    try:
        res, v = _run(tmp_path, "other", HOST_WAIT_LOCK=str(held))
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 3, res.stderr[-3000:]
    assert v["status"] == "hang" and v["culprit_ranks"] == [1, 2, 3] and v["waiting_ranks"] == [0], v["summary"]
    r0, r1, r2, r3 = (v["ranks"][k] for k in ("0", "1", "2", "3"))
    assert r0["blocked"] == "in_collective", r0
    assert r1["blocked"] == "lock_wait" and f"held by pid {holder.pid}" in r1["blocked_detail"], r1
    assert str(held) in r1["blocked_detail"] and "alive" in r1["blocked_detail"]
    assert r2["blocked"] == "waiting_on_process" and "pipe" in r2["blocked_detail"], r2
    assert "(sleep" in r2["blocked_detail"] and "writes nothing" in r2["blocked_detail"]
    assert r3["blocked"] == "lock_wait" and "waits for the GIL" in r3["blocked_detail"], r3
    assert "thread native_holder holds the GIL while blocked in native code" in r3["blocked_detail"]
    assert f"held by pid {holder.pid}" in v["summary"] and "writes nothing" in v["summary"]   # the headline says it


def test_verdicts_written_before_blocked_states_still_load() -> None:
    from ranktrace.analyzers.verdict import Verdict

    old = {"schema": "ranktrace.verdict/1", "status": "hang", "kind": "missing_ranks", "summary": "s",
           "ranks": {"0": {"state": "in_collective", "stack": [], "pids": [7]}}}
    v = Verdict.from_dict(old)
    assert v.ranks[0].blocked is None and "blocked" not in v.to_dict()["ranks"]["0"]


def test_a_rank_in_uninterruptible_sleep_is_named_with_its_wchan_and_what_that_usually_means() -> None:
    """A D state cannot be made on demand without a driver or root (the nvidia_uvm eviction deadlock of
    NVIDIA/open-gpu-kernel-modules#1223 is one): the watchdog's /proc rows are given as it writes them."""
    from ranktrace.analyzers.model.blocked import blocked_states
    from tests.test_rule_units import IN_ALL_REDUCE, model, stack

    def proc(rank: int, letter: str, wchan: str) -> dict:
        return {"kind": "thread_state", "rank": rank, "pid": 100 + rank, "tid": 100 + rank, "name": letter,
                "value": 5_000_000_000, "detail": f"comm=python wchan={wchan} cpu_ms=5000 cpu_ms_last_10s=0 "
                f"since_ns={10**18}", "source": "proc", "file": "proc.arrows", "wall_ns": 10**18 + 90 * 10**9}

    wedged = ("uvm_va_block_evict (nvidia_uvm.ko)", "forward (model.py:12)")
    m = model(stacks=[stack(0, IN_ALL_REDUCE), stack(1, wedged)], world=2,
              observations=[proc(0, "S", "futex_wait_queue"), proc(1, "D", "uvm_va_block_lock")])
    b = blocked_states(m)
    assert b[1].state == "in_kernel" and "wchan uvm_va_block_lock" in b[1].detail and "nvidia_uvm" in b[1].detail
    assert "for 90 s at least" in b[1].detail
    assert b[0].state == "in_collective" and "parked" in b[0].detail
    bare = blocked_states(model(stacks=[stack(0, ("poll (selectors.py:1)", "main (app.py:3)"))], world=1))
    assert bare[0].state == "unknown" and "no /proc samples" in bare[0].detail   # says what it lacked


def test_a_rank_in_a_collective_says_spinning_or_parked_and_what_its_gpu_does() -> None:
    """gloo parks in a collective at 0% CPU; an NCCL kernel waiting for a peer spins its GPU at 100%. NVML's rows are
    given as the gpu sampler writes them (this machine has no GPU); without them nothing is said about the GPU."""
    from ranktrace.analyzers.model.blocked import blocked_states
    from tests.test_rule_units import IN_ALL_REDUCE, IN_SYNC, model, stack

    gpu = [{"kind": "gpu_util", "name": "gpu1", "value": 100, "detail": "util_mem=0 power_mw=412000", "source": "gpu",
            "file": "gpu.arrows"},
           {"kind": "gpu_memory", "rank": 1, "pid": 101, "name": "gpu1", "value": 1 << 30, "detail": "process",
            "source": "gpu", "file": "gpu.arrows"}]
    b = blocked_states(model(stacks=[stack(0, IN_ALL_REDUCE), stack(1, IN_SYNC)], world=2, observations=gpu))
    assert b[1].state == "in_collective" and "gpu1 at 100%, 412 W: a kernel spins on it" in b[1].detail
    assert b[0].state == "in_collective" and "gpu" not in b[0].detail   # no NVML row for rank 0: no GPU claim
