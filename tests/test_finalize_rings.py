"""Light run folders (issue #27): after finalize the rings whose records are in events.arrow are gone, the ones that
are still the only copy stay, and no agent socket of a gone process is left.

Real rings made by the real recorder: one by a child process that has exited (its writer is gone), one by this
test process (its writer still runs, as a daemon the job left behind would), one cut short (unreadable).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ranktrace.tracer.launch.finalize import finalize_host_dir
from tests.helpers import PY, REPO, trace_env

RING = ("import sys\n"
        "from ranktrace.tracer.rank.recorder import Recorder\n"
        "r = Recorder(sys.argv[1], slots=64)\n"
        "r.meta({'type': 'identity', 'rank': 0, 'world': 2})\n"
        "r.meta({'type': 'group', 'name': '0', 'desc': 'default_pg', 'backend': 'gloo', 'ranks': [0, 1]})\n"
        "g, ar = r.intern('0'), r.intern('all_reduce')\n"
        "r.op('enter', 'collective', ar, tid=1, group_id=g, seq=1, span_id=1)\n"
        "r.op('exit', 'collective', ar, tid=1, group_id=g, seq=1, span_id=1)\n"
        "r.close()\n")


def _host(tmp_path: Path) -> tuple[Path, object]:
    from ranktrace.tracer.rank.recorder import Recorder

    host = tmp_path / "run" / "node0-abc"
    (host / "rings").mkdir(parents=True)
    gone = host / "rings" / "exited.ring"
    res = subprocess.run([PY, "-c", RING, str(gone)], env=trace_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and gone.stat().st_size > 1 << 20, res.stderr  # reserved whole when made
    alive = Recorder(str(host / "rings" / f"{os.getpid()}.ring"), slots=64)
    alive.meta({"type": "identity", "rank": 1, "world": 2})
    alive.op("enter", "collective", alive.intern("all_reduce"), tid=1, group_id=alive.intern("0"), seq=1, span_id=1)
    (host / "rings" / "cut.ring").write_bytes(gone.read_bytes()[:100])
    return host, alive


def _files(host: Path) -> set[str]:
    return {str(p.relative_to(host)) for p in host.rglob("*") if p.is_file() or p.is_socket()}


def test_rings_in_events_arrow_are_removed_and_the_only_copies_stay(tmp_path: Path):
    host, alive = _host(tmp_path)
    before = sum(p.stat().st_blocks * 512 for p in (host / "rings").iterdir())
    fin = finalize_host_dir(host)
    rings = fin["rings"]
    assert rings["removed"] == 1 and rings["bytes_freed"] >= 1 << 20
    assert sorted(rings["kept"]) == [f"rings/{os.getpid()}.ring kept: its process {os.getpid()} still runs",
                                     "rings/cut.ring kept: its records could not be read into events.arrow"]
    assert not (host / "rings" / "exited.ring").exists()
    with pa.memory_map(str(host / "events.arrow")) as src:
        ev = ipc.open_file(src).read_all()
    files = set(pc.unique(ev["file"].cast(pa.string())).to_pylist())
    assert {"rings/exited.ring", f"rings/{os.getpid()}.ring"} <= files   # the removed ring's records are here
    after = sum(p.stat().st_blocks * 512 for p in (host / "rings").iterdir())
    assert after < before
    alive.close()  # type: ignore[attr-defined]


def test_keep_rings_keeps_every_ring(tmp_path: Path):
    host, alive = _host(tmp_path)
    fin = finalize_host_dir(host, keep_rings=True)
    assert fin["rings"]["removed"] == 0 and fin["rings"]["kept"] == "all (--keep-rings)"
    assert {"rings/exited.ring", "rings/cut.ring", f"rings/{os.getpid()}.ring"} <= _files(host)
    alive.close()  # type: ignore[attr-defined]


def test_sockets_of_gone_processes_are_removed_and_a_live_ones_kept(tmp_path: Path):
    host = tmp_path / "h"
    agents = host / "agents"
    agents.mkdir(parents=True)
    (host / "rings").mkdir()
    socks = []

    def bind(name: str) -> Path:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(agents / name))
        socks.append(s)
        return agents / name

    child = subprocess.Popen([PY, "-c", "pass"])
    child.wait()
    bind(f"{child.pid}.sock")                     # exited and reaped
    zombie = subprocess.Popen([PY, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:            # exited, not reaped yet: a zombie, nobody's socket
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    bind(f"{zombie.pid}.sock")
    mine = bind(f"{os.getpid()}.sock")            # alive: kept
    reused = bind(f"{os.getppid()}.sock")         # the pid's process started after the socket was made: another one
    long_ago = time.time() - 10 * 365 * 86400
    os.utime(reused, (long_ago, long_ago), follow_symlinks=False)
    finalize_host_dir(host)
    zombie.wait()
    assert sorted(p.name for p in agents.iterdir()) == [mine.name]
    for s in socks:
        s.close()
