"""What a person looks at (issue #18): the terminal verdict, the Perfetto trace, report.html in a real browser, and
the run as tables — all from one real 4-rank gloo job that really hangs.

The shared job (`hung`): `trace run --hang-after 5 --perfetto P` on examples/tp_job.py --fault skip (rank 3 skips
step 3's all_reduce and then sits in its data loader; gloo's own timeout is far away), its stderr on an 80-column
pseudo-terminal. Once the watchdog has printed its verdict the test presses "stop" (SIGTERM to trace run, which
forwards it to the job), so the hung all_reduce is still open when the job ends: the verdict at the hang is HANG,
at the end the job died of a signal.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.helpers import EXAMPLE, PY, REPO, TRACE, count_colour, host_dir, kill_group, png_rgb, trace_env

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the status line's own writes on the terminal's bottom row (tracer/watch/statusline.region_sequences): its draws
# (the text captured), the first draw's reservation of the row and the release at the end
STATUS_DRAW = re.compile(r"(?:\x1bD\x1b\[1A\x1b7\x1b\[1;\d+r\x1b8)?"
                         r"\x1b7\x1b\[\d+;1H\x1b\[2K\x1b\[0m(\[ranktrace\] [ -~]*)\x1b8"
                         r"|\x1b7\x1b\[\d+;1H\x1b\[2K\x1b\[r\x1b8")
COLS = 80


@dataclass
class HungRun:
    run_dir: Path
    perfetto: Path
    returncode: int
    tty: str          # what the terminal received, raw
    screen: str       # the same, status-line draws and colour codes removed, \r\n -> \n


def _read_until(master: int, chunks: list[bytes], until: bytes | None, deadline: float) -> bool:
    import select

    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                return False
            if not data:
                return False
            chunks.append(data)
            if until is not None and until in b"".join(chunks):
                return True
    return False


def _signal_session(sid: int, signum: int) -> None:
    """`signum` to every process of session `sid` at once (Slurm's scancel, systemd, pkill): each rank is ended
    where it is, so its open call stays open in the trace."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    os.kill(int(d), signum)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> HungRun:
    import fcntl
    import pty
    import struct
    import termios

    base = tmp_path_factory.mktemp("views")
    run_dir, perfetto = base / "run", base / "timeline.json"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLS, 0, 0))
    env = trace_env(RANKTRACE_STACK_EVERY="2")
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        TRACE + ["run", "-o", str(run_dir), "--hang-after", "5", "--perfetto", str(perfetto), "--", PY, str(EXAMPLE),
                 "--world", "4", "--steps", "6", "--fault", "skip", "--hang-seconds", "300", "--timeout", "300"],
        stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        # the watchdog's verdict ends with the one line of notes (or the next steps, where nothing is missing)
        seen = _read_until(master, chunks, b"HANG \xc2\xb7 missing_ranks", time.monotonic() + 120)
        assert seen, b"".join(chunks).decode("utf-8", "replace")[-3000:]
        _read_until(master, chunks, None, time.monotonic() + 4)   # the rest of the verdict, a few status lines
        _signal_session(proc.pid, signal.SIGTERM)  # the run is stopped as a scheduler stops a job: every process
        _read_until(master, chunks, None, time.monotonic() + 90)   # until every writer has closed the terminal
        proc.wait(timeout=60)
    finally:
        kill_group(proc)
        os.close(master)
    tty = b"".join(chunks).decode("utf-8", "replace")
    # fresh_line's padding (a terminal's width of spaces, then carriage return and erase: nothing on the screen
    # when the cursor was at a line's start) is not text
    screen = ANSI.sub("", STATUS_DRAW.sub("", re.sub(r" +\r\x1b\[K", "", tty))).replace("\r\n", "\n").replace("\r", "")
    return HungRun(run_dir, perfetto, proc.returncode, tty, screen)


# --------------------------------------------------------------------------------------------- the terminal

def test_terminal_verdict_once_in_the_terminals_width_colour_and_words(hung: HungRun):
    lines = hung.screen.split("\n")
    heads = [i for i, ln in enumerate(lines) if ln.startswith("HANG · missing_ranks")]
    assert len(heads) == 1, hung.screen[-4000:]          # printed once, at the hang
    early = [i for i, ln in enumerate(lines) if "s silent: ranks 0-2 in all_reduce group 0 seq 5" in ln]
    assert len(early) == 1 and early[0] < heads[0]       # the one-line picture first, then the verdict
    assert hung.screen.count("merged stacks (outermost first):") == 1
    assert sum(ln.startswith("operation: ") for ln in lines) == 1
    # in colour on a terminal: the headline bold red
    assert "\x1b[1;31mHANG · missing_ranks" in hung.tty
    # the terminal's own width: no line of the verdict is wider than its 80 columns, the rank table included
    block = lines[heads[0]:next(i for i in range(heads[0], len(lines)) if lines[i].startswith("[ranktrace]"))]
    assert len(block) > 10 and max(len(ln) for ln in block) <= COLS, max(block, key=len)
    assert any(ln.startswith("0-2 ") for ln in block) and any(ln.startswith("3 * ") for ln in block)
    # at the end only what changed: the new headline with what it was, not the verdict again
    assert re.search(r"^(CRASHED|HANG) · missing_ranks \(was HANG · missing_ranks; same culprit and operation\)$",
                     hung.screen, re.M) or not re.search(r"^(CRASHED|COMPLETED|INCONCLUSIVE) · ", hung.screen, re.M)
    # plain words, never the internal state names; no finding that contradicts the verdict
    for internal in ("blocked_other", "in_collective", "host_sync_wait", "DESIGN §"):
        assert internal not in hung.screen
    flat = " ".join(hung.screen.split())  # words a line end broke apart
    assert "(blocked outside communication)" in flat and "waiting in a" in hung.screen
    assert "no collective is pending" not in hung.screen
    # what this machine lacks: one line under the verdict, not lines of their own while the job starts
    notes = [i for i, ln in enumerate(lines) if ln.startswith("[ranktrace] on this machine: ")]
    assert len(notes) == 1 and notes[0] > heads[0], hung.screen[:3000]
    assert "no NCCL RAS" in lines[notes[0]]
    assert sum("NCCL RAS" in ln for ln in lines) == 1
    if "NVML" in hung.screen:
        assert [ln for ln in lines if "NVML" in ln] == [lines[notes[0]]]
    # the status line says it in words
    draws = STATUS_DRAW.findall(hung.tty)
    assert any("group 0 at seq 5, rank 3 at 4" in d for d in draws), draws[-5:]


def test_piped_verdict_is_plain_and_never_wrapped(hung: HungRun):
    res = subprocess.run(TRACE + ["analyze", str(hung.run_dir)], capture_output=True, text=True, env=trace_env(),
                         cwd=REPO)
    assert res.returncode == 3, res.stderr
    assert "\x1b" not in res.stdout
    summary = res.stdout.splitlines()[1]
    assert summary.startswith("Ranks 0-2 are waiting in all_reduce") and summary.endswith(".")  # one whole line
    assert "rank 3 is in next_batch" in summary and "(blocked outside communication)" in summary


def test_a_mistyped_run_option_is_unknown_not_the_command(tmp_path: Path):
    res = subprocess.run(TRACE + ["run", "--hang-afer", "5", "--", PY, "-c", "print('ran')"], capture_output=True,
                         text=True, env=trace_env(), cwd=tmp_path)
    assert res.returncode == 2
    assert "unknown option --hang-afer" in res.stderr and "did you mean --hang-after?" in res.stderr
    assert "cannot run" not in res.stderr and "ran" not in res.stdout and not (tmp_path / "traces").exists()
    # after the command's first word every option is the command's
    res = subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "r"), PY, "-c",
                                  "import sys; print(sys.argv[1:])", "--hang-afer", "5"],
                         capture_output=True, text=True, env=trace_env(), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "['--hang-afer', '5']" in res.stdout


# ----------------------------------------------------------------------------------------------- Perfetto

_PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n"}


def _check_chrome_trace(doc: dict) -> None:
    """The Chrome trace-event format, checked by hand (Perfetto's trace processor cannot be fetched here)."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ns", "ms")
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert ph in _PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int), e
        if ph == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"), e
            assert isinstance(e["args"], dict) and e["args"], e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert isinstance(e["name"], str) and e["name"], e
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] > 0, e
        elif ph == "i":
            assert e["s"] in ("g", "p", "t"), e
        elif ph == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif ph in ("s", "f"):
            assert isinstance(e["id"], int), e
    json.dumps(doc)  # and it is plain JSON again


def _trace_processor() -> str | None:
    """A trace_processor_shell to load the trace with (RANKTRACE_TRACE_PROCESSOR, PATH, perfetto's own cache)."""
    cand = [os.environ.get("RANKTRACE_TRACE_PROCESSOR"), shutil.which("trace_processor_shell")]
    cache = Path.home() / ".local/share/perfetto/prebuilts"
    cand += [str(p) for p in sorted(cache.glob("trace_processor_shell*")) if not p.name.endswith(".tmp")]
    return next((c for c in cand if c and os.access(c, os.X_OK)), None)


def test_trace_run_perfetto_draws_the_hang_until_the_verdict(hung: HungRun):
    doc = json.loads(hung.perfetto.read_text())
    _check_chrome_trace(doc)
    ev = doc["traceEvents"]
    open_ = [e for e in ev if e["ph"] == "X" and e["name"] == "all_reduce seq 5 (never returned)"]
    assert sorted(e["pid"] for e in open_) == [0, 1, 2]
    # a hang of seconds is seconds long: drawn until the verdict's moment (>= --hang-after), not to the last record
    assert all(e["dur"] >= 5e6 and e["args"]["verdict_operation"] for e in open_), [e["dur"] for e in open_]
    hung_marks = [e for e in ev if e["ph"] == "i" and e["name"] == "hung: never returned"]
    assert sorted(e["pid"] for e in hung_marks) == [0, 1, 2]
    verdicts = [e["name"] for e in ev if e["ph"] == "i" and e["s"] == "g"]
    assert len(verdicts) == 1 and re.fullmatch(r"verdict: (CRASHED|HANG) · missing_ranks", verdicts[0]), verdicts
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(r, "MainThread") for r in range(4)} <= names and {(r, "phases") for r in range(4)} <= names
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[3].startswith("rank 3 (culprit)") and procs[0].startswith("rank 0 · ")
    counters = {(e["pid"], e["name"]) for e in ev if e["ph"] == "C"}
    assert {(r, "RSS MiB") for r in range(4)} <= counters and {(r, "CPU %") for r in range(4)} <= counters
    stacks3 = [e for e in ev if e["ph"] == "i" and e.get("cat") == "stack" and e["pid"] == 3]
    assert any("next_batch" in e["name"] for e in stacks3) and all(e["args"]["frames"] for e in stacks3)
    (sat,) = [e for e in ev if e["ph"] == "X" and e.get("cat") == "culprit"]
    assert sat["pid"] == 3 and sat["name"].startswith("sat in next_batch (tp_job.py:") and sat["dur"] >= 5e6
    assert any(e["ph"] == "s" for e in ev) and any(e["ph"] == "f" for e in ev)  # flows join (group, seq)
    tp = _trace_processor()
    if tp is None:
        return  # checked against the format above; no trace_processor_shell on this machine to load it with
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    with TraceProcessor(trace=str(hung.perfetto), config=TraceProcessorConfig(bin_path=tp)) as proc:
        n = proc.query("select count(*) as n from slice where name like '%never returned%'").as_pandas_dataframe()
        assert int(n["n"][0]) == 3


# --------------------------------------------------------------------------------------------- report.html

def _chromium() -> str | None:
    return next((c for c in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if c), None)


def _browser(exe: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-dev-shm-usage", *args, url],
                          capture_output=True, text=True, timeout=120)


def test_report_html_in_a_real_browser(hung: HungRun, tmp_path: Path):
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium here (apt-get install chromium; .ci/run installs it where it runs as root)")
    page = hung.run_dir / "report.html"
    shot = tmp_path / "report.png"
    res = _browser(exe, page.as_uri(), "--window-size=1280,1000", f"--screenshot={shot}")
    assert shot.exists(), res.stderr[-2000:]
    if os.environ.get("RANKTRACE_ARTIFACTS"):
        out = Path(os.environ["RANKTRACE_ARTIFACTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / "report.png")
    width, height, rows = png_rgb(shot)
    assert (width, height) == (1280, 1000)
    # visible: the red bars of the all_reduce that never returned, the culprit's row, the run header
    assert count_colour(rows, (0xd6, 0x27, 0x28)) > 3 * 300, "no red hung bar on screen"
    assert count_colour(rows, (0xfd, 0xe8, 0xea)) > 2000, "no culprit row on screen"
    assert count_colour(rows, (0xee, 0xf1, 0xf6)) > 20000, "no run header on screen"
    assert count_colour(rows, (0xf2, 0xb1, 0x34)) > 300, "the culprit's lane does not show where it sat"
    # the page after its script ran: the header's facts, the culprit's lane, zoom working in the browser
    dom = _browser(exe, page.as_uri() + "#zoom=end", "--dump-dom").stdout
    header = dom[dom.index('<table id="run">'):dom.index("</table>", dom.index('<table id="run">'))]
    for fact in ("examples/tp_job.py --world 4", "start", "duration", "exit", "torch 2.", "python 3."):
        assert fact in header, (fact, header)
    assert re.search(r'<tr class="culprit"><td>3 \*</td><td>blocked outside communication</td>', dom)
    assert re.search(r">sat in next_batch \(tp_job\.py:\d+\)</text>", dom)
    assert float(re.search(r'data-zoom="([\d.]+)"', dom).group(1)) > 1.0  # "#zoom=end": the last 10 s, zoomed
    assert re.search(r'id="tl-lanes" transform="matrix\(', dom)


def test_report_html_names_its_bars_and_keeps_the_culprits_evidence(hung: HungRun):
    """Each nesting level says what it is: a bar wide enough carries its call's name (the hung all_reduce of each
    waiting rank says it never returned); the evidence list is the terminal's (the culprit's lines, never cut)."""
    page = (hung.run_dir / "report.html").read_text()
    names = re.findall(r'class="bar-label"[^>]*>([^<]+)</text>', page)
    assert names.count("all_reduce seq 5 (never returned)") == 3, names
    ev = re.findall(r'<li class="ev">(rank 3: [^<]+)', page)
    assert any("next_batch" in e for e in ev) and any("its last op on group 0 was all_reduce seq 4" in e for e in ev)


def test_report_html_groups_identical_ranks(hung: HungRun, monkeypatch: pytest.MonkeyPatch):
    from ranktrace.analyzers import api
    from ranktrace.analyzers.report import html_report

    monkeypatch.setattr(html_report, "GROUP_ABOVE", 2)  # as a 64-rank job would be: ranks alike share a lane
    page = html_report.render(api.analyze([hung.run_dir], liveness=None))
    assert ">+ 1-2 alike</text>" in page and "<li>ranks 1-2 like rank 0</li>" in page
    labels = re.findall(r'<text x="4" y="\d+" fill="[^"]+">(rank \d+[^<]*)</text>', page)
    assert labels == ["rank 0", "rank 3 *"], labels
    open_bars = re.findall(r'<rect [^>]*class="open"><title>rank (\d+): ', page)
    assert open_bars == ["0"]
    # the ranks table groups alike ranks whatever the world size
    assert '<tr class=""><td>0-2</td><td>waiting in a collective</td>' in page


# ------------------------------------------------------------------------------------------- the data as tables

def test_samples_are_streams_while_running_and_arrow_files_after(hung: HungRun, tmp_path: Path):
    """While the job runs the samples are Arrow IPC streams named .arrows (flushed as they go, readable live with
    open_stream); when the run ends they are sealed into the trace dir's .arrow IPC files (open_file, DuckDB)."""
    import pyarrow.ipc as ipc

    from ranktrace.tracer.launch.finalize import seal_samples

    samples = host_dir(hung.run_dir) / "samples"
    assert sorted(p.name for p in samples.iterdir()) == ["gpu.arrow", "proc.arrow", "stacks.arrow"]
    with open(samples / "proc.arrow", "rb") as f:
        sealed = ipc.open_file(f).read_all()
    assert sealed.num_rows > 0
    # the same rows as a live stream, sealed again: nothing lost, the stream removed
    live = tmp_path / "samples"
    live.mkdir()
    with open(live / "proc.arrows", "wb") as f, ipc.new_stream(f, sealed.schema) as w:
        w.write_table(sealed)
    assert seal_samples(tmp_path) == []
    assert [p.name for p in live.iterdir()] == ["proc.arrow"]
    with open(live / "proc.arrow", "rb") as f:
        assert ipc.open_file(f).read_all().equals(sealed)


def test_trace_export_parquet_duckdb_csv_and_sql(hung: HungRun, tmp_path: Path):
    duckdb = pytest.importorskip("duckdb")
    res = subprocess.run(TRACE + ["export", str(hung.run_dir), "-o", str(tmp_path / "pq")], capture_output=True,
                         text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    names = {"ops", "spans", "stacks", "samples_stacks", "samples_proc", "samples_gpu", "phases", "events"}
    assert {p.stem for p in (tmp_path / "pq").iterdir()} == names
    ops = pq.read_table(tmp_path / "pq" / "ops.parquet")
    seq5 = ops.filter(pc.and_(pc.equal(ops["chan"], "0"), pc.equal(ops["seq"], 5)))
    assert sorted(seq5["rank"].to_pylist()) == [0, 1, 2] and not any(seq5["completed"].to_pylist())
    spans = pq.read_table(tmp_path / "pq" / "spans.parquet")
    s5 = spans.filter(pc.and_(pc.equal(spans["name"], "all_reduce"), pc.equal(spans["seq"], 5)))
    assert sorted(s5["rank"].to_pylist()) == [0, 1, 2] and set(s5["outcome"].to_pylist()) == {"open"}
    done = spans.filter(pc.equal(spans["outcome"], "returned"))
    assert done.num_rows == 4 * 5 and pc.min(done["duration_ns"]).as_py() > 0  # init and seq 1-4 on each rank
    # DuckDB reads the files directly
    q = duckdb.sql(f"SELECT rank, count(*) AS n FROM '{tmp_path / 'pq' / 'spans.parquet'}' "
                   f"WHERE category = 'collective' GROUP BY rank ORDER BY rank").fetchall()
    assert [r for r, _n in q] == [0, 1, 2, 3] and q[3][1] < q[0][1]  # rank 3 issued one all_reduce fewer
    ss = pq.read_table(tmp_path / "pq" / "samples_stacks.parquet")
    assert ss.num_rows > 0 and any("next_batch" in " ".join(f) for f in ss.filter(pc.equal(ss["rank"], 3))[
        "frames"].to_pylist())
    # trace sql: the same tables by name
    res = subprocess.run(TRACE + ["sql", str(hung.run_dir), "SELECT rank, outcome FROM spans WHERE seq = 5 AND "
                                  "name = 'all_reduce' ORDER BY rank"], capture_output=True, text=True,
                         env=trace_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert [ln.split() for ln in res.stdout.splitlines()[2:5]] == [["0", "open"], ["1", "open"], ["2", "open"]]
    res = subprocess.run(TRACE + ["sql", str(hung.run_dir), "SELECT * FROM no_such_table"], capture_output=True,
                         text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no_such_table" in res.stderr
    # CSV and one DuckDB file
    res = subprocess.run(TRACE + ["export", str(hung.run_dir), "--format", "csv", "-o", str(tmp_path / "csv")],
                         capture_output=True, text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    import pyarrow.csv as pcsv

    assert pcsv.read_csv(tmp_path / "csv" / "spans.csv").num_rows == spans.num_rows
    res = subprocess.run(TRACE + ["export", str(hung.run_dir), "--format", "duckdb", "-o", str(tmp_path / "db")],
                         capture_output=True, text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    con = duckdb.connect(str(tmp_path / "db" / "ranktrace.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM ops").fetchall() == [(ops.num_rows,)]
    con.close()
    # never over what is there
    res = subprocess.run(TRACE + ["export", str(hung.run_dir), "-o", str(tmp_path / "pq")], capture_output=True,
                         text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 2 and "not overwritten" in res.stderr


def test_the_readmes_trace_sql_examples_give_the_hung_call_a_duration(hung: HungRun):
    """Every `trace sql RUN "..."` of the README, run on the hung run: the all_reduce that never returned is there,
    said to be open, with a duration until the end of the trace (>= the 5 s of silence), never NULL."""
    pytest.importorskip("duckdb")
    queries = [q for q in re.findall(r'`trace sql RUN "([^"`]+)"`', (REPO / "README.md").read_text())
               if "..." not in q]  # the usage line's own "SELECT ..." is a placeholder
    assert queries
    for q in queries:
        res = subprocess.run(TRACE + ["sql", str(hung.run_dir), "--csv", q], capture_output=True, text=True,
                             env=trace_env(), cwd=REPO)
        assert res.returncode == 0, (q, res.stderr)
        import csv
        import io

        rows = list(csv.DictReader(io.StringIO(res.stdout)))
        hung_rows = [r for r in rows if r.get("name") == "all_reduce" and r.get("seq") == "5"]
        assert sorted(int(r["rank"]) for r in hung_rows) == [0, 1, 2], (q, rows)
        for r in hung_rows:
            assert r["open"] == "true", r
            assert r["s"] not in ("", "NULL") and float(r["s"]) >= 5.0, r


def test_the_run_folder_holds_what_the_analysis_reads_and_every_path_reads_it(hung: HungRun, tmp_path: Path):
    """After finalize: events.arrow and its index, meta, verdict, report, samples, dumps; no rings (each was ~9 MiB
    reserved), no agent socket though every rank was killed by a signal; the whole 4-rank folder <= 2 MB. analyze,
    compare, export and snapshot read it as they read a folder with rings."""
    hd = host_dir(hung.run_dir)
    assert not (hd / "rings").exists() and not list(hung.run_dir.rglob("*.sock")) and not list(hd.glob("*.ring"))
    for f in ("events.arrow", "events.index.arrow", "meta.json", "samples/stacks.arrow", "samples/proc.arrow"):
        assert (hd / f).is_file(), f
    assert (hung.run_dir / "verdict.json").is_file() and (hung.run_dir / "report.html").is_file()
    size = sum(p.stat().st_blocks * 512 for p in hung.run_dir.rglob("*") if p.is_file())
    rings = json.loads((hd / "meta.json").read_text())["rings"]
    assert rings["removed"] >= 4 and rings["kept"] == [], rings   # the 4 ranks' rings (and the spawn parent's)
    print(f"run folder: {size / 1e6:.2f} MB after finalize, {(size + rings['bytes_freed']) / 1e6:.1f} MB before")
    assert size <= 2_000_000, size
    res = subprocess.run(TRACE + ["analyze", "--json", str(hung.run_dir)], capture_output=True, text=True,
                         env=trace_env(), cwd=REPO)
    assert res.returncode == 3, res.stderr
    v = json.loads(res.stdout)
    assert (v["kind"], v["culprit_ranks"], v["operation"]["seq"]) == ("missing_ranks", [3], 5)
    res = subprocess.run(TRACE + ["compare", "--json", str(hung.run_dir), str(hung.run_dir)], capture_output=True,
                         text=True, env=trace_env(), cwd=REPO)
    assert res.returncode in (0, 3), res.stderr
    cmp = json.loads(res.stdout)
    assert cmp["schema"] == "ranktrace.compare/1"
    res = subprocess.run(TRACE + ["export", str(hung.run_dir), "-o", str(tmp_path / "x")], capture_output=True,
                         text=True, env=trace_env(), cwd=REPO)
    assert res.returncode == 0 and pq.read_table(tmp_path / "x" / "spans.parquet").num_rows > 20, res.stderr
    res = subprocess.run(TRACE + ["snapshot", str(hung.run_dir)], capture_output=True, text=True, env=trace_env(),
                         cwd=REPO)
    assert res.returncode == 2 and "no live traced job here (finished" in res.stderr, res.stderr


def test_analysis_work_shows_a_transient_spinner_on_a_terminal_only(hung: HungRun):
    """`trace analyze` on a terminal: a spinner on stderr while it works (shown at once here, past 2 s normally),
    erased when the verdict comes; piped, not one byte of it."""
    from tests.helpers import run_in_pty
    from tests.vt_screen import Screen

    env = trace_env(RANKTRACE_PROGRESS_AFTER="0", TERM="xterm")
    rc, tty, out = run_in_pty(["analyze", "--no-snapshot", str(hung.run_dir)], cols=COLS, rows=24, env=env)
    assert rc == 3 and re.match(r"(HANG|CRASHED) · missing_ranks", out), out[:300]
    assert f"[ranktrace] analyzing {hung.run_dir}" in tty, tty[-500:]
    screen = Screen(COLS, 24)
    screen.feed(tty)
    assert not any("analyzing" in ln for ln in screen.transcript()), screen.transcript()   # transient
    res = subprocess.run(TRACE + ["analyze", "--no-snapshot", str(hung.run_dir)], capture_output=True, text=True,
                         env=env, cwd=REPO)
    assert res.returncode == 3 and "analyzing" not in res.stderr and "\x1b" not in res.stderr, res.stderr


def test_trace_sql_without_duckdb_is_one_line_and_exit_2(hung: HungRun, tmp_path: Path):
    (tmp_path / "duckdb.py").write_text("raise ImportError('no duckdb in this test')\n")
    env = trace_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    res = subprocess.run(TRACE + ["sql", str(hung.run_dir), "SELECT 1"], capture_output=True, text=True, env=env,
                         cwd=REPO)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "[ranktrace] trace sql needs DuckDB, which is not installed: pip install 'ranktrace[sql]'"]
