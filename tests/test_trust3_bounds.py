"""#31, bounds: an input that would cost unbounded time, memory or bytes written stops at a documented bound with one
line naming the file and the bound, and every other input is still used (docs/SAFETY.md lists each bound).

Each attack is made for real in the test: a gzip bomb small on disk, tar archives with a bomb member and with more
members than the bound, a meta.json nested 100k deep, a 12 KB SQLite whose view never ends."""
from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from ranktrace.analyzers.inputs import archives
from ranktrace.analyzers import api
from ranktrace.analyzers.readers.text.opener import MAX_TEXT_BYTES
from tests.helpers import PY, REPO, TRACE, trace_env

GOOD_LOG = REPO / "tests" / "data" / "nasty" / "crlf.log"  # a small NCCL log: the input that must still be used


def _gzip_bomb(path: Path, nbytes: int) -> None:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (16 << 20)
    with open(path, "wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(c.compress(block))
        f.write(c.flush())


def _reasons(a, name: str) -> list[str]:
    return [s.reason for s in a.skipped if Path(s.file).name == name]


def _used(a) -> set[str]:
    return {Path(f).name for f in a.files}


def test_a_gzip_bomb_is_cut_at_the_text_bound_and_the_other_inputs_are_read(tmp_path: Path):
    bomb = tmp_path / "rank0.log.gz"
    _gzip_bomb(bomb, MAX_TEXT_BYTES + (64 << 20))
    assert bomb.stat().st_size < 1 << 20  # under 1 MB on disk
    t0 = time.monotonic()
    a = api.analyze([bomb, GOOD_LOG], liveness=None)
    took = time.monotonic() - t0
    (line,) = [r for r in _reasons(a, bomb.name) if "decompressed" in r]
    assert f"{MAX_TEXT_BYTES >> 20} MiB" in line
    assert GOOD_LOG.name in _used(a) and a.events.num_rows > 0
    assert took < 60, took


def _tar_with(path: Path, members: list[tuple[str, bytes | int]]) -> None:
    """A tar.gz; a member given as an int is that many zero bytes (streamed, never held)."""
    class Zeros(io.RawIOBase):
        def __init__(self, n: int) -> None:
            self.left = n

        def readinto(self, b) -> int:  # type: ignore[override]
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = data if isinstance(data, int) else len(data)
            tar.addfile(info, Zeros(data) if isinstance(data, int) else io.BytesIO(data))


def test_a_tar_bomb_writes_no_more_than_the_bound_and_says_so(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_BYTES", 64 << 20)
    monkeypatch.setattr(archives, "MAX_MEMBER_BYTES", 32 << 20)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    tar = tmp_path / "node-0.tar.gz"
    log = GOOD_LOG.read_bytes()
    _tar_with(tar, [("node-0/rank0.log", log), ("node-0/zeros.bin", 48 << 20), ("node-0/more.bin", 40 << 20),
                    ("node-0/late.log", log)])
    assert tar.stat().st_size < 1 << 20
    a = api.analyze([tar], liveness=None)
    reasons = [s.reason for s in a.skipped if Path(s.file).name == tar.name]
    assert any("zeros.bin (48 MiB) is over 32 MiB: not extracted" in r for r in reasons), reasons
    assert any("extraction stopped at 48 MiB, 1 members (the bound: 64 MiB per archive)" in r for r in reasons), \
        reasons
    assert "rank0.log" in _used(a) and "late.log" not in _used(a)
    written = sum(p.stat().st_size for p in (tmp_path / "tmp").rglob("*") if p.is_file())
    assert written <= 64 << 20


def test_a_tar_of_too_many_members_stops_at_the_member_bound(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_MEMBERS", 300)
    tar = tmp_path / "many.tar.gz"
    _tar_with(tar, [("many/rank0.log", GOOD_LOG.read_bytes())] + [(f"many/f{i}.txt", b"x\n") for i in range(3000)])
    t0 = time.monotonic()
    a = api.analyze([tar], liveness=None)
    assert time.monotonic() - t0 < 60
    reasons = [s.reason for s in a.skipped if Path(s.file).name == tar.name]
    assert any("more than 300 members" in r for r in reasons), reasons
    assert "rank0.log" in _used(a)


UNPACK_AND_WAIT = ("import sys, time\nfrom pathlib import Path\nfrom ranktrace.analyzers.inputs import archives\n"
                   "(p,) = archives.expand([Path(sys.argv[1])])\nprint(p, flush=True)\ntime.sleep(60)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_what_an_archive_unpacked_to_is_removed_on_any_exit(tmp_path: Path, sig: int):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tar = tmp_path / "node.tar.gz"
    _tar_with(tar, [("node/rank0.log", GOOD_LOG.read_bytes()), ("node/blob.bin", 4 << 20)])
    env = trace_env(TMPDIR=str(tmp))
    proc = subprocess.Popen([PY, "-c", UNPACK_AND_WAIT, str(tar)], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    where = Path(proc.stdout.readline().strip())
    assert where.is_dir() and str(where).startswith(str(tmp))
    proc.send_signal(sig)
    proc.wait(timeout=30)
    if sig == signal.SIGKILL:  # nothing runs in a SIGKILLed process: the next analysis of this user removes it
        assert where.exists()
        proc2 = subprocess.Popen([PY, "-c", UNPACK_AND_WAIT, str(tar)], stdout=subprocess.PIPE, text=True, env=env,
                                 cwd=REPO)
        proc2.stdout.readline()
        proc2.send_signal(signal.SIGTERM)
        proc2.wait(timeout=30)
    assert not where.exists()
    assert list(tmp.iterdir()) == []


def test_a_meta_json_nested_100k_deep_is_one_line_naming_it(tmp_path: Path):
    host = tmp_path / "run" / "host-1"
    (host / "rings").mkdir(parents=True)
    (host / "meta.json").write_text('{"schema": "ranktrace.meta/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = subprocess.run(TRACE + ["analyze", str(tmp_path / "run"), str(GOOD_LOG)], capture_output=True, text=True,
                         timeout=120, env=trace_env(), cwd=tmp_path)  # the live snapshot is on (the default)
    assert "ranktrace bug" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert res.returncode in (0, 3, 4), res.stderr
    assert "meta.json" in res.stdout and "recursion" in res.stdout


def test_a_kineto_trace_nested_100k_deep_is_one_line_naming_the_bound(tmp_path: Path):
    deep = tmp_path / "rank0.trace.json"
    deep.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    a = api.analyze([deep, GOOD_LOG], liveness=None)
    (line,) = _reasons(a, deep.name)
    assert "nested deeper than the parser's bound" in line and "RecursionError" not in line
    assert GOOD_LOG.name in _used(a)


def test_a_dump_file_over_its_bound_is_not_read_whole(tmp_path: Path):
    """A 300 MiB py-spy JSON took over 120 s and 7 GB (killed); now one line, the other inputs read. The file is
    sparse: 300 MiB long, a few KB on disk."""
    from ranktrace.analyzers.readers.base import MAX_FILE_BYTES

    big = tmp_path / "pyspy-123.json"
    with open(big, "wb") as f:
        f.write(b'[{"pid": 123, "thread_id": 1, "thread_name": "MainThread", "owns_gil": false, "active": true, '
                b'"frames": [{"name": "wait", "filename": "a.py", "short_filename": "a.py", "line": 3}]}')
        f.write(b', {"pid": 123, "thread_id": 2, "frames": []}' * 2000 + b"]")
        f.truncate(MAX_FILE_BYTES + (44 << 20))
    t0 = time.monotonic()
    a = api.analyze([big, GOOD_LOG], liveness=None)
    assert time.monotonic() - t0 < 30
    (line,) = _reasons(a, big.name)
    assert f"larger than {MAX_FILE_BYTES >> 20} MiB, the bound for one dump file: not read" in line
    assert GOOD_LOG.name in _used(a)


def test_a_text_input_of_millions_of_lines_keeps_its_first_and_last_lines(tmp_path: Path, monkeypatch):
    """125M short lines took over 300 s and 8 GB (killed, or MemoryError read as "a ranktrace bug"); the opener now
    splits only the first and last MAX_TEXT_LINES // 2 lines. Here the bound is made small, the file real: an NCCL
    log whose last lines (where a hang shows) sit past 20,000 filler lines."""
    from ranktrace.analyzers.readers.text import opener

    monkeypatch.setattr(opener, "MAX_TEXT_LINES", 1000)
    nccl = GOOD_LOG.read_bytes().replace(b"\r\n", b"\n")
    n_head = nccl.count(b"\n")
    log = tmp_path / "rank0.log.gz"  # gzip: the NCCL reader then reads the opener's lines, not the file again
    import gzip

    log.write_bytes(gzip.compress(nccl + b"progress 1%\n" * 20_000 + nccl))
    total = 2 * n_head + 20_000
    a = api.analyze([log], liveness=None)
    (note,) = [r for r in _reasons(a, log.name) if "lines per text input" in r]
    assert f"{total:,} lines: the first and last 500 are read" in note and "(the bound: 1,000 lines" in note
    lines = [ln for f, ln in zip(a.events["file"].to_pylist(), a.events["line"].to_pylist()) if f == str(log)]
    assert max(lines) == total and min(lines) <= n_head  # the tail's records keep their true line numbers


def _endless_sqlite(path: Path) -> None:
    c = sqlite3.connect(path)
    c.executescript("""
        CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT);
        CREATE VIEW NVTX_EVENTS AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)
          SELECT x AS start, x AS end, 59 AS eventType, 'a' AS text, 0 AS globalTid, NULL AS textId,
                 NULL AS domainId, 0 AS rangeId FROM r WHERE x < 0;
    """)
    c.commit()
    c.close()


def test_an_sqlite_view_that_never_ends_stops_at_the_time_bound(tmp_path: Path, monkeypatch):
    from ranktrace.analyzers.readers.nsys import export

    monkeypatch.setattr(export, "SQLITE_BUDGET_S", 2.0)
    db = tmp_path / "report.sqlite"
    _endless_sqlite(db)
    assert db.stat().st_size <= 16 << 10
    t0 = time.monotonic()
    a = api.analyze([db, GOOD_LOG], liveness=None)
    assert time.monotonic() - t0 < 15
    (line,) = [r for r in _reasons(a, db.name)]
    assert "stopped after 2 s (the time bound per file" in line
    assert GOOD_LOG.name in _used(a)
    # trace compare reads the same way
    from ranktrace.analyzers import compare

    both = tmp_path / "a"
    both.mkdir()
    db.rename(both / db.name)
    (both / GOOD_LOG.name).write_bytes(GOOD_LOG.read_bytes())
    t0 = time.monotonic()
    compare.compare_paths(both, GOOD_LOG, liveness=None)
    assert time.monotonic() - t0 < 15


def test_a_meta_json_over_its_bound_is_one_line(tmp_path: Path):
    host = tmp_path / "run" / "host-1"
    (host / "rings").mkdir(parents=True)
    with open(host / "meta.json", "wb") as f:  # sparse: 65 MiB long, a few bytes on disk
        f.write(b'{"schema": "ranktrace.meta/1"}')
        f.truncate(65 << 20)
    a = api.analyze([tmp_path / "run", GOOD_LOG], liveness=None)
    assert any("larger than 64 MiB" in r for r in _reasons(a, "meta.json"))
    assert GOOD_LOG.name in _used(a)


def test_a_py_spy_that_never_answers_costs_its_timeout(tmp_path: Path):
    from ranktrace.tracer.watch.stack_sampler import pyspy_dump

    stuck = tmp_path / "py-spy"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")
    stuck.chmod(0o755)
    t0 = time.monotonic()
    d = pyspy_dump(str(stuck), os.getpid(), timeout=1.0)
    assert time.monotonic() - t0 < 5 and d.text is None and "did not answer within 1 s" in (d.error or "")
