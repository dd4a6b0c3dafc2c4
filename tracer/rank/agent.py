"""In-rank responder: all Python stacks of this process and its Flight Recorder, asked over a UNIX socket.

py-spy needs ptrace rights that containers and Yama often deny, and only the rank itself can ask torch for its
Flight Recorder (which says which NCCL collectives completed). One daemon thread per process, blocked in
``accept()`` with the GIL released, so it costs nothing until asked; it never asks the Flight Recorder while a
graph capture is open.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["AGENTS_DIR", "THREAD_NAME", "REQUEST", "STACKS_REQUEST", "start", "socket_path", "ask", "stacks_as_pyspy"]

AGENTS_DIR = "agents"
THREAD_NAME = "ranktrace-agent"
REQUEST = b"dump\n"            # stacks and Flight Recorder (hang-time bursts)
STACKS_REQUEST = b"stacks\n"   # stacks only (the monitor's periodic samples when py-spy cannot run)
MAX_REQUEST = 64

_started_in: int | None = None  # pid of the process whose agent is running (a fork child has another pid)


def socket_path(host_dir: Path | str, pid: int) -> Path:
    return Path(host_dir) / AGENTS_DIR / f"{pid}.sock"


def _via_dir_fd(path: Path, use: Callable[[str], Any]) -> Any:
    """Call use(short address) with `path` reached through an open fd of its directory (no 108-byte limit)."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return use(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)


def start(host_dir: Path | str, rank_of: Callable[[], int | None], capture_gate: Callable[[], Any],
          note: Callable[[str], None]) -> bool:
    """Start this process's agent (once per process). `rank_of` is read at each request; `capture_gate()` is a
    context manager held around the Flight Recorder dump that yields True when a CUDA graph capture is open or
    starting (CaptureState.no_capture_starts: no capture can begin while it is held)."""
    global _started_in
    pid = os.getpid()
    if _started_in == pid:
        return False
    _started_in = pid
    try:
        path = socket_path(host_dir, pid)
        path.parent.mkdir(exist_ok=True)
        try:
            path.unlink()  # a socket left by an earlier process with this pid
        except FileNotFoundError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _via_dir_fd(path, srv.bind)
        os.chmod(path, 0o600)
        srv.listen(4)
    except Exception as e:  # no agent, the job goes on; the ring says why
        note(f"agent not started: {type(e).__name__}: {e}")
        return False
    t = threading.Thread(target=_serve, args=(srv, rank_of, capture_gate), name=THREAD_NAME, daemon=True)
    t.start()
    # a forked child (a DataLoader worker) has no agent thread: it must not keep the listening socket open either —
    # unless the fd number is no longer ours (the job closed every fd and opened its own file there before forking)
    ident = _ident(srv)
    os.register_at_fork(after_in_child=lambda: (_close_if_ours(srv, ident), _close_inherited()))
    import atexit

    atexit.register(_remove, path, pid)
    return True


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:
        try:
            path.unlink()
        except OSError:
            pass


# the connection being answered now, with its fd's identity (closed in a child forked meanwhile, if still ours)
_serving: list[tuple[socket.socket, tuple[int, int] | None]] = []


def _ident(sock: socket.socket) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the socket's fd: what says, after a fork, that the fd number still holds our socket."""
    try:
        st = os.fstat(sock.fileno())
        return st.st_dev, st.st_ino
    except (OSError, ValueError):
        return None


def _close_if_ours(sock: socket.socket, ident: tuple[int, int] | None) -> None:
    """Close `sock` in a forked child only while its fd is still the socket we made; otherwise the job reused the
    number (os.closerange then open) and the fd is the job's own file: let it go without closing it."""
    try:
        if ident is not None and _ident(sock) == ident:
            sock.close()
        else:
            sock.detach()  # forget the number, never close it: it is the job's now
    except OSError:
        pass


def _close_inherited() -> None:
    for conn, ident in _serving:
        _close_if_ours(conn, ident)
    _serving.clear()


def _serve(srv: socket.socket, rank_of: Callable[[], int | None], capture_gate: Callable[[], Any]) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        _serving[:] = [(conn, _ident(conn))]
        try:
            with conn:
                conn.settimeout(2.0)
                req = conn.recv(MAX_REQUEST).strip()
                if req not in (REQUEST.strip(), STACKS_REQUEST.strip()):
                    continue
                try:
                    body = json.dumps(_answer(rank_of, capture_gate, with_fr=req == REQUEST.strip()), default=str)
                except Exception as e:  # still answer: the burst says what went wrong
                    body = json.dumps({"pid": os.getpid(), "threads": [], "error": f"{type(e).__name__}: {e}"})
                # MSG_NOSIGNAL: a client gone meanwhile is EPIPE here, never a SIGPIPE that kills a job which
                # restored SIGPIPE's default action
                conn.sendall(body.encode(), socket.MSG_NOSIGNAL)
        except Exception:  # a client gone mid-answer: wait for the next one
            continue
        finally:
            _serving.clear()


def _answer(rank_of: Callable[[], int | None], capture_gate: Callable[[], Any], with_fr: bool = True
            ) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": os.getpid(), "rank": None, "wall_ns": time.time_ns(), "threads": [],
                           "fr": None, "fr_note": None}
    try:
        out["rank"] = rank_of()
    except Exception:
        pass
    try:
        out["threads"] = stacks_as_pyspy()
    except Exception as e:
        out["stacks_note"] = f"{type(e).__name__}: {e}"
    if not with_fr:
        return out
    with capture_gate() as capture_open:
        if capture_open:
            out["fr_note"] = "a CUDA graph capture is open: Flight Recorder not dumped (it may read CUDA events)"
            return out
        ext = sys.modules.get("torch._C._distributed_c10d")
        dump = getattr(ext, "_dump_fr_trace_json", None)
        if dump is None:
            out["fr_note"] = "this torch has no _dump_fr_trace_json"
        else:
            try:
                fr = dump()
                out["fr"] = fr.decode("utf-8", "replace") if isinstance(fr, bytes) else fr
            except Exception as e:
                out["fr_note"] = f"_dump_fr_trace_json failed: {type(e).__name__}: {e}"
    return out


def _short(filename: str, roots: list[str]) -> str:
    for root in roots:
        if root and filename.startswith(root + os.sep):
            return filename[len(root) + 1:]
    return os.path.basename(filename)


def _thread_states() -> dict[int, str]:
    """native thread id -> /proc state letter (R running, S sleeping, D disk wait, ...)."""
    out: dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
            out[int(tid)] = stat[stat.rindex(b")") + 2:].split()[0].decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


def stacks_as_pyspy() -> list[dict[str, Any]]:
    """Every Python thread but this one, innermost frame first, in py-spy's ``dump --json`` layout."""
    me = threading.get_ident()
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    states = _thread_states()
    roots = sorted({p for p in sys.path if p}, key=len, reverse=True)
    pid = os.getpid()
    out = []
    for ident, frame in frames.items():
        if ident == me:
            continue
        t = threads.get(ident)
        native = getattr(t, "native_id", None)
        stack = []
        f = frame
        while f is not None:
            co = f.f_code
            stack.append({"name": getattr(co, "co_qualname", co.co_name), "filename": co.co_filename,
                          "module": None, "short_filename": _short(co.co_filename, roots), "line": f.f_lineno or 0,
                          "locals": None})
            f = f.f_back
        del f
        out.append({"pid": pid, "thread_id": ident, "thread_name": t.name if t is not None else None,
                    "os_thread_id": native, "active": states.get(native or -1) == "R", "owns_gil": False,
                    "frames": stack})
    del frames
    main = threading.main_thread().ident
    out.sort(key=lambda t: t["thread_id"] != main)  # the main thread first, as py-spy lists it
    return out


MAX_ANSWER = 64 << 20   # bytes of one answer (stacks + Flight Recorder of 2000 entries are a few MB)


def ask(path: Path | str, timeout: float = 5.0, request: bytes = REQUEST, *, expect_pid: int | None = None,
        max_bytes: int = MAX_ANSWER) -> dict[str, Any]:
    """One agent's answer (the burst side). Raises OSError / ValueError when there is none in time, when it is
    larger than `max_bytes` or still coming after `timeout` (a socket that streams forever costs at most both), or
    when the process listening is not `expect_pid` (SO_PEERCRED: a socket someone else put there)."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        _via_dir_fd(Path(path), s.connect)
        if expect_pid is not None:
            peer = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if peer[0] != expect_pid:
                raise ValueError(f"the socket is served by pid {peer[0]}, not by {expect_pid}: not asked")
        s.sendall(request)
        chunks = []
        got = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"answer still coming after {timeout:.0f} s ({got >> 10} KiB): cut")
            s.settimeout(left)
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
            if got > max_bytes:
                raise ValueError(f"answer larger than {max_bytes >> 20} MiB: cut")
            chunks.append(b)
    try:
        return json.loads(b"".join(chunks))
    except RecursionError:
        raise ValueError("answer nested too deep") from None
