"""trace run on real multi-process gloo jobs: what a user checks in the trace directory and on the terminal."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.helpers import (EXAMPLE, PY, SCRIPTS, TRACE, end_session, events, meta, pty_session, read_until, run_trace,
                           trace_env, wait_exit)

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
ARGV_SECRET = "sk-proj-ZZtopsecretvalue1234567890abcdef"


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One clean 4-rank job, shared by every check below (a job costs ~6 s here)."""
    run_dir = tmp_path_factory.mktemp("spine") / "run"
    env = trace_env(HF_TOKEN=TOKEN, MY_DB_URL="postgres://alice:s3cr3tpassw0rd@db.internal/x")
    res = run_trace(["run", "-o", str(run_dir), "--", PY, str(SCRIPTS / "spine_job.py"), "--api-key", ARGV_SECRET,
                     "--data", "x"], env=env)
    return run_dir, res


def test_clean_run_passes_status_and_output_through(clean_run):
    run_dir, res = clean_run
    assert res.returncode == 0, res.stderr[-3000:]
    assert "spine job starting" in res.stdout and "rank 3 done" in res.stdout
    assert "spine job stderr line" in res.stderr
    assert "[ranktrace]" not in res.stdout  # our own lines only on stderr, prefixed
    last = [ln for ln in res.stderr.splitlines() if ln.startswith("[ranktrace]")][-1]
    assert "exit code 0 is the job's" in last and str(run_dir) in last
    m = meta(run_dir)
    assert m["schema"] == "ranktrace.meta/1" and m["exit"]["exit_code"] == 0
    assert m["versions"]["torch"].startswith("2.")
    ranked = {info["rank"]: pid for pid, info in m["pids"].items() if info["rank"] is not None}
    assert sorted(ranked) == [0, 1, 2, 3]


def test_every_op_recorded_once_with_seq_aligned(clean_run):
    run_dir, _ = clean_run
    ev = events(run_dir)
    enters = ev.filter(pc.and_(pc.equal(ev["kind"], "enter"), pc.is_in(ev["category"], value_set=__import__(
        "pyarrow").array(["collective", "p2p"])))).to_pylist()
    by_rank: dict[int, list] = {}
    for e in enters:
        by_rank.setdefault(e["rank"], []).append(e)
    assert sorted(by_rank) == [0, 1, 2, 3]
    # default group: 5 x (all_reduce, broadcast) + all_gather_object + barrier, in the same order on every rank
    world = {r: [(e["seq"], e["name"]) for e in es if e["group_desc"] == "default_pg" and e["category"] == "collective"]
             for r, es in by_rank.items()}
    expected = [(i + 1, n) for i, n in enumerate(["all_reduce", "broadcast"] * 5 + ["all_gather_object", "barrier"])]
    assert all(v == expected for v in world.values()), world
    # the inner all_gather calls of all_gather_object and ProcessGroup calls are not recorded a second time
    assert sum(1 for e in enters if e["name"] == "all_gather") == 0
    # the pair group {0,1}: seq 1 on both members, absent on the others. A group's members are recorded on its last
    # row of each process (and its meta rows), not on every op (issue #19: 4 KiB a record at 1,024 ranks)
    members = {r["group"]: r["group_ranks"] for r in ev.select(["group", "group_ranks"]).to_pylist()
               if r["group_ranks"] is not None}
    pair = {r: [(e["seq"], e["name"]) for e in es if members.get(e["group"]) == [0, 1]] for r, es in by_rank.items()}
    assert pair[0] == pair[1] == [(1, "all_reduce")] and pair[2] == pair[3] == []
    # p2p pairs: the k-th send from A to B aligns with B's k-th recv from A
    sends = {(e["rank"], e["peer"], e["seq"]) for e in enters if e["name"] == "send"}
    recvs = {(e["peer"], e["rank"], e["seq"]) for e in enters if e["name"] == "recv"}
    assert sends == recvs == {(0, 1, 1), (2, 3, 1)}
    # every enter has an exit, with the backend's own counter read after the call
    exits = ev.filter(pc.equal(ev["kind"], "exit"))
    assert exits.num_rows >= len(enters)
    ar = [e for e in by_rank[0] if e["name"] == "all_reduce" and e["group_desc"] == "default_pg"]
    assert ar[0]["dtype"] == "float32" and ar[0]["shape"] == "[8]" and ar[0]["nbytes"] == 32
    assert ar[0]["callsite"].split(":")[0].endswith("spine_job.py")  # call site is the user's line, not torch's


def test_early_bound_reference_is_traced(clean_run):
    run_dir, _ = clean_run
    ev = events(run_dir)
    sites = set(ev.filter(pc.equal(ev["name"], "all_reduce"))["callsite"].to_pylist())
    lines = (SCRIPTS / "spine_job.py").read_text().splitlines()
    lineno = next(i + 1 for i, ln in enumerate(lines) if ln.strip().startswith("all_reduce(t)"))
    assert any(f"spine_job.py:{lineno} " in s for s in sites if s), sites  # the early-bound call's own line


def test_secrets_appear_nowhere_in_the_trace_dir(clean_run):
    run_dir, _ = clean_run
    blobs = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    for secret in (TOKEN, ARGV_SECRET, "s3cr3tpassw0rd"):
        assert secret.encode() not in blobs, secret
    m = meta(run_dir)
    assert m["env"]["HF_TOKEN"] == "<redacted>"
    assert "--api-key" in m["command"] and "<redacted>" in m["command"]


def test_killed_rank_keeps_its_records(tmp_path: Path):
    run_dir = tmp_path / "run"
    res = run_trace(["run", "--no-analyze", "-o", str(run_dir), "--", PY, str(SCRIPTS / "killed_mid_loop.py")])
    assert res.returncode == 1  # mp.spawn's own status after a child died of SIGKILL
    ev = events(run_dir)
    mine = ev.filter(pc.and_(pc.equal(ev["rank"], 2), pc.equal(ev["name"], "all_reduce")))
    assert max(mine.filter(pc.equal(mine["kind"], "exit"))["seq"].to_pylist()) == 6


@pytest.mark.parametrize("code,expected", [(7, 7), (-15, 143)])
def test_exit_status_and_signals_pass_through(tmp_path: Path, code: int, expected: int):
    res = run_trace(["run", "--no-analyze", "-o", str(tmp_path / "r"), "--", PY, str(SCRIPTS / "exit_with.py"),
                     str(code)])
    assert res.returncode == expected
    assert "exit_with running" in res.stdout
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("[ranktrace]") and f"exit code {expected}" in line


def test_a_crash_with_nothing_pending_and_a_run_killed_midway_are_not_called_hangs(tmp_path: Path):
    """Two verdicts that must not blame anyone: the job failed with no collective pending (crashed, unknown), and
    `trace run` itself was SIGKILLed with its job (no exit status and nothing alive, though the killed rank may
    still be an unreaped zombie: inconclusive, exit 4)."""
    import json

    crash = tmp_path / "crash"
    res = run_trace(["run", "-o", str(crash), "--", PY, "-c", "import torch.distributed, sys; sys.exit(7)"])
    assert res.returncode == 7
    v = json.loads((crash / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("crashed", "unknown", [])
    assert "ended with status 7; no collective was left pending" in v["summary"]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(killed), "--no-monitor", "--", PY, "-c",
                                     "import torch.distributed, time; time.sleep(120)"],
                            env=trace_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(killed.glob("*/rings/*.ring")) and time.monotonic() < deadline:
            time.sleep(0.1)
        rings = list(killed.glob("*/rings/*.ring"))
        assert rings
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # trace run first: it never writes an exit status
        proc.wait()
        for ring in killed.glob("*/rings/*.ring"):  # then the job (its own process group), by its ring's pid
            try:
                os.kill(int(ring.name.split(".")[0].split("-")[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    # no sleep: the job is a zombie until whoever inherited it reaps it, and a zombie is not a live rank
    res = run_trace(["analyze", "--json", str(killed)])
    v = json.loads(res.stdout)
    assert (v["status"], v["kind"], res.returncode) == ("inconclusive", "unknown", 4), res.stderr[-2000:]
    assert "trace is incomplete" in v["summary"]  # the guardian ended the job (or nothing is alive): a cut trace


def test_missing_command_is_one_line_and_exit_2(tmp_path: Path):
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--", "no-such-command-xyz"])
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no-such-command-xyz" in res.stderr
    assert not (tmp_path / "r").exists()


def test_unwritable_or_existing_output_refused_before_start(tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    marker = tmp_path / "started"
    cmd = ["--", PY, "-c", f"open({str(marker)!r}, 'w')"]
    try:
        if os.geteuid() != 0:  # root ignores permission bits; the existing-dir check still runs below
            res = run_trace(["run", "-o", str(ro / "r")] + cmd)
            assert res.returncode == 2 and "not writable" in res.stderr
    finally:
        ro.chmod(0o700)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "user-file").write_text("keep me")
    res = run_trace(["run", "-o", str(existing)] + cmd)
    assert res.returncode == 2 and "never overwrites" in res.stderr
    assert (existing / "user-file").read_text() == "keep me" and not marker.exists()


def test_tracer_failure_in_a_rank_is_one_line_and_never_the_jobs(tmp_path: Path):
    """A ring that cannot be created: tracing turns off with one line; the job runs and exits as usual."""
    blocker = tmp_path / "host"
    blocker.mkdir()
    (blocker / "rings").write_text("a file where the rings directory should be")
    env = trace_env(RANKTRACE_DIR=str(blocker), PYTHONPATH=str(Path(__file__).resolve().parents[1] / "tracer" / "rank" /
                                                                   "_inject"))
    code = ("import os, torch, torch.distributed as dist\n"
            "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0')\n"
            "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:0')\n"
            "t = torch.ones(2); dist.all_reduce(t); print('sum', t.sum().item()); dist.destroy_process_group()\n")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "sum 2.0" in res.stdout
    assert res.stderr.count("[ranktrace]") == 1 and "tracing off" in res.stderr


def test_rings_readable_while_hung(tmp_path: Path):
    """A live hung job: the rings show ranks 0-2 inside all_reduce; analyze names rank 3 with its stack. (Ctrl-C at
    the terminal during a hang: tests/test_launch_safety.py, under a pty, as a person types it.)"""
    from ranktrace.analyzers.readers import ranktrace_ring
    from ranktrace.analyzers.readers.base import ReaderError

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(TRACE + ["run", "-o", str(run_dir), "--", PY, str(EXAMPLE), "--world", "4", "--steps",
                                     "6", "--fault", "skip", "--timeout", "120", "--hang-seconds", "120"],
                            env=trace_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        hd = None
        deadline = time.monotonic() + 60
        open_ranks: set[int] = set()
        while time.monotonic() < deadline and open_ranks != {0, 1, 2}:
            time.sleep(0.5)
            if hd is None:
                hs = [d for d in run_dir.iterdir() if d.is_dir()] if run_dir.exists() else []
                hd = hs[0] if hs else None
                continue
            open_ranks = set()
            for ring in (hd / "rings").glob("*.ring"):
                try:
                    t = ranktrace_ring.read(ring).events.to_pylist()
                except ReaderError:  # a process that is only now creating its ring
                    continue
                if not t:
                    continue
                spans = {e["span_id"]: e for e in t if e["kind"] == "enter" and e["category"] == "collective"}
                for e in t:
                    if e["kind"] in ("exit", "error"):
                        spans.pop(e["span_id"], None)
                if any(e["name"] == "all_reduce" and e["seq"] == 5 for e in spans.values()):
                    open_ranks.add(t[0]["rank"])
        assert open_ranks == {0, 1, 2}
        res = subprocess.run(TRACE + ["analyze", "--json", str(run_dir)], capture_output=True, text=True,
                             env=trace_env(), timeout=60)
        import json

        v = json.loads(res.stdout)
        assert res.returncode == 3, res.stderr
        assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "missing_ranks", [3],
                                                                                      [0, 1, 2])
        assert (v["operation"]["name"], v["operation"]["seq"]) == ("all_reduce", 5)
        stacks = [e for f in v["findings"] for e in f["evidence"] if e["source"] == "pyspy" and e["rank"] == 3]
        assert stacks and "next_batch" in stacks[0]["detail"]  # the culprit's own stack, taken live
        assert v["ranks"]["3"]["state"] == "blocked_other" and v["ranks"]["0"]["state"] == "in_collective"
    finally:
        from ranktrace.tracer.launch.attach import descendants

        for pid in reversed(descendants([proc.pid])):  # the job runs in its own group: kill the whole tree
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


READ_A_LINE = ("import sys; print('prompt>', flush=True); line = sys.stdin.readline(); "
               "print('got', line.strip(), flush=True)")


def test_a_job_reading_the_terminal_gets_it_instead_of_stopping(tmp_path: Path):
    """`trace run` typed at a terminal puts the job in its own process group; a rank that then reads the terminal
    (input(), breakpoint(), pdb) would be stopped by SIGTTIN forever. The launcher hands it the terminal, as a shell
    does for a foreground job, and takes it back at the end."""
    argv = TRACE + ["run", "--no-analyze", "-o", str(tmp_path / "r"), "--", PY, "-c", READ_A_LINE]
    pid, master = pty_session(argv, trace_env())
    out = bytearray()
    try:
        assert read_until(master, out, b"prompt>", 30), out.decode(errors="replace")
        os.write(master, b"hello\n")
        assert read_until(master, out, b"got hello", 30), out.decode(errors="replace")
        # the job is continued before the line is printed, so the line may come after the job's answer
        read_until(master, out, b"the job reads the terminal", 15)
        status = wait_exit(pid, 15)
    finally:
        end_session(pid, master)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out.decode(errors="replace")
    assert b"the job reads the terminal" in out


def test_the_job_is_continued_before_the_person_is_told_it_has_the_terminal(monkeypatch):
    """A Ctrl-Z typed right after the hand-over line must find the job running: sent to a job still stopped by
    SIGTTIN, the SIGTSTP stays pending and the SIGCONT that follows discards it (signal(7)) — seen in CI as a
    Ctrl-Z that never suspended. The order is the whole fix, so it is what this checks."""
    import signal as sig
    import termios

    from ranktrace.tracer.launch import terminal

    said: list[str] = []
    monkeypatch.setattr(terminal, "give_terminal", lambda fd, pgid: said.append("terminal"))
    monkeypatch.setattr(termios, "tcgetattr", lambda fd: [])
    jt = terminal.JobTerminal(0, 4242, lambda s: said.append(sig.Signals(s).name), lambda line: said.append("told"),
                              lambda: said.append("paused"))
    before = sig.getsignal(sig.SIGTTOU)
    try:
        jt._hand_over()
        jt._hand_over()  # `fg` after Ctrl-Z: hand it back and continue, nothing said
        assert said == ["terminal", "paused", "SIGCONT", "told", "terminal", "SIGCONT"]
        assert sig.getsignal(sig.SIGTTOU) == sig.SIG_IGN  # our lines come from the background meanwhile
    finally:
        jt.restore()
    assert sig.getsignal(sig.SIGTTOU) == before


def test_ctrl_z_under_a_shell_suspends_trace_run_and_fg_resumes_the_job(tmp_path: Path):
    """Under an interactive bash (job control), Ctrl-Z on a job that has the terminal stops `trace run` as the
    shell's job; `fg` resumes it, the terminal goes back to the job, and the job reads its line."""
    cmd = " ".join(TRACE + ["run", "--no-analyze", "-o", str(tmp_path / "r"), "--", PY, "-c", repr(READ_A_LINE)])
    bash = shutil.which("bash")
    assert bash
    pid, master = pty_session([bash, "--norc", "--noprofile", "-i"], dict(trace_env(), PS1="$ ", TERM="dumb"))
    out = bytearray()
    try:
        assert read_until(master, out, b"$ ", 10)
        os.write(master, cmd.encode() + b"\n")
        assert read_until(master, out, b"the job reads the terminal", 30), out.decode(errors="replace")
        os.write(master, b"\x1a")  # Ctrl-Z while the job waits for its line
        assert read_until(master, out, b"Stopped", 10), out.decode(errors="replace")
        del out[:]
        os.write(master, b"fg\n")
        time.sleep(1.0)
        os.write(master, b"hello\n")
        assert read_until(master, out, b"got hello", 30), out.decode(errors="replace")
        assert read_until(master, out, b"$ ", 15)  # trace run ended and the shell has its terminal back
        os.write(master, b"exit\n")
        os.waitpid(pid, 0)
    finally:
        end_session(pid, master)


def test_ctrl_z_without_a_job_control_shell_is_dropped_as_it_would_be(tmp_path: Path):
    """`trace run` straight in a terminal session (tmux, ssh -t, docker exec): no shell will ever continue a
    stopped group, so Ctrl-Z must not stop anything for good — the job reads its line and ends."""
    argv = TRACE + ["run", "--no-analyze", "-o", str(tmp_path / "r"), "--", PY, "-c", READ_A_LINE]
    pid, master = pty_session(argv, trace_env())
    out = bytearray()
    try:
        assert read_until(master, out, b"the job reads the terminal", 30), out.decode(errors="replace")
        os.write(master, b"\x1a")
        time.sleep(1.0)
        os.write(master, b"hello\n")
        assert read_until(master, out, b"got hello", 20), out.decode(errors="replace")
        status = wait_exit(pid, 15)
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        end_session(pid, master)
