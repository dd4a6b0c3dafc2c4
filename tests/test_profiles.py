"""Issue #14's profiles and in-rank semantics, piece by piece: profile files (bad input named by file and line,
detection from the command), @contextmanager spans, hooked collectives counted while a capture is open, a changed
signature, identity from a process title, and a ring that survives thousands of graph captures."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.helpers import PY, run_trace


def _state(tmp_path: Path, slots: int = 4096, meta_bytes: int | None = None):
    from ranktrace.tracer.rank.recorder import DEFAULT_META_BYTES, Recorder
    from ranktrace.tracer.rank.tracestate import TraceState

    path = tmp_path / "r.ring"
    st = TraceState(lambda: Recorder(str(path), slots=slots, meta_bytes=meta_bytes or DEFAULT_META_BYTES), 0, 2)
    st.identity("test")
    return st, path


def _events(path: Path) -> list[dict]:
    from ranktrace.analyzers.readers import ranktrace_ring

    return ranktrace_ring.read(path).events.to_pylist()


# --- profile files ----------------------------------------------------------------------------------------------
def test_shipped_profiles_load_and_are_picked_from_the_command():
    from ranktrace.tracer.launch import profiles

    assert profiles.builtin_names() == ["sglang", "torch", "vllm"]
    for cmd, name in ((["python", "-m", "sglang.launch_server", "--tp", "8"], "sglang"),
                      (["sglang", "serve", "--model-path", "m"], "sglang"), (["vllm", "serve", "m"], "vllm"),
                      (["python3", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
                      (["torchrun", "--nproc-per-node", "2", "train.py"], "torch"),
                      (["bash", "-c", "exec python -m sglang.launch_server --tp 2"], "sglang"),
                      (["python", "train.py"], None)):
        found = profiles.detect(cmd)
        assert (found.name if found else None) == name, cmd
    sg = profiles.find("sglang")
    roles = {t.role for t in sg.targets}
    assert roles == {"identity", "init", "collective", "registration", "phase"}
    capture = next(t for t in sg.targets if t.name == "cuda_graph_capture")
    assert capture.targets[1].endswith("CudaGraphRunner.capture_one_batch_size") and capture.detail == ("bs", "size")
    assert capture.read_from[capture.targets[1]] == ("0.5.13.post1", "0.5.12.post1")
    plan = profiles.plan([sg])
    assert plan["proctitle"] and all(t["category"] in (None, "init", "collective", "graph", "phase", "user", "sync")
                                     for t in plan["targets"])


@pytest.mark.parametrize("body, where, what", [
    ('[profile]\nname = "x"\nfavourite = 1\n', ":3:", "unknown key 'favourite' in [profile]"),
    ('[profile]\nname = "x"\n\n[[target]]\nrole = "phase"\nname = "p"\ntargets = ["m:f"]\ncolour = "red"\n', ":8:",
     "target #1: unknown key 'colour'"),
    ('[profile]\nname = "x"\n\n[[target]]\nrole = "phase"\nname = "p"\ntargets = ["m:f", "not a target"]\n', ":7:",
     "'not a target' is not MODULE:QUALNAME"),
    ('[profile]\nname = "x"\n\n[[target]]\nrole = "kernel"\nname = "p"\ntargets = ["m:f"]\n', ":5:",
     "role must be one of"),
    ('[profile]\nname = "x"\ntargets = [\n', ":3:", "not valid TOML"),
])
def test_a_bad_profile_file_is_one_line_naming_file_and_line(tmp_path: Path, body: str, where: str, what: str):
    prof = tmp_path / "mine.toml"
    prof.write_text(body)
    marker = tmp_path / "started"
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--profile", str(prof), "--", PY, "-c",
                     f"open({str(marker)!r}, 'w')"])
    assert res.returncode == 2 and not marker.exists() and not (tmp_path / "r").exists()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{prof}{where}" in lines[0] and what in lines[0], res.stderr


def test_profile_none_and_an_unknown_name(tmp_path: Path):
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--profile", "nope", "--", PY, "-c", "pass"])
    assert res.returncode == 2 and "not a profile name (sglang, torch, vllm)" in res.stderr
    res = run_trace(["run", "-o", str(tmp_path / "r2"), "--profile", "none", "--no-analyze", "--", PY, "-c", "pass"])
    assert res.returncode == 0 and "profile" not in res.stderr.split("job exited")[0]


def test_a_profile_file_of_ones_own_is_used_and_hook_adds_to_it(tmp_path: Path):
    (tmp_path / "mylib.py").write_text(
        "import contextlib\n"
        "class Comm:\n"
        "    def all_reduce(self, x, *, bs=0):\n        return x + 1\n"
        "@contextlib.contextmanager\n"
        "def step(bs):\n    yield bs\n"
        "def other():\n    return 7\n")
    (tmp_path / "main.py").write_text(
        "import mylib, time\n"
        "c = mylib.Comm()\n"
        "assert c.all_reduce(1) == 2 and c.all_reduce(2, bs=3) == 3\n"
        "with mylib.step(64) as b:\n    assert b == 64\n    time.sleep(0.2)\n"
        "assert mylib.other() == 7\n"
        "import torch.distributed\n")
    prof = tmp_path / "p.toml"
    prof.write_text('[profile]\nname = "mine"\n\n[[target]]\nrole = "collective"\nname = "all_reduce"\n'
                    'comm = "mycomm"\ntargets = ["mylib:Comm.all_reduce"]\n\n[[target]]\nrole = "phase"\n'
                    'name = "stepping"\ndetail = "size|bs"\ntargets = ["mylib:step"]\n\n[[target]]\nrole = "phase"\n'
                    'name = "renamed"\ntargets = ["mylib:gone", "mylib:also_gone"]\n')
    from tests.helpers import events, meta, trace_env

    env = trace_env(PYTHONPATH=f"{tmp_path}:{trace_env()['PYTHONPATH']}", RANK="0", WORLD_SIZE="1")
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--no-analyze", "--profile", str(prof), "--hook",
                     "mylib:other=phase", "--", PY, str(tmp_path / "main.py")], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = events(tmp_path / "r").to_pylist()
    ar = [r for r in rows if r["name"] == "all_reduce" and r["kind"] == "enter"]
    assert [(r["seq"], r["group_desc"], r["backend"]) for r in ar] == [(1, "mycomm", "hook"), (2, "mycomm", "hook")]
    step = [r for r in rows if r["name"] == "stepping"]
    assert [(r["kind"], r["category"]) for r in step] == [("enter", "phase"), ("exit", "phase")]
    assert step[0]["detail"] == "detail=bs=64" and step[1]["t_ns"] - step[0]["t_ns"] >= 200_000_000  # the with block
    assert [r["kind"] for r in rows if r["name"] == "other"] == ["enter", "exit"]  # --hook added to the profile
    problems = meta(tmp_path / "r")["hook_problems"]
    assert [p["target"] for p in problems] == ["profile mine: mylib:gone"]
    assert "not found in the installed release" in problems[0]["problem"] and "also_gone" in problems[0]["problem"]
    assert res.stderr.count("mylib:gone") == 1
    assert meta(tmp_path / "r")["profile"]["names"] == ["mine"]


def test_a_phase_target_covers_the_subclass_override_that_actually_runs(tmp_path: Path):
    """vLLM's CPUWorker / CPUModelRunner override gpu_worker's / GPUModelRunner's methods: the override is what runs,
    so a target named on the base class records the override's call — a subclass defined before the patch and one
    defined after it (the CPU worker's module imports the GPU one, then subclasses it) — once, even when the override
    calls super()."""
    (tmp_path / "gpu_like.py").write_text(
        "class Worker:\n"
        "    def load_model(self):\n        return 'base'\n"
        "class EarlySub(Worker):\n"
        "    def load_model(self):\n        return 'early'\n")
    (tmp_path / "cpu_like.py").write_text(
        "import gpu_like\n"
        "class CPUWorker(gpu_like.Worker):\n"
        "    def load_model(self):\n        return 'cpu+' + super().load_model()\n"
        "class Plain(gpu_like.Worker):\n    pass\n")
    (tmp_path / "main.py").write_text(
        "import cpu_like, gpu_like\n"
        "assert cpu_like.CPUWorker().load_model() == 'cpu+base'\n"
        "assert gpu_like.EarlySub().load_model() == 'early'\n"
        "assert cpu_like.Plain().load_model() == 'base'\n"
        "assert cpu_like.CPUWorker.load_model.__name__ == 'load_model'\n"
        "import torch.distributed\n")
    prof = tmp_path / "p.toml"
    prof.write_text('[profile]\nname = "mine"\n\n[[target]]\nrole = "phase"\nname = "weight_loading"\n'
                    'targets = ["gpu_like:Worker.load_model"]\n')
    from tests.helpers import events, trace_env

    env = trace_env(PYTHONPATH=f"{tmp_path}:{trace_env()['PYTHONPATH']}", RANK="0", WORLD_SIZE="1")
    res = run_trace(["run", "-o", str(tmp_path / "r"), "--no-analyze", "--profile", str(prof), "--", PY,
                     str(tmp_path / "main.py")], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [r for r in events(tmp_path / "r").to_pylist() if r["name"] == "weight_loading"]
    # three calls (CPUWorker's override with its super() inside it, EarlySub's, Plain's inherited one): three spans
    assert [r["kind"] for r in rows] == ["enter", "exit"] * 3, [(r["kind"], r["line"]) for r in rows]


# --- in-rank semantics -------------------------------------------------------------------------------------------
def test_a_contextmanager_target_spans_the_with_block_and_passes_everything_through(tmp_path: Path):
    from ranktrace.tracer.rank.wrap_user import make_user_wrapper

    st, path = _state(tmp_path)
    seen: list[str] = []

    @contextlib.contextmanager
    def capture(bs: int):
        seen.append("enter")
        try:
            yield bs * 2
        finally:
            seen.append("exit")

    wrapped = make_user_wrapper(st, "m:capture", "capture", "phase", capture, False, name="cuda_graph_capture",
                                detail=("bs",))
    with wrapped(32) as got:
        assert got == 64
        seen.append("body")
    with pytest.raises(KeyError):
        with wrapped(bs=8):
            raise KeyError("inside")
    assert seen == ["enter", "body", "exit", "enter", "exit"]
    assert type(wrapped(1)) is type(capture(1))  # still contextlib's object
    rows = [r for r in _events(path) if r["name"] == "cuda_graph_capture"]
    assert [(r["kind"], r["detail"]) for r in rows] == [("enter", "detail=bs=32"), ("exit", None),
                                                         ("enter", "detail=bs=8"), ("error", None)]


def test_a_hooked_collective_is_counted_while_a_capture_is_open(tmp_path: Path):
    from ranktrace.tracer.rank.wrap_graphs import make_capture_wrapper
    from ranktrace.tracer.rank.wrap_user import make_user_wrapper

    st, path = _state(tmp_path)

    class Comm:
        def all_reduce(self, x):
            return x

    class Graph:
        pass

    Comm.all_reduce = make_user_wrapper(st, "m:Comm.all_reduce", "Comm.all_reduce", "collective", Comm.all_reduce,
                                        True, name="all_reduce", comm="pynccl")
    begin = make_capture_wrapper(st, "capture_begin", lambda self: None)
    end = make_capture_wrapper(st, "capture_end", lambda self: None)
    c, g = Comm(), Graph()
    c.all_reduce(1)
    begin(g)
    c.all_reduce(2)
    end(g)
    c.all_reduce(3)
    rows = [r for r in _events(path) if r["name"] == "all_reduce" and r["kind"] == "enter"]
    assert [(r["seq"], r["capturing"], r["group_desc"]) for r in rows] == [(1, False, "pynccl"), (2, True, "pynccl"),
                                                                           (3, False, "pynccl")]


def test_a_changed_signature_loses_the_detail_never_the_call(tmp_path: Path):
    from ranktrace.tracer.rank.wrap_user import make_user_wrapper

    st, path = _state(tmp_path)

    def capture_one_shape(self, size, forward=None, *rest, **kw):  # a release renamed bs -> size and added args
        return (size, forward, rest, kw)

    w = make_user_wrapper(st, "m:f", "f", "phase", capture_one_shape, False, name="cuda_graph_capture",
                          detail=("bs",))
    assert w("self", 16, "fwd", 1, 2, extra=3) == (16, "fwd", (1, 2), {"extra": 3})
    assert [r["detail"] for r in _events(path) if r["name"] == "cuda_graph_capture"] == [None, None]
    with pytest.raises(TypeError):
        w()  # the job's own TypeError, unchanged


def test_identity_from_a_process_title_and_from_arguments(tmp_path: Path):
    from ranktrace.tracer.launch import profiles
    from ranktrace.tracer.rank.tracestate import TraceState
    from ranktrace.tracer.rank.recorder import Recorder
    from ranktrace.tracer.rank.wrap_user import make_identity_wrapper, make_proctitle_wrapper

    st = TraceState(lambda: Recorder(str(tmp_path / "i.ring"), slots=64), None, None)
    run = make_identity_wrapper(st, "profile sglang", {"tp": "tp_rank", "pp": "pp_rank", "dp": "dp_rank"},
                                lambda server_args, tp_rank, pp_rank, dp_rank: "ran")
    assert run(None, 3, 0, None) == "ran" and st.rank == 3 and st.roles == {"tp": 3}
    title = make_proctitle_wrapper(st, list(profiles.find("sglang").proctitle), lambda t: None)
    title("sglang::scheduler_DP1_TP3_EP3")
    assert st.roles == {"dp": 1, "tp": 3, "ep": 3}
    from ranktrace.analyzers.readers.ranktrace_ring import identity_of
    from ranktrace.analyzers.readers.ranktrace_ring.events import roles_text
    from ranktrace.tracer.formats.ringreader import read_ring

    assert roles_text(identity_of(read_ring(str(tmp_path / "i.ring")))["roles"]) == "DP1 TP3 EP3"
    vl = make_proctitle_wrapper(st, list(profiles.find("vllm").proctitle), lambda t: None)
    vl("VLLM::Worker_PP1_TP2")
    assert st.roles == {"pp": 1, "tp": 2}


def test_the_ring_meta_region_survives_thousands_of_graph_captures(tmp_path: Path):
    """vLLM's piecewise capture makes ~4,000 captures: past half the meta region they go to op slots, so identity,
    groups and strings recorded afterwards still fit, and the last capture is still there."""
    from ranktrace.tracer.rank.wrap_graphs import make_capture_wrapper
    from ranktrace.tracer.formats.ringreader import read_ring

    st, path = _state(tmp_path, slots=16384)
    begin = make_capture_wrapper(st, "capture_begin", lambda self: None)
    end = make_capture_wrapper(st, "capture_end", lambda self: None)

    class Graph:
        pass

    graphs = [Graph() for _ in range(4000)]
    for g in graphs:
        begin(g)
        end(g)
    st.rec.meta({"type": "group", "name": "late", "desc": "after the captures", "backend": "gloo", "ranks": [0, 1]})
    late = st.name_id("a string interned after 4000 captures")
    rc = read_ring(str(path))
    assert not rc.meta_full and rc.strings[late] == "a string interned after 4000 captures"
    assert any(m.get("name") == "late" for m in rc.meta if m.get("type") == "group")
    rows = [r for r in _events(path) if r["name"] == "cuda_graph_capture"]
    assert len(rows) == 8000 and rows[-1]["kind"] == "exit" and rows[-1]["graph_id"] == 4000
    assert any(r["line"] < 0 for r in rows) and any(r["line"] >= 0 for r in rows)  # both regions used


def test_the_plan_the_ranks_read_is_plain_json(tmp_path: Path):
    from ranktrace.tracer.launch import profiles
    from ranktrace.tracer.rank.patch_user import load_plan

    path, info = profiles.apply(tmp_path, [profiles.find("vllm")], "--profile")
    assert info == {"names": ["vllm"], "chosen_by": "--profile", "files": [str(profiles.PROFILE_DIR / "vllm.toml")],
                    "targets": len(profiles.find("vllm").targets)}
    targets, titles, problems = load_plan(str(path))
    assert not problems and titles and len(targets) == info["targets"]
    assert json.loads(path.read_text())["schema"] == "ranktrace.profile/1"
    assert load_plan(str(tmp_path / "missing.json"))[2][0][1].startswith("cannot be read")


def test_the_host_syncs_serving_frameworks_use_are_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """vLLM's current releases sync through torch.accelerator (capture, memory profiling); empty_cache waits too."""
    import sys
    import types

    from ranktrace.tracer.rank.patch_graphs import install_cuda

    st, path = _state(tmp_path)
    cuda = types.ModuleType("torch.cuda")
    cuda.synchronize = lambda device=None: "cuda"
    cuda.empty_cache = lambda: "emptied"
    accel = types.ModuleType("torch.accelerator")
    accel.synchronize = lambda device=None, /: "accelerator"
    accel.empty_cache = lambda: "accelerator emptied"
    monkeypatch.setitem(sys.modules, "torch.accelerator", accel)
    how = install_cuda(st, cuda)
    assert (how["accelerator.synchronize"], how["accelerator.empty_cache"], how["empty_cache"]) == ("attr",) * 3
    assert accel.synchronize() == "accelerator" and accel.empty_cache() == "accelerator emptied"
    assert cuda.synchronize(0) == "cuda" and cuda.empty_cache() == "emptied"
    names = [(r["name"], r["category"]) for r in _events(path) if r["kind"] == "enter"]
    assert names == [("accelerator_synchronize", "sync"), ("accelerator_empty_cache", "sync"),
                     ("cuda_synchronize", "sync"), ("empty_cache", "sync")]


def test_two_dp_replicas_that_reuse_ranks_are_kept_apart():
    """SGLang DP2 x TP2 without DP attention: two torch worlds, both with ranks 0-1. DP1's rank 1 never issues
    all_reduce seq 2 on its group; DP0 completes its own: the verdict blames DP1's rank 1 (rank 3), not DP0."""
    from ranktrace.tracer.formats import schema
    from ranktrace.analyzers.diagnose import diagnose
    from ranktrace.analyzers.model.build import build_model
    from ranktrace.analyzers.model.dpworlds import separate_dp_worlds
    from ranktrace.analyzers.model.records import Inputs

    rows = []
    for dp in (0, 1):
        for rank in (0, 1):
            pid = 100 + dp * 10 + rank
            base = {"host": "h", "pid": pid, "rank": rank, "world": 2, "source": "events", "file": f"{pid}.ring"}
            rows.append({**base, "kind": "identity", "name": "roles", "detail": f"DP{dp} TP{rank}", "line": -1})
            n = 1 if (dp, rank) == (1, 1) else 2
            for seq in range(1, n + 1):
                for kind in ("enter", "exit"):
                    rows.append({**base, "kind": kind, "name": "all_reduce", "category": "collective", "group": "2",
                                 "group_ranks": [0, 1], "backend": "gloo", "seq": seq, "t_ns": seq * 10 + dp,
                                 "wall_ns": seq * 10 + dp, "span_id": seq, "line": seq})
    events = schema.table_from_rows(schema.EVENTS, rows)
    ev, st, obs, world = separate_dp_worlds(events, schema.empty(schema.STACKS), schema.empty(schema.OBSERVATIONS))
    assert world == 4
    pairs = {(r["pid"], r["rank"], r["group"]) for r in ev.to_pylist() if r["kind"] == "enter"}
    assert pairs == {(100, 0, "2"), (101, 1, "2"), (110, 2, "dp1:2"), (111, 3, "dp1:2")}
    # DP1's rank 0 (now 2) still waits in seq 2 (its gloo call never returned): drop its exit
    ev = ev.filter(pa_not_last_exit(ev))
    inputs = Inputs(events=ev, stacks=st, observations=obs, world_size=world)
    v = diagnose(build_model(inputs, None))
    assert (v.kind, v.culprit_ranks, v.waiting_ranks) == ("missing_ranks", (3,), (2,))


def pa_not_last_exit(ev):
    import pyarrow as pa

    keep = [not (r["pid"] == 110 and r["kind"] == "exit" and r["seq"] == 2) for r in ev.to_pylist()]
    return pa.array(keep)


def test_gpu_utilisation_is_evidence_for_an_enqueued_collective():
    """Both ranks returned from pynccl all_reduce #7 and wait in torch.cuda.synchronize; NVML says their GPUs spin
    at 100%: a kernel waits for a peer (not a host-side wait)."""
    from ranktrace.tracer.formats import schema
    from ranktrace.analyzers.diagnose import diagnose
    from ranktrace.analyzers.model.build import build_model
    from ranktrace.analyzers.model.records import Inputs

    rows, obs = [], []
    for rank in (0, 1):
        base = {"host": "h", "pid": 10 + rank, "rank": rank, "world": 2, "source": "events", "file": f"{rank}.ring",
                "tid": 1}
        for seq in range(1, 8):
            for kind in ("enter", "exit"):
                rows.append({**base, "kind": kind, "name": "all_reduce", "category": "collective",
                             "group": "hook:PyNcclCommunicator.all_reduce#0", "group_desc": "pynccl",
                             "backend": "hook", "seq": seq, "t_ns": seq * 100, "wall_ns": seq * 100, "span_id": seq,
                             "line": seq * 2 + (kind == "exit"), "callsite": "forward (model.py:10)"})
        rows.append({**base, "kind": "enter", "name": "cuda_synchronize", "category": "sync", "t_ns": 900,
                     "wall_ns": 900, "span_id": 99, "line": 40, "callsite": "capture (runner.py:5)"})
        obs.append({"host": "h", "pid": 10 + rank, "rank": rank, "kind": "gpu_memory", "name": f"gpu{rank}",
                    "value": 1 << 30, "detail": "process", "source": "gpu", "file": "gpu.arrow"})
        obs.append({"host": "h", "kind": "gpu_util", "name": f"gpu{rank}", "value": 100, "source": "gpu",
                    "file": "gpu.arrow"})
    inputs = Inputs(events=schema.table_from_rows(schema.EVENTS, rows), stacks=schema.empty(schema.STACKS),
                    observations=schema.table_from_rows(schema.OBSERVATIONS, obs), world_size=2)
    v = diagnose(build_model(inputs, None))
    assert (v.kind, v.operation.name, v.operation.group_desc, v.operation.seq) == ("stuck_in_collective",
                                                                                  "all_reduce", "pynccl", 7)
    assert "pynccl all_reduce #7, returned" in v.summary and "their GPUs are busy" in v.summary
    gpu = [e for f in v.findings for e in f.evidence if e.source == "gpu"]
    assert [(e.rank, "spins" in e.detail) for e in gpu] == [(0, True), (1, True)]
