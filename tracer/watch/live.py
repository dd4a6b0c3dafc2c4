"""Is a trace directory's job still running here? The one rule for "alive", and the capture burst it allows.

The analysis never looks at a process table: ``liveness`` looks here, on the job's own machine, and hands the
answer to it as a plain value. `trace analyze RUN` on a job that is hung *now* should also see where each rank is,
not only what the rings say: the rings tell which op is open, the stacks tell what the rank that never issued it
is doing instead (``snapshot_live``).
"""
from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

from ranktrace.analyzers.model.values import Liveness
from ranktrace.tracer.watch import burst
from ranktrace.tracer.launch import hostinfo, pidident

__all__ = ["liveness", "live_pids", "host_dirs", "snapshot_live", "snapshot_targets"]


def host_dirs(path: Path) -> list[Path]:
    """The trace host dirs at `path` (itself, or its children). A folder that cannot be read holds none here: the
    analysis walks it again and says why it was skipped."""
    def is_host(p: Path) -> bool:
        try:
            return (p / "meta.json").exists() or (p / "rings").is_dir()
        except OSError:
            return False

    if is_host(path):
        return [path]
    try:
        return sorted(d for d in path.iterdir() if is_host(d)) if path.is_dir() else []
    except OSError:
        return []


def liveness(paths: list[Path]) -> Liveness:
    """What is alive of the traced jobs under `paths`, for the analysis. Only host dirs of this machine are looked
    at (meta.json names it); another machine's stay out of the answer, so their state reads as unknown."""
    node = os.uname().nodename
    seen: dict[str, frozenset[int]] = {}
    for p in paths:
        for hd in host_dirs(Path(p)) if Path(p).is_dir() else []:
            if _meta(hd).get("hostname") == node:
                seen[Liveness.key(hd)] = frozenset(live_pids(hd))
    return Liveness(host=node, checked_at=time.time(), live_pids=seen)


def _meta(host_dir: Path) -> dict:
    return _meta_bounded(host_dir)  # never blocks on a FIFO, never reads more than META_MAX_BYTES


def live_pids(host_dir: Path) -> list[int]:
    """Pids of the job's traced processes that are alive on this machine (none once the job has ended).

    A pid is taken from a ring's name only if the process running under it now is the one that wrote the ring:
    same boot (the host dir names its boot id) and started no later than the ring was created. A `trace run` that
    was SIGKILLed never wrote its exit: days later its pids may belong to unrelated processes, which must not be
    dumped and read as ranks. `trace attach` writes no rings: its meta.json pids count when they started before
    the attach. A zombie (killed, not yet reaped by whoever inherited it) is not alive."""
    meta = _meta(host_dir)
    if meta.get("exit") or meta.get("hostname") not in (None, os.uname().nodename):
        return []
    key = meta.get("host_key") or (host_dir.name if host_dir.name.startswith(f"{socket.gethostname()}-") else None)
    if key is not None and key != hostinfo.host_key():  # the dir may be named by a --host-label: meta.json's key
        return []  # this machine rebooted since: none of those processes exists any more
    pids = []
    with_ring = set()
    for ring in (host_dir / "rings").glob("*.ring"):
        head = ring.stem.split("-")[0]
        if head.isdigit():
            with_ring.add(int(head))
            if ring_owner_alive(int(head), ring):
                pids.append(int(head))
    start_ns = meta.get("start_wall_ns")
    for p in meta.get("pids") or {}:
        if str(p).isdigit() and int(p) not in with_ring:
            by = None if not isinstance(start_ns, int) else start_ns / 1e9 - (time.time() - _boottime())
            if pid_running(int(p), by):
                pids.append(int(p))
    return sorted(set(pids))


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def pid_running(pid: int, started_by_s: float | None = None) -> bool:
    """Process `pid` exists, is not a zombie and (when `started_by_s`, seconds since boot, is given) started no
    later than that, with 1 s of slack for tick rounding. Where /proc hides another user's processes
    (hidepid), existence is all that can be known: a process we may not see counts as running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, PermissionError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc/self") or os.path.exists(f"/proc/{pid}")
    except OSError:
        return False
    try:
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):  # killed, not yet reaped: not alive
            return False
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError):
        return False
    return started_by_s is None or started_s <= started_by_s + 1.0


def ring_owner_alive(pid: int, ring: Path) -> bool:
    """Whether process `pid` is running (not a zombie) and is the one that wrote `ring`: the ring's record of its
    writer's start time, or for an old ring, started no later than the ring was made (pidident). The ring is opened
    without following a symlink and without blocking (a FIFO named like a ring is no ring)."""
    writer = pidident.ring_writer(ring)
    if writer is None:
        return False
    st = pidident.stat(pid)
    if st is None:  # /proc hides it (hidepid): existence, and no later start than the ring, is all that can be known
        return pid_running(pid, writer.made_s())
    return pidident.writer_matches(pid, writer, st)


# --- what a snapshot may act on ------------------------------------------------------------------------------------

META_MAX_BYTES = 16 << 20   # meta.json read for the snapshot decision (the analysis reads it with its own bounds)


def _own_dir(path: Path) -> str | None:
    """Why `path` (a real folder) is not ours alone to act on, or None: owned by us, and no one else may write in it."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
    if st.st_mode & 0o022:  # made under umask 000: fine when nobody else can reach into it (the run folder, 0700)
        try:
            up = os.stat(path.parent)
        except OSError:
            up = None
        if up is None or up.st_uid != os.geteuid() or up.st_mode & 0o077:
            return f"{path} is writable by others (mode {st.st_mode & 0o7777:04o})"
    return None


def _own_meta(host_dir: Path) -> tuple[dict | None, str | None]:
    """meta.json as a snapshot may trust it: a plain file of ours (never through a symlink, never a FIFO), bounded,
    in our own format. (meta, None), (None, why), or (None, None) for a folder that holds no meta at all."""
    try:
        fd = os.open(host_dir / "meta.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"{host_dir / 'meta.json'}: {e.strerror or e} (a symlink is never followed)"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{host_dir / 'meta.json'} is not a plain file"
        if st.st_uid != os.geteuid():
            return None, f"{host_dir / 'meta.json'} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
        raw = os.read(fd, META_MAX_BYTES + 1)
    except OSError as e:
        return None, f"{host_dir / 'meta.json'}: {e.strerror or e}"
    finally:
        os.close(fd)
    if len(raw) > META_MAX_BYTES:
        return None, f"{host_dir / 'meta.json'} is over {META_MAX_BYTES >> 20} MiB"
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        return None, f"{host_dir / 'meta.json'} is not ranktrace's meta.json (unreadable JSON)"
    if not isinstance(meta, dict) or meta.get("schema") != "ranktrace.meta/1":
        return None, f"{host_dir / 'meta.json'} is not ranktrace's meta.json (schema ranktrace.meta/1)"
    return meta, None


def _looks_live(host_dir: Path) -> bool:
    """What the snapshot looked at before #31 (without acting on it): an unfinished run of this machine."""
    meta = _meta_bounded(host_dir)
    return not meta.get("exit") and meta.get("hostname") in (None, os.uname().nodename) and bool(live_pids(host_dir))


def _meta_bounded(host_dir: Path) -> dict:
    try:
        fd = os.open(host_dir / "meta.json", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        meta = json.loads(os.read(fd, META_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    return meta if isinstance(meta, dict) else {}


def _names_dir(env_dir: str, real: Path, pid: int, meta: dict) -> bool:
    """RANKTRACE_DIR (as the process was started with it) is the host dir `real`. A relative one (`trace run -o
    traces/x`) is relative to where trace run started the job (meta.json's cwd), or to the process's cwd now."""
    if os.path.isabs(env_dir):
        return os.path.realpath(env_dir) == str(real)
    bases = [meta.get("cwd")] if isinstance(meta.get("cwd"), str) else []
    try:
        bases.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    return any(os.path.realpath(os.path.join(b, env_dir)) == str(real) for b in bases)


def snapshot_targets(host_dir: Path, top: Path | None = None) -> tuple[list[int], str | None]:
    """The processes a snapshot of `host_dir` may dump, and in one line why some or all were left alone.

    Only a run this user started is acted on: the folder (and `top`, the folder given, when the host dir is inside
    it) and its meta.json are ours and closed to other writers, meta.json is ours in format, and each pid is really
    this run's rank now: a ring of ours (no symlink) whose header names the pid, the process running under it the
    ring's writer (its start time, pidident), and started with RANKTRACE_DIR pointing at this very host dir.
    `trace attach` dirs hold no rings: their pids count when meta.json recorded each one's start time and it
    matches. Anything else is only read, never dumped or written into."""
    real = Path(os.path.realpath(host_dir))
    for d in ([Path(os.path.realpath(top))] if top is not None and Path(os.path.realpath(top)) != real else []) + [real]:
        why = _own_dir(d)
        if why is not None:
            return [], f"live snapshot skipped: {why}; a folder someone else wrote is only read, never acted on"
    meta, why = _own_meta(real)
    if meta is None:
        return [], (f"live snapshot skipped: {why}" if why else None)
    if meta.get("exit") or meta.get("hostname") not in (None, os.uname().nodename):
        return [], None
    key = meta.get("host_key")
    if key is not None and key != hostinfo.host_key():
        return [], None
    pids: list[int] = []
    refused: list[str] = []
    if meta.get("attached"):
        recorded = meta.get("pids") if isinstance(meta.get("pids"), dict) else {}
        for p, info in recorded.items():
            if not str(p).isdigit():
                continue
            st = pidident.stat(int(p))
            if st is None or st.zombie:
                continue
            ticks = info.get("start_ticks") if isinstance(info, dict) else None
            if isinstance(ticks, int) and ticks == st.start_ticks:
                pids.append(int(p))
            else:
                refused.append(f"{p} (no start time recorded)" if not isinstance(ticks, int) else f"{p} (reused)")
    rings = real / "rings"
    try:
        names = sorted(os.listdir(rings)) if not os.path.islink(rings) else []
    except OSError:
        names = []
    for name in names:
        pid = pidident.ring_pid(name)
        if pid is None or not name.endswith(".ring") or pid in pids:
            continue
        st = pidident.stat(pid)
        if st is None or st.zombie:
            continue  # gone: nothing to say, as before
        try:
            rst = os.lstat(rings / name)
        except OSError:
            continue
        if not stat.S_ISREG(rst.st_mode) or rst.st_uid != os.geteuid():
            refused.append(f"{pid} (ring not ours)")
            continue
        writer = pidident.ring_writer(rings / name)
        if writer is None or not pidident.writer_matches(pid, writer, st):
            refused.append(f"{pid} (not the ring's writer: reused pid)")
            continue
        env_dir = pidident.environ_dir(pid)
        if isinstance(env_dir, pidident.Unreadable):
            refused.append(f"{pid} (environment unreadable)")
        elif env_dir is None or not _names_dir(env_dir, real, pid, meta):
            refused.append(f"{pid} (not started for this run: RANKTRACE_DIR={env_dir})")
        else:
            pids.append(pid)
    note = None
    if refused:
        note = (f"live snapshot of {host_dir}: left alone pid(s) {', '.join(refused[:6])}"
                f"{f' and {len(refused) - 6} more' if len(refused) > 6 else ''}: not this run's ranks now")
    return sorted(set(pids)), note


def snapshot_live(paths: list[Path], reason: str = "trace analyze") -> list[str]:
    """Burst every live job under `paths` that this user started (snapshot_targets); returns one line per problem
    (py-spy missing, denied, a folder left alone and why)."""
    problems: list[str] = []
    for p in paths:
        for hd in host_dirs(p):
            pids, why = snapshot_targets(hd, top=p)
            if why is not None and (pids or _looks_live(hd)):
                problems.append(why)
            if pids:
                problems.extend(burst.capture_burst(hd, pids, reason=reason).problems)
    return problems
