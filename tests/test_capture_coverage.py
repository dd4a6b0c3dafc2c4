"""Issue #3, capture coverage: every path a rank can issue communication through is recorded once, aligned by seq.

One real 2-rank gloo job (tests/scripts/coverage_job.py) under ``trace run --hook ...`` is shared by the checks of
ProcessGroup method calls, async handles and their waits, batch p2p, coalesced blocks, untraced (C++-issued) ops and
--hook targets. CUDA-graph and host-sync wrappers cannot run on a CPU build, so tests/scripts/coverage_graphs.py
drives them through torch's real Python classes down to stand-in C++ bases, with the tracer installed as
``trace run`` installs it. NVTX is checked in-process with an enabled domain built by hand (no tool attached here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.helpers import PY, REPO, SCRIPTS, events, meta, run_trace, trace_env

HOOKS = ["coverage_lib:Comm.all_reduce=collective", "coverage_lib:load_weights=phase", "coverage_lib:Missing.method",
         "__main__:Stage.run", "coverage_lib:Scheduler.step=phase"]
# what every rank issues on the default group, in order (tests/scripts/coverage_job.py)
WORLD_OPS = ["all_reduce", "broadcast", "barrier",            # ProcessGroup methods
             "all_reduce", "all_reduce",                      # dist.all_reduce, async
             "all_reduce", "all_reduce",                      # inside the coalesced block
             "all_reduce", "all_reduce", "all_reduce",        # inside Comm.all_reduce (hooked)
             "barrier"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], list[dict]]:
    run_dir = tmp_path_factory.mktemp("coverage") / "run"
    args = ["run", "--no-analyze", "-o", str(run_dir)]
    for h in HOOKS:
        args += ["--hook", h]
    res = run_trace(args + ["--", PY, str(SCRIPTS / "coverage_job.py")], timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir, res, events(run_dir).to_pylist()


def by_rank(rows: list[dict], **match: object) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {0: [], 1: []}
    for r in rows:
        if r["rank"] in out and all(r.get(k) == v for k, v in match.items()):
            out[r["rank"]].append(r)
    return out


def test_job_runs_unchanged_and_a_bad_target_is_said_once(job):
    run_dir, res, _ = job
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[ranktrace] --hook")]
    assert len(lines) == 1 and "coverage_lib:Missing.method=user" in lines[0] and "'Missing' not found" in lines[0]
    problems = meta(run_dir)["hook_problems"]
    assert [(p["target"], p["ranks"]) for p in problems] == [("coverage_lib:Missing.method=user", [0, 1])]


def test_process_group_calls_and_functions_each_recorded_once_with_seq_aligned(job):
    _, _, rows = job
    world = by_rank(rows, kind="enter", group_desc="default_pg", category="collective")
    for rank, ops in world.items():
        ops = [o for o in ops if o["seq"] is not None]  # the coalesced block's own span takes no seq
        assert [(o["seq"], o["name"]) for o in ops] == list(enumerate(WORLD_OPS, 1)), rank
        pg_calls = ops[:3]  # pg.allreduce / pg.broadcast / pg.barrier: async handles, the user's own lines
        assert all(o["async_op"] and o["callsite"].split(":")[0].endswith("coverage_job.py") for o in pg_calls)
        # each exit carries the backend's counter; the traced ops explain every step of it but one (the funcol)
    exits = by_rank(rows, kind="exit", group_desc="default_pg", category="collective")
    assert [o["backend_seq"] for o in exits[0] if o["parent_span_id"] is None] == \
           [o["backend_seq"] for o in exits[1] if o["parent_span_id"] is None]


def test_p2p_through_process_group_and_batch_align_per_pair(job):
    _, _, rows = job
    p2p = [r for r in rows if r["kind"] == "enter" and r["category"] == "p2p" and r["seq"] is not None]
    sends = sorted((r["rank"], r["peer"], r["seq"], r["name"]) for r in p2p if r["name"] in ("send", "isend"))
    recvs = sorted((r["peer"], r["rank"], r["seq"], r["name"]) for r in p2p if r["name"] in ("recv", "irecv"))
    # pg.send/recv are pair seq 1 on 0->1; the batch adds isend/irecv both ways
    assert [s[:3] for s in sends] == [s[:3] for s in recvs] == [(0, 1, 1), (0, 1, 2), (1, 0, 1)]
    batch = by_rank(rows, kind="enter", name="batch_isend_irecv")
    for rank, (b,) in batch.items():
        assert b["seq"] is None and b["category"] == "p2p"
        inside = [r for r in p2p if r["rank"] == rank and r["parent_span_id"] == b["span_id"]]
        assert sorted(r["name"] for r in inside) == ["irecv", "isend"]
        assert all(r["peer"] == 1 - rank and r["async_op"] for r in inside)


def test_async_handles_and_their_waits_are_linked(job):
    _, _, rows = job
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        spans = {r["span_id"]: r for r in mine if r["kind"] == "enter"}
        waits = [r for r in mine if r["kind"] == "enter" and r["name"] == "wait"]
        assert all(w["category"] == "sync" for w in waits)
        waited = [spans[w["parent_span_id"]] for w in waits]
        # pg.allreduce/broadcast/barrier, pg.send|recv, async dist.all_reduce, the batch's isend and irecv
        assert [(o["name"], o["seq"]) for o in waited] == [
            ("all_reduce", 1), ("broadcast", 2), ("barrier", 3), ("send" if rank == 0 else "recv", 1),
            ("all_reduce", 5), ("isend", 2 if rank == 0 else 1), ("irecv", 1 if rank == 0 else 2)]
        assert all((w["group"], w["seq"]) == (o["group"], o["seq"]) for w, o in zip(waits, waited))
        # gloo finishes the work before wait returns: the op is completed, not merely returned
        done = {r["span_id"] for r in mine if r["kind"] == "complete"}
        assert {o["span_id"] for o in waited} <= done


def test_coalesced_block_is_one_span_counting_each_call(job):
    _, _, rows = job
    for rank, (blk,) in by_rank(rows, kind="enter", name="coalesced").items():
        assert blk["seq"] is None and blk["category"] == "collective" and blk["group_desc"] == "default_pg"
        inner = [r for r in rows if r["rank"] == rank and r["parent_span_id"] == blk["span_id"]]
        assert [(r["kind"], r["name"], r["seq"]) for r in inner] == [
            ("enter", "all_reduce", 6), ("exit", "all_reduce", 6), ("enter", "all_reduce", 7), ("exit", "all_reduce", 7)]
        (end,) = [r for r in rows if r["rank"] == rank and r["kind"] == "exit" and r["span_id"] == blk["span_id"]
                  and r["name"] == "coalesced"]
        assert end["backend_seq"] == inner[-1]["backend_seq"] + 1  # the block made one backend op at its end


def test_ops_python_never_saw_are_reported_not_hidden(job):
    _, _, rows = job
    for rank in (0, 1):
        marks = [r for r in rows if r["rank"] == rank and r["name"] == "untraced_ops"]
        # exactly the functional collective: p2p, batches, blocks, init and captures explain their own steps
        assert len(marks) == 1, marks
        assert marks[0]["kind"] == "mark" and marks[0]["group"] == "0"
        assert "backend_seq jumped from 9 to 10 on group 0" in marks[0]["detail"]


def test_hooked_method_is_a_collective_aligned_per_object(job):
    _, _, rows = job
    hooked = by_rank(rows, kind="enter", name="Comm.all_reduce")
    assert [(r["group"], r["seq"]) for r in hooked[0]] == [(r["group"], r["seq"]) for r in hooked[1]] == [
        ("hook:Comm.all_reduce#0", 1), ("hook:Comm.all_reduce#1", 1), ("hook:Comm.all_reduce#0", 2)]
    for rank, spans in hooked.items():
        assert all(r["category"] == "collective" and r["group_desc"] == "--hook coverage_lib:Comm.all_reduce="
                   "collective" for r in spans)
        # members read from the object's ProcessGroup, recorded on the group's last row of the process (issue #19)
        carriers = [r for r in rows if r["rank"] == rank and r["group"] == spans[0]["group"] and r["group_ranks"]]
        assert carriers and carriers[-1]["group_ranks"] == [0, 1]
        children = [r for r in rows if r["rank"] == rank and r["kind"] == "enter" and
                    r["parent_span_id"] in {s["span_id"] for s in spans}]
        assert [c["name"] for c in children] == ["all_reduce"] * 3  # the torch call inside, recorded once


def test_phase_hook_in_the_meta_region_and_main_script_target_resolved(job):
    from ranktrace.analyzers.model import timeline

    _, _, rows = job
    for rank in (0, 1):
        phase = [r for r in rows if r["rank"] == rank and r["name"] == "load_weights"]
        assert [(r["kind"], r["category"]) for r in phase] == [("enter", "phase"), ("exit", "phase")]
        assert all(r["line"] < 0 for r in phase)  # negative line = a meta-region record: never evicted
        stage = [r for r in rows if r["rank"] == rank and r["name"] == "Stage.run"]
        assert [(r["kind"], r["category"]) for r in stage] == [("enter", "user"), ("exit", "user")]
    first_op = min(r["t_ns"] for r in rows if r["name"] == "all_reduce")
    early = pa.Table.from_pylist([r for r in rows if r["t_ns"] < first_op], schema=events_schema())
    assert timeline.last_phase(early) == {0: "Scheduler.step", 1: "Scheduler.step"}


def test_async_hook_target_stays_a_coroutine_and_its_span_covers_the_awaits(job):
    """The job asserts inspect.iscoroutinefunction on the hooked method (it exits non-zero otherwise); the span
    must last the 50 ms the coroutine awaits, not the instant a sync wrapper would take to create it."""
    _, _, rows = job
    for rank in (0, 1):
        step = [r for r in rows if r["rank"] == rank and r["name"] == "Scheduler.step"]
        assert [(r["kind"], r["category"]) for r in step] == [("enter", "phase"), ("exit", "phase")]
        assert step[1]["t_ns"] - step[0]["t_ns"] >= 50_000_000
        assert "coverage_job.py" in (step[0]["callsite"] or "")


def test_async_generator_targets_are_refused_not_silently_changed(tmp_path: Path):
    from ranktrace.tracer.rank.recorder import Recorder
    from ranktrace.tracer.rank.tracestate import TraceState
    from ranktrace.tracer.rank.wrap_user import make_user_wrapper

    async def stream():  # noqa: ANN202
        yield 1

    st = TraceState(lambda: Recorder(str(tmp_path / "r.ring"), slots=64), 0, 1)
    with pytest.raises(TypeError, match="async generator"):
        make_user_wrapper(st, "m:stream=user", "stream", "user", stream, bound=False)


def events_schema() -> pa.Schema:
    from ranktrace.tracer.formats import schema

    return schema.EVENTS


def test_cuda_graph_and_sync_wrappers_driven_through_torch_classes(tmp_path: Path):
    host = tmp_path / "host"
    (host / "rings").mkdir(parents=True)
    env = trace_env(RANKTRACE_DIR=str(host), PYTHONPATH=os.pathsep.join([str(REPO / "tracer" / "rank" / "_inject"),
                                                                         str(REPO)]))
    res = subprocess.run([PY, str(SCRIPTS / "coverage_graphs.py")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["cuda_calls_during_capture"] == []       # ranktrace made no CUDA call while a capture was open
    assert seen["calls"][-1] == "raised: capture_end failed (stand-in)"  # the job's exception, unchanged
    from ranktrace.analyzers.readers import ranktrace_ring

    (ring,) = (host / "rings").glob("*.ring")
    rows = ranktrace_ring.read(ring).events.to_pylist()
    caps = [(r["kind"], r["graph_id"], r["line"] < 0) for r in rows if r["name"] == "cuda_graph_capture"]
    assert caps == [("enter", 1, True), ("exit", 1, True), ("enter", 2, True), ("exit", 2, True),
                    ("enter", 3, True), ("exit", 3, True), ("enter", 4, True), ("error", 4, True)]
    ar = [r for r in rows if r["name"] == "all_reduce" and r["kind"] == "enter"]
    assert [(r["seq"], bool(r["capturing"]), r["graph_id"]) for r in ar] == [
        (1, False, None), (None, True, 1), (None, True, 2), (2, False, None), (3, False, None), (None, True, 3)]
    # the second seq-2 op came from another thread while graph 2 was being captured: it really ran
    assert ar[3]["tid"] != ar[2]["tid"] and ar[4]["tid"] == ar[2]["tid"]
    cap_span = {r["graph_id"]: r["span_id"] for r in rows if r["name"] == "cuda_graph_capture" and r["kind"] == "enter"}
    assert all(r["parent_span_id"] == cap_span[r["graph_id"]] for r in ar if r["capturing"])
    replays = [(r["graph_id"], r["seq"], r["category"]) for r in rows if r["name"] == "replay" and r["kind"] == "enter"]
    assert replays == [(1, 1, "graph"), (1, 2, "graph"), (1, 3, "graph"), (2, 1, "graph")]
    syncs = [r["name"] for r in rows if r["category"] == "sync" and r["kind"] == "enter"]
    assert syncs == ["cuda_synchronize", "stream_synchronize", "event_synchronize"]  # not torch's own inside capture
    mgc = [r for r in rows if r["name"] == "make_graphed_callables"]
    assert [r["kind"] for r in mgc] == ["enter", "exit"]
    assert [r["parent_span_id"] for r in rows if r["name"] == "cuda_graph_capture" and r["graph_id"] == 3
            and r["kind"] == "enter"] == [mgc[0]["span_id"]]
    assert not [r for r in rows if r["name"] == "untraced_ops"]  # captured collectives are not "untraced"


def test_nvtx_ranges_carry_op_group_and_seq(tmp_path: Path):
    """No NVTX tool here: load() makes no ranges; with an enabled domain built by hand, the wrappers push the texts
    the nsys reader parses, constant texts reuse pre-built attributes, and a missing nvtx is noted once."""
    import nvtx

    from ranktrace.tracer.rank import nvtx_ranges
    from ranktrace.tracer.rank.recorder import Recorder
    from ranktrace.tracer.rank.tracestate import TraceState
    from ranktrace.tracer.rank.wrap_graphs import make_sync_wrapper
    from ranktrace.tracer.rank.wrap_user import make_user_wrapper

    notes: list[str] = []
    assert nvtx_ranges.load(notes.append) is None and notes == []  # no tool attached: no per-call cost
    saved = sys.modules.get("nvtx")
    sys.modules["nvtx"] = None  # type: ignore[assignment]
    try:
        assert nvtx_ranges.load(notes.append) is None
    finally:
        sys.modules["nvtx"] = saved  # type: ignore[assignment]
    assert len(notes) == 1 and "nvtx not importable" in notes[0]

    from nvtx._lib.lib import DomainHandle

    domain = object.__new__(nvtx.Domain)  # what get_domain returns while a tool is attached
    domain.handle, domain.name, domain.categories = DomainHandle(nvtx_ranges.DOMAIN), nvtx_ranges.DOMAIN, {}
    real = nvtx_ranges.NvtxRanges(domain)
    real.push("cuda_synchronize")
    real.push("all_reduce group=0 seq=1")
    real.pop()
    real.pop()
    assert list(real._cached) == ["cuda_synchronize"]  # seq texts are new every call: not cached

    class Seen:
        def __init__(self) -> None:
            self.texts: list[str] = []
            self.depth = 0

        def push(self, text: str) -> None:
            self.texts.append(text)
            self.depth += 1

        def pop(self) -> None:
            self.depth -= 1

    st = TraceState(lambda: Recorder(str(tmp_path / "r.ring"), slots=64), 0, 1)
    st._nv_loaded = True
    st.nv = seen = Seen()
    comm = make_user_wrapper(st, "m:f=collective", "f", "collective", lambda x: x + 1, bound=False)
    sync = make_sync_wrapper(st, "cuda_synchronize", lambda: None)
    assert comm(1) == 2 and comm(2) == 3 and sync() is None
    with pytest.raises(ZeroDivisionError):
        make_sync_wrapper(st, "event_synchronize", lambda: 1 / 0)()  # popped on the error path too
    assert seen.texts == ["f group=hook:f seq=1", "f group=hook:f seq=2", "cuda_synchronize", "event_synchronize"]
    assert seen.depth == 0


def test_hook_values_checked_before_the_job_starts(tmp_path: Path):
    from ranktrace.tracer.launch import envplan
    from ranktrace.tracer.rank import patch_user as user_hooks

    assert user_hooks.parse_spec("pkg.mod:Cls.meth").text == "pkg.mod:Cls.meth=user"
    for bad in ("nocolon", "m:Cls.meth=kernel", "m:", "m:1bad"):
        with pytest.raises(user_hooks.SpecError):
            user_hooks.parse_spec(bad)
    assert envplan.hooks_value({"RANKTRACE_HOOKS": "a:b=user"}, ["a:b=user", "c:d=phase"]) == "a:b=user,c:d=phase"
    plan = envplan.plan_environment({}, tmp_path, hooks=["c:d=phase"])
    assert plan.added["RANKTRACE_HOOKS"] == "c:d=phase"
    marker = tmp_path / "started"
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--hook", "mod:Cls.meth=kernel", "--", PY, "-c",
                     f"open({str(marker)!r}, 'w')"])
    assert res.returncode == 2 and "category must be one of" in res.stderr
    assert not marker.exists() and not (tmp_path / "r").exists()


def test_untraced_marks_spill_to_op_slots_after_the_first_notes(tmp_path: Path):
    """A DDP loop makes one gap per step: after MAX_GAP_NOTES readable meta records, marks go to op slots (which wrap)
    so the non-wrapping region never fills up."""
    from ranktrace.analyzers.readers import ranktrace_ring
    from ranktrace.tracer.rank.groups import MAX_GAP_NOTES
    from ranktrace.tracer.rank.recorder import Recorder
    from ranktrace.tracer.rank.tracestate import TraceState

    st = TraceState(lambda: Recorder(str(tmp_path / "r.ring"), slots=64), 0, 2)
    group = (lambda: None, st.rec.intern("0"), "0", [0, 1], None, True)
    for i in range(MAX_GAP_NOTES + 2):
        st.untraced(group, 10 * i, 10 * i + 3, 0, 1)
    st.rec.close()
    rows = [r for r in ranktrace_ring.read(tmp_path / "r.ring").events.to_pylist() if r["name"] == "untraced_ops"]
    meta_rows = [r for r in rows if r["line"] < 0]
    slot_rows = [r for r in rows if r["line"] >= 0]
    assert len(meta_rows) == MAX_GAP_NOTES and "jumped from 0 to 3 on group 0" in meta_rows[0]["detail"]
    assert [(r["kind"], r["group"], r["backend_seq"], r["seq"]) for r in slot_rows] == [
        ("mark", "0", 10 * MAX_GAP_NOTES + 3, None), ("mark", "0", 10 * MAX_GAP_NOTES + 13, None)]


def test_no_capture_begins_while_the_agent_dumps_the_flight_recorder(tmp_path: Path):
    """The FR dump may read CUDA events; a capture that began meanwhile would be invalidated. The agent holds the
    gate around the dump; a capture start waits for it, and a dump asked during a start is skipped."""
    import threading
    import time as _time

    from ranktrace.tracer.rank.recorder import Recorder
    from ranktrace.tracer.rank.tracestate import TraceState
    from ranktrace.tracer.rank.wrap_graphs import make_capture_wrapper

    st = TraceState(lambda: Recorder(str(tmp_path / "g.ring"), slots=64), 0, 1)
    began: list[float] = []

    class Graph:
        pass

    begin = make_capture_wrapper(st, "capture_begin", lambda self: began.append(_time.monotonic()))
    released: list[float] = []
    inside = threading.Event()

    def dump() -> None:
        with st.no_capture_starts() as capture_open:
            assert capture_open is False
            inside.set()
            _time.sleep(0.3)  # the Flight Recorder dump
            released.append(_time.monotonic())

    agent = threading.Thread(target=dump)
    agent.start()
    inside.wait(5)
    begin(Graph())  # the job starts a capture while the dump runs: it waits
    agent.join()
    assert began and released and began[0] >= released[0]
    assert st.capturing is not None and st.capture_pending == 0
    with st.no_capture_starts() as capture_open:  # now a capture is open: the agent would not dump
        assert capture_open is True
