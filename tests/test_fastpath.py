"""The compiled fast path (tracer/rank/_fastspan.c) records exactly what the pure-Python wrappers record.

The Python wrappers are the reference: the same real gloo job (tests/scripts/fastpath_job.py) runs once with
RANKTRACE_FASTPATH=0 and once with the compiled path, and the two rings must hold the same records (times, thread
ids and object addresses inside error texts aside). The host-sync wrapper, which needs no process group, is checked
in-process, together with what the tracer owes the job: same results, same exceptions, tracing switched off with one
line when ranktrace itself fails.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, SCRIPTS, trace_env
from ranktrace.tracer.rank.fastpath import FASTPATH_ERROR, fastpath_available
from ranktrace.tracer.rank.recorder import Recorder
from ranktrace.tracer.rank.tracestate import TraceState
from ranktrace.tracer.rank.wrap_graphs import make_sync_wrapper
from ranktrace.tracer.formats.ringreader import read_ring

FIELDS = ("kind", "category", "flags", "peer", "graph_id", "seq", "backend_seq", "nbytes", "span_id",
          "parent_span_id")
STRINGS = ("name", "group", "callsite", "dtype", "shape", "error")
VOLATILE_META = ("t_ns", "pid", "ppid", "tid", "argv", "id", "fastpath")


@pytest.fixture(autouse=True)
def _compiled_path_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the compiled path: a RANKTRACE_FASTPATH=0 run of the suite must not turn it off here."""
    monkeypatch.delenv("RANKTRACE_FASTPATH", raising=False)


def ring_rows(path: Path) -> tuple[list[tuple], list[dict]]:
    """Every op record (string fields decoded) and every non-string meta record, minus what differs per run."""
    rc = read_ring(str(path))
    cols = rc.columns()
    rows = []
    for i in range(rc.num_slots):
        strs = [re.sub(r"0x[0-9a-f]+", "0x?", rc.strings.get(int(cols[f][i]), "?")) for f in STRINGS]
        rows.append(tuple(int(cols[f][i]) for f in FIELDS) + tuple(strs))
    metas = [{k: v for k, v in m.items() if k not in VOLATILE_META} for m in rc.meta if m.get("type") != "str"]
    for m, raw in zip(metas, [m for m in rc.meta if m.get("type") != "str"]):
        if "fastpath" in raw:
            m["_fastpath_flag"] = raw["fastpath"]
    return rows, metas


def run_job(tmp: Path, fastpath: str) -> tuple[dict, list[tuple], list[dict]]:
    (tmp / "rings").mkdir(parents=True)
    env = trace_env(RANKTRACE_DIR=str(tmp), RANKTRACE_FASTPATH=fastpath)
    env["PYTHONPATH"] = str(REPO / "tracer" / "rank" / "_inject") + ":" + env["PYTHONPATH"]
    res = subprocess.run([PY, str(SCRIPTS / "fastpath_job.py")], capture_output=True, text=True, timeout=120,
                         env=env, cwd=REPO, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    (ring,) = (tmp / "rings").glob("*.ring")
    return (json.loads(res.stdout.strip().splitlines()[-1]),) + ring_rows(ring)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, list[tuple], list[dict]]]:
    tmp = tmp_path_factory.mktemp("fastpath")
    return {fp: run_job(tmp / fp, fp) for fp in ("0", "1")}


def test_the_compiled_path_is_built_and_used():
    """CI compiles it (gcc is there): a silent build failure would leave every other test on the Python path."""
    assert FASTPATH_ERROR is None and fastpath_available()


def test_fast_and_python_paths_write_the_same_ring(both):
    counts_py, rows_py, meta_py = both["0"]
    counts_c, rows_c, meta_c = both["1"]
    assert counts_py["fastpath"] is False and counts_c["fastpath"] is True
    # the reference run really was pure Python, and the compiled run really took the fast path for most calls
    assert all(v == [0, 0] for k, v in counts_py.items() if k != "fastpath")
    fast, slow = counts_c["all_reduce"]
    assert fast >= 12 and slow <= 9, counts_c  # first call per call site / shape / thread goes to Python
    assert counts_c["ProcessGroup.allreduce"][0] >= 2 and counts_c["broadcast"][0] >= 2
    assert counts_c["barrier"][0] >= 2
    assert len(rows_c) == len(rows_py) > 80
    for i, (a, b) in enumerate(zip(rows_py, rows_c)):
        assert a == b, f"record {i}: python {a} != compiled {b}"
    strip = [[{k: v for k, v in m.items() if k != "_fastpath_flag"} for m in ms] for ms in (meta_py, meta_c)]
    assert strip[1] == strip[0]
    # and each ring says which path wrote it
    for fp, expect in (("0", False), ("1", True)):
        (hooks_meta,) = [m for m in both[fp][2] if m["type"] == "hooks" and "c10d" in m]
        assert hooks_meta["_fastpath_flag"] is expect and hooks_meta["fastpath_error"] is None


def test_the_job_ring_holds_what_a_user_would_check(both):
    _, rows, metas = both["1"]
    named = [dict(zip(FIELDS + STRINGS, r)) for r in rows]
    enters = [r for r in named if r["kind"] == 0 and r["name"] == "all_reduce"]
    seqs = [r["seq"] for r in enters]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # one record per op, seq strictly increasing
    errors = [r for r in named if r["kind"] == 2]
    assert len(errors) == 3 and all("TypeError" in r["error"] for r in errors)
    assert {r["shape"] for r in enters} == {"[4]", "[2, 3]"}
    untraced = [m for m in metas if m.get("name") == "untraced_ops"]
    # the three raw ProcessGroup calls, and the op issued while tracing was switched off
    assert len(untraced) == 4 and all("1 op(s) issued outside Python" in m["detail"] for m in untraced)
    gathers = [r for r in named if r["name"] == "all_gather_object" and r["kind"] == 0]
    assert len(gathers) == 2 and not [r for r in named if r["name"] == "all_gather"]  # inner op not doubled


def _sync_pair(tmp_path: Path) -> tuple[TraceState, object, object, list[str]]:
    st = TraceState(lambda: Recorder(str(tmp_path / "sync.ring"), slots=256), 0, 1)
    calls: list[str] = []

    def synchronize(device=None, fail=None):  # noqa: ANN001, ANN202
        calls.append("sync")
        if fail is not None:
            raise fail
        return device

    return st, make_sync_wrapper(st, "cuda_synchronize", synchronize), synchronize, calls


def test_sync_wrapper_passes_results_and_exceptions_through_untouched(tmp_path: Path):
    st, wrapped, _, calls = _sync_pair(tmp_path)
    assert type(wrapped).__name__ == "FastSpan" and wrapped.__name__ == "synchronize"
    sentinel = object()
    for _ in range(3):
        assert wrapped(sentinel) is sentinel
    err = KeyError("boom")
    for _ in range(3):
        with pytest.raises(KeyError) as info:
            wrapped(fail=err)
        assert info.value is err
        assert info.traceback[-1].name == "synchronize"  # raised where it was raised, not in ranktrace
    assert wrapped.fast_calls >= 4 and calls == ["sync"] * 6
    st.rec.close()
    rows, _ = ring_rows(tmp_path / "sync.ring")
    assert [r[0] for r in rows] == [0, 1] * 3 + [0, 2] * 3  # enter/exit, then enter/error
    assert all(r[FIELDS.index("category")] == 3 for r in rows)  # category sync
    assert {r[len(FIELDS) + STRINGS.index("error")] for r in rows if r[0] == 2} == {"KeyError: 'boom'"}


def test_sync_wrapper_nested_and_disabled_calls_are_not_recorded(tmp_path: Path):
    st, wrapped, orig, _ = _sync_pair(tmp_path)
    outer = make_sync_wrapper(st, "stream_synchronize", lambda: [wrapped(), wrapped()])
    for _ in range(3):
        outer()
    st.enabled = False
    wrapped()
    st.enabled = True
    st.rec.close()
    rows, _ = ring_rows(tmp_path / "sync.ring")
    names = [r[len(FIELDS)] for r in rows]
    assert names == ["stream_synchronize"] * 6  # the inner calls run inside a recorded one: not recorded again


def test_a_failure_inside_ranktrace_turns_tracing_off_and_the_call_still_runs(tmp_path: Path, capfd):
    st, wrapped, _, calls = _sync_pair(tmp_path)
    wrapped(1)
    wrapped(1)  # now on the fast path
    st.rec._buf.close()  # ranktrace's own ring becomes unwritable
    assert wrapped(7) == 7 and calls == ["sync"] * 3
    assert st.enabled is False
    err = capfd.readouterr().err
    assert err.count("[ranktrace] tracing disabled") == 1 and "mmap" in err


def test_error_texts_are_redacted_before_they_reach_the_ring(tmp_path: Path):
    """A failed rendezvous names its store URL, credentials included; an exception may quote a token."""
    st, wrapped, _, _ = _sync_pair(tmp_path)
    err = RuntimeError("rendezvous https://bob:hunter2@store:29500 failed, token hf_abcdefghijklmnopqrstuvwxyz")
    for _ in range(3):  # the first call goes through the Python wrapper, the others through the compiled path
        with pytest.raises(RuntimeError):
            wrapped(fail=err)
    assert wrapped.fast_calls >= 2
    st.rec.close()
    raw = (tmp_path / "sync.ring").read_bytes()
    assert b"hunter2" not in raw and b"hf_abcdefghij" not in raw
    rows, _ = ring_rows(tmp_path / "sync.ring")
    (text,) = {r[len(FIELDS) + STRINGS.index("error")] for r in rows if r[0] == 2}
    assert text == "RuntimeError: rendezvous https://bob:<redacted>@store:29500 failed, token <redacted>"


def test_dynamic_shapes_do_not_fill_the_meta_region(tmp_path: Path, monkeypatch):
    """A serving loop sees a new shape per batch size: past MAX_SHAPES only the rank is written, nbytes stays exact."""
    import torch

    from ranktrace.tracer.rank import callinfo

    monkeypatch.setattr(callinfo, "MAX_SHAPES", 8)  # read where TraceState.tensor is defined
    st = TraceState(lambda: Recorder(str(tmp_path / "s.ring"), slots=64), 0, 1)
    ids = [st.tensor(torch.empty(n, 3)) for n in range(1, 41)]
    strings = {v: k for k, v in st.rec._strings.items()}
    assert [strings[i[1]] for i in ids[:8]] == [f"[{n}, 3]" for n in range(1, 9)]
    assert {strings[i[1]] for i in ids[8:]} == {"<2-d, shape not kept>"}
    assert [i[2] for i in ids] == [n * 3 * 4 for n in range(1, 41)]
    assert len(st.tensor_ids) == 8 and len(st.rec._strings) <= 8 + 3


def synchronize(device=None):  # noqa: ANN001, ANN201
    """A module-level function, so pickle can name it (as torch.cuda.synchronize is named)."""
    return device


def test_a_traced_function_copies_and_pickles_like_the_function(tmp_path: Path):
    """A job that deep-copies or torch.saves an object holding dist.all_reduce / torch.cuda.synchronize must not
    fail because ranktrace wrapped them."""
    import copy
    import pickle
    import sys

    st = TraceState(lambda: Recorder(str(tmp_path / "p.ring"), slots=64), 0, 1)
    wrapped = make_sync_wrapper(st, "cuda_synchronize", synchronize)
    assert type(wrapped).__name__ == "FastSpan"
    module = sys.modules[__name__]
    saved = module.synchronize
    module.synchronize = wrapped  # installed in its module, as tracer.graphs installs torch.cuda.synchronize
    try:
        holder = {"sync": wrapped, "n": [1]}
        assert copy.copy(wrapped) is wrapped and copy.deepcopy(holder)["sync"] is wrapped
        assert pickle.loads(pickle.dumps(holder))["sync"] is wrapped
    finally:
        module.synchronize = saved


def test_a_keyboard_interrupt_inside_ranktrace_code_is_the_jobs(tmp_path: Path):
    """Ctrl-C's KeyboardInterrupt raised while ranktrace's own Python code runs (here: its ring clock) propagates
    as it would from the Python wrapper — not swallowed as a tracer failure, and the call is not run after it."""
    ticks = {"n": 0, "raise_at": None}

    def clock() -> int:
        ticks["n"] += 1
        if ticks["raise_at"] is not None and ticks["n"] >= ticks["raise_at"]:
            ticks["raise_at"] = None
            raise KeyboardInterrupt
        return ticks["n"]

    st = TraceState(lambda: Recorder(str(tmp_path / "k.ring"), slots=64, clock=clock), 0, 1)
    calls: list[int] = []
    wrapped = make_sync_wrapper(st, "cuda_synchronize", lambda: calls.append(1))
    for _ in range(2):
        wrapped()
    assert wrapped.fast_calls >= 1 and len(calls) == 2
    ticks["raise_at"] = ticks["n"] + 1  # the enter record's clock read
    with pytest.raises(KeyboardInterrupt):
        wrapped()
    assert len(calls) == 2 and st.enabled  # not run, and tracing is still on: it was not ranktrace's failure
    ticks["raise_at"] = ticks["n"] + 2  # the exit record's clock read, after the call ran
    with pytest.raises(KeyboardInterrupt):
        wrapped()
    assert len(calls) == 3 and st.enabled
