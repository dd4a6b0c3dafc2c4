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
