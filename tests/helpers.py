"""Helpers for tests that run real jobs under `trace run` (subprocesses, killed by process group on teardown)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TRACE = [PY, "-m", "ranktrace.cli"]
EXAMPLE = REPO / "examples" / "tp_job.py"
SCRIPTS = REPO / "tests" / "scripts"


def trace_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RANKTRACE_DIR", None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_trace(args: list[str], timeout: float = 120, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(TRACE + args, capture_output=True, text=True, timeout=timeout, env=env or trace_env(),
                          cwd=cwd or REPO, stdin=subprocess.DEVNULL)


def host_dir(run_dir: Path) -> Path:
    hosts = [d for d in run_dir.iterdir() if d.is_dir()]
    assert len(hosts) == 1, hosts
    return hosts[0]


def events(run_dir: Path) -> pa.Table:
    with pa.memory_map(str(host_dir(run_dir) / "events.arrow")) as src:
        return ipc.open_file(src).read_all()


def meta(run_dir: Path) -> dict:
    return json.loads((host_dir(run_dir) / "meta.json").read_text())


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_pty(args: list[str], cols: int = 80, rows: int = 50, timeout: float = 120,
               env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str, str]:
    """`trace ARGS` with its stderr on a pseudo-terminal `cols` wide (stdout piped, stdin /dev/null): (returncode,
    everything written to the terminal, stdout). The process group is killed if it outlives `timeout`."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(TRACE + args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env or trace_env(), cwd=cwd or REPO, start_new_session=True)
    os.close(slave)
    out_box: list[bytes] = []
    reader = threading.Thread(target=lambda: out_box.append(proc.stdout.read()), daemon=True)  # type: ignore
    reader.start()
    written = drain_pty(master, proc, timeout)
    reader.join(timeout=10)
    return (proc.returncode, written.decode("utf-8", "replace"),
            (out_box[0] if out_box else b"").decode("utf-8", "replace"))


def drain_pty(master: int, proc: subprocess.Popen, timeout: float) -> bytes:
    """Everything written to a pseudo-terminal's slave side until every holder of it has gone (or `timeout`); the
    process is waited for, its group killed and `master` closed whatever happens."""
    import select
    import time

    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if not r:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has gone
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
        os.close(master)
    return b"".join(chunks)


def png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    import struct
    import zlib

    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa_, pb, pc_ = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa_ <= pb and pa_ <= pc_ else b if pb <= pc_ else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
    return width, height, rows


def count_colour(rows: list[bytes], rgb: tuple[int, int, int], y0: int = 0, y1: int | None = None) -> int:
    """Pixels of exactly this colour in rows y0..y1."""
    want = bytes(rgb)
    n = 0
    for row in rows[y0:y1]:
        n += sum(1 for i in range(0, len(row), 3) if row[i:i + 3] == want)
    return n


# --- a job on a terminal of its own (pty) ---------------------------------------------------------------------

def pty_session(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """`argv` as a session leader whose controlling terminal is a new pty: (pid, the pty's master fd)."""
    import pty

    pid, master = pty.fork()
    if pid == 0:  # a session leader whose controlling terminal is the pty
        os.chdir(str(REPO))
        os.execve(argv[0], argv, env)
    return pid, master


def wait_exit(pid: int, seconds: float) -> int | None:
    """The wait status of `pid` once it exits within `seconds`, else None."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return status
        time.sleep(0.05)
    return None


def end_session(pid: int, master: int) -> None:
    """Kill a pty_session's process and close its master."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.close(master)


def read_until(master: int, out: bytearray, marker: bytes, seconds: float) -> bool:
    """Read the pty into `out` until `marker` shows up or `seconds` pass; whether it did."""
    import select

    end = time.monotonic() + seconds
    while marker not in out and time.monotonic() < end:
        if select.select([master], [], [], 0.2)[0]:
            try:
                out += os.read(master, 4096)
            except OSError:
                break
    return marker in out
