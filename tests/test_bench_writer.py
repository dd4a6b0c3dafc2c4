"""bench/bench_analyze.py writes its large runs with numpy in the ring layout, not one Recorder.op call per record:
the two must give the same ring, byte for byte, or the bench measures a format no rank writes (issue #19)."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import bench_analyze  # noqa: E402


def _clock() -> object:
    ticks = itertools.count(10_000_000_000, 1200)
    return lambda: next(ticks)


def _ring(tmp_path: Path, writer: str, pairs: int, open_last: bool) -> bytes:
    path = tmp_path / f"{writer}-{pairs}-{open_last}.ring"
    bench_analyze.write_rank(str(path), rank=3, world=8, pairs=pairs, open_last=open_last, slots=1024,
                             writer=writer, clock=_clock(), wall_clock=lambda: 1_700_000_000_000_000_000)
    return path.read_bytes()  # the header's pid and host are this test's for both


def test_numpy_writer_writes_what_the_recorder_writes(tmp_path: Path) -> None:
    for pairs, open_last in ((5, True), (6, False), (1, True)):
        a = _ring(tmp_path, "recorder", pairs, open_last)
        b = _ring(tmp_path, "numpy", pairs, open_last)
        assert len(a) == len(b)
        assert a == b, f"rings differ for pairs={pairs} open_last={open_last}"


def test_the_bench_trace_is_a_hang_the_analysis_names(tmp_path: Path) -> None:
    """A small bench run end to end, through the numpy writer and in a fresh process: the verdict is right."""
    assert bench_analyze.main(["--ranks", "4", "--hosts", "2", "--events", "200", "--repeat", "1", "--writer", "numpy",
                               "--modes", "live,fin", "--keep", str(tmp_path / "b")]) == 0
    assert sorted(d.name for d in (tmp_path / "b" / "live").iterdir()) == [bench_analyze.host_name(0),
                                                                        bench_analyze.host_name(1)]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


def test_writers_die_with_the_bench_even_when_it_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the bench no chance to clean up: its writers (held alive as a live job's ranks) and their
    group's leader must go anyway (PR_SET_PDEATHSIG); SIGTERM is cleaned up by the bench itself."""
    import os
    import signal
    import subprocess
    import time

    from tests.helpers import PY, trace_env

    for sig in (signal.SIGKILL, signal.SIGTERM):
        keep = tmp_path / f"b{sig}"
        proc = subprocess.Popen([PY, str(REPO / "bench" / "bench_analyze.py"), "--ranks", "4", "--events", "200000",
                                 "--hold", "--modes", "live", "--repeat", "50", "--keep", str(keep)],
                                env=trace_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            kids: list[int] = []
            while time.monotonic() < deadline and len(kids) < 5:  # the group leader and 4 writers
                kids = _children(proc.pid)
                time.sleep(0.2)
            assert len(kids) >= 5, kids
            os.kill(proc.pid, sig)
            proc.wait(timeout=60)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(_alive(k) for k in kids):
                time.sleep(0.2)
            assert not [k for k in kids if _alive(k)], f"writers outlived the bench ({signal.Signals(sig).name})"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
