"""Opening an nsys SQLite export: the file checks done before SQLite sees it (missing, empty, not SQLite, cut inside
the first page, shorter than its header declares), the read-only connection, the "is this an nsys export" test on
the table names, and the wording of lock and unreadable-database errors.

Why separate: this is everything about the file and the SQLite library, nothing about nsys tables' meaning; both
``sniff`` and ``read`` (in :mod:`analyzers.readers.nsys`) and the export's stages rely on it.
"""
from __future__ import annotations

import sqlite3
import struct
import urllib.parse
from pathlib import Path

from ranktrace.analyzers.readers.base import ReaderError

_SQLITE_MAGIC = b"SQLite format 3\x00"
_LOCK_TIMEOUT_S = 0.5


def _is_lock_error(e: sqlite3.Error) -> bool:
    return "locked" in str(e).lower() or "busy" in str(e).lower()


def _unreadable(e: sqlite3.Error, truncated: str | None) -> str:
    return f"{truncated}; nothing readable ({e})" if truncated else \
        f"unreadable SQLite database ({e}); truncated or corrupt export?"


# ---------------------------------------------------------------------------------------------------- file checks

def _check_file(path: Path) -> str | None:
    """Refuse what SQLite would open lazily and fail on later: missing, empty, non-SQLite files, and files cut
    inside the first page. A file shorter than its header declares is read as far as it goes: returns a note."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if size == 0:
        raise ReaderError(path, "empty file, expected an Nsight Systems SQLite export")
    if not header.startswith(_SQLITE_MAGIC):
        raise ReaderError(path, "not an SQLite database (no 'SQLite format 3' header); "
                                "export the report with `nsys export --type sqlite`")
    if len(header) < 100:
        raise ReaderError(path, f"truncated SQLite header ({len(header)} of 100 bytes)")
    note = _short_by(header, size)
    page_size = struct.unpack(">H", header[16:18])[0]
    if note and size < (65536 if page_size == 1 else page_size):
        raise ReaderError(path, f"{note}: not even the first page (schema) is there")
    return note


def _short_by(header: bytes, size: int) -> str | None:
    """A note when the file is shorter than the page count its SQLite header declares (an interrupted export or
    copy), else None."""
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, n_pages, valid_for = (struct.unpack(">I", header[i:i + 4])[0] for i in (24, 28, 92))
    if n_pages and change_counter == valid_for and size < n_pages * page_size:
        return (f"truncated SQLite database: header declares {n_pages} pages of {page_size} bytes "
                f"({n_pages * page_size} bytes), file has {size} bytes (interrupted export or copy?)")
    return None


def _connect(path: Path) -> sqlite3.Connection:
    """A read-only connection. For a truncated file, ``writable_schema`` makes SQLite use the pages that are there
    instead of refusing the whole file (nothing can be written: the connection is read-only); tables whose pages
    are missing then fail one by one."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=_LOCK_TIMEOUT_S)
    except sqlite3.Error as e:
        raise ReaderError(path, f"cannot open as SQLite: {e}") from e
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
        if len(header) == 100 and _short_by(header, path.stat().st_size):
            conn.execute("PRAGMA writable_schema=ON")
    except (OSError, sqlite3.Error):
        pass
    return conn


def _looks_like_nsys(names: set[str]) -> bool:
    if {"META_DATA_EXPORT", "EXPORT_META_DATA"} & names:
        return True
    markers = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_", "TARGET_INFO_", "ThreadNames", "ENUM_NSYS_")
    return "StringIds" in names and any(n.startswith(markers) for n in names)
