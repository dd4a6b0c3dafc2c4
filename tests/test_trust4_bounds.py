"""#31, bounds (round 4): the reader-side leftovers. A NUL hole of any size in a text log (a sparse hole after a node
crash, the NULs a copytruncate'd log starts with) is stepped over and said once, the lines on both sides read; a
Kineto trace of many collectives keeps a bounded number of ops per group and says which it summarised, with the same
verdict. docs/SAFETY.md, "Bounds, per input", names these tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO

D = REPO / "tests" / "data" / "readers"
# real logs: a torch 2.5 watchdog log, and NCCL lines posted in a thread (nccl#147): one read by the opener, the other,
# once a hole makes it bigger than 32 MiB, streamed from disk by the NCCL reader
LOGS = [D / "watchdog" / "gen3_torch25.log", REPO / "tests" / "field" / "nccl-147" / "grep_logs.txt"]


def _sparse_with_hole(src: Path, dst: Path, hole: int, where: str) -> int:
    """`src` with a `hole`-byte sparse hole (written by seeking, nothing stored) at its start or at the line boundary
    nearest its middle; returns the hole's offset."""
    data = src.read_bytes()
    at = 0 if where == "lead" else data.index(b"\n", len(data) // 2) + 1
    with open(dst, "wb") as f:
        f.write(data[:at])
        f.seek(at + hole)
        f.write(data[at:])
    return at


def _rows(a) -> set[tuple]:
    ev = a.events
    return set(zip(ev["kind"].to_pylist(), ev["name"].to_pylist(), ev["line"].to_pylist(), ev["rank"].to_pylist()))


@pytest.mark.parametrize("where", ["lead", "mid"])
@pytest.mark.parametrize("hole", [1 << 20, 100 << 20], ids=["1MiB", "100MiB"])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_a_nul_hole_of_any_size_is_stepped_over_and_said_once(tmp_path: Path, log: Path, hole: int, where: str):
    """A hole over 64 KiB made the log "binary content" (a hole at its start) and dropped it; now the lines before
    and after it are read with their own line numbers, and one line says the hole."""
    clean = api.analyze([log], liveness=None)
    holed = tmp_path / log.name
    at = _sparse_with_hole(log, holed, hole, where)
    assert holed.stat().st_blocks * 512 < 1 << 20, "the hole is sparse: nothing of it is on disk"
    a = api.analyze([holed], liveness=None)
    assert holed.name in {Path(f).name for f in a.files}, [s.reason for s in a.skipped]
    assert _rows(a) == _rows(clean) and _rows(a), "every event of the clean log, at its own line"
    lines = {ln for _k, _n, ln, _r in _rows(a) if ln is not None}
    if where == "mid":
        cut_line = log.read_bytes()[:at].count(b"\n") + 1
        assert min(lines) < cut_line <= max(lines), "lines on both sides of the hole are read"
    said = [s.reason for s in a.skipped if "NUL" in s.reason]
    assert said == [f"{hole:,} bytes of NUL (a hole) at offset {at:,} skipped"], said


def test_nul_runs_stored_on_disk_are_dropped_and_counted(tmp_path: Path):
    """NULs written for real (not sparse) around and inside the text: each run is dropped as it is read; the first
    few are said one by one, the rest in one line."""
    log = LOGS[1]
    data = log.read_bytes()
    cuts = [i + 1 for i, b in enumerate(data) if b == 10][:8]
    out = bytearray()
    last = 0
    for c in cuts:
        out += data[last:c] + b"\0" * 70000
        last = c
    out += data[last:]
    p = tmp_path / log.name
    p.write_bytes(bytes(out))
    a = api.analyze([p], liveness=None)
    assert _rows(a) == _rows(api.analyze([log], liveness=None))
    said = [s.reason for s in a.skipped if "NUL" in s.reason]
    assert said[:3] == [f"70,000 bytes of NUL (a hole) at offset {c + 70000 * i:,} skipped"
                        for i, c in enumerate(cuts[:3])]
    rest = len(cuts) - 3
    assert rest > 0 and said[3:] == [f"and {rest} more NUL runs ({rest * 70000:,} bytes) skipped"]
