"""trace analyze on files users already have (and on documented inputs for what needs a GPU to happen for real).

Each folder under tests/data/scenarios/ holds only foreign artifacts (watchdog lines, py-spy dumps, NCCL logs,
Flight Recorder dumps, RAS output, an nsys export, server logs) written from the documented formats; the real
sample set in ../shared/data/local is a hung 4-rank gloo job. All go through the same readers and the same
wait-for engine as our own captures.
"""
from __future__ import annotations

import html
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from ranktrace.analyzers import api
from tests.helpers import REPO, TRACE, trace_env

SCEN = REPO / "tests" / "data" / "scenarios"


def verdict_of(*paths: Path) -> dict:
    return api.analyze(list(paths), liveness=None).verdict.to_dict()


def brief(v: dict) -> tuple:
    op = v["operation"] or {}
    return (v["status"], v["kind"], op.get("name"), op.get("seq"), v["culprit_ranks"], v["waiting_ranks"])


def evidence_files(v: dict) -> set[str]:
    return {Path(e["file"]).name for f in v["findings"] for e in f["evidence"] if e["file"]}


def test_watchdog_lines_one_rank_behind():  # (a)
    v = verdict_of(SCEN / "watchdog_seq_mismatch")
    # ranks 0,1,3 time out on SeqNum 43, rank 2 on 42: rank 2 never issued 43; the watchdog aborted the job
    assert brief(v) == ("crashed", "missing_ranks", "all_reduce", 43, [2], [0, 1, 3])
    assert any(e["line"] for f in v["findings"] for e in f["evidence"] if e["source"] == "watchdog")


def test_pyspy_dumps_one_rank_elsewhere():  # (b)
    v = verdict_of(SCEN / "pyspy_one_elsewhere")
    assert brief(v)[:3] == ("hang", "missing_ranks", "all_reduce")
    assert v["culprit_ranks"] == [3] and v["waiting_ranks"] == [0, 1, 2]
    assert "rank3.txt" in evidence_files(v)


def test_nccl_coll_log_allgather_vs_allreduce():  # (c)
    v = verdict_of(SCEN / "nccl_coll_mismatch")
    assert brief(v)[:2] == ("hang", "collective_mismatch")
    assert v["culprit_ranks"] == [1] and v["operation"]["name"] == "all_reduce"
    assert "all_gather" in v["summary"]
    assert any(e["source"] == "nccl" and e["line"] for f in v["findings"] for e in f["evidence"])


def test_nccl_log_communicator_never_completes_init():  # (d)
    v = verdict_of(SCEN / "nccl_init_incomplete")
    assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "init_hang", [3], [0, 1, 2])
    assert v["operation"]["name"] == "nccl_comm_init"


def test_fr_dump_set_with_a_missing_rank():  # (e)
    v = verdict_of(SCEN / "fr_missing_rank")
    assert brief(v) == ("hang", "missing_ranks", "all_reduce", 7, [1], [0, 2, 3])
    assert "nccl_trace_rank_0.json" in evidence_files(v)


def test_ras_two_ranks_ahead():  # (f): RAS lists the ranks *ahead*; the ones behind are the culprits
    v = verdict_of(SCEN / "ras_two_ahead")
    assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "missing_ranks", [0, 1],
                                                                                  [2, 3])
    assert any(e["source"] == "ras" for f in v["findings"] for e in f["evidence"])


def test_nccl_async_case_fr_not_completed_and_stack_in_tolist():  # documented input: needs a GPU for real
    v = verdict_of(SCEN / "fr_nccl_not_completed")
    # every rank *issued* seq 42 (on NCCL the call returned at enqueue); only rank 3's never completed on its GPU,
    # and its host sits in tolist waiting for it
    assert brief(v) == ("hang", "stuck_in_collective", "all_reduce", 42, [3], [0, 1, 2])
    assert v["ranks"]["3"]["state"] == "host_sync_wait"


def test_nsys_export_with_an_open_range():  # issue 8
    v = verdict_of(SCEN / "nsys_open_range")
    assert brief(v) == ("hang", "missing_ranks", "all_reduce", 12, [0], [1])
    assert any(e["source"] == "nsys" for f in v["findings"] for e in f["evidence"])


def test_server_logs_one_tp_rank_never_registers_its_graph():  # issue 8
    v = verdict_of(SCEN / "server_log_graph_registration")
    assert (v["status"], v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("hang", "graph_capture", [3],
                                                                                  [0, 1, 2])


def test_real_gloo_hang_sample_set(shared_data: Path):
    """FR pickles+JSON, py-spy text/JSON/native, faulthandler and gdb of one real hung job, all at once."""
    v = verdict_of(shared_data / "local" / "torch-2.13-gloo-hang")
    assert brief(v) == ("hang", "missing_ranks", "all_reduce", 11, [3], [0, 1, 2])
    assert v["ranks"]["0"]["state"] == "in_collective"
    assert v["stack_tree"].startswith("[")


def _two_nccl_rings(tmp: Path) -> tuple[Path, list]:
    """A finished-looking host dir of another machine with a 64-slot ring per rank of a 2-rank NCCL world group,
    written by the real recorder (identity and group records in place); the caller writes the ops."""
    from ranktrace.tracer.rank.recorder import Recorder

    host = tmp / "run" / "node0-abc"
    (host / "rings").mkdir(parents=True)
    (host / "meta.json").write_text(json.dumps({"schema": "ranktrace.meta/1", "hostname": "elsewhere",
                                                "exit": None, "pids": {}}))
    recs = []
    for rank in (0, 1):
        rec = Recorder(str(host / "rings" / f"{100 + rank}.ring"), slots=64)
        rec.meta({"type": "identity", "rank": rank, "world": 2})
        rec.meta({"type": "group", "name": "0", "desc": "default_pg", "backend": "nccl", "ranks": [0, 1]})
        recs.append(rec)
    return host, recs


def _capture_open_rings(tmp: Path) -> Path:
    """A documented input for a hang with a CUDA graph capture open (cannot happen on CPU): rings written by the
    real recorder, in the shape tracer hooks record — rank 1 entered graph capture and its captured all_reduce
    never returned; rank 0 finished capture and waits in the next real all_reduce."""
    host, recs = _two_nccl_rings(tmp)
    for rank, rec in enumerate(recs):
        g, ar = rec.intern("0"), rec.intern("all_reduce")
        for seq in (1, 2):
            rec.op("enter", "collective", ar, tid=1, group_id=g, seq=seq, span_id=seq)
            rec.op("exit", "collective", ar, tid=1, group_id=g, seq=seq, span_id=seq)
            rec.op("complete", "collective", ar, tid=1, group_id=g, seq=seq, span_id=seq)
        rec.meta({"type": "event", "kind": "enter", "name": "cuda_graph_capture", "category": "graph", "t_ns": 10,
                  "tid": 1, "span_id": 50, "graph_id": 1, "callsite": "model_runner.py:300 capture"})
        rec.op("enter", "collective", ar, tid=1, group_id=g, span_id=51, capturing=True, graph_id=1)
        if rank == 0:
            rec.op("exit", "collective", ar, tid=1, group_id=g, span_id=51, capturing=True, graph_id=1)
            rec.meta({"type": "event", "kind": "exit", "name": "cuda_graph_capture", "category": "graph",
                      "t_ns": 20, "tid": 1, "span_id": 50, "graph_id": 1})
            rec.op("enter", "collective", ar, tid=1, group_id=g, seq=3, span_id=60)
        rec.close()
    return host.parent


def test_hang_with_a_capture_open(tmp_path: Path):
    v = verdict_of(_capture_open_rings(tmp_path))
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("hang", "graph_capture", [1])
    assert v["operation"]["phase"] == "cuda_graph_capture"


def _wrapped_ring_rings(tmp: Path, rank1_tail: int, rank1_last: int = 5) -> Path:
    """Rings written by the real recorder: both ranks issued world all_reduce seq 1..4 (NCCL: issued, then the
    next one is what tells the previous one finished); rank 0 waits in seq 5. Rank 1 then issued `rank1_tail` ops
    on its own TP group "1" — enough of them wrap its 64-slot ring past every world record."""
    host, recs = _two_nccl_rings(tmp)
    for rank, rec in enumerate(recs):
        rec.meta({"type": "group", "name": "1", "desc": "tp", "backend": "nccl", "ranks": [rank]})
        w, tp, ar = rec.intern("0"), rec.intern("1"), rec.intern("all_reduce")
        for seq in range(1, 5 if rank == 0 else rank1_last + 1):
            rec.op("enter", "collective", ar, tid=1, group_id=w, seq=seq, span_id=seq)
            rec.op("exit", "collective", ar, tid=1, group_id=w, seq=seq, span_id=seq)
        if rank == 0:
            rec.op("enter", "collective", ar, tid=1, group_id=w, seq=5, span_id=5)
        else:
            for seq in range(1, rank1_tail + 1):
                rec.op("enter", "collective", ar, tid=1, group_id=tp, seq=seq, span_id=100 + seq)
                rec.op("exit", "collective", ar, tid=1, group_id=tp, seq=seq, span_id=100 + seq)
        rec.close()
    return host.parent


def test_a_rank_whose_ring_wrapped_past_a_group_is_not_blamed_for_it(tmp_path: Path):
    """Rank 1 issued seq 5 long ago; its ring no longer shows it. Without the wrap it is plainly there."""
    v = verdict_of(_wrapped_ring_rings(tmp_path / "wrapped", rank1_tail=100))
    assert 1 not in v["culprit_ranks"] and v["kind"] != "missing_ranks", v["summary"]
    (f,) = [f for f in v["findings"] if f["kind"] == "ring_wrapped"]
    assert f["ranks"] == [1] and "all_reduce seq 5" in f["summary"] and "rank 0 waits in it" in f["summary"]
    # the same job with rank 1's world records still in its ring: rank 1 issued seq 5, so nobody is "missing" it
    v = verdict_of(_wrapped_ring_rings(tmp_path / "kept", rank1_tail=10))
    assert not [f for f in v["findings"] if f["kind"] == "ring_wrapped"] and v["kind"] != "missing_ranks"
    # a rank 1 that really stopped at seq 4, its ring wrapped but still holding seq 3 and 4: still named
    v = verdict_of(_wrapped_ring_rings(tmp_path / "stopped", rank1_tail=30, rank1_last=4))
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [1], [0])
    assert any("overwritten by the ring wrap" in f["summary"] for f in v["findings"])


def test_every_scenario_verdict_round_trips_and_renders():
    from html.parser import HTMLParser

    from ranktrace.analyzers.report import html_report, json_report, perfetto_report, text_report
    from ranktrace.analyzers.report.words import plain
    from ranktrace.analyzers.verdict import Verdict

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.open: list[str] = []

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag not in ("meta", "br", "line", "rect", "i"):
                self.open.append(tag)

        def handle_endtag(self, tag: str) -> None:
            if tag in ("rect", "line", "i"):
                return
            assert self.open and self.open[-1] == tag, (self.open[-3:], tag)
            self.open.pop()

    for d in sorted(p for p in SCEN.iterdir() if p.is_dir()):
        result = api.analyze([d], liveness=None)
        v = result.verdict
        again = Verdict.from_dict(json.loads(json_report.render(v)))
        assert again == v, d
        text = text_report.render(v)
        assert text.splitlines()[0].startswith(v.status.upper()) and plain(v.summary)[:40] in text.replace("\n", " ")
        for f in v.findings:
            assert f.evidence, (d, f)
        page = html_report.render(result)
        tags = Tags()
        tags.feed(page)
        assert tags.open == [], (d, tags.open)  # every element closed: the page is well formed
        assert f"{v.status.upper()} · {v.kind}" in page and html.escape(plain(v.summary)) in page, d
        json.loads(perfetto_report.render(result))


def test_report_html_escapes_what_came_from_the_trace():
    """Op names, call sites, error texts and summaries are data from the job: never markup in the page."""
    import dataclasses

    import pyarrow as pa

    from ranktrace.analyzers.report import html_report

    from ranktrace.analyzers.report import text_report

    result = api.analyze([SCEN / "nsys_open_range"], liveness=None)
    evil = "<script>alert(1)</script>[/x]:bug:"
    ev = result.events
    for col in ("callsite", "error", "name"):
        ev = ev.set_column(ev.schema.get_field_index(col), col, pa.array([f"{col}{evil}"] * ev.num_rows, pa.string()))
    verdict = dataclasses.replace(result.verdict, summary=f"rank 0 {evil}", next_steps=(evil,))
    page = html_report.render(dataclasses.replace(result, events=ev, verdict=verdict))
    # the one script is the page's own zoom (fixed text); nothing from the trace becomes one
    assert page.count("<script") == 1 and f"<script>{html_report._SCRIPT}</script>" in page
    assert html.escape(evil) in page
    assert all(html.escape(f"{col}{evil}") in page for col in ("callsite", "name"))  # a bar's tooltip
    # the terminal report takes the same text as text: no rich markup error, no emoji code turned into one
    assert f"rank 0 {evil}" in text_report.render(verdict, width=400)


@pytest.mark.parametrize("log,expected,code", [
    # an SGLang server that said it is ready and then only waits for requests: idle, not hung (exit 0)
    ("sglang_dp_pp_ep_docker.log", ("idle", "no_hang"), 0),
    # a vLLM V0 log that stops while loading, with nothing pending and no stacks: no verdict is claimed (exit 4)
    ("vllm_v0_single_gpu.log", ("inconclusive", "unknown"), 4),
])
def test_serving_idle_and_not_enough_evidence(log: str, expected: tuple[str, str], code: int):
    res = subprocess.run(TRACE + ["analyze", "--json", str(REPO / "tests/data/readers/server_log" / log)],
                         capture_output=True, text=True, env=trace_env())
    v = json.loads(res.stdout)
    assert (v["status"], v["kind"]) == expected and res.returncode == code, res.stderr
    assert not v["culprit_ranks"] and not v["waiting_ranks"]
    if expected[0] == "idle":
        assert "serving and idle" in v["summary"]
    else:
        assert any("Capture stacks while it is hung" in s for s in v["next_steps"])


def test_report_html_draws_phase_marks_of_a_server_log():
    """A serving engine's log has phases, not ops: the page still shows each rank's lane with its phase marks."""
    from ranktrace.analyzers.report import html_report

    page = html_report.render(api.analyze([SCEN / "server_log_graph_registration"], liveness=None))
    marks = re.findall(r'<path [^>]*><title>rank (\d+): ([^<]*)</title>', page)
    assert ("0", "dist_init_begin") in marks and "No timed op records" not in page


def test_report_html_timeline_window_and_outline():
    """The picture spans what is drawn: an op that never returned reaches the latest record of any drawn rank (here
    another rank's later phase mark), a phase open since the start does not squeeze the ops into a pixel, and an
    operation without a seq (an init) outlines its open calls."""
    import dataclasses

    from ranktrace.tracer.formats import schema
    from ranktrace.analyzers.model.values import Analysis, JobStatus
    from ranktrace.analyzers.model.timeline import OPS, open_enter_rows
    from ranktrace.analyzers.report import html_report
    from ranktrace.analyzers.verdict import Operation

    base = api.analyze([SCEN / "nsys_open_range"], liveness=None).verdict
    plain = dataclasses.replace(base, ranks={}, operation=None, culprit_ranks=(), waiting_ranks=())

    def page(rows: list[dict], verdict=plain) -> str:  # noqa: ANN001
        full = [{"source": "events", "file": "f", "host": "h", "pid": r["rank"], "tid": 1, "wall_ns": r["t_ns"], **r}
                for r in rows]
        events = schema.table_from_rows(schema.EVENTS, full)
        result = Analysis(verdict=verdict, events=events, ops=schema.empty(OPS), stacks=schema.empty(schema.STACKS),
                          observations=schema.empty(schema.OBSERVATIONS), open_spans=(),
                          open_rows=tuple(int(i) for i in open_enter_rows(events)),
                          job=JobStatus(False, False, None, None), liveness=None)
        return html_report.render(result)

    def bars(text: str) -> list[tuple[float, float, str]]:
        return [(float(x), float(w), t) for x, w, t in
                re.findall(r'<rect x="([\d.]+)" y="\d+" width="([\d.]+)"[^>]*><title>([^<]*)</title>', text)]

    s = 10**9
    hung = page([dict(rank=0, kind="enter", name="fwd", category="user", span_id=1, t_ns=0),
                 dict(rank=0, kind="exit", name="fwd", span_id=1, t_ns=s // 2),
                 dict(rank=0, kind="enter", name="all_reduce", category="collective", span_id=2, t_ns=s),
                 dict(rank=1, kind="mark", name="phase:eval", t_ns=10 * s)])
    (open_bar,) = [b for b in bars(hung) if "never returned" in b[2]]
    assert open_bar[1] > 800  # from 1 s to the mark at 10 s: most of the 1000-pixel picture
    ops = [dict(rank=0, kind=k, name="all_reduce", category="collective", span_id=10 + i, seq=i,
                t_ns=3600 * s + i * s // 100 + (s // 200 if k == "exit" else 0))
           for i in range(30) for k in ("enter", "exit")]
    squeezed = page([dict(rank=0, kind="enter", name="serve", category="phase", span_id=1, t_ns=0)] + ops)
    assert len({x for x, _w, t in bars(squeezed) if "all_reduce" in t}) == 30  # 30 distinct places, not one pixel
    # another thread's call ends before a child starts inside its parent: the child is still drawn below its parent
    nested = page([dict(rank=0, tid=2, kind="enter", name="other", category="user", span_id=1, t_ns=0),
                   dict(rank=0, tid=2, kind="exit", name="other", span_id=1, t_ns=5 * s),
                   dict(rank=0, kind="enter", name="all_reduce", category="collective", span_id=2, t_ns=3 * s),
                   dict(rank=0, kind="enter", name="wait", category="sync", span_id=3, t_ns=6 * s),
                   dict(rank=0, kind="exit", name="wait", span_id=3, t_ns=8 * s),
                   dict(rank=0, kind="exit", name="all_reduce", span_id=2, t_ns=20 * s)])
    y = {t.split(":")[1].split()[0]: int(yy) for yy, t in re.findall(r'<rect x="[\d.]+" y="(\d+)"[^>]*><title>([^<]*)',
                                                                       nested)}
    assert y["all_reduce"] > y["other"] and y["wait"] > y["all_reduce"], y
    init = dataclasses.replace(plain, operation=Operation(name="init_process_group", phase="init"))
    outlined = page([dict(rank=r, kind="enter", name="init_process_group", category="init", span_id=1, t_ns=r)
                     for r in range(2)], init)
    assert outlined.count('stroke="#000"') == 2


def test_run_files_keep_the_verdict_when_the_page_fails(tmp_path: Path, monkeypatch):
    """verdict.json is the contract and always lands; a failing report.html is one line, and no page of an older
    verdict stays beside the new one."""
    from ranktrace.analyzers.report import html_report

    result = api.analyze([SCEN / "nsys_open_range"], liveness=None)
    assert api.write_run_files(tmp_path, result) is None
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")

    def broken(_result):  # noqa: ANN001, ANN202
        raise ValueError("a bug in the page")

    monkeypatch.setattr(html_report, "render", broken)
    (tmp_path / "verdict.json").unlink()
    problem = api.write_run_files(tmp_path, result)
    assert problem == "report.html not written: ValueError: a bug in the page"
    assert json.loads((tmp_path / "verdict.json").read_text())["status"] == result.verdict.status
    assert not (tmp_path / "report.html").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["verdict.json"]


def test_cli_exit_codes_and_json(tmp_path: Path):
    res = subprocess.run(TRACE + ["analyze", "--json", str(SCEN / "fr_missing_rank")], capture_output=True,
                         text=True, env=trace_env())
    assert res.returncode == 3 and json.loads(res.stdout)["schema"] == "ranktrace.verdict/1"
    out = tmp_path / "t.json"
    res = subprocess.run(TRACE + ["analyze", "--perfetto", str(out), str(SCEN / "nsys_open_range")],
                         capture_output=True, text=True, env=trace_env())
    trace = json.loads(out.read_text())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert any(e["name"].endswith("(never returned)") and e["pid"] == 1 for e in slices)  # the range never closed
    assert any(e.get("ph") == "s" for e in trace["traceEvents"])  # flow arrows join the same op across ranks
    page = tmp_path / "r.html"
    res = subprocess.run(TRACE + ["analyze", "--html", str(page), str(SCEN / "nsys_open_range")],
                         capture_output=True, text=True, env=trace_env())
    assert res.returncode == 3 and 'class="open"><title>rank 1: ' in page.read_text()
    # an existing file is never overwritten: refused before any work, exit 2, the file as it was
    before = page.read_text()
    res = subprocess.run(TRACE + ["analyze", "--html", str(page), str(SCEN / "nsys_open_range")],
                         capture_output=True, text=True, env=trace_env())
    assert res.returncode == 2 and "exists: not overwritten" in res.stderr and page.read_text() == before


@pytest.mark.parametrize("make", ["empty_dir", "unrelated", "missing"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, make: str):
    target = tmp_path / "in"
    if make == "empty_dir":
        target.mkdir()
    elif make == "unrelated":
        target.mkdir()
        (target / "notes.txt").write_text("shopping list: eggs, milk\n")
        (target / "blob.bin").write_bytes(bytes(range(256)) * 40)
    res = subprocess.run(TRACE + ["analyze", str(target)], capture_output=True, text=True, env=trace_env())
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and str(target) in res.stderr
    assert "Traceback" not in res.stderr


def test_damaged_trace_dir_still_gives_a_verdict(tmp_path: Path):
    """Truncated events.arrow, a ring cut mid-record, corrupt meta.json: verdict from what is readable + a note."""
    import shutil

    run = _capture_open_rings(tmp_path)
    host = next(run.iterdir())
    (host / "meta.json").write_text("{not json")
    (host / "events.arrow").write_bytes(b"ARROW1\x00\x00garbage")
    ring = host / "rings" / "101.ring"
    data = ring.read_bytes()
    shutil.copy(ring, host / "rings" / "102.ring")
    (host / "rings" / "102.ring").write_bytes(data[:4096 + 100])  # header + a cut meta record
    res = subprocess.run(TRACE + ["analyze", "--json", str(run)], capture_output=True, text=True, env=trace_env())
    assert res.returncode == 3, res.stderr
    v = json.loads(res.stdout)
    assert v["kind"] == "graph_capture"
    notes = " ".join(f["summary"] for f in v["findings"] if f["kind"] == "input_skipped")
    assert "meta.json" in notes and "events.arrow" in notes


def test_live_analyze_does_not_change_a_finished_run(tmp_path: Path):
    run = _capture_open_rings(tmp_path)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    time.sleep(0.01)
    verdict_of(run)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_example_capture_in_the_repository():
    """traces/examples/skip-4rank-gloo: a real capture (events.arrow, meta.json, py-spy burst), no rings."""
    v = verdict_of(REPO / "traces" / "examples" / "skip-4rank-gloo")
    assert brief(v) == ("hang", "missing_ranks", "all_reduce", 5, [3], [0, 1, 2])
    assert any(e["source"] == "pyspy" and e["rank"] == 3 and "next_batch" in e["detail"]
               for f in v["findings"] for e in f["evidence"])
