"""`trace bisect`: the knob search, on real jobs that really hang.

The example job's p2p and custom-ar faults hang only while an environment knob or a flag leaves them on; the
search must find that knob, in the order the verdict points at, with rates over --repeat, inside the budget, and
leave no process behind. tests/scripts/knob_job.py (no torch, starts in a blink) drives the parts of the loop that
need many runs: combinations, rejected spellings, the ready line, the time budget, Ctrl-C, orphans.
"""
from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ranktrace.tracer.launch.bisect import knobs
from ranktrace.tracer.launch.bisect.search import Config, Search, Tally
from tests.helpers import EXAMPLE, PY, SCRIPTS, TRACE, run_trace, trace_env

KNOB_JOB = SCRIPTS / "knob_job.py"


def leftovers(marker: str) -> list[str]:
    """Live processes (not zombies) whose command line or environment mentions `marker` (a test's tmp dir)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rindex(b")") + 2:][:1] == b"Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except (OSError, ValueError):
            continue
        if marker.encode() in cmd or marker.encode() in env:
            shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:200]
            out.append(f"{pid}: {shown}")
    return out


def write_knobs(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bisect(tmp: Path, args: list[str], timeout: float = 400, **env: str) -> tuple[subprocess.CompletedProcess[str],
                                                                                 dict]:
    out = tmp / "b"
    env.setdefault("RANKTRACE_LOCK_DIR", str(tmp / "locks"))  # other test runs on this machine hold their own
    res = run_trace(["bisect", "-o", str(out), "--json"] + args, timeout=timeout, env=trace_env(**env))
    doc = json.loads((out / "bisect.json").read_text()) if (out / "bisect.json").exists() else {}
    return res, doc


def config(doc: dict, name: str) -> dict:
    return next(c for c in doc["configurations"] if c["name"] == name)


# ---- the example job: a real gloo hang that a knob turns off ------------------------------------------------------

EXAMPLE_P2P = ["--", PY, str(EXAMPLE), "--world", "2", "--steps", "3", "--fault", "p2p", "--fault-step", "1",
               "--timeout", "300", "--hang-seconds", "300"]


# The four runs of real example jobs (and the ready-line one) take most of this file's time, most of it waiting for
# --hang-after: they run once, up front, two at a time, the longest first; each test reads its own.

def _bisect_flaky(tmp_path: Path) -> tuple:
    kf = write_knobs(tmp_path / "knobs.toml", 'only = ["NCCL_P2P_DISABLE=1"]\n')
    return bisect(tmp_path, ["--repeat", "2", "--budget", "4", "--hang-after", "4", "--knobs", str(kf)]
                  + EXAMPLE_P2P + ["--fault-rate", "0.5"], EXAMPLE_FAULT_COUNTER=str(tmp_path / "counter"))


def _bisect_ready(tmp_path: Path) -> tuple:
    kf = write_knobs(tmp_path / "knobs.toml", 'only = ["graphs off"]\n[[knob]]\nname = "graphs off"\narea = "graph"\n'
                                              '[[knob.variant]]\nadd = ["--new-spelling"]\n'
                                              '[[knob.variant]]\nadd = ["--old-spelling"]\n')
    return bisect(tmp_path, ["--repeat", "2", "--hang-after", "1", "--startup-hang-after", "3", "--knobs",
                             str(kf), "--ready", "READY TO SERVE", "--", PY, str(KNOB_JOB),
                             "--reject-flag=--new-spelling", "--needs-flag=--old-spelling", "--ready", "--orphan",
                             str(tmp_path / "orphan.pid")])


def _bisect_p2p(tmp_path: Path) -> tuple:
    return bisect(tmp_path, ["--repeat", "1", "--budget", "2", "--hang-after", "4"] + EXAMPLE_P2P)


def _bisect_flag(tmp_path: Path) -> tuple:
    kf = write_knobs(tmp_path / "knobs.toml", '[[knob]]\nname = "no custom all-reduce"\narea = "custom_ar"\n'
                                              'add = ["--disable-custom-all-reduce"]\n'
                                              'suggests = "the custom all-reduce"\n')
    return bisect(tmp_path, ["--repeat", "1", "--budget", "3", "--hang-after", "4", "--knobs", str(kf), "--",
                             PY, str(EXAMPLE), "--world", "2", "--steps", "3", "--fault", "custom-ar",
                             "--fault-step", "1", "--timeout", "300", "--hang-seconds", "300"])


BISECTS = {"flaky": _bisect_flaky, "ready": _bisect_ready, "p2p": _bisect_p2p, "flag": _bisect_flag}


@pytest.fixture(scope="module")
def bisected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("bisects")

    def one(name: str) -> tuple[str, tuple]:
        tmp = base / name
        tmp.mkdir()
        try:
            return name, (tmp, *BISECTS[name](tmp))
        except Exception as e:  # raised in the test that reads this run, not in all of them
            return name, (tmp, e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, BISECTS))


def ran(bisected: dict[str, tuple], name: str) -> tuple:
    got = bisected[name]
    if isinstance(got[1], BaseException):
        raise got[1]
    return got


def test_bisect_finds_the_p2p_knob_from_the_catalogue_within_the_budget(bisected):
    """The p2p fault: rank 1's transfer never lands while P2P is on. The verdict (a send left waiting on rank 1,
    whose stack is in p2p_copy) puts the P2P knobs first; NCCL_P2P_DISABLE=1 fixes it; its narrower knob
    NCCL_P2P_LEVEL=NVL would be next, but --budget 2 is spent: the answer stands, the rest is listed untried."""
    tmp_path, res, doc = ran(bisected, "p2p")
    assert res.returncode == 0, res.stderr[-3000:]
    assert doc["schema"] == "ranktrace.bisect/1" and doc["status"] == "fixed"
    assert doc["runs_used"] == 2 and doc["stopped"].startswith("budget: 2 of 2 runs used")
    assert doc["order"][0]["area"] == "p2p" and "p2p op (send)" in doc["order"][0]["reason"]
    base = config(doc, "baseline")
    assert base["rates"] == "hang 1/1"
    v = base["runs"][0]["verdict"]
    assert (v["kind"], v["op"], v["peer"], v["culprit_ranks"]) == ("missing_ranks", "send", 1, [1])
    assert config(doc, "NCCL_P2P_DISABLE=1")["rates"] == "success 1/1"
    assert doc["fix"]["changes"] == ["NCCL_P2P_DISABLE=1"] and "P2P" in doc["fix"]["suggests"][0]
    assert {"knob": "NCCL_P2P_LEVEL=NVL", "changes": "NCCL_P2P_LEVEL=NVL",
            "why": doc["not_tried"][0]["why"]} == doc["not_tried"][0]
    # every run's trace dir under the bisect folder, each with its verdict; the comparison of the two
    root = tmp_path / "b"
    for c in doc["configurations"]:
        for r in c["runs"]:
            assert (root / r["dir"] / "verdict.json").exists() and (root / r["log"]).exists()
    assert doc["compare"]["hung"].startswith("runs/01-baseline") and doc["compare"]["good"].startswith("runs/02-")
    assert ["NCCL_P2P_DISABLE", "(unset)", "1"] in doc["compare"]["context"]
    assert "send" in doc["compare"]["summary"] and (root / "compare.txt").exists()
    page = (root / "report.html").read_text()
    assert 'class="bisect"' in page and "NCCL_P2P_DISABLE=1" in page and "HANG · missing_ranks" in page
    # the headline is the answer, not the hung run's verdict (which comes under it)
    h1 = re.search(r"<h1>([^<]*)</h1>", page)
    assert h1 and h1.group(1) == "trace bisect: " + html.escape(doc["answer"]), page[:2000]
    assert re.search(r'<h2 class="(hang|crashed)">The best hung run: HANG · missing_ranks</h2>', page)
    assert (root / "bisect.txt").read_text().startswith("trace bisect · ")
    assert leftovers(str(tmp_path)) == []


def test_bisect_flaky_hang_reports_rates_over_repeat(bisected):
    """The p2p fault firing in every other run (--fault-rate 0.5, exact through a counter file): the baseline hangs
    1/2, NCCL_P2P_DISABLE=1 succeeds 2/2 — a fix, with the chance that two successes were luck at the baseline's
    rate (25%) said in the answer."""
    tmp_path, res, doc = ran(bisected, "flaky")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(c["name"], c["rates"], c["effect"]) for c in doc["configurations"]] == [
        ("baseline", "hang 1/2, success 1/2", "baseline"), ("NCCL_P2P_DISABLE=1", "success 2/2", "fixes")]
    assert [r["outcome"] for r in config(doc, "baseline")["runs"]] == ["hang", "success"]
    assert config(doc, "baseline")["runs"][0]["verdict"]["op"] == "send"
    assert doc["runs_used"] == 4 and doc["fix"]["chance_by_luck"] == 0.25 and "weak: 25% chance" in doc["answer"]
    assert leftovers(str(tmp_path)) == []


def test_bisect_finds_a_flag_the_verdict_points_at(bisected):
    """The custom-ar fault: rank 1 hangs registering IPC buffers inside custom_all_reduce. A knobs file adds the
    framework flag --disable-custom-all-reduce (area custom_ar) beside the catalogue; the culprit's stack puts
    custom all-reduce knobs first, so the flag is the first thing tried."""
    tmp_path, res, doc = ran(bisected, "flag")
    assert res.returncode == 0, res.stderr[-3000:]
    assert doc["order"][0] == {"area": "custom_ar", "reason": "the verdict mentions 'custom_all_reduce'"}
    assert [c["name"] for c in doc["configurations"]] == ["baseline", "+ --disable-custom-all-reduce"]
    assert doc["fix"]["knobs"] == ["no custom all-reduce"] and doc["runs_used"] == 2
    v = config(doc, "baseline")["runs"][0]["verdict"]
    assert (v["kind"], v["op"], v["culprit_ranks"]) == ("missing_ranks", "all_reduce", [1])
    fixed = json.loads(next((tmp_path / "b").glob("runs/02-*/*/meta.json")).read_text())
    assert fixed["command"][-1] == "--disable-custom-all-reduce"
    assert leftovers(str(tmp_path)) == []


# ---- the loop, on a job that starts in a blink ---------------------------------------------------------------

def _user_knobs(tmp: Path, names: str = "ABC", extra: str = "") -> Path:
    body = "".join(f'[[knob]]\nname = "{n}"\nenv = {{ K{n} = "1" }}\n' for n in names)
    return write_knobs(tmp / "knobs.toml", f'only = [{", ".join(repr(n).replace(chr(39), chr(34)) for n in names)}]\n'
                       + extra + body)


def test_two_knobs_needed_together_are_found_by_reduction(tmp_path: Path):
    """The job needs KA=1 and KB=1: no knob alone fixes it, all three together do, and delta debugging drops KC."""
    res, doc = bisect(tmp_path, ["--repeat", "1", "--budget", "12", "--hang-after", "1", "--knobs",
                                 str(_user_knobs(tmp_path)), "--", PY, str(KNOB_JOB), "--fail", "crash",
                                 "--needs", "KA=1", "--needs", "KB=1"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert doc["fix"]["knobs"] == ["A", "B"] and doc["fix"]["minimal"] is True
    names = [c["name"] for c in doc["configurations"]]
    assert names[:5] == ["baseline", "KA=1", "KB=1", "KC=1", "KA=1 + KB=1 + KC=1"] and names[-1] == "KA=1 + KB=1"
    assert all(config(doc, n)["effect"] == "no effect" for n in ("KA=1", "KB=1", "KC=1"))
    assert doc["runs_used"] == len(names) <= 12


def test_a_lucky_success_is_no_fix(tmp_path: Path):
    """A job failing every other run (exact, through a counter): KA=1 changes nothing yet succeeds once — no fix,
    it 'does not matter'; KB=1 succeeds in all its runs."""
    res, doc = bisect(tmp_path, ["--repeat", "2", "--knobs", str(_user_knobs(tmp_path, "AB")), "--", PY,
                                 str(KNOB_JOB), "--fail", "crash", "--needs", "KB=1", "--rate", "0.5", "--counter",
                                 str(tmp_path / "counter")])
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(c["name"], c["rates"], c["effect"]) for c in doc["configurations"]] == [
        ("baseline", "crash 1/2, success 1/2", "baseline"), ("KA=1", "crash 1/2, success 1/2", "no effect"),
        ("KB=1", "success 2/2", "fixes")]
    assert doc["do_not_matter"][0]["knob"] == "A" and doc["fix"]["knobs"] == ["B"]
    assert "succeeds with KB=1 (success 2/2)" in doc["answer"] and "KA=1 does not matter" in doc["answer"]


def test_budget_caps_the_runs_and_what_is_left_is_listed(tmp_path: Path):
    res, doc = bisect(tmp_path, ["--repeat", "1", "--budget", "2", "--knobs", str(_user_knobs(tmp_path)), "--", PY,
                                 str(KNOB_JOB), "--fail", "crash", "--needs", "KC=1"])
    assert res.returncode == 3, res.stderr[-2000:]
    assert doc["status"] == "incomplete" and doc["runs_used"] == 2
    assert doc["stopped"] == "budget: 2 of 2 runs used, the next configuration needs 1"
    assert [x["knob"] for x in doc["not_tried"]] == ["B", "C"] and doc["fix"] is None
    assert len(list((tmp_path / "b" / "runs").glob("*.log"))) == 2


def test_time_budget_cuts_the_run_in_progress(tmp_path: Path):
    t0 = time.monotonic()
    res, doc = bisect(tmp_path, ["--time", "3s", "--hang-after", "60", "--knobs", str(_user_knobs(tmp_path)), "--",
                                 PY, str(KNOB_JOB), "--needs", "KA=1"])
    assert res.returncode == 3, res.stderr[-2000:]
    assert time.monotonic() - t0 < 60
    assert doc["stopped"] == "time: --time ran out" and doc["runs_used"] == 1
    assert config(doc, "baseline")["runs"][0]["outcome"] == "cut"
    assert leftovers(str(tmp_path)) == []


def test_ready_line_is_success_and_rejected_spellings_fall_back_and_orphans_are_reaped(bisected):
    """A server-like job: success is its ready line (the bisect then stops it). The knob's first spelling is one the
    command rejects (as a flag of another release would be): the next spelling is tried. Every run leaves a detached
    grandchild behind; none survives."""
    tmp_path, res, doc = ran(bisected, "ready")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(c["name"], c["rates"]) for c in doc["configurations"]] == [
        ("baseline", "hang 2/2"), ("+ --new-spelling", "rejected 1/1"), ("+ --old-spelling", "success 2/2")]
    good = config(doc, "+ --old-spelling")["runs"]
    assert all(r["how"] == "ready: knob_job: READY TO SERVE" for r in good)
    assert doc["rejected"][0]["changes"] == "+ --new-spelling" and doc["fix"]["changes"] == ["+ --old-spelling"]
    assert leftovers(str(tmp_path)) == []


def test_ctrl_c_stops_the_search_prints_what_is_known_and_leaves_nothing(tmp_path: Path):
    out = tmp_path / "b"
    proc = subprocess.Popen(TRACE + ["bisect", "-o", str(out), "--repeat", "1", "--hang-after", "2",
                                     "--startup-hang-after", "2", "--knobs",
                                     str(_user_knobs(tmp_path)), "--", PY, str(KNOB_JOB), "--needs", "KC=1"],
                            env=trace_env(RANKTRACE_LOCK_DIR=str(tmp_path / "locks")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(out.glob("runs/02-*.log")):
            time.sleep(0.2)
        time.sleep(1.0)  # run 2 (KA=1) is under way: its job hangs
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "stopped: interrupted (Ctrl-C)" in stdout and "baseline" in stdout
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["status"] == "incomplete" and doc["stopped"] == "interrupted (Ctrl-C)"
    assert config(doc, "baseline")["rates"] == "hang 1/1"
    assert config(doc, "KA=1")["runs"][0]["outcome"] == "interrupted" and config(doc, "KA=1")["rates"] == \
        "interrupted 1"
    assert leftovers(str(tmp_path)) == []


def test_usage_errors_before_anything_runs(tmp_path: Path):
    env = trace_env(RANKTRACE_LOCK_DIR=str(tmp_path / "locks"))
    bad = write_knobs(tmp_path / "bad.toml", 'only = ["NO_SUCH_KNOB"]\n')
    res = run_trace(["bisect", "-o", str(tmp_path / "b"), "--knobs", str(bad), "--", PY, str(KNOB_JOB)], env=env)
    assert res.returncode == 2 and "NO_SUCH_KNOB" in res.stderr and not (tmp_path / "b").exists()
    res = run_trace(["bisect", "-o", str(tmp_path / "b"), "--repeat", "3", "--budget", "2", "--", PY, str(KNOB_JOB)],
                    env=env)
    assert res.returncode == 2 and "--budget 2" in res.stderr
    res = run_trace(["bisect", "-o", str(tmp_path / "b"), "--", "no-such-command-xyz"], env=env)
    assert res.returncode == 2 and "no-such-command-xyz" in res.stderr and not (tmp_path / "b").exists()


def test_one_bisect_per_set_of_gpus(tmp_path: Path):
    """A second bisect on GPUs another one holds is refused before it runs anything (all GPUs overlap with any)."""
    from ranktrace.tracer.launch.bisect import runner

    locks = str(tmp_path / "locks")
    with runner.gpu_lock({"CUDA_VISIBLE_DEVICES": "6,7", "RANKTRACE_LOCK_DIR": locks}):
        for devices in ("7", ""):
            res = run_trace(["bisect", "-o", str(tmp_path / "b"), "--", PY, str(KNOB_JOB)],
                            env=trace_env(CUDA_VISIBLE_DEVICES=devices, RANKTRACE_LOCK_DIR=locks))
            assert res.returncode == 2 and "another trace bisect" in res.stderr, res.stderr
            assert not (tmp_path / "b").exists()
    with runner.gpu_lock({"CUDA_VISIBLE_DEVICES": "5", "RANKTRACE_LOCK_DIR": locks}):  # other GPUs: fine
        with runner.gpu_lock({"CUDA_VISIBLE_DEVICES": "4", "RANKTRACE_LOCK_DIR": locks}):
            pass


# ---- pure parts: the knobs, the order, the search ---------------------------------------------------------------

SGLANG = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8", "--speculative-algorithm",
          "EAGLE", "--speculative-num-steps=3", "--enable-symm-mem"]


def _cands(command, fw, env=None, kf=None):
    ks, first = knobs.merge(knobs.load_catalogue(), kf)
    return ks, first, knobs.candidates(ks, command, env or {}, fw)[0]


def test_framework_is_detected_from_the_command():
    d = knobs.detect_framework
    assert d(SGLANG).name == "sglang" and d(["sglang", "serve", "--model-path", "m"]).name == "sglang"
    assert d(["/venv/bin/vllm", "serve", "m", "-tp", "8"]).name == "vllm"
    assert d(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]).name == "vllm"
    assert d(["torchrun", "--nproc-per-node", "8", "train.py"]).name == "torch"
    assert d(["python3.11", "train.py"]).name == "python" and d(["bash", "serve.sh"]).name == "unknown"
    assert knobs.parse_framework("sglang==0.5.12.post1") == knobs.Framework("sglang", "0.5.12.post1",
                                                                            "given with --framework")
    assert knobs.version_key("0.5.12.post1") < knobs.version_key("0.5.13") < knobs.version_key("0.5.23")


def test_sglang_knobs_follow_the_release_and_edit_the_command_line():
    new, old, unknown = (knobs.Framework("sglang", v, "") for v in ("0.5.23", "0.5.12.post1", None))
    by = {v: {c.name: c for c in _cands(SGLANG, fw)[2]} for v, fw in (("new", new), ("old", old), ("?", unknown))}
    assert by["old"]["sglang:no-cuda-graph"].label == "+ --disable-cuda-graph"
    assert by["new"]["sglang:no-cuda-graph"].label == ("+ --cuda-graph-backend-decode disabled "
                                                       "--cuda-graph-backend-prefill disabled")
    # release unknown: the newest spelling first, the older one if the command rejects it
    guess = by["?"]["sglang:no-cuda-graph"]
    assert guess.label == by["new"]["sglang:no-cuda-graph"].label
    assert knobs.alternative(guess, SGLANG, {}, unknown).label == "+ --disable-cuda-graph"
    assert knobs.alternative(by["old"]["sglang:no-cuda-graph"], SGLANG, {}, old) is None
    assert by["new"]["sglang:half-tp"].label == "--tp 8 -> 4"
    assert by["new"]["sglang:no-speculative-decoding"].label == ("- --speculative-algorithm EAGLE; "
                                                                 "- --speculative-num-steps=3")
    assert by["new"]["sglang:no-symm-mem"].label == "- --enable-symm-mem"
    assert "vllm:enforce-eager" not in by["new"] and "NCCL_P2P_DISABLE=1" in by["new"]
    applied = knobs.apply(SGLANG, {}, [by["new"]["sglang:half-tp"], by["new"]["sglang:no-speculative-decoding"],
                                       by["new"]["NCCL_P2P_DISABLE=1"]])
    assert applied.argv == ("python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "4",
                            "--enable-symm-mem")
    assert applied.env == (("NCCL_P2P_DISABLE", "1"),)
    # the narrower graph knobs wait for the broad one, in the release's spelling
    ks = knobs.load_catalogue()
    narrow = knobs.narrower(ks, by["old"]["sglang:no-cuda-graph"], SGLANG, {}, old)
    assert [c.label for c in narrow] == ["+ --cuda-graph-max-bs 8", "+ --disable-piecewise-cuda-graph"]
    narrow = knobs.narrower(ks, by["new"]["sglang:no-cuda-graph"], SGLANG, {}, new)
    assert [c.label for c in narrow] == ["+ --cuda-graph-max-bs-decode 8"]


def test_a_knob_that_changes_nothing_is_not_a_candidate():
    fw = knobs.Framework("vllm", "0.33.0", "")
    cmd = ["vllm", "serve", "m", "--enforce-eager", "--tensor-parallel-size=1"]
    cands = {c.name: c for c in _cands(cmd, fw, env={"NCCL_P2P_DISABLE": "1"})[2]}
    assert "vllm:enforce-eager" not in cands and "NCCL_P2P_DISABLE=1" not in cands  # already so
    assert "vllm:half-tp" not in cands and "vllm:no-speculative-decoding" not in cands  # tp 1, no spec
    assert cands["vllm:disable-custom-all-reduce"].label == "+ --disable-custom-all-reduce"


def test_knobs_file_adds_removes_keeps_and_puts_first(tmp_path: Path):
    kf = knobs.load_knobs_file(write_knobs(tmp_path / "k.toml", (
        'remove = ["NCCL_IB_DISABLE=1", "area:proto"]\nfirst = ["mine"]\n'
        '[[knob]]\nname = "mine"\narea = "p2p"\nenv = { MY_P2P = "0" }\n')))
    ks, first, cands = _cands(["python", "x.py"], knobs.Framework("python", None, ""), kf=kf)
    names = [c.name for c in cands]
    assert "mine" in names and "NCCL_IB_DISABLE=1" not in names and "NCCL_PROTO=Simple" not in names
    ordered = knobs.order(cands, knobs.hints([{"kind": "graph_capture"}]), first)
    assert ordered[0].name == "mine"
    json_kf = knobs.load_knobs_file(write_knobs(tmp_path / "k.json", json.dumps(
        {"only": ["NCCL_P2P_LEVEL=NVL"]})))
    ks, _, cands = _cands(["python", "x.py"], knobs.Framework("python", None, ""), kf=json_kf)
    assert [c.name for c in cands] == ["NCCL_P2P_LEVEL=NVL"]  # its broad knob is gone: tried on its own
    for text, msg in (('only = ["nope"]', "'nope'"), ('[[knob]]\nname = "x"\n', "changes nothing"),
                      ('[[knob]]\nname = "x"\nenv = { A = "1" }\ncolour = 1\n', "unknown field"),
                      ("wat = 1", "unknown key")):
        with pytest.raises(knobs.KnobError, match=msg):
            knobs.merge(knobs.load_catalogue(), knobs.load_knobs_file(write_knobs(tmp_path / "e.toml", text)))


def test_the_verdict_orders_the_areas():
    h = knobs.hints
    assert h([{"kind": "graph_capture", "operation": {"name": "all_reduce", "phase": "cuda_graph_capture"}}])[0].area \
        == "graph"
    assert h([{"kind": "missing_ranks", "operation": {"name": "recv", "peer": 3}}])[0].area == "p2p"
    assert h([{"kind": "missing_ranks", "operation": {"name": "all_reduce"},
               "ranks": {"1": {"stack": ["register_graph_buffers (custom_all_reduce.py:80)"]}}}])[0].area == "custom_ar"
    assert [x.area for x in h([{"kind": "init_hang"}])][:2] == ["p2p", "shm"]
    assert h([{"kind": "missing_ranks", "summary": "rank 1 is in process_exit (beagle.py:3)"}]) == []
    assert h([{"kind": "missing_ranks", "summary": "rank 1 in sgl_custom_all_reduce"}])[0].area == "custom_ar"
    assert [x.area for x in h([{"kind": "stuck_in_collective", "summary": "NVLS"}])][:2] == ["nvls", "algo"]
    fw = knobs.Framework("vllm", "0.33.0", "")
    _, _, cands = _cands(["vllm", "serve", "m", "-tp", "8"], fw)
    ordered = knobs.order(cands, h([{"kind": "graph_capture"}]))
    assert ordered[0].name == "vllm:enforce-eager" and ordered[1].knob.area != "graph"
    assert knobs.order(cands, h([{"kind": "missing_ranks", "operation": {"name": "send", "peer": 1}}]))[0].name \
        == "NCCL_P2P_DISABLE=1"


def _knob(name: str, narrows: str | None = None) -> knobs.Candidate:
    k = knobs.Knob(name=name, area="user", suggests=f"{name} matters", env=((f"K{name}", "1"),), narrows=narrows)
    return knobs.Candidate(k, 0, f"K{name}=1")


def drive(s: Search, outcome, repeat: int) -> list[str]:
    """Run the search against a fake job: outcome(set of knob names, repetition) -> outcome."""
    ran: list[str] = []
    plan = s.plan()
    try:
        cfg = next(plan)
        while True:
            t = Tally(cfg, repeat)
            for rep in range(repeat):
                o = outcome(set(cfg.knob_names), rep)
                ran.append(cfg.name)
                t.outcomes.append(o)
                t.verdicts.append(None)
                if o == "rejected":
                    break
            cfg = plan.send(t)
    except StopIteration:
        pass
    return ran


def test_search_single_knob_then_the_narrower_one():
    a, b, c, c_narrow = _knob("A"), _knob("B"), _knob("C"), _knob("N", narrows="C")
    s = Search(2, lambda base: [a, b, c], lambda x: [c_narrow] if x is c else [], lambda x: None)
    ran = drive(s, lambda on, i: "success" if on & {"C", "N"} else "hang", 2)
    assert ran == ["baseline"] * 2 + ["KA=1"] * 2 + ["KB=1"] * 2 + ["KC=1"] * 2 + ["KN=1"] * 2
    assert s.status == "fixed" and [x.name for x in s.fix] == ["N"] and s.fix_minimal
    assert s.chance_by_luck() == 0.0


def test_search_needs_every_run_of_a_flaky_configuration_to_succeed():
    a, b = _knob("A"), _knob("B")
    s = Search(3, lambda base: [a, b], lambda x: [], lambda x: None)
    # the baseline hangs 2 runs in 3; A only lowers that to 1 in 3; B fixes it
    drive(s, lambda on, rep: "success" if "B" in on else ("hang" if rep < (1 if "A" in on else 2) else "success"), 3)
    tallies = {t.config.name: t for t in s.tried()}
    assert tallies["baseline"].rates() == "hang 2/3, success 1/3"
    assert tallies["KA=1"].rates() == "hang 1/3, success 2/3" and not tallies["KA=1"].fixes
    assert [x.name for x in s.fix] == ["B"] and abs(s.chance_by_luck() - (1 / 3) ** 3) < 1e-9


def test_search_reduces_a_combination_to_what_is_needed():
    ks = [_knob(n) for n in "ABCDE"]
    s = Search(1, lambda base: ks, lambda x: [], lambda x: None)
    ran = drive(s, lambda on, i: "success" if {"B", "D"} <= on else "hang", 1)
    assert s.status == "fixed" and sorted(x.name for x in s.fix) == ["B", "D"] and s.fix_minimal
    assert ran[:7] == ["baseline", "KA=1", "KB=1", "KC=1", "KD=1", "KE=1", "KA=1 + KB=1 + KC=1 + KD=1 + KE=1"]
    assert len(ran) <= 16 and len(ran) == len(set(ran))  # nothing run twice


def test_search_gives_up_honestly():
    ks = [_knob(n) for n in "AB"]
    s = Search(1, lambda base: ks, lambda x: [], lambda x: None)
    assert drive(s, lambda on, i: "hang", 1)[-1] == "KA=1 + KB=1"
    assert s.status == "no_fix" and s.fix is None and "not all 2 together" in s.note
    s = Search(2, lambda base: ks, lambda x: [], lambda x: None)
    assert drive(s, lambda on, i: "success", 2) == ["baseline", "baseline"]
    assert s.status == "not_reproduced"
    s = Search(1, lambda base: [], lambda x: [], lambda x: None)
    assert drive(s, lambda on, i: "hang", 1) == ["baseline"]
    assert s.status == "no_fix" and "no knob changes this command" in s.note


def test_search_a_rejected_spelling_is_retried_in_the_next_one():
    k = knobs.Knob(name="G", area="graph", suggests="", variants=(knobs.Variant(add=("--new",)),
                                                                 knobs.Variant(add=("--old",))))
    new, old = knobs.Candidate(k, 0, "+ --new"), knobs.Candidate(k, 1, "+ --old")
    s = Search(2, lambda base: [new], lambda x: [], lambda x: old if x is new else None)
    ran = []
    plan = s.plan()
    cfg = next(plan)
    results = {"baseline": ["hang", "hang"], "+ --new": ["rejected"], "+ --old": ["success", "success"]}
    try:
        while True:
            ran.append(cfg.name)
            t = Tally(cfg, 2, outcomes=list(results[cfg.name]), verdicts=[None] * len(results[cfg.name]))
            cfg = plan.send(t)
    except StopIteration:
        pass
    assert ran == ["baseline", "+ --new", "+ --old"] and s.fix == (old,)
    assert Config((old,), "alternative").name == "+ --old"


def test_the_bisect_section_escapes_what_came_from_the_job():
    from ranktrace.analyzers.report import bisect_html

    evil = "<script>alert(1)</script>"
    doc = {"schema": "ranktrace.bisect/1", "status": "not_reproduced", "answer": evil, "command": ["python", evil],
           "configurations": [{"name": evil, "effect": "baseline", "rates": "success 1/1",
                               "runs": [{"dir": "runs/01", "outcome": "success", "seconds": 1.0, "how": evil,
                                         "verdict": {"kind": "no_hang", "summary": evil, "op": evil}}]}],
           "fix": None, "not_tried": [{"knob": "A", "changes": evil, "why": "not reached"}], "runs_used": 1}
    page = bisect_html.page(doc)
    assert evil not in page and "&lt;script&gt;" in page and page.count("<section") == 1
