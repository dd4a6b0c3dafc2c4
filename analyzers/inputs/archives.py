"""Tar archives given to the analysis (issue #19): ``trace analyze node-0.tar node-1.tar`` where hosts share no
filesystem — each host's directory packed where it ran, the archives copied to one place — reads them as the
directories they hold. Also any archive of logs and dumps a user attaches to a ticket.

An archive is unpacked once into a private temporary directory with the tarfile "data" filter (no absolute paths,
no links out of it, no device files); a single top-level directory in it stands for the archive. Plain, gzip, bzip2
and xz tars are recognised by content, not by name.

Bounds (docs/SAFETY.md): at most MAX_MEMBERS members and MAX_BYTES extracted per archive (a member larger than
MAX_MEMBER_BYTES is skipped; the member sizes read through count towards MAX_BYTES too), and never more than half of
the free space of TMPDIR; past a bound, extraction stops with one line naming the archive and the bound, and what was
extracted is read. The directory is removed at exit, on SIGTERM / SIGHUP while it exists, and, if the process was
SIGKILLed, by the next analysis of this user (directories of dead pids).
"""
from __future__ import annotations

import atexit
import lzma
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import zlib
from pathlib import Path

from ranktrace.analyzers.readers.base import Skipped

__all__ = ["expand", "expand_noted", "is_archive", "MAX_MEMBERS", "MAX_BYTES", "MAX_MEMBER_BYTES"]

MAX_MEMBERS = 10_000           # members extracted from one archive
MAX_BYTES = 2 << 30            # bytes extracted (and read through) from one archive
MAX_MEMBER_BYTES = 1 << 30     # one member larger than this is skipped
_PREFIX = "ranktrace-unpack-"

_unpacked: dict[Path, tuple[Path, tuple[Skipped, ...]]] = {}
# What a damaged or cut compressed file raises while tarfile reads it (a gzip cut short: EOFError; a corrupt
# deflate stream: zlib.error; xz: LZMAError; bzip2: OSError)
_DAMAGED = (OSError, EOFError, ValueError, tarfile.TarError, zlib.error, lzma.LZMAError)


def is_archive(p: Path) -> bool:
    """A tar (plain or compressed) holding at least one member. A file that starts with a 512-byte block of NULs
    (a log or dump with a sparse hole at its head) reads to tarfile as an empty archive: it is not one. Compression
    is told by its magic bytes before tarfile is asked: tarfile's "r:*" also tries xz's headerless .lzma format,
    which takes a run of NULs for a valid stream and decodes a 100 MiB hole for 20 s."""
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            head = f.read(512)
        if not head.strip(b"\0"):
            return False
        mode = _COMPRESSED.get(next((m for m in _COMPRESSED if head.startswith(m)), b""), "r:")
        if mode == "r:" and not tarfile.is_tarfile(p):
            return False
        with tarfile.open(p, mode) as tar:  # type: ignore[call-overload]  # mode: r:, r:gz, r:bz2 or r:xz
            return tar.next() is not None
    except _DAMAGED:  # not an archive we can read: its reader says what it is
        return False


_COMPRESSED = {b"\x1f\x8b": "r:gz", b"BZh": "r:bz2", b"\xfd7zXZ\x00": "r:xz"}


def expand(paths: list[Path]) -> list[Path]:
    """`paths` with every tar archive replaced by what it unpacks to (a failure leaves the path as given: its reader
    then says what it is)."""
    return expand_noted(paths)[0]


def expand_noted(paths: list[Path]) -> tuple[list[Path], list[Skipped]]:
    """expand, and one line per archive that went past a bound (naming it and the bound)."""
    out: list[Path] = []
    notes: list[Skipped] = []
    for p in paths:
        if is_archive(p):
            try:
                where, said = _unpack(p)
                out.append(where)
                notes.extend(said)
                continue
            except _DAMAGED:
                pass
        out.append(p)
    return out, notes


def _unpack(archive: Path) -> tuple[Path, tuple[Skipped, ...]]:
    key = archive.resolve()
    if key in _unpacked:
        return _unpacked[key]
    _sweep()
    root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-{archive.name[:40]}-"))
    _track(root)
    notes = tuple(_extract(archive, root))
    entries = [e for e in root.iterdir() if not e.name.startswith(".")]
    result = entries[0] if len(entries) == 1 and entries[0].is_dir() else root
    _unpacked[key] = (result, notes)
    return _unpacked[key]


def _extract(archive: Path, root: Path) -> list[Skipped]:
    """Members one by one through the data filter, within the bounds; the lines saying which bound was reached."""
    notes: list[Skipped] = []
    try:
        budget = min(MAX_BYTES, shutil.disk_usage(root).free // 2)
    except OSError:
        budget = MAX_BYTES
    done = [0]
    with tarfile.open(archive) as tar:
        try:
            _members(tar, archive, root, budget, notes, done)
        except _DAMAGED as e:  # cut or damaged further on: what came before it is read
            notes.append(Skipped(str(archive), None, f"archive damaged after {done[0]:,} members "
                                                     f"({type(e).__name__}: {e}): what came before is read"))
    return notes


def _members(tar: tarfile.TarFile, archive: Path, root: Path, budget: int, notes: list[Skipped],
             done: list[int]) -> None:
    used = 0
    for m in tar:
        if done[0] >= MAX_MEMBERS:
            notes.append(Skipped(str(archive), None, f"more than {MAX_MEMBERS:,} members: extraction stopped there "
                                                     f"(the bound per archive); the rest is not read"))
            return
        size = m.size if m.isreg() else 0
        if used + size > budget:
            bound = (f"{_size(MAX_BYTES)} per archive" if budget == MAX_BYTES
                     else f"half of the free space in {root.parent}, {_size(budget)}")
            notes.append(Skipped(str(archive), None, f"extraction stopped at {_size(used)}, {done[0]:,} members "
                                                     f"(the bound: {bound}); the rest is not read"))
            return
        used += size
        if size > MAX_MEMBER_BYTES:
            notes.append(Skipped(str(archive), None, f"member {m.name[:200]} ({_size(size)}) is over "
                                                     f"{_size(MAX_MEMBER_BYTES)}: not extracted"))
            continue
        done[0] += 1
        try:
            tar.extract(m, root, filter="data")
        except (tarfile.FilterError, KeyError) as e:
            notes.append(Skipped(str(archive), None, f"member {m.name[:200]} not extracted: {e}"))
        except OSError as e:  # disk full or similar: what is there is read
            notes.append(Skipped(str(archive), None, f"member {m.name[:200]} not extracted ({e.strerror or e}): "
                                                     f"extraction stopped"))
            return


def _size(n: int) -> str:
    return (f"{n >> 30} GiB" if n % (1 << 30) == 0 else f"{n / (1 << 30):.1f} GiB") if n >= 1 << 30 else f"{n >> 20} MiB"


_roots: list[Path] = []   # every directory unpacked into, removed at exit
_lock = threading.Lock()


def _track(root: Path) -> None:
    with _lock:
        if not _roots:
            atexit.register(_clean)
            _on_signals()
        _roots.append(root)


def _on_signals() -> None:
    """SIGTERM / SIGHUP end the process after removing what was unpacked (only where nobody installed a handler of
    their own: then that handler decides, and atexit still cleans when it exits)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _cleaned_exit)
        except (ValueError, OSError):
            pass


def _cleaned_exit(signum: int, _frame: object) -> None:
    _clean()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _clean() -> None:
    for root in list(_roots):
        shutil.rmtree(root, ignore_errors=True)
    _roots.clear()


def _sweep() -> None:
    """What an analysis that was SIGKILLed left in TMPDIR: our own unpack dirs of pids no longer running."""
    tmp = Path(tempfile.gettempdir())
    try:
        entries = list(tmp.iterdir())
    except OSError:
        return
    for d in entries:
        if not d.name.startswith(_PREFIX):
            continue
        pid = d.name[len(_PREFIX):].split("-", 1)[0]
        try:
            st = d.lstat()
        except OSError:
            continue
        if not pid.isdigit() or int(pid) == os.getpid() or st.st_uid != os.geteuid() or not d.is_dir() \
                or d.is_symlink() or os.path.exists(f"/proc/{pid}"):
            continue
        shutil.rmtree(d, ignore_errors=True)
