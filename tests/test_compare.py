"""`trace compare A B`: real gloo runs under `trace run` (a clean one, the same job with one rank skipping an
all_reduce, a clean one with another world size and NCCL environment, an unrelated job), real NCCL INFO logs from
issue threads (tests/data/nccl_pairs) whose NCCL chose different transports, a run compared with itself, foreign
inputs, and the three outputs (text, --json ranktrace.compare/1, --html)."""
from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ranktrace.analyzers.compare import compare_paths
from ranktrace.analyzers.report import compare_html, compare_text
from tests.helpers import EXAMPLE, PY, REPO, SCRIPTS, TRACE, run_trace, trace_env

PAIRS = REPO / "tests" / "data" / "nccl_pairs"
SCEN = REPO / "tests" / "data" / "scenarios"
JOB = [PY, str(EXAMPLE), "--steps", "4", "--timeout", "5", "--hang-seconds", "20"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("compare_runs")
    jobs = {
        "clean": (JOB + ["--world", "2"], {}),
        "skip": (JOB + ["--world", "2", "--fault", "skip"], {}),
        "world3": (JOB + ["--world", "3"], {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}),
        "other": ([PY, str(SCRIPTS / "spine_job.py")], {}),
    }

    def one(name: str) -> tuple[str, Path]:
        cmd, env = jobs[name]
        run_dir = base / name
        keep = ["--keep-rings"] if name == "skip" else []  # its rings make the live-run copy below
        res = run_trace(["run", "-o", str(run_dir), *keep, "--"] + cmd, timeout=240, env=trace_env(**env))
        assert (run_dir / "verdict.json").exists(), res.stderr
        return name, run_dir

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, jobs))


def facts_by_key(c) -> dict[str, object]:
    return {f.key: f for f in c.context_diff}


# --- real runs ---------------------------------------------------------------------------------------------------

def test_one_rank_skipping_a_collective_first_divergence_names_rank_op_and_seq(runs):
    c = compare_paths(runs["clean"], runs["skip"], liveness=None)
    assert c.related
    first = min(c.first_divergence, key=lambda d: (d.position, d.rank))
    # rank 1 (the last rank) skipped step 3's all_reduce: the 5th op of the clean run, seq 5 of default_pg
    assert first.rank == 1 and first.b is None
    assert (first.a_op.op, first.a_op.group, first.a_op.seq) == ("all_reduce", "default_pg", 5)
    assert first.a_op.callsite and "tp_job.py" in first.a_op.callsite
    assert c.verdict_a.kind == "no_hang" and (c.verdict_b.kind, c.verdict_b.culprit_ranks) == ("missing_ranks", (1,))
    assert c.summary().startswith("rank 1: A went on to all_reduce default_pg seq 5")
    assert facts_by_key(c)["command"].status == "differs"
    text = compare_text.render(c)
    assert text.index("1. hardware and software") < text.index("2. what NCCL decided") < text.index(
        "3. outcome") < text.index("4. where B departed from A") < text.index("5. timings")
    assert "rank 1 op #4: A=all_reduce default_pg seq 5" in text


def test_the_verdict_window_never_cuts_the_sequences_compared(runs, monkeypatch: pytest.MonkeyPatch):
    """A verdict reads each rank's latest records only (analyzers/inputs/own_records.py); trace compare reads every op, so the
    first divergence keeps its position in the run however small the window."""
    whole = compare_paths(runs["clean"], runs["skip"], liveness=None)
    monkeypatch.setenv("RANKTRACE_WINDOW_ROWS", "2")
    cut = compare_paths(runs["clean"], runs["skip"], liveness=None)
    key = lambda c: sorted((d.rank, d.position, d.a, d.b) for d in c.first_divergence)  # noqa: E731
    assert key(cut) == key(whole) and min(d.position for d in cut.first_divergence) == 4


def test_whole_sequences_read_from_events_arrow_equal_a_whole_analysis(runs, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """Where the verdict's window cut a finalized run, compare reads every op straight from events.arrow (strings
    left dictionary-encoded, issue #17's 5 s); each rank's sequence is the one a whole analysis gives. A live run
    (rings only, no events.arrow) falls back to that whole analysis, with the same answer."""
    from ranktrace.analyzers import api
    from ranktrace.analyzers.compare import sequences, whole

    monkeypatch.setenv("RANKTRACE_WINDOW_ROWS", "2")
    run = runs["skip"]
    an = api.analyze([run], liveness=None)
    assert an.windowed
    fast = whole.run_tables(an, run, liveness=None)
    slow = api.analyze([run], liveness=None, whole=True)
    assert fast.how == "events.arrow" and not slow.windowed

    def seqs(tables) -> dict[int, list[tuple]]:
        s = sequences.op_sequences(tables, "events")
        rows = whole.decoded(s.table).to_pylist()
        return {r: [(x["phase"], x["group"], x["name"], x["seq"], x["dtype"], x["shape"], x["callsite"])
                    for x in rows[a:b]] for r, (a, b) in s.bounds.items()}

    got, want = seqs(fast), seqs(whole.RunTables(slow.events, slow.ops, "analysis"))
    assert got == want and sorted(got) == [0, 1] and min(len(v) for v in got.values()) >= 4

    # what the run dir holds besides our records (an NCCL debug log where NCCL_DEBUG_FILE puts it) stays beside them
    import shutil
    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed)
    nccl_dir = next(mixed.glob("*/meta.json")).parent / "nccl"
    nccl_dir.mkdir(exist_ok=True)
    shutil.copy(REPO / "tests" / "data" / "readers" / "nccl" / "prefixes.log", nccl_dir / "node.1.log")
    an_mixed = api.analyze([mixed], liveness=None)
    both = whole.run_tables(an_mixed, mixed, liveness=None)
    assert both.how == "events.arrow" and sequences.op_sources(both).keys() == {"events", "nccl"}
    assert seqs(both) == want and sequences.op_sequences(both, "nccl").table.num_rows == 8

    live = tmp_path / "live"
    shutil.copytree(run, live)
    for ev in live.glob("*/events.arrow"):
        ev.unlink()
    an_live = api.analyze([live], liveness=None)
    assert whole.run_tables(an_live, live, liveness=None).how == "analysis"
    key = lambda c: sorted((d.rank, d.position, d.a, d.b) for d in c.first_divergence)  # noqa: E731
    assert key(compare_paths(runs["clean"], live, liveness=None)) == key(compare_paths(runs["clean"], run,
                                                                                        liveness=None))


def test_other_world_size_and_nccl_env_named_in_the_context_and_no_false_divergence(runs):
    c = compare_paths(runs["clean"], runs["world3"], liveness=None)
    f = facts_by_key(c)
    assert (f["world size"].a, f["world size"].b, f["world size"].status) == ("2", "3", "differs")
    assert (f["NCCL_P2P_DISABLE"].a, f["NCCL_P2P_DISABLE"].b, f["NCCL_P2P_DISABLE"].status) == (
        "(unset)", "1", "differs")
    assert f["NCCL_ALGO"].b == "Ring" and f["NCCL_ALGO"].status == "differs"
    differing = [x.key for x in c.context_diff if x.status == "differs"]
    assert set(differing) == {"command", "world size", "NCCL_P2P_DISABLE", "NCCL_ALGO"}
    assert c.related and c.first_divergence == []          # shapes follow the world size: not a divergence
    assert "shapes left out" in c.sequence_note and "ranks only in B: [2]" in c.sequence_note
    assert [f.status for f in c.context_diff][:len(differing)] == ["differs"] * len(differing)   # differences first


def test_a_run_compared_with_itself_has_no_differences(runs):
    c = compare_paths(runs["clean"], runs["clean"], liveness=None)
    assert [f for f in c.context_diff if f.status != "same"] == []
    assert [d for d in c.nccl_diff if d.differs] == []
    assert c.first_divergence == [] and c.related
    assert c.summary() == "the runs issued the same collectives in the same order on every rank both observed"
    assert all(p.ratio in (None, 1.0) for p in c.phases)
    assert all(r.ratio_p50 in (None, 1.0) and r.a_n == r.b_n for r in c.latency)


def test_two_unrelated_jobs_are_said_to_be_different_jobs_not_a_divergence(runs):
    c = compare_paths(runs["clean"], runs["other"], liveness=None)
    assert not c.related and c.first_divergence == []
    assert "tp_job.py vs spine_job.py" in c.relation
    assert c.summary().startswith("A and B look like different jobs")
    assert "their op sequences are not compared" in compare_text.render(c)


def test_timings_side_by_side(runs):
    c = compare_paths(runs["clean"], runs["skip"], liveness=None)
    phases = {p.name: p for p in c.phases}
    assert phases["init_process_group"].a_s > 0 and phases["init_process_group"].b_s > 0
    assert phases["init_process_group"].ratio == pytest.approx(phases["init_process_group"].b_s
                                                               / phases["init_process_group"].a_s)
    rows = {(r.op, r.nbytes): r for r in c.latency}
    big = rows[("all_reduce", 65536)]    # [128, 128] float32 partial sums of the TP "layer"
    assert big.basis == "host call (our rings)" and big.a_n == 8 and big.b_n >= 5
    assert big.a_p50_us > 0 and big.a_p99_us >= big.a_p50_us and big.ratio_p50 is not None


def test_cli_json_text_and_html(runs, tmp_path: Path):
    good, hung = runs["clean"], runs["skip"]
    res = subprocess.run(TRACE + ["compare", "--json", str(good), str(hung)], capture_output=True, text=True,
                         env=trace_env())
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "ranktrace.compare/1"
    assert {"context_diff", "nccl_diff", "first_divergence", "phases", "latency", "verdict_a", "verdict_b"} <= set(doc)
    assert doc["verdict_b"]["schema"] == "ranktrace.verdict/1"
    page = tmp_path / "cmp.html"
    res = subprocess.run(TRACE + ["compare", "--html", str(page), str(good), str(hung)], capture_output=True,
                         text=True, env=trace_env())
    assert res.returncode == 0 and page.exists()
    html = page.read_text()
    assert "<script" not in html and "5. Timings" in html and "missing_ranks" in html
    again = subprocess.run(TRACE + ["compare", "--html", str(page), str(good), str(hung)], capture_output=True,
                           text=True, env=trace_env())
    assert again.returncode == 2 and "not overwritten" in again.stderr


# --- real NCCL logs from issue threads -----------------------------------------------------------------------------

def test_consumer_blackwell_p2p_vs_ada_shm_transports():
    """tinygrad/open-gpu-kernel-modules#29 (8x RTX 5090, P2P) vs NVIDIA/nccl-tests#307 (8x RTX 4090, SHM)."""
    c = compare_paths(PAIRS / "consumer_p2p_vs_shm" / "a_rtx5090_p2p.log",
                      PAIRS / "consumer_p2p_vs_shm" / "b_rtx4090_shm.log", liveness=None)
    rows = [d for d in c.nccl_diff if d.scope == "runs" and d.what == "transport" and d.differs]
    assert [(d.ranks, d.a, d.b) for d in rows] == [((1, 2, 3, 4, 5, 6, 7), "P2P/direct", "SHM")]
    assert any(e.startswith("a_rtx5090_p2p.log:") for e in rows[0].evidence)
    nvls = next(d for d in c.nccl_diff if d.what == "nvls_multicast")
    assert nvls.b == "not available"
    assert facts_by_key(c)["NCCL"].a == "2.25.1"
    text = compare_text.render(c)
    assert "transport ranks 1-7: A=P2P/direct  B=SHM" in text


def test_h100_cumem_vs_direct_and_rccl_vs_nccl():
    c = compare_paths(PAIRS / "h100_cumem_vs_direct" / "a_h100_cumem.log",
                      PAIRS / "h100_cumem_vs_direct" / "b_h100_direct.log", liveness=None)
    row = next(d for d in c.nccl_diff if d.what == "transport" and d.differs)
    assert (row.ranks, row.a, row.b) == ((1,), "P2P/CUMEM", "P2P/direct")
    c = compare_paths(PAIRS / "rccl_mi250x_vs_a100" / "a_rccl_mi250x.log",
                      PAIRS / "rccl_mi250x_vs_a100" / "b_nccl_a100.log", liveness=None)
    used = next(d for d in c.nccl_diff if d.what == "transports used (all ranks seen)")
    assert (used.a, used.b, used.differs) == ("NET/Socket, P2P/IPC", "P2P/IPC", True)
    # NET only between nodes (g1064 and g1072): expected, never a rank that chose another path
    assert [d for d in c.nccl_diff if d.scope == "within_a"] == []


def test_b200_nvls_channels_vs_a100(shared_data: Path):
    c = compare_paths(PAIRS / "b200_vs_a100" / "a_b200_nvls.log",
                      shared_data / "external" / "nccl-tests-Timez-zx" / "nccl.log", liveness=None)
    ch = next(d for d in c.nccl_diff if d.what == "channels")
    assert (ch.a, ch.b, ch.differs) == ("32 coll, 32 nvls, 32 p2p (32 per peer)",
                                         "24 coll, 0 nvls, 32 p2p (32 per peer)", True)
    p2p = next(d for d in c.nccl_diff if d.what == "p2p_type")
    assert p2p.differs and "directMode 0" in p2p.a and "directMode 1" in p2p.b


def test_a_rank_that_chose_a_different_path_within_one_run(tmp_path: Path):
    """The RTX 5090 log with one rank's transport line changed to SHM (constructed from the real lines): the other
    intra-node links use P2P/direct, so rank 3 is named."""
    lines = (PAIRS / "consumer_p2p_vs_shm" / "a_rtx5090_p2p.log").read_text().splitlines(keepends=True)
    odd = [x.replace("via P2P/direct pointer", "via SHM/direct/direct") if "3[3] -> 4[4]" in x else x for x in lines]
    path = tmp_path / "one_rank_shm.log"
    path.write_text("".join(odd))
    c = compare_paths(PAIRS / "consumer_p2p_vs_shm" / "a_rtx5090_p2p.log", path, liveness=None)
    within = [d for d in c.nccl_diff if d.scope == "within_b"]
    assert [(d.what, d.ranks, d.a, d.b, d.who) for d in within] == [
        ("transport (intra-node links)", (3,), "P2P/direct", "SHM", "links 3->4")]
    across = [d for d in c.nccl_diff if d.scope == "runs" and d.what == "transport" and d.differs]
    assert [(d.ranks, d.a, d.b) for d in across] == [((3,), "P2P/direct", "SHM")]
    assert "between the ranks of B" in compare_text.render(c)


# --- foreign inputs ------------------------------------------------------------------------------------------------

def test_foreign_inputs_nsys_export_and_nccl_coll_logs(tmp_path: Path):
    """An nsys export and a folder of NCCL COLL logs: both verdicts, the GPU from the export, kernel latencies."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nsys_open_range_make", SCEN / "nsys_open_range" / "make.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    export = mod.build(tmp_path / "hang.sqlite")
    c = compare_paths(SCEN / "nccl_coll_mismatch", export, liveness=None)
    assert c.verdict_a.kind == "collective_mismatch" and c.verdict_b.status == "hang"
    assert facts_by_key(c)["GPU model"].b == "NVIDIA H100 80GB HBM3"
    assert any(r.basis == "GPU kernel (nsys)" and r.b_n == 4 for r in c.latency)
    assert "nsys export" in c.b_inputs and "NCCL log" in c.a_inputs
    page = compare_html.render(c)
    assert "<script" not in page and "nsys export" in page and "collective_mismatch" in page
