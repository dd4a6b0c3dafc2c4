"""What a quiet process waits for on the host, read from /proc (issue #29), for the watchdog's proc samples.

* the syscall its main thread sleeps in (``/proc/<pid>/syscall``) and the file behind the descriptor it waits on
  (``/proc/<pid>/fd``): a pipe, a socket, a lock file; for a pipe the processes holding its write end (the ones that
  could answer), for ``flock`` / ``fcntl`` the holder ``/proc/locks`` names;
* lock files in the JIT caches the process's environment points at (torch_extensions, Triton, FlashInfer,
  TorchInductor): torch's ``FileBaton`` waiter polls with ``time.sleep`` and holds no descriptor on the lock, so the
  lock is found where the build would put it; per lock its age (mtime), who holds a ``flock`` / ``fcntl`` lock on it,
  who has it open (FileBaton's builder keeps its descriptor until it removes the file), and which compilers run;
* the ranks' descendants: what they run (comm, command line, redacted) and their CPU — a JIT build's compiler.

Every read is bounded: a whole round has a deadline, a process in uninterruptible sleep (D) is never asked for what
needs its memory map (environ, cmdline, mem can block behind its mm lock), and what could not be read is said in the
fact's ``note``, never raised. Nothing here writes, signals or attaches to a process.
"""
from __future__ import annotations

import os
import platform
import struct
import time
from dataclasses import dataclass, field

from ranktrace.tracer.formats.redact import redact_argv

__all__ = ["Deadline", "WaitFact", "LockFact", "ChildFact", "ProcIndex", "wait_fact", "lock_facts", "children",
           "cache_roots", "SLEEP_SYSCALLS", "COMPILER_COMMS"]

# syscall numbers of the waits worth naming, per architecture (asm/unistd_64.h; asm-generic/unistd.h for arm64)
_X86_64 = {0: "read", 7: "poll", 17: "pread64", 19: "readv", 23: "select", 35: "nanosleep", 43: "accept",
           45: "recvfrom", 47: "recvmsg", 61: "wait4", 72: "fcntl", 73: "flock", 202: "futex", 230: "clock_nanosleep",
           232: "epoll_wait", 247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
           42: "connect", 1: "write", 44: "sendto", 46: "sendmsg"}
_ARM64 = {63: "read", 67: "pread64", 65: "readv", 101: "nanosleep", 202: "accept", 207: "recvfrom", 212: "recvmsg",
          260: "wait4", 25: "fcntl", 32: "flock", 98: "futex", 115: "clock_nanosleep", 22: "epoll_pwait", 95: "waitid",
          72: "pselect6", 73: "ppoll", 242: "accept4", 203: "connect", 64: "write", 206: "sendto", 211: "sendmsg"}
_SYSCALLS = _ARM64 if platform.machine() in ("aarch64", "arm64") else _X86_64
#: waits whose first argument is the descriptor waited on
_FD_ARG0 = frozenset({"read", "pread64", "readv", "recvfrom", "recvmsg", "accept", "accept4", "flock", "fcntl",
                      "connect", "write", "sendto", "sendmsg"})
#: a sleep: how FileBaton.wait and filelock's acquire poll (time.sleep between tries)
SLEEP_SYSCALLS = frozenset({"clock_nanosleep", "nanosleep", "select", "pselect6"})
_F_SETLKW = (7, 38)  # fcntl commands that block: F_SETLKW, F_OFD_SETLKW
#: compilers and build drivers of a JIT build (a live one is a build in progress)
COMPILER_COMMS = frozenset({"nvcc", "cicc", "ptxas", "ninja", "cc1plus", "c++", "g++", "gcc", "clang", "clang++",
                            "ld", "nvlink", "fatbinary", "cudafe++", "hipcc", "cc1", "as"})
_MAX_LOCK_ENTRIES = 4000   # directory entries one cache walk may look at
_MAX_LOCKS = 8             # lock files reported per process


class Deadline:
    """A time budget shared by every read of one round; what it cut short is said once per kind."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.missed: set[str] = set()

    def left(self, what: str) -> bool:
        if time.monotonic() < self.end:
            return True
        self.missed.add(what)
        return False


def _read(path: str, limit: int = 4096) -> bytes | None:
    """The first `limit` bytes of a /proc file, or None when it cannot be read (the process went, hidepid)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


read_proc_file = _read  # also activity.py's: one reader of small /proc files for the watch side


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _state(pid: int) -> str | None:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    try:
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _comm(pid: int) -> str:
    return (_read(f"/proc/{pid}/comm") or b"?").decode("utf-8", "replace").strip()


def _fd_flags(pid: int, fd: int) -> int | None:
    raw = _read(f"/proc/{pid}/fdinfo/{fd}")
    for line in (raw or b"").splitlines():
        if line.startswith(b"flags:"):
            try:
                return int(line.split()[1], 8)
            except (IndexError, ValueError):
                return None
    return None


@dataclass(frozen=True)
class Holder:
    """A process at the other end of a wait: it holds the lock, has the file open, or holds a pipe's write end."""

    pid: int
    comm: str
    alive: bool = True

    def text(self) -> str:
        return f"{self.pid}:{self.comm}" + ("" if self.alive else ":dead")


@dataclass(frozen=True)
class WaitFact:
    """The main thread's wait: its syscall, the descriptor and what is behind it, and who could end the wait."""

    pid: int
    tid: int
    syscall: str | None            # None: running, or /proc/<pid>/syscall unreadable (note says which)
    fd: int | None = None
    target: str | None = None      # /proc/<pid>/fd/<fd>: a path, pipe:[ino], socket:[ino], anon_inode:...
    peers: tuple[Holder, ...] = ()  # pipe writers / lock holders / other holders of the socket inode
    remote: str | None = None      # a TCP socket's remote address (/proc/net/tcp)
    note: str = ""


@dataclass(frozen=True)
class LockFact:
    """A lock file where a JIT build puts it: how old, who holds or has it open, which compilers run anywhere here."""

    path: str
    mtime_ns: int
    holders: tuple[Holder, ...] = ()   # /proc/locks: a flock / fcntl lock on its inode
    waiters: tuple[int, ...] = ()      # /proc/locks: processes blocked asking for it
    openers: tuple[Holder, ...] = ()   # processes with the file open (FileBaton's builder keeps its descriptor)
    builders: tuple[Holder, ...] = ()  # compilers alive on this machine (nvcc, ninja, ...): a build in progress
    note: str = ""                     # what could not be checked (time limit, unreadable processes)


@dataclass(frozen=True)
class ChildFact:
    """A descendant of a rank process (not a rank itself): what it runs and its CPU so far."""

    pid: int
    ppid: int
    root: int          # the rank process it descends from
    comm: str
    state: str
    cpu_ticks: int
    cmd: str           # its command line, redacted and cut to 200 characters ("" when not read)


class ProcIndex:
    """One pass over /proc for a round, made only when a fact needs it: every process's comm and parent, and who has
    which of the wanted files open. Unreadable processes (another user's) are counted, not raised."""

    def __init__(self, deadline: Deadline, fds: tuple[int, dict[str, list[tuple[int, int]]]] | None = None, *,
                 partial: bool = False, may_rescan: bool = True) -> None:
        """`fds`: (when it was read, wall ns; the map) of an earlier round, reused (the costly part: a readlink per
        descriptor of every process) except for what it cannot know (holders_of); who is alive is read afresh."""
        self.deadline = deadline
        self._procs: dict[int, tuple[str, int, str, int]] | None = None   # pid -> (comm, ppid, state, cpu ticks)
        self._fds: dict[str, list[tuple[int, int]]] | None = fds[1] if fds else None  # target -> [(pid, fd)]
        self.fds_at = fds[0] if fds else time.time_ns()
        self.fds_read = False                                               # this round read them afresh
        self.unreadable = 0
        self.cut = partial            # the reused map was itself cut by a time limit
        self.may_rescan = may_rescan  # a reused map may be read again this round (the sampler rate-limits it)

    def procs(self) -> dict[int, tuple[str, int, str, int]]:
        if self._procs is None:
            self._procs = {}
            try:
                entries = os.listdir("/proc")
            except OSError:
                entries = []
            for e in entries:
                if not e.isdigit():
                    continue
                if not self.deadline.left("process list"):
                    self.cut = True
                    break
                stat = _read(f"/proc/{e}/stat")
                if not stat:
                    continue
                try:
                    comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode("utf-8", "replace")
                    f = stat[stat.rindex(b")") + 2:].split()
                    self._procs[int(e)] = (comm, int(f[1]), f[0].decode(), int(f[11]) + int(f[12]))
                except (ValueError, IndexError):
                    continue
        return self._procs

    def fd_holders(self) -> dict[str, list[tuple[int, int]]]:
        """fd target -> [(pid, fd)] for every readable process (the same user's; /proc hides the others' fds)."""
        if self._fds is None:
            self._fds = {}
            self.fds_read, self.fds_at = True, time.time_ns()
            for pid in self.procs():
                if not self.deadline.left("open files of every process"):
                    self.cut = True
                    break
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    self.unreadable += 1
                    continue
                for fd in fds:
                    t = _readlink(f"/proc/{pid}/fd/{fd}")
                    if t is not None and fd.isdigit():
                        self._fds.setdefault(t, []).append((pid, int(fd)))
        return self._fds

    def holders_of(self, target: str, newer_than_ns: int | None = None) -> list[tuple[int, int]]:
        """[(pid, fd)] with `target` open. A reused map is read again when it cannot know: a pipe or socket it has
        not seen (made since), a file changed since it was read (`newer_than_ns`: a lock taken since)."""
        got = self.fd_holders().get(target)
        stale = not self.fds_read and self.may_rescan and ((got is None and not target.startswith("/")) or
                                       (newer_than_ns is not None and newer_than_ns >= self.fds_at))
        if stale:
            self._fds = None
            got = self.fd_holders().get(target)
        return got or []

    def holder(self, pid: int) -> Holder:
        p = self.procs().get(pid)
        if p is None:
            alive = os.path.exists(f"/proc/{pid}")
            return Holder(pid, _comm(pid) if alive else "?", alive)
        return Holder(pid, p[0], p[2] not in ("Z", "X"))

    def builders(self) -> tuple[Holder, ...]:
        return tuple(Holder(pid, c) for pid, (c, _pp, st, _cpu) in sorted(self.procs().items())
                     if c in COMPILER_COMMS and st not in ("Z", "X"))

    def note(self) -> str:
        parts = []
        if self.cut:
            parts.append("not every process was looked at (time limit)")
        if self.unreadable:
            parts.append(f"{self.unreadable} processes' open files unreadable (another user's)")
        return "; ".join(parts)


@dataclass(frozen=True)
class _LockRow:
    kind: str          # FLOCK | POSIX | OFDLCK | LEASE
    pid: int
    dev: str           # "maj:min" as /proc/locks prints them (hex)
    ino: int
    waiting: bool      # a "->" line: blocked asking


def _proc_locks() -> list[_LockRow] | None:
    raw = _read("/proc/locks", 1 << 20)
    if raw is None:
        return None
    rows = []
    for line in raw.decode("ascii", "replace").splitlines():
        parts = line.split()
        waiting = len(parts) > 1 and parts[1] == "->"
        if waiting:
            parts = parts[:1] + parts[2:]
        try:
            maj, mnr, ino = parts[5].split(":")
            rows.append(_LockRow(parts[1], int(parts[4]), f"{int(maj, 16):02x}:{int(mnr, 16):02x}", int(ino), waiting))
        except (IndexError, ValueError):
            continue
    return rows


def _locks_on(path: str, locks: list[_LockRow] | None) -> tuple[list[int], list[int]]:
    """(holder pids, waiting pids) of locks /proc/locks shows on `path`'s inode."""
    if not locks:
        return [], []
    try:
        st = os.stat(path)
    except OSError:
        return [], []
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    on = [r for r in locks if r.ino == st.st_ino]
    same_dev = [r for r in on if r.dev == dev]
    on = same_dev or on  # btrfs / overlay report another device number in /proc/locks than stat does
    return sorted({r.pid for r in on if not r.waiting}), sorted({r.pid for r in on if r.waiting})


def _tcp_remote(ino: int) -> str | None:
    for name in ("tcp", "tcp6"):
        raw = _read(f"/proc/net/{name}", 1 << 20)
        for line in (raw or b"").decode("ascii", "replace").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[9] == str(ino):
                addr, _, port = parts[2].partition(":")
                try:
                    if len(addr) == 8:
                        ip = ".".join(str(b) for b in bytes.fromhex(addr)[::-1])
                    else:
                        ip = f"[{addr}]"
                    return f"{ip}:{int(port, 16)}"
                except ValueError:
                    return None
    return None


def _poll_fds(pid: int, addr: int, nfds: int) -> list[int]:
    """The descriptors of a poll() / ppoll() call, read from its pollfd array (struct pollfd: int fd; short; short)."""
    if not 0 < nfds <= 16:
        return []
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return []
    try:
        raw = os.pread(fd, 8 * nfds, addr)
    except (OSError, OverflowError, ValueError):
        return []
    finally:
        os.close(fd)
    return [struct.unpack_from("i", raw, 8 * i)[0] for i in range(len(raw) // 8)]


def _epoll_fds(pid: int, epfd: int) -> list[int]:
    raw = _read(f"/proc/{pid}/fdinfo/{epfd}", 16384)
    out = []
    for line in (raw or b"").splitlines():
        if line.startswith(b"tfd:"):
            try:
                out.append(int(line.split()[1]))
            except (IndexError, ValueError):
                continue
    return out


def wait_fact(pid: int, state: str, index: ProcIndex) -> WaitFact:
    """The main thread's blocking syscall and who is at the other end. `state`: the process's /proc state letter."""
    raw = _read(f"/proc/{pid}/syscall")
    if raw is None:
        return WaitFact(pid, pid, None, note="/proc/<pid>/syscall unreadable (ptrace access denied)")
    text = raw.decode("ascii", "replace").split()
    if not text or text[0] == "running":
        return WaitFact(pid, pid, None, note="running")
    try:
        nr = int(text[0])
        args = [int(a, 16) for a in text[1:7]]
    except ValueError:
        return WaitFact(pid, pid, None, note=f"unreadable syscall line {raw[:40]!r}")
    if nr < 0:
        return WaitFact(pid, pid, None, note="blocked outside a syscall (a page fault or the kernel)")
    name = _SYSCALLS.get(nr, f"syscall_{nr}")
    fds: list[int] = []
    if name in _FD_ARG0 and args:
        if name != "fcntl" or (len(args) > 1 and args[1] in _F_SETLKW):
            fds = [args[0]]
    elif name in ("poll", "ppoll") and len(args) > 1:
        if state == "D":
            return WaitFact(pid, pid, name, note="its pollfd array was not read (process in D)")
        fds = _poll_fds(pid, args[0], args[1])
    elif name in ("epoll_wait", "epoll_pwait") and args:
        fds = _epoll_fds(pid, args[0])
    targets = [(fd, t) for fd in fds[:8] if fd >= 0 and (t := _readlink(f"/proc/{pid}/fd/{fd}")) is not None]
    if not targets:
        return WaitFact(pid, pid, name, note="" if not fds else "its descriptors' targets unreadable")
    # the telling descriptor: a pipe or socket before an eventfd / the process's own wake-up pipe
    fd, target = sorted(targets, key=lambda ft: (not ft[1].startswith(("pipe:", "socket:", "/")), ft[0]))[0]
    if name in ("flock", "fcntl") and target.startswith("/"):
        holders, _waiting = _locks_on(target, _proc_locks())
        return WaitFact(pid, pid, name, fd, target, tuple(index.holder(p) for p in holders if p != pid),
                        note="" if holders else "/proc/locks shows no holder")
    if target.startswith("pipe:"):
        writers = []
        for p, f in index.holders_of(target):
            flags = _fd_flags(p, f)
            if flags is not None and flags & 3 in (1, 2):  # O_WRONLY, O_RDWR: a write end
                writers.append(p)
        peers = tuple(index.holder(p) for p in sorted(set(writers)))
        note = index.note() or ("nobody holds its write end" if not peers else "")
        return WaitFact(pid, pid, name, fd, target, peers, note=note)
    if target.startswith("socket:"):
        ino = int(target[8:-1]) if target[8:-1].isdigit() else -1
        others = sorted({p for p, _f in index.holders_of(target) if p != pid})
        return WaitFact(pid, pid, name, fd, target, tuple(index.holder(p) for p in others),
                        remote=_tcp_remote(ino) if ino >= 0 else None, note=index.note())
    return WaitFact(pid, pid, name, fd, target)


def _environ(pid: int) -> dict[str, str]:
    raw = _read(f"/proc/{pid}/environ", 1 << 18)
    out = {}
    for item in (raw or b"").split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def cache_roots(env: dict[str, str]) -> list[str]:
    """Where the JIT builds of this process put their lock files, from its environment (the builders' defaults)."""
    home = env.get("HOME") or os.path.expanduser("~")
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    roots = [env.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions"),
             env.get("TRITON_CACHE_DIR") or os.path.join(env.get("TRITON_HOME") or home, ".triton", "cache"),
             os.path.join(env.get("FLASHINFER_WORKSPACE_BASE") or home, ".cache", "flashinfer"),
             env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(env.get("TMPDIR") or "/tmp",
                                                               f"torchinductor_{env.get('USER') or ''}")]
    return list(dict.fromkeys(os.path.realpath(r) for r in roots if r))


def _walk_locks(root: str, deadline: Deadline, depth: int = 4) -> list[str]:
    found: list[str] = []
    seen = 0
    stack = [(root, 0)]
    while stack and seen < _MAX_LOCK_ENTRIES:
        d, level = stack.pop()
        if not deadline.left("lock files in the JIT caches"):
            break
        try:
            with os.scandir(d) as it:
                for e in it:
                    seen += 1
                    if e.name == "lock" or e.name.endswith(".lock"):
                        if e.is_file(follow_symlinks=False):
                            found.append(e.path)
                    elif level < depth and e.is_dir(follow_symlinks=False):
                        stack.append((e.path, level + 1))
        except OSError:
            continue
    return found


def lock_facts(pid: int, index: ProcIndex, roots_cache: dict[str, list[str]]) -> tuple[list[LockFact], str]:
    """Lock files in the JIT caches of `pid`'s environment, newest first, and what could not be looked at."""
    env = _environ(pid)
    if not env:
        return [], "its environment is unreadable, so its JIT caches are unknown"
    paths: list[str] = []
    for root in cache_roots(env):
        if root not in roots_cache:
            roots_cache[root] = _walk_locks(root, index.deadline) if os.path.isdir(root) else []
        paths += roots_cache[root]
    if not paths:
        return [], ""
    stamped = []
    for p in dict.fromkeys(paths):
        try:
            stamped.append((os.stat(p).st_mtime_ns, p))
        except OSError:
            continue
    stamped.sort(reverse=True)
    locks = _proc_locks()
    builders = index.builders()
    out = []
    for mtime, p in stamped[:_MAX_LOCKS]:
        holders, waiting = _locks_on(p, locks)
        openers = sorted({q for q, _f in index.holders_of(p, newer_than_ns=mtime)})
        out.append(LockFact(p, mtime, tuple(index.holder(q) for q in holders), tuple(waiting),
                            tuple(index.holder(q) for q in openers), builders,
                            note=index.note() or ("" if locks is not None else "/proc/locks unreadable")))
    return out, ""


def children(roots: set[int], index: ProcIndex) -> list[ChildFact]:
    """Every live descendant of the `roots` processes that is not one of them, with what it runs."""
    procs = index.procs()
    kids: dict[int, list[int]] = {}
    for pid, (_c, ppid, _s, _cpu) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out = []
    for root in sorted(roots):
        todo = list(kids.get(root, []))
        while todo:
            pid = todo.pop()
            if pid in roots:
                continue
            todo += kids.get(pid, [])
            comm, ppid, state, cpu = procs[pid]
            if state in ("Z", "X"):
                continue
            cmd = ""
            if state != "D" and index.deadline.left("children's command lines"):
                raw = _read(f"/proc/{pid}/cmdline", 4096) or b""
                argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
                cmd = " ".join(redact_argv(argv))[:200]
            out.append(ChildFact(pid, ppid, root, comm, state, cpu, cmd))
    return out


@dataclass
class ProbeState:
    """What the sampler remembers between rounds: when each process was last probed and its CPU then."""

    last: dict[int, tuple[float, int]] = field(default_factory=dict)
