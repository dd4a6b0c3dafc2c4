"""Ask NCCL's RAS service (NCCL >= 2.24, on by default, ``localhost:28028``) twice, a moment apart, during a burst.

Why twice: RAS says, per communicator, how many collectives each rank has *launched* and which ranks did not answer
or are dead (formats.md §1.10). One answer names laggards; two answers a second or two apart say whether the
counts still move — if they do, NCCL work is still being issued (C++-side collectives included, which no Python hook
sees) and the silence is not a hang.

Client protocol (NCCL ``src/ras/client.cc`` / ``client_support.cc``, what ``ncclras`` does), one command per line:
``CLIENT PROTOCOL 2`` → ``SERVER PROTOCOL <n>``; ``TIMEOUT <s>`` → ``OK`` (how long the local RAS thread waits for
its peers); ``SET FORMAT json`` → ``OK`` (2.28.7+; older versions answer ``ERROR: Unknown command ...`` and we keep
text); ``STATUS`` → the report, then the server closes the connection.

Both answers go into the burst folder as one file (``ras.json`` — concatenated JSON documents — or ``ras.txt``)
that ``analyzers.readers.nccl_ras`` reads as two snapshots. Nothing listening costs one refused connect and one
line per run (``no NCCL RAS on localhost:28028``). Total time is bounded by ``budget_s`` (3 s).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["DEFAULT_ADDR", "RasAnswer", "RasPoll", "parse_addr", "query", "poll", "default_addr"]

DEFAULT_ADDR = "localhost:28028"
PROTOCOL = 2


class RasUnavailable(Exception):
    """Nothing accepts connections at the RAS address."""


def default_addr(env: dict[str, str] | None = None) -> str | None:
    """``NCCL_RAS_ADDR`` if set, the NCCL default otherwise; None when ``NCCL_RAS_ENABLE=0``."""
    env = os.environ if env is None else env
    if env.get("NCCL_RAS_ENABLE", "1").strip() == "0":
        return None
    return env.get("NCCL_RAS_ADDR") or DEFAULT_ADDR


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``v6::addr:port`` (NCCL's own form) → (host, port)."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "localhost"
    return host, int(port)


@dataclass
class RasAnswer:
    text: str
    format: str          # json | text
    wall_ns: int
    seconds: float
    complete: bool       # the server closed the connection (a cut answer is kept, marked incomplete)


@dataclass
class RasPoll:
    addr: str
    answers: list[RasAnswer] = field(default_factory=list)
    absent: str | None = None        # one line: why there is no RAS here
    problems: list[str] = field(default_factory=list)
    file: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)   # see summarize()

    @property
    def moved(self) -> bool | None:
        return self.summary.get("moved")


MAX_LINE = 64 << 10       # one protocol line
MAX_ANSWER = 16 << 20     # one STATUS answer (a few KB per communicator)


def _readline(sock: socket.socket, deadline: float, buf: bytearray) -> str:
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("RAS did not answer in time")
        sock.settimeout(left)
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("RAS closed the connection")
        buf.extend(chunk)
        if len(buf) > MAX_LINE:
            raise ConnectionError(f"not an NCCL RAS service (a line of over {MAX_LINE >> 10} KiB)")
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode("utf-8", "replace").strip()


def query(host: str, port: int, *, deadline: float, peer_timeout_s: int = 1, want_json: bool = True) -> RasAnswer:
    """One STATUS query. Raises RasUnavailable (nothing listening), TimeoutError or ConnectionError."""
    t0 = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=max(0.05, deadline - t0))
    except (ConnectionRefusedError, socket.gaierror, OSError) as e:
        if isinstance(e, (socket.timeout, TimeoutError)):
            raise TimeoutError(f"connect to {host}:{port} timed out") from e
        raise RasUnavailable(str(e)) from e
    buf = bytearray()
    with sock:
        sock.sendall(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
        hello = _readline(sock, deadline, buf)
        if not hello.upper().startswith("SERVER PROTOCOL"):
            raise ConnectionError(f"not an NCCL RAS service (it said {hello[:60]!r})")
        sock.sendall(f"TIMEOUT {peer_timeout_s}\n".encode())
        _readline(sock, deadline, buf)   # OK (or ERROR: ... on a bad value; the default timeout then applies)
        fmt = "text"
        if want_json:
            sock.sendall(b"SET FORMAT json\n")
            if _readline(sock, deadline, buf).upper() == "OK":
                fmt = "json"
        sock.sendall(b"STATUS\n")
        out = bytearray(buf)
        complete = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, TimeoutError):
                break
            if not chunk:
                complete = True
                break
            out.extend(chunk[:MAX_ANSWER - len(out)])
            if len(out) >= MAX_ANSWER:  # a service that streams forever: what came is kept, marked incomplete
                break
    return RasAnswer(out.decode("utf-8", "replace"), fmt, time.time_ns(), time.monotonic() - t0, complete)


def poll(addr: str | None = None, *, budget_s: float = 3.0, gap_s: float = 1.5) -> RasPoll:
    """Two STATUS queries `gap_s` apart, everything within `budget_s`. Never raises."""
    addr = addr or DEFAULT_ADDR
    res = RasPoll(addr)
    try:
        host, port = parse_addr(addr)
    except ValueError:
        res.absent = f"NCCL RAS address {addr!r} is not host:port"
        return res
    start = time.monotonic()
    for i in range(2):
        if i == 1:
            wait = start + gap_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        deadline = start + (budget_s if i == 1 else min(budget_s, gap_s))
        if deadline - time.monotonic() < 0.05:
            res.problems.append(f"NCCL RAS query {i + 1} skipped: the {budget_s:.0f} s budget is spent")
            break
        try:
            res.answers.append(query(host, port, deadline=deadline))
        except RasUnavailable:
            if i == 0:
                res.absent = f"no NCCL RAS on {addr}"
                return res
            res.problems.append(f"NCCL RAS on {addr} stopped answering between the two queries")
        except (TimeoutError, ConnectionError, OSError) as e:
            res.problems.append(f"NCCL RAS query {i + 1} on {addr} failed: {e}")
    return res


def save(res: RasPoll, directory: Path, write: "Callable[[str, str], Path] | None" = None) -> Path | None:
    """Write the answers as one file the nccl_ras reader reads as consecutive snapshots (through `write(name,
    text)` when given: a burst's DumpDir, which never follows a symlink)."""
    answers = [a for a in res.answers if a.text.strip()]
    if not answers:
        return None
    fmt = "json" if all(a.format == "json" for a in answers) else "txt"
    text = "\n".join(a.text.rstrip("\n") for a in answers) + "\n"
    if write is not None:
        path = write(f"ras.{fmt}", text)
    else:
        path = directory / f"ras.{fmt}"
        path.write_text(text)
    res.file = path
    return path


def summarize(res: RasPoll) -> dict[str, Any]:
    """Per-communicator op counts of both answers, missing/dead ranks, and whether any count moved."""
    if res.file is None:
        return {}
    from ranktrace.analyzers.readers import ranktrace_samples

    try:
        res.summary = ranktrace_samples.ras_summary(res.file)
    except Exception as e:  # a reader problem must not lose the burst
        res.problems.append(f"NCCL RAS answer not understood: {type(e).__name__}: {e}")
        res.summary = {}
    return res.summary
