"""What `trace run` does to a job's processes and signals (issue #16): the same as without it, except that no rank
outlives a killed `trace run`. Each case runs the job plain and traced where the comparison is the point."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, host_dir, trace_env

# A main process and one forked child, both counting the signals they get into OUT/<who>: the first SIGTERM starts a
# graceful shutdown (1 s), a second one aborts it ("aborted"). USR1 keeps its default action (the process dies).
SIGNAL_JOB = r'''
import os, signal, sys, time
out = sys.argv[1]
def run(who):
    got = []
    def on_term(sig, frame):
        got.append(sig)
        with open(os.path.join(out, who), "a") as f:
            f.write(f"TERM {len(got)}\n")
        if len(got) >= 2:
            with open(os.path.join(out, who), "a") as f:
                f.write("aborted\n")
            os._exit(9)
    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(out, who + ".ready"), "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + 8  # outlives the checks (about 2 s after the signal); `term` waits it out twice
    while time.monotonic() < end and not got:
        time.sleep(0.05)
    if got:
        time.sleep(1.0)  # the graceful shutdown
        with open(os.path.join(out, who), "a") as f:
            f.write("graceful\n")
    else:
        with open(os.path.join(out, who), "a") as f:
            f.write("done\n")
child = os.fork()
if child == 0:
    run("child")
    os._exit(0)
run("main")
os.waitpid(child, 0)
'''


def _start(cmd: list[str], traced: bool, run_dir: Path) -> subprocess.Popen:
    argv = TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(run_dir), "--"] + cmd if traced else cmd
    return subprocess.Popen(argv, env=trace_env(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(paths: list[Path], seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < end, f"never appeared: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def _tree(root: int) -> list[int]:
    from ranktrace.tracer.launch.attach import descendants

    return descendants([root])


def _job_pids(proc: subprocess.Popen, traced: bool) -> list[int]:
    """Every process of the run (trace run, its guardian, the job), as a scheduler's cgroup would hold them."""
    return _tree(proc.pid)


def _signal_run(tmp_path: Path, traced: bool, how: str) -> tuple[dict[str, str], int]:
    out = tmp_path / ("traced" if traced else "plain")
    out.mkdir(parents=True)
    proc = _start([PY, "-c", SIGNAL_JOB, str(out)], traced, tmp_path / "run")
    try:
        _wait_for([out / "main.ready", out / "child.ready"])
        time.sleep(0.3)
        if how == "broadcast":  # systemd / Slurm / pkill: every process of the job gets SIGTERM
            for pid in _job_pids(proc, traced):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        else:  # a person: `kill -SIG <the pid they started>`
            os.kill(proc.pid, signal.SIGTERM if how == "term" else signal.SIGUSR1)
        proc.wait(timeout=60)
        time.sleep(1.5)  # the child's own graceful shutdown ends after the main's when it was spared
        alive = sorted(who for who in ("main", "child") if _running(int((out / f"{who}.ready").read_text())))
    finally:
        for pid in _tree(proc.pid):
            os.kill(pid, signal.SIGKILL)
        for who in ("main", "child"):
            try:
                os.kill(int((out / f"{who}.ready").read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        proc.wait()
    got = {p.name: p.read_text() for p in out.iterdir() if not p.name.endswith(".ready")}
    got["alive"] = ",".join(alive)
    return got, proc.returncode


@pytest.mark.parametrize("how", ["broadcast", "term", "usr1"])
def test_a_signal_reaches_the_job_exactly_once_as_without_ranktrace(tmp_path: Path, how: str):
    """broadcast: a scheduler sent SIGTERM to every process, and trace run forwarded it to the whole job group
    again: each process got two, and the second aborted the graceful shutdown. term / usr1: `kill <trace run>` is
    `kill <the started process>` (USR1 to the group killed the child too, which plain USR1 to the job spares)."""
    with ThreadPoolExecutor(max_workers=2) as pool:   # side by side: each mostly waits out its job's own loop
        runs = [pool.submit(_signal_run, tmp_path / d, traced, how) for d, traced in (("p", False), ("t", True))]
        (plain, plain_rc), (traced, traced_rc) = (r.result() for r in runs)
    assert traced == plain, (how, plain, traced)
    assert traced_rc == (128 - plain_rc if plain_rc < 0 else plain_rc), (traced_rc, plain_rc)
    if how == "broadcast":
        assert plain == {"main": "TERM 1\ngraceful\n", "child": "TERM 1\ngraceful\n", "alive": ""}
    if how == "usr1":
        assert plain == {"alive": "child"} and plain_rc == -signal.SIGUSR1  # the child is spared


LEAVES_BEHIND = r'''
import os, subprocess, sys
out = sys.argv[1]
# a daemon in a session of its own, and a background writer in the job's own process group: both outlive the job
subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(3); open({out + '/daemon'!r}, 'w').write('ok')"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(2); open({out + '/writer'!r}, 'w').write('ok')"],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("main exits", flush=True)
'''


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
def test_processes_the_job_leaves_behind_on_purpose_live_on(tmp_path: Path, traced: bool):
    """trace run terminated every process left in the job's group and every re-parented orphan at exit: a daemon,
    a start_new_session helper and a background writer died, which without ranktrace live."""
    proc = _start([PY, "-c", LEAVES_BEHIND, str(tmp_path)], traced, tmp_path / "run")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    _wait_for([tmp_path / "daemon", tmp_path / "writer"], seconds=15)


HEALTHY_SPAWN = r'''
import datetime, os, socket, subprocess, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
def rank_main(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    t = torch.ones(4)
    end = time.monotonic() + 90
    while time.monotonic() < end:
        dist.all_reduce(t)
        time.sleep(0.01)
if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    # a worker in a session of its own, as torchrun starts its workers: it too writes a ring, so it is the job's
    code = ("import torch, torch.distributed as dist, time\n"
            "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:0')\n"
            "t = torch.ones(2)\n"
            "end = time.monotonic() + 90\n"
            "while time.monotonic() < end:\n    dist.all_reduce(t); time.sleep(0.01)\n")
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    mp.spawn(rank_main, args=(2,), nprocs=2)
'''


def test_sigkill_of_trace_run_ends_every_rank_and_the_trace_says_it_was_cut(tmp_path: Path):
    """SIGKILL of trace run left the mp.spawn ranks under PID 1 (PDEATHSIG reaches only the direct child), and the
    trace dir then read HANG, culprit 0, exit 3 for a healthy job, saying nothing of the cut."""
    run_dir = tmp_path / "run"
    script = tmp_path / "healthy_spawn.py"  # a file: mp.spawn's children import rank_main from it
    script.write_text(HEALTHY_SPAWN)
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run_dir), "--", PY, str(script)], env=trace_env(),
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    rings: list[Path] = []
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            rings = list(run_dir.glob("*/rings/*.ring"))
            if len(rings) >= 4 and all(r.stat().st_size for r in rings):
                break
            time.sleep(0.2)
        time.sleep(3)   # every rank in its loop
        job = [int(r.name.split(".")[0].split("-")[0]) for r in run_dir.glob("*/rings/*.ring")]
        assert len(job) >= 4 and proc.poll() is None  # main, 2 ranks, the new-session worker: all running
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 15
        alive = job
        while time.monotonic() < end:
            alive = [p for p in job if _running(p)]
            if not alive:
                break
            time.sleep(0.2)
        assert alive == [], f"still running {time.monotonic() - end + 15:.0f} s after trace run was killed: {alive}"
    finally:
        for p in [int(r.name.split(".")[0].split("-")[0]) for r in run_dir.glob("*/rings/*.ring")]:
            if _running(p):
                os.kill(p, signal.SIGKILL)
    m = json.loads((host_dir(run_dir) / "meta.json").read_text())
    assert m["exit"] is None and m["launcher_lost"]["ended_pids"]
    res = subprocess.run(TRACE + ["analyze", "--json", str(run_dir)], capture_output=True, text=True,
                         env=trace_env(), cwd=REPO, timeout=120)
    v = json.loads(res.stdout)
    assert (v["status"], v["kind"], v["culprit_ranks"], res.returncode) == ("inconclusive", "unknown", [], 4), \
        (v["summary"], res.stderr[-2000:])
    assert any(f["kind"] == "trace_incomplete" for f in v["findings"]), [f["kind"] for f in v["findings"]]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def test_ctrl_c_during_a_hang_is_an_interrupt_not_a_crash(tmp_path: Path):
    """Ctrl-C at the terminal while rank 3 stalls and ranks 0-2 wait for it: the verdict read 'rank 3 exited first,
    check OOM/dmesg' (status crashed): the person's own interrupt blamed as a crash."""
    from tests.helpers import end_session, pty_session, read_until, wait_exit

    run_dir = tmp_path / "run"
    argv = TRACE + ["run", "-o", str(run_dir), "--hang-after", "4", "--", PY, str(REPO / "examples" / "tp_job.py"),
                    "--world", "4", "--steps", "6", "--fault", "skip", "--timeout", "15", "--hang-seconds", "120"]
    pid, master = pty_session(argv, trace_env())
    out = bytearray()
    try:
        assert read_until(master, out, b"HANG", 90), out.decode(errors="replace")[-3000:]
        os.write(master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground group (trace run)
        status = wait_exit(pid, 90)
        read_until(master, out, b"trace in", 5)
    finally:
        end_session(pid, master)
    assert status is not None, out.decode(errors="replace")[-3000:]
    v = json.loads((run_dir / "verdict.json").read_text())
    text = json.dumps(v)
    assert v["status"] == "interrupted", (v["status"], v["summary"])
    assert v["kind"] == "missing_ranks" and v["culprit_ranks"] == [3], v["summary"]
    assert "exited first" not in text and "OOM" not in text and "dmesg" not in text
    assert any(f["kind"] == "interrupted" for f in v["findings"])
    m = json.loads((host_dir(run_dir) / "meta.json").read_text())
    assert m["exit"]["interrupted"] is True
    left = [p for p in map(int, m["pids"]) if _running(p)]
    assert left == []  # Ctrl-C reached every process of the job, as the terminal would have sent it


def test_on_hang_kill_still_ends_the_whole_job(tmp_path: Path):
    """--on-hang kill is the one case trace run ends the job's processes itself, workers in sessions of their own
    included."""
    run_dir = tmp_path / "run"
    res = subprocess.run(TRACE + ["run", "-o", str(run_dir), "--hang-after", "3", "--on-hang", "kill", "--", PY,
                                  str(REPO / "examples" / "tp_job.py"), "--world", "2", "--steps", "6", "--fault",
                                  "skip", "--timeout", "120", "--hang-seconds", "120"],
                         capture_output=True, text=True, env=trace_env(), cwd=REPO, timeout=180,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 3, res.stderr[-3000:]
    m = json.loads((host_dir(run_dir) / "meta.json").read_text())
    time.sleep(0.5)
    assert [p for p in map(int, m["pids"]) if _running(p)] == []
