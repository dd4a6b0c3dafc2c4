"""Reader fuzz suite (issue #16): real sample files, mutated deterministically (cuts, flipped bytes, duplicated,
deleted and shuffled lines, NUL runs, two files spliced), each analyzed in-process. Whatever the bytes, the analysis
either gives a verdict or raises the one documented bad-input error (InputError, naming the file); it never takes
more than a few seconds; and a damaged copy of a file whose job finished is never read as a hang.

The kept corpus tests/data/nasty/ holds hand-made nasty files and the inputs this fuzzer found crashes with
(regressions); each of them is analyzed the same way."""
from __future__ import annotations

import faulthandler
import os
import gzip
import random
import time
import zlib
from pathlib import Path

import pytest

from ranktrace.analyzers.api import analyze
from ranktrace.analyzers.inputs.collect import InputError
from tests.conftest import SHARED

REPO = Path(__file__).resolve().parents[1]
NASTY = REPO / "tests" / "data" / "nasty"
SEED = 16
CASES = int(os.environ.get("RANKTRACE_FUZZ_CASES", "300"))  # more, to hunt; 300 fits CI
PER_CALL_S = 5.0
_SKIP_SUFFIXES = {".md", ".py"}


def _samples() -> list[Path]:
    files = [p for p in (REPO / "tests" / "data").rglob("*") if p.is_file() and NASTY not in p.parents]
    files += [p for p in (SHARED / "data").rglob("*") if p.is_file()]
    field = sorted(p for p in (REPO / "tests" / "field").rglob("*") if p.is_file() and p.name != "case.json")
    files = sorted(p for p in files if p.suffix not in _SKIP_SUFFIXES)
    return files + random.Random(SEED).sample(field, min(40, len(field)))


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [data]


def _mutate(rng: random.Random, data: bytes, other: bytes) -> tuple[str, bytes]:
    """One deterministic mutation of `data` (`other`: a second sample, for splices): (what was done, the bytes)."""
    n = len(data)
    kind = rng.choice(["cut", "flip", "dup_lines", "del_lines", "shuffle_lines", "nul_run", "splice", "long_line",
                       "crlf", "cut_line"])
    if kind == "cut" and n:
        return kind, data[:rng.randrange(n)]
    if kind == "flip" and n:
        b = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return kind, bytes(b)
    if kind == "cut_line" and n:  # cut mid-way through a line near the end, as a killed writer leaves it
        return kind, data[:max(0, n - rng.randint(1, 200))]
    lines = _lines(data)
    if kind == "dup_lines":
        i = rng.randrange(len(lines))
        j = min(len(lines), i + rng.randint(1, 20))
        return kind, b"".join(lines[:j] + lines[i:j] * rng.randint(1, 5) + lines[j:])
    if kind == "del_lines":
        keep = [ln for ln in lines if rng.random() > 0.2]
        return kind, b"".join(keep)
    if kind == "shuffle_lines":
        i = rng.randrange(len(lines))
        j = min(len(lines), i + rng.randint(2, 30))
        part = lines[i:j]
        rng.shuffle(part)
        return kind, b"".join(lines[:i] + part + lines[j:])
    if kind == "nul_run":
        at = rng.randrange(n + 1)
        return kind, data[:at] + b"\0" * rng.choice([1, 7, 512, 70000]) + data[at:]
    if kind == "long_line":
        at = rng.randrange(n + 1)
        return kind, data[:at] + bytes(rng.choice(b"Aa0/=+ :[]{}\"") for _ in range(200_000)) + data[at:]
    if kind == "crlf":
        return kind, data.replace(b"\n", rng.choice([b"\r\n", b"\r"]))
    # splice: the head of this file and the tail of another
    return "splice", data[:rng.randrange(n + 1)] + other[rng.randrange(len(other) + 1):]


_ODD_VALUES = [None, -1, 0, 2**70, 1.5, float("nan"), "", "x" * 300, [], [1, "a", None], {}, {"a": {"b": []}}, True]


def _retype(rng: random.Random, obj: object, rate: float) -> object:
    """The same structure with some values swapped for values of other types (a dump of another version, a
    hand-edited file): every reader that trusts a field's type is hit."""
    if rng.random() < rate:
        return rng.choice(_ODD_VALUES)
    if isinstance(obj, dict):
        return {k: _retype(rng, v, rate) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_retype(rng, v, rate) for v in obj)
    return obj


def _structured(rng: random.Random, path: Path, data: bytes) -> tuple[str, bytes] | None:
    """JSON and pickle samples (ours: trusted) decoded, retyped and encoded again; None when `data` is neither."""
    import json
    import pickle

    if path.suffix == ".pkl":
        obj = pickle.loads(data)  # noqa: S301 - one of the kept samples, never a mutated file
        return "retype", pickle.dumps(_retype(rng, obj, rng.choice([0.01, 0.05, 0.3])), protocol=4)
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return "retype", json.dumps(_retype(rng, obj, rng.choice([0.01, 0.05, 0.3]))).encode()


def _gz_aware(rng: random.Random, path: Path, data: bytes, other: bytes) -> tuple[str, bytes]:
    """A .gz is mutated either as bytes (a damaged archive) or inside (damaged content, compressed again); a JSON
    or pickle sample is retyped a third of the time."""
    if path.suffix == ".gz" and rng.random() < 0.6:
        try:
            inner = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            inner = None
        if inner is not None:
            got = _structured(rng, Path(path.stem), inner) if rng.random() < 0.4 else None
            kind, body = got or _mutate(rng, inner, other)
            return "gz:" + kind, gzip.compress(body, compresslevel=1)
    if path.suffix in (".json", ".pkl") and rng.random() < 0.35:
        got = _structured(rng, path, data)
        if got:
            return got
    return _mutate(rng, data, other)


def _analyze(path: Path) -> tuple[str | None, float]:
    """(the verdict's status or None for InputError, seconds). Anything else raised is a finding."""
    faulthandler.dump_traceback_later(60, exit=True)  # a true hang would otherwise stop the whole suite
    t = time.perf_counter()
    try:
        status = analyze([path], liveness=None).verdict.status
    except InputError as e:
        assert str(path) in str(e) or path.name in str(e), f"InputError without the file's name: {e}"
        status = None
    finally:
        faulthandler.cancel_dump_traceback_later()
    return status, time.perf_counter() - t


# Mutations that keep what the file says happened, its end included (a cut, a deletion, a splice with another job's
# file or a shuffle can honestly turn "finished" into "stopped during start-up").
_KEEPS_THE_END = {"flip", "nul_run", "dup_lines", "long_line", "crlf", "retype"}
_BASELINE: dict[Path, str | None] = {}


def _baseline(path: Path) -> str | None:
    if path not in _BASELINE:
        _BASELINE[path] = _analyze(path)[0]
    return _BASELINE[path]


def _cases() -> list[tuple[int, Path, Path]]:
    files = _samples()
    rng = random.Random(SEED)
    return [(i, files[i % len(files)], rng.choice(files)) for i in range(CASES)]


@pytest.mark.parametrize("chunk", range(6))
def test_mutated_samples_never_crash_hang_or_lie(tmp_path: Path, chunk: int):
    cases = [c for c in _cases() if c[0] % 6 == chunk]
    found: list[str] = []
    for i, src, other in cases:
        rng = random.Random(f"{SEED}:{i}")
        kind, data = _gz_aware(rng, src, src.read_bytes(), other.read_bytes())
        where = tmp_path / str(i)
        where.mkdir()
        mutated = where / src.name
        mutated.write_bytes(data)
        label = f"case {i} {kind} of {src.relative_to(src.parents[2])}"
        try:
            status, took = _analyze(mutated)
        except Exception as e:  # noqa: BLE001 - collected, so one run reports every crash
            found.append(f"{label}: {type(e).__name__}: {e}"[:400])
            continue
        if took > PER_CALL_S:
            found.append(f"{label}: {took:.1f} s")
        if status == "hang" and kind.split(":")[-1] in _KEEPS_THE_END and _baseline(src) in ("completed", "idle"):
            found.append(f"{label}: a finished job's file read as a hang")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", sorted(p for p in NASTY.iterdir() if p.suffix != ".md"), ids=lambda p: p.name)
def test_the_nasty_corpus(path: Path):
    status, took = _analyze(path)
    assert took < PER_CALL_S, took


def test_a_pickle_that_runs_code_is_refused_and_never_run(tmp_path: Path):
    marker = Path("/tmp/ranktrace_nasty_pwned")
    marker.unlink(missing_ok=True)
    _analyze(NASTY / "code_running.pkl")
    assert not marker.exists()


def test_an_absurd_world_size_is_ignored_and_said(tmp_path: Path):
    """Found by this fuzzer: a RAS dump whose communicator size was retyped to 2^70 made the analysis build a set of
    2^70 ranks (it never ended); a world size past any job's is a damaged field: skipped, and the skip is shown."""
    a = analyze([NASTY / "ras_world_2pow70.json"], liveness=None)
    assert any("world size 1180591620717411303424 ignored" in s.reason for s in a.skipped), a.skipped
    assert len(a.verdict.ranks) < 10
