"""Tar archives given to the analysis (issue #19): ``trace analyze node-0.tar node-1.tar`` where hosts share no
filesystem — each host's directory packed where it ran, the archives copied to one place — reads them as the
directories they hold. Also any archive of logs and dumps a user attaches to a ticket.

An archive is unpacked once into a private temporary directory (removed when the process exits) with the tarfile
"data" filter (no absolute paths, no links out of it, no device files); a single top-level directory in it stands
for the archive. Plain, gzip, bzip2 and xz tars are recognised by content, not by name.
"""
from __future__ import annotations

import atexit
import lzma
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

__all__ = ["expand", "is_archive"]

_unpacked: dict[Path, Path] = {}
# What a damaged or cut compressed file raises while tarfile reads it (a gzip cut short: EOFError; a corrupt
# deflate stream: zlib.error; xz: LZMAError; bzip2: OSError)
_DAMAGED = (OSError, EOFError, ValueError, tarfile.TarError, zlib.error, lzma.LZMAError)


def is_archive(p: Path) -> bool:
    """A tar (plain or compressed) holding at least one member. A file that starts with a 512-byte block of NULs
    (a log or dump with a sparse hole at its head) reads to tarfile as an empty archive: it is not one."""
    try:
        if not (p.is_file() and tarfile.is_tarfile(p)):
            return False
        with tarfile.open(p) as tar:
            return tar.next() is not None
    except _DAMAGED:  # not an archive we can read: its reader says what it is
        return False


def expand(paths: list[Path]) -> list[Path]:
    """`paths` with every tar archive replaced by what it unpacks to (a failure leaves the path as given: its reader
    then says what it is)."""
    out = []
    for p in paths:
        if is_archive(p):
            try:
                out.append(_unpack(p))
                continue
            except _DAMAGED:
                pass
        out.append(p)
    return out


def _unpack(archive: Path) -> Path:
    key = archive.resolve()
    if key in _unpacked:
        return _unpacked[key]
    root = Path(tempfile.mkdtemp(prefix=f"ranktrace-{archive.name[:40]}-"))
    if not _roots:
        atexit.register(_clean)
    _roots.append(root)
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    entries = [e for e in root.iterdir() if not e.name.startswith(".")]
    result = entries[0] if len(entries) == 1 and entries[0].is_dir() else root
    _unpacked[key] = result
    return result


_roots: list[Path] = []   # every directory unpacked into, removed at exit


def _clean() -> None:
    for root in _roots:
        shutil.rmtree(root, ignore_errors=True)
