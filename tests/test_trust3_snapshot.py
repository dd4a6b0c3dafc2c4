"""#31, bullet 1: `trace analyze` on a folder someone else wrote never acts on live processes.

The live snapshot (on by default) dumps a run's ranks with py-spy, asks their agent sockets and writes into
<host>/dumps/. It now acts only on a run this user started (folder and meta.json ours, our meta format, each pid
really the run's rank now), never follows a symlink when writing, bounds every answer read from a socket, and says
in one line why it left something alone."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ranktrace.tracer.formats import ringformat as rf
from ranktrace.tracer.launch import hostinfo, pidident
from ranktrace.tracer.rank import agent
from ranktrace.tracer.rank.recorder import Recorder
from ranktrace.tracer.watch import burst, live
from tests.helpers import PY, REPO, TRACE, trace_env

OTHER_UID = 65534  # nobody: stands for another local user

# A rank stand-in: its ring, started for this run (RANKTRACE_DIR), and an agent socket that answers forever.
STREAMING_RANK = r"""
import os, socket, sys, threading, time
from ranktrace.tracer.rank.recorder import Recorder
host = sys.argv[1]
Recorder(host + '/rings/%d.ring' % os.getpid(), slots=16)
os.makedirs(host + '/agents', exist_ok=True)
os.chdir(host + '/agents')
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind('%d.sock' % os.getpid())
s.listen(8)
print('ready', flush=True)
def stream(c):
    chunk = b' ' * (1 << 20)  # whitespace: a JSON answer that never ends
    try:
        while True:
            c.sendall(chunk)
    except OSError:
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=stream, args=(c,), daemon=True).start()
"""


def _fake_pyspy(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "pyspy-was-run"
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> {mark}\necho '[]'\n")
    exe.chmod(0o755)
    return exe, mark


def _meta(host: Path) -> None:
    (host / "meta.json").write_text(json.dumps({
        "schema": "ranktrace.meta/1", "hostname": os.uname().nodename, "host_key": hostinfo.host_key(),
        "exit": None, "start_wall_ns": time.time_ns(), "pids": {}}))
    (host / "meta.json").chmod(0o600)


def _ring_naming(path: Path, pid: int) -> None:
    """A ring whose header and start-time record name `pid` exactly (so only ownership and environ tell)."""
    Recorder(str(path), slots=16).close()
    st = pidident.stat(pid)
    assert st is not None
    with open(path, "r+b") as f:
        head = bytearray(f.read(rf.IDENT_OFFSET + rf.IDENT.size))
        fields = list(rf.HEADER.unpack_from(head, 0))
        fields[2] = pid
        rf.HEADER.pack_into(head, 0, *fields)
        rf.IDENT.pack_into(head, rf.IDENT_OFFSET, rf.IDENT_MAGIC, st.start_ticks)
        f.seek(0)
        f.write(head)


def _chown_tree(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.chown(p, OTHER_UID, OTHER_UID, follow_symlinks=False)


@pytest.fixture
def victim_process():
    p = subprocess.Popen(["sleep", "120"])  # stands for one of root's processes the folder's author chose
    try:
        yield p
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another user (chown)")
def test_a_folder_another_user_wrote_is_only_read(tmp_path: Path, victim_process):
    run = tmp_path / "evil-run"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    _meta(host)
    _ring_naming(host / "rings" / f"{victim_process.pid}.ring", victim_process.pid)
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    (host / "dumps").symlink_to(private)
    _chown_tree(run)
    pyspy, mark = _fake_pyspy(tmp_path)
    res = subprocess.run(TRACE + ["analyze", "--json", str(run)], capture_output=True, text=True, timeout=120,
                         env=trace_env(RANKTRACE_PYSPY=str(pyspy)), cwd=tmp_path)
    assert not mark.exists(), "py-spy was run on a process the folder named"
    assert list(private.iterdir()) == [], "something was written through the folder's dumps symlink"
    skipped = [ln for ln in res.stderr.splitlines() if "live snapshot skipped" in ln]
    assert len(skipped) == 1 and f"owned by uid {OTHER_UID}" in skipped[0], res.stderr
    assert "Traceback" not in res.stderr and res.returncode in (0, 3, 4), res.stderr
    json.loads(res.stdout)  # the analysis of what is on disk still comes
    # and `trace snapshot` refuses it the same way (it would also write verdict.json and report.html there)
    res = subprocess.run(TRACE + ["snapshot", str(run)], capture_output=True, text=True, timeout=120,
                         env=trace_env(RANKTRACE_PYSPY=str(pyspy)), cwd=tmp_path)
    assert res.returncode == 2 and not mark.exists() and not (run / "verdict.json").exists(), res.stderr
    assert f"owned by uid {OTHER_UID}" in res.stderr


def test_a_folder_others_may_write_is_only_read(tmp_path: Path, victim_process):
    """Without root: the same folder, ours but open to every writer, is refused as well."""
    run = tmp_path / "shared-run"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    _meta(host)
    _ring_naming(host / "rings" / f"{victim_process.pid}.ring", victim_process.pid)
    os.chmod(run, 0o777)
    os.chmod(host, 0o777)
    pids, why = live.snapshot_targets(host, top=run)
    assert pids == [] and why is not None and "writable by others" in why


def test_our_own_folder_dumps_only_processes_started_for_it(tmp_path: Path, victim_process):
    """Our folder, a ring naming a live process with its exact start time, but that process was never started for
    this run (no RANKTRACE_DIR pointing here): left alone, said once."""
    run = tmp_path / "run"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    os.chmod(run, 0o700)
    _meta(host)
    _ring_naming(host / "rings" / f"{victim_process.pid}.ring", victim_process.pid)
    pyspy, mark = _fake_pyspy(tmp_path)
    env = dict(os.environ, RANKTRACE_PYSPY=str(pyspy))
    old = os.environ.copy()
    os.environ.update(env)
    try:
        problems = live.snapshot_live([run])
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert not mark.exists() and not (host / "dumps").exists()
    (line,) = [p for p in problems if "left alone" in p]
    assert str(victim_process.pid) in line and "not started for this run" in line


@pytest.fixture
def streaming_rank(tmp_path: Path):
    run = tmp_path / "run"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    os.chmod(run, 0o700)
    _meta(host)
    proc = subprocess.Popen([PY, "-c", STREAMING_RANK, str(host)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env=trace_env(RANKTRACE_DIR=str(host)))
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield run, host, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_started_with_a_relative_trace_dir_is_still_ours(tmp_path: Path):
    """`trace run -o traces/x` gives the ranks RANKTRACE_DIR relative to where the job started (meta.json's cwd)."""
    run = tmp_path / "traces" / "x"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    os.chmod(run, 0o700)
    _meta(host)
    meta = json.loads((host / "meta.json").read_text())
    meta["cwd"] = str(tmp_path)
    (host / "meta.json").write_text(json.dumps(meta))
    rel = os.path.relpath(host, tmp_path)
    proc = subprocess.Popen([PY, "-c", STREAMING_RANK, str(host)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env=trace_env(RANKTRACE_DIR=rel))
    try:
        assert proc.stdout.readline().strip() == "ready"
        pids, why = live.snapshot_targets(host, top=run)
        assert pids == [proc.pid] and why is None
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_answer_that_never_ends_is_cut_in_time_and_size(streaming_rank, tmp_path: Path):
    run, host, proc = streaming_rank
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=f"larger than {agent.MAX_ANSWER >> 20} MiB"):
        agent.ask(agent.socket_path(host, proc.pid), timeout=30.0)
    assert time.monotonic() - t0 < 10.0
    # the whole snapshot of this (real, ours) rank: dumped, the agent's answer cut with one line, bounded time
    pyspy, mark = _fake_pyspy(tmp_path)
    old = os.environ.copy()
    os.environ["RANKTRACE_PYSPY"] = str(pyspy)
    try:
        t0 = time.monotonic()
        problems = live.snapshot_live([run])
        took = time.monotonic() - t0
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert mark.exists() and str(proc.pid) in mark.read_text()  # it is ours: py-spy dumped it
    assert took < 12.0, took
    assert any(f"pid {proc.pid}: in-rank agent did not answer" in p and "cut" in p for p in problems), problems
    (dump,) = (host / "dumps").iterdir()
    assert (dump / f"pyspy-{proc.pid}.json").read_text() == "[]\n"


def test_an_answer_that_trickles_forever_is_cut_at_the_timeout(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("t.sock")
    srv.listen(1)

    def trickle() -> None:
        c, _ = srv.accept()
        try:
            while True:
                c.sendall(b" ")
                time.sleep(0.01)
        except OSError:
            pass

    threading.Thread(target=trickle, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        agent.ask(tmp_path / "t.sock", timeout=2.0)
    assert time.monotonic() - t0 < 3.0
    srv.close()


def test_a_socket_served_by_another_process_is_not_asked(streaming_rank):
    run, host, proc = streaming_rank
    with pytest.raises(ValueError, match=f"served by pid {proc.pid}"):
        agent.ask(agent.socket_path(host, proc.pid), timeout=2.0, expect_pid=proc.pid + 1)


def test_a_dumps_symlink_is_never_written_through(tmp_path: Path):
    host = tmp_path / "host"
    host.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (host / "dumps").symlink_to(elsewhere)
    res = burst.capture_burst(host, [os.getpid()], reason="test")
    assert list(elsewhere.iterdir()) == []
    assert any("symlink is never followed" in p for p in res.problems), res.problems
    # a real dumps folder: written, files new and private
    (host / "dumps").unlink()
    res = burst.capture_burst(host, [], reason="test")
    assert (res.directory / "proc.json").is_file()
    assert (res.directory.stat().st_mode & 0o777) == 0o700 and ((res.directory / "proc.json").stat().st_mode
                                                                 & 0o077) == 0


def test_verdict_files_are_never_written_through_a_planted_temporary_name(tmp_path: Path):
    from ranktrace.analyzers import api

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / f".verdict.json.{os.getpid()}.tmp").symlink_to(victim)
    api._replace(run / "verdict.json", "{}\n")
    assert victim.read_text() == "precious\n" and (run / "verdict.json").read_text() == "{}\n"


def test_an_nccl_ras_service_that_streams_forever_is_cut_in_size_and_time():
    from ranktrace.tracer.watch import ras

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return

            def stream(c: socket.socket = c) -> None:
                try:
                    c.sendall(b"SERVER PROTOCOL 2\nOK\nOK\n")
                    chunk = b"x" * (1 << 20)
                    while True:
                        c.sendall(chunk)
                except OSError:
                    pass

            threading.Thread(target=stream, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    t0 = time.monotonic()
    ans = ras.query("127.0.0.1", srv.getsockname()[1], deadline=time.monotonic() + 10.0)
    assert time.monotonic() - t0 < 10.5
    assert len(ans.text) <= ras.MAX_ANSWER and not ans.complete
    srv.close()


def test_fifos_named_like_a_ring_or_meta_json_never_block_the_analysis(tmp_path: Path):
    """A folder whose rings/<pid>.ring and meta.json are FIFOs: opening one to read would wait forever."""
    run = tmp_path / "fifo-run"
    host = run / hostinfo.host_key()
    (host / "rings").mkdir(parents=True)
    os.mkfifo(host / "rings" / f"{os.getpid()}.ring")
    os.mkfifo(host / "meta.json")
    res = subprocess.run(TRACE + ["analyze", str(run), str(REPO / "tests" / "data" / "nasty" / "crlf.log")],
                         capture_output=True, text=True, timeout=60, env=trace_env(), cwd=tmp_path)
    assert "Traceback" not in res.stderr and "ranktrace bug" not in res.stderr, res.stderr
    assert live.live_pids(host) == [] and live.snapshot_targets(host, top=run)[0] == []


# What the other user runs: builds the fake run folder (meta, a ring naming root's process, a dumps symlink into a
# root-only dir, an agent socket that answers forever) and keeps the socket served.
ATTACKER = r"""
import json, os, socket, sys, threading
run, host_key, ring_hex, victim, private, ready = sys.argv[1:7]
host = os.path.join(run, host_key)
os.makedirs(os.path.join(host, 'rings'))
os.makedirs(os.path.join(host, 'agents'))
with open(os.path.join(host, 'meta.json'), 'w') as f:
    json.dump({'schema': 'ranktrace.meta/1', 'hostname': os.uname().nodename, 'host_key': host_key, 'exit': None,
               'pids': {}}, f)
with open(os.path.join(host, 'rings', victim + '.ring'), 'wb') as f:
    f.write(bytes.fromhex(ring_hex))
os.symlink(private, os.path.join(host, 'dumps'))
os.chdir(os.path.join(host, 'agents'))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(victim + '.sock')
s.listen(8)
open(ready, 'w').close()
def stream(c):
    try:
        while True:
            c.sendall(b' ' * (1 << 20))
    except OSError:
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=stream, args=(c,), daemon=True).start()
"""


OTHER_PY = "/usr/bin/python3"  # the other user cannot run this venv's interpreter (under /root)


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(OTHER_PY, os.X_OK),
                    reason="needs root and a system python3: the attack is another local user's folder analyzed by root")
def test_a_real_second_users_fake_run_folder_makes_root_do_nothing(tmp_path: Path, victim_process):
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rt-trust3-", dir="/tmp"))
    try:
        os.chmod(base, 0o777)  # where the other user (nobody) may write
        private = tmp_path / "root-only"
        private.mkdir(mode=0o700)
        ring = tmp_path / "r.ring"
        _ring_naming(ring, victim_process.pid)
        head = ring.read_bytes()[:rf.IDENT_OFFSET + rf.IDENT.size]
        run, ready = base / "evil", base / "ready"
        os.chmod(tmp_path, 0o711)  # the other user may reach private/ to plant the symlink (not to write there)
        attacker = subprocess.Popen([OTHER_PY, "-I", "-S", "-c", ATTACKER, str(run), hostinfo.host_key(), head.hex(),
                                     str(victim_process.pid), str(private), str(ready)],
                                    user=OTHER_UID, group=OTHER_UID, extra_groups=[], cwd="/")
        try:
            deadline = time.monotonic() + 20
            while not ready.exists() and time.monotonic() < deadline and attacker.poll() is None:
                time.sleep(0.05)
            assert ready.exists(), "the other user's setup did not finish"
            assert (run / hostinfo.host_key() / "meta.json").stat().st_uid == OTHER_UID
            pyspy, mark = _fake_pyspy(tmp_path)
            t0 = time.monotonic()
            res = subprocess.run(TRACE + ["analyze", "--json", str(run)], capture_output=True, text=True, timeout=120,
                                 env=trace_env(RANKTRACE_PYSPY=str(pyspy)), cwd=tmp_path)
            took = time.monotonic() - t0
        finally:
            attacker.kill()
            attacker.wait()
        assert not mark.exists(), "py-spy was run on the process the folder named"
        assert list(private.iterdir()) == [], "something was written through the folder's dumps symlink"
        (line,) = [ln for ln in res.stderr.splitlines() if "live snapshot skipped" in ln]
        assert f"owned by uid {OTHER_UID}" in line and "only read, never acted on" in line
        assert "Traceback" not in res.stderr and res.returncode in (0, 3, 4) and took < 60, res.stderr
        assert victim_process.poll() is None
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
