"""The README's sample output and docs/report-hang.png come from a real run, so they cannot drift (issue #27).

The README's first block is what a person sees after typing its command in a 100-column terminal: the command runs
here for real on a 100 x 60 pseudo-terminal (stdin, stdout, stderr, its controlling terminal), the bytes are played
through a VT screen model (tests/vt_screen.py: colours, the status line's bottom row and fresh_line's padding leave
no text; a line the terminal wrapped is one line), and the scrollback + screen must say what the README's block
says: the same words in the same order once these are normalised on both sides — the checkout's path and the run's
folder read as /home/me/ranktrace and traces/<run>; the job's own lines (neither a "[ranktrace] " line nor inside a
verdict) are one placeholder line per run of them; pids, dump times, the host key, the seconds of silence counted
and what this machine lacks are what differs between two runs. Words and not lines, because where rich and the
terminal wrap depends on those lengths; the verdict's lines are checked to fit the 100 columns on their own.

report.html of the same run is screenshotted by headless Chromium and must show the hung bars (skipped with the
reason when chromium is missing). RANKTRACE_WRITE_DOCS=1 writes both into the checkout (README block,
docs/report-hang.png) instead of failing on a difference: run it after a change to what the verdict says.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, count_colour, drain_pty, png_rgb, trace_env
from tests.vt_screen import Screen

COLS, ROWS = 100, 60
OPTIONS = ["--hang-after", "5", "--on-hang", "kill"]
COMMAND = ["python", "examples/tp_job.py", "--world", "4", "--fault", "skip"]
PROMPT = "$ trace run " + " ".join(OPTIONS) + " -- " + " ".join(COMMAND)
JOB_LINES = "... (the job's own output)"
HOME = "/home/me/ranktrace"
README = REPO / "README.md"
PNG = REPO / "docs" / "report-hang.png"
WRITE = os.environ.get("RANKTRACE_WRITE_DOCS") == "1"


def _run(cwd: Path) -> str:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = trace_env(TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    bindir = cwd / "bin"   # `trace` and `python` as a person's shell finds them
    bindir.mkdir()
    (bindir / "trace").symlink_to(Path(TRACE[0]).parent / "trace")
    # a script, not a symlink: a venv's python found through a link elsewhere looks for pyvenv.cfg beside the link
    # and runs without the venv's packages (no torch) where the base Python has none
    (bindir / "python").write_text(f"#!/bin/sh\nexec {PY} \"$@\"\n")
    (bindir / "python").chmod(0o755)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(TRACE + ["run"] + OPTIONS + ["--"] + COMMAND, stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=cwd, start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    written = drain_pty(master, proc, 150)
    assert proc.returncode == 3, written[-3000:]   # ranktrace's: a hang found, the job ended
    screen = Screen(COLS, ROWS)
    screen.feed(written.decode("utf-8", "replace"))
    return "\n".join(screen.transcript(join_wrapped=True))


def _shown(text: str, cwd: Path) -> list[str]:
    """The transcript as the README shows it (see the module docstring). Ranktrace's lines are its "[ranktrace] "
    lines and its verdict blocks (a headline "HANG · kind" up to its next "[ranktrace] " line); any other line is the
    job's, and each run of them is one placeholder line."""
    text = text.replace(str(cwd), HOME).replace(str(REPO), HOME)
    text = re.sub(r"traces/\d{8}-\d{6}(-\d+)?-tp_job", "traces/20261201-164733-tp_job", text)
    out: list[str] = []
    in_verdict = False
    for ln in text.splitlines():
        if ln.startswith("[ranktrace] "):
            in_verdict = False
        elif re.match(r"(HANG|CRASHED|COMPLETED|STOPPED|INCONCLUSIVE|IDLE) · \w+", ln):
            in_verdict = True
        elif not in_verdict:
            if not out or out[-1] != JOB_LINES:
                out.append(JOB_LINES)
            continue
        out.append(ln)
    return out


_VARIES = [  # what differs between two runs of the same command on the same kind of machine
    (r"(\[ranktrace\] on this machine: ).*", r"\1<what this machine lacks>"),
    (r"rings/\d+\.ring", "rings/<pid>.ring"), (r"pyspy-\d+\.json", "pyspy-<pid>.json"),
    (r"agent-\d+\.json", "agent-<pid>.json"), (r"dumps/\d{8}-\d{6}\.\d+/", "dumps/<time>/"),
    (r"(traces/20261201-164733-tp_job/)[^/\s]+/", r"\1<host>/"),
    (r"\b\d+ s silent\b", "<n> s silent"), (r"after \d+ s with no progress", "after <n> s with no progress"),
]


def _normal(lines: list[str]) -> list[str]:
    """Words in order, with what varies between runs (pids, times, the host key, what a machine lacks) replaced:
    where a terminal or rich wraps a line depends on those lengths, so lines are compared as the words they hold
    (the width is checked on its own)."""
    text = "\n".join(lines)
    for pat, rep in _VARIES:
        text = re.sub(pat, rep, text)
    return text.split()


def _readme_block() -> tuple[str, int, int]:
    text = README.read_text()
    start = text.index("```\n" + PROMPT + "\n") + 4
    end = text.index("\n```\n", start)
    return text, start, end


def _checkout_like(base: Path) -> Path:
    """A folder whose path is as long as HOME, holding `examples`: paths in the verdict wrap where the README's do."""
    import secrets

    d = Path("/tmp") / ("rt-" + secrets.token_hex(8))[:len(HOME) - len("/tmp/")]
    d.mkdir()
    (d / "examples").symlink_to(REPO / "examples")
    return d


def test_the_readmes_sample_is_what_the_real_run_prints_and_its_screenshot(tmp_path: Path):
    home = _checkout_like(tmp_path)
    try:
        _check(home, tmp_path)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _check(home: Path, tmp_path: Path) -> None:
    assert len(str(home)) == len(HOME)
    got = [PROMPT] + _shown(_run(home), home)
    text, start, end = _readme_block()
    if WRITE:
        README.write_text(text[:start] + "\n".join(got) + text[end:])
    else:
        want = text[start:end].split("\n")
        a, b = _normal(want), _normal(got)
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert a == b, ("the README's sample differs from what the real run prints (RANKTRACE_WRITE_DOCS=1 "
                        f"rewrites it): README ... {' '.join(a[max(0, first - 8):first + 12])!r}\n"
                        f"run    ... {' '.join(b[max(0, first - 8):first + 12])!r}")
    rich_lines = got[got.index(next(ln for ln in got if re.match(r"HANG · ", ln))):]
    assert max(len(ln) for ln in rich_lines if not ln.startswith("[ranktrace] ")) <= COLS  # the verdict fits
    # report.html of the same run, in a real browser
    exe = next((c for c in (shutil.which("chromium"), shutil.which("chromium-browser"),
                            shutil.which("google-chrome")) if c), None)
    if exe is None:
        pytest.skip("no chromium here to screenshot report.html (apt-get install chromium)")
    (run_dir,) = (home / "traces").iterdir()
    shot = tmp_path / "report.png"
    res = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                          "--disable-dev-shm-usage", "--window-size=1280,900", f"--screenshot={shot}",
                          (run_dir / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists(), res.stderr[-2000:]
    width, height, rows = png_rgb(shot)
    assert (width, height) == (1280, 900)
    # ranks 0-2's all_reduce that never returned (red), rank 3's "sat in next_batch" band
    assert count_colour(rows, (0xd6, 0x27, 0x28)) > 3 * 300, "no red hung bar on screen"
    assert count_colour(rows, (0xf2, 0xb1, 0x34)) > 300, "the culprit's lane does not show where it sat"
    if WRITE:
        shutil.copy(shot, PNG)


SGLANG_PNG = REPO / "docs" / "report-startup-sglang.png"


@pytest.mark.skipif(not WRITE, reason="regenerates docs/report-startup-sglang.png (a 4-process SGLang replica start-up "
                                      "hang, ~40 s): RANKTRACE_WRITE_DOCS=1")
def test_regenerate_the_sglang_startup_hang_screenshot(tmp_path: Path):
    """The SGLang replica (examples/replica) hangs in its CUDA-graph set-up (rank 3 never finishes registering its
    graph buffers): report.html of that start-up hang, as docs/report-startup-sglang.png."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium here to screenshot report.html (apt-get install chromium)")
    env = trace_env(PYTHONPATH=os.pathsep.join([str(REPO / "examples" / "replica"), str(REPO)]))
    run = tmp_path / "replica"
    res = subprocess.run(TRACE + ["run", "-o", str(run), "--hang-after", "5", "--on-hang", "kill", "--", PY, "-m",
                                  "sglang.launch_server", "--tp", "4", "--fault", "register-one", "--fault-rank", "3"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 3, res.stderr[-3000:]
    page = (run / "report.html").read_text()
    assert "register_graph_buffers (never returned)" in page   # the step each rank sat in, named on its bar
    shot = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                    "--disable-dev-shm-usage", "--window-size=1280,1200", f"--screenshot={shot}",
                    (run / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    width, height, rows = png_rgb(shot)
    assert (width, height) == (1280, 1200) and count_colour(rows, (0xd6, 0x27, 0x28)) > 4 * 300
    shutil.copy(shot, SGLANG_PNG)
