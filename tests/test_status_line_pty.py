"""The live status line never garbles the job's output on a terminal (issue #27).

A job that prints a line every 1.5 s (and one line in two pieces, 1.5 s apart) runs under `trace run` on a real
pseudo-terminal, 80 x 24, that is `trace run`'s controlling terminal (stdin, stdout and stderr, as in a shell), once
with the status line and once with RANKTRACE_STATUS_LINE=0, both at the same time.

What "identical" means here, and is asserted:
1. bytes: the terminal's byte stream with the status line's own writes taken out (exactly the sequences
   statusline.region_sequences makes, around the text) equals the byte stream of the run without it (run folder
   names normalised). The job's bytes are untouched and nothing of ours sits between them.
2. what a person sees: both streams fed to a VT model (tests/vt_screen.py) of an 80 x 24 terminal already full of
   earlier output give the same scrollback + screen at the end, line for line; while the job ran, the bottom row
   held the status line (never wider than 79 columns) and no job row ever held a character of it.
"""
from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios
import threading
from pathlib import Path

from tests.helpers import PY, REPO, TRACE, drain_pty, trace_env
from tests.vt_screen import Screen

COLS, ROWS = 80, 24
JOB = ("import time\n"
       "for i in range(6):\n"
       "    print(i, flush=True); time.sleep(1.5)\n"
       "print('half a line', end='', flush=True); time.sleep(1.5); print(' and the rest', flush=True)\n")


def _run_on_pty(run_dir: Path, status: bool) -> bytes:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = trace_env(TERM="xterm", RANKTRACE_STATUS_LINE="1" if status else "0")

    def controlling_terminal() -> None:  # after setsid: the pty becomes this session's terminal, as in a shell
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(TRACE + ["run", "-o", str(run_dir), "--", PY, "-c", JOB], stdin=slave, stdout=slave,
                            stderr=slave, env=env, cwd=REPO, start_new_session=True,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    written = drain_pty(master, proc, 90)
    assert proc.returncode == 0, written[-2000:]
    return written


def _both(tmp_path: Path) -> tuple[str, str]:
    out: dict[bool, bytes] = {}
    threads = [threading.Thread(target=lambda s=s: out.__setitem__(s, _run_on_pty(tmp_path / f"run{int(s)}", s)))
               for s in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with_line = out[True].decode().replace(str(tmp_path / "run1"), "RUN")
    without = out[False].decode().replace(str(tmp_path / "run0"), "RUN")
    return with_line, without


def _ours(rows: int) -> re.Pattern[str]:
    from ranktrace.tracer.watch.statusline import region_sequences

    reserve, draw, release = (re.escape(s) for s in region_sequences(rows))
    return re.compile(f"(?:{release})?(?:{reserve})?{draw}[ -~]*\x1b8|{release}")


def test_the_jobs_output_is_identical_with_and_without_the_status_line(tmp_path: Path):
    with_line, without = _both(tmp_path)
    ours = _ours(ROWS)
    draws = ours.findall(with_line)
    assert len(draws) >= 5, with_line[-1500:]   # drawn about once a second over ~10 s
    assert "\x1b7" not in without               # switched off: not one byte of it
    # 1. bytes
    assert ours.sub("", with_line) == without
    for i in range(6):
        assert f"\r\n{i}\r\n" in without or without.startswith(f"{i}\r\n") or f"\n{i}\r\n" in without
    assert "half a line and the rest\r\n" in without
    # 2. what a person sees, on a terminal already full of earlier output (the first draw makes its own room)
    earlier = "".join(f"earlier line {k}\r\n" for k in range(30))
    seen, plain = Screen(COLS, ROWS), Screen(COLS, ROWS)
    seen.feed(earlier)
    plain.feed(earlier + without)
    status_rows = []
    for piece in re.split(f"({ours.pattern})", with_line):
        seen.feed(piece)
        if piece and ours.fullmatch(piece) and seen.bottom == ROWS - 2:
            status_rows.append(seen.line(ROWS - 1))
            assert not any("[ranktrace] no rank" in seen.line(r) or "quiet " in seen.line(r)
                           for r in range(ROWS - 1)), [seen.line(r) for r in range(ROWS)]
    assert status_rows and all(s.startswith("[ranktrace] ") and len(s) < COLS for s in status_rows), status_rows
    assert any("quiet" in s for s in status_rows), status_rows
    assert seen.bottom == ROWS - 1 and seen.top == 0   # the whole screen scrolls again after the run
    got, want = seen.transcript(), plain.transcript()
    assert got == want, "\n".join(f"{a!r:40} | {b!r}" for a, b in zip(got, want) if a != b)
    assert not any("ranktrace]" in ln and not ln.startswith("[ranktrace]") for ln in got), got
