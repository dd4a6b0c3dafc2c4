"""In-rank behaviour that must not change the job: fork, os._exit call forms (real processes, 1-rank gloo)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ranktrace.analyzers.readers import ranktrace_ring
from tests.helpers import PY, REPO, SCRIPTS, trace_env


def test_forked_child_records_its_own_ops_and_os_exit_keyword_form_passes(tmp_path: Path):
    host = tmp_path / "host"
    (host / "rings").mkdir(parents=True)
    env = trace_env(RANKTRACE_DIR=str(host), PYTHONPATH=str(REPO / "tracer" / "rank" / "_inject"))
    res = subprocess.run([PY, str(SCRIPTS / "fork_child_ops.py")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 11, res.stderr[-2000:]  # os._exit(status=11) went through unchanged
    assert "[ranktrace]" not in res.stderr
    rings = sorted((host / "rings").glob("*.ring"))
    assert len(rings) == 2  # the child writes its own ring
    names = {}
    for ring in rings:
        ev = ranktrace_ring.read(ring).events
        ops = [r["name"] for r in ev.to_pylist() if r["kind"] == "enter" and r["category"] == "collective"]
        names[ring.name] = ops
        marks = [r["detail"] for r in ev.to_pylist() if r["name"] == "process_exit"]
        assert marks, ring  # both processes left an exit record
    assert all(ops == ["all_reduce", "broadcast"] for ops in names.values()), names


def test_agent_answers_from_a_long_trace_dir_and_never_dumps_fr_during_a_capture(tmp_path: Path):
    """The in-rank agent (tracer/rank/agent.py) in a real process: its socket lives under a trace dir far longer than a
    UNIX socket address allows, it is started once per process, it lists the other threads' stacks in py-spy's
    layout while the main thread sleeps in C, and it never asks the Flight Recorder while a capture is open."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    script = (
        "import json, sys, threading, time\n"
        "from ranktrace.tracer.rank import agent\n"
        "def waiting_in_c():\n"
        "    time.sleep(30)\n"
        "import contextlib\n"
        "gate = lambda: contextlib.nullcontext(True)  # a capture is open\n"
        f"assert agent.start({str(deep)!r}, lambda: 5, gate, print)\n"
        f"assert not agent.start({str(deep)!r}, lambda: 5, gate, print)\n"
        "threading.Thread(target=waiting_in_c, name='worker', daemon=True).start()\n"
        "time.sleep(0.2)\n"
        f"ans = agent.ask(agent.socket_path({str(deep)!r}, __import__('os').getpid()))\n"
        "print(json.dumps(ans))\n"
    )
    res = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=trace_env())
    assert res.returncode == 0, res.stderr[-2000:]
    ans = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(str(deep / "agents")) > 108
    assert ans["rank"] == 5 and ans["fr"] is None and "capture is open" in ans["fr_note"]
    names = {t["thread_name"]: t for t in ans["threads"]}
    assert set(names) == {"MainThread", "worker"}  # the agent leaves itself out
    assert [f["name"] for f in names["worker"]["frames"]][:1] == ["waiting_in_c"]
    assert names["worker"]["active"] is False and names["MainThread"]["frames"][0]["name"] == "ask"


def test_a_client_that_leaves_early_never_kills_the_rank_with_sigpipe(tmp_path: Path):
    """A job may restore SIGPIPE's default action (CLI code does); a burst that gave up on an answer must not make
    the agent's write kill the rank."""
    script = (
        "import os, signal, socket, time\n"
        "from ranktrace.tracer.rank import agent\n"
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
        "import contextlib\n"
        f"agent.start({str(tmp_path)!r}, lambda: 0, lambda: contextlib.nullcontext(False), print)\n"
        "for _ in range(50):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        f"    agent._via_dir_fd(agent.socket_path({str(tmp_path)!r}, os.getpid()), s.connect)\n"
        "    s.sendall(b'dump\\n')\n"
        "    s.close()\n"
        "time.sleep(1)\n"
        "print('alive')\n"
    )
    res = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO, env=trace_env())
    assert res.returncode == 0 and res.stdout.strip() == "alive", (res.returncode, res.stderr[-1000:])
