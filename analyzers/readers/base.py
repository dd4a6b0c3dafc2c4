"""The reader contract: a package ``analyzers/readers/<format>/`` whose ``__init__`` has ``FORMAT``, ``FIELD_MAP``
(its raw -> column map, ``ColumnMap`` rows) and ``sniff``/``read`` (structured formats) or ``read_doc`` (text
families); a read returns a picklable ``ReadResult``, puts what it cannot use in ``skipped`` and raises
``ReaderError`` only for a file it cannot open or that is not its format. Plus the helpers most readers use."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from ranktrace.tracer.formats import schema

__all__ = ["Skipped", "ReadResult", "ReaderError", "ColumnMap", "empty_result", "read_file_bytes", "read_text_file",
           "has_nul_bytes", "binary_content", "without_nuls", "binary_or_json", "json_array_items", "empty_file", "decode_text"]


@dataclass(frozen=True)
class Skipped:
    """Something a reader could not use, and why (shown to the user as a finding)."""

    file: str
    line: int | None
    reason: str


@dataclass(frozen=True)
class ReadResult:
    """What one reader got out of one file, in the common tables."""

    file: str
    format: str
    version: str | None = None
    events: pa.Table = field(default_factory=lambda: schema.empty(schema.EVENTS))
    stacks: pa.Table = field(default_factory=lambda: schema.empty(schema.STACKS))
    observations: pa.Table = field(default_factory=lambda: schema.empty(schema.OBSERVATIONS))
    skipped: tuple[Skipped, ...] = ()
    world_size: int | None = None  # when the file states the world size (so unobserved ranks can be named)


@dataclass(frozen=True)
class ColumnMap:
    """One line of a reader's declared raw -> column mapping: every reader's ``FIELD_MAP`` is a tuple of these."""

    raw: str        # the raw field, line part or derived quantity
    column: str     # where it lands: ``EVENTS.x`` / ``OBSERVATIONS.x`` / a STACKS column ('' = used inside only)
    type: str       # its raw type, unit or the conversion applied
    default: str    # the value when it is absent ("null", "required", "-" when not applicable)
    since: str      # first version of the writer known to print it ("-" when not versioned)


class ReaderError(Exception):
    """A file that cannot be opened or is not of the reader's format. Message names the file."""

    def __init__(self, file: str | Path, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = str(file)
        self.reason = reason


def empty_result(path: str | Path, fmt: str) -> ReadResult:
    """A result with no rows (a readable file that held nothing useful)."""
    return ReadResult(file=str(path), format=fmt)


MAX_FILE_BYTES = 256 << 20  # a dump read whole (py-spy, Flight Recorder, faulthandler, gdb): docs/SAFETY.md


def read_file_bytes(path: Path) -> bytes:
    """The whole file, or ReaderError naming it (every small-file reader starts here). A file over MAX_FILE_BYTES
    is not read: one dump of that size is no dump (memory would grow with it)."""
    try:
        with open(path, "rb") as f:
            big = os.fstat(f.fileno()).st_size > MAX_FILE_BYTES
            data = b"" if big else f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ReaderError(path, f"cannot open: {exc.strerror or exc}") from exc
    if big or len(data) > MAX_FILE_BYTES:
        raise ReaderError(path, f"larger than {MAX_FILE_BYTES >> 20} MiB, the bound for one dump file: not read")
    return data


def empty_file(path: str | Path, fmt: str, reason: str = "empty file") -> ReadResult:
    """A readable file with nothing in it: no rows, one note saying so."""
    return ReadResult(file=str(path), format=fmt, skipped=(Skipped(str(path), None, reason),))


def read_text_file(path: str | Path, fmt: str, not_what: str,
                   from_text: Callable[[Path, str], ReadResult]) -> ReadResult:
    """A text reader's read(path): the file's bytes, an empty file said so, binary data refused (naming what it is
    not), the text handed to `from_text(path, text)`."""
    path = Path(path)
    data = read_file_bytes(path)
    if not data.strip():
        return empty_file(str(path), fmt)
    return from_text(path, decode_text(path, data, not_what))


def decode_text(path: str | Path, data: bytes, not_what: str) -> str:
    """Text of a dump with its NUL runs dropped (holes a crash or copytruncate leave in a log); a binary file (a
    core, a pickle: control bytes once the NULs are set aside) is ReaderError ``not_what``."""
    if binary_content(data[:65536]):
        raise ReaderError(path, not_what)
    return without_nuls(data)[0].decode("utf-8", errors="replace")


def without_nuls(data: bytes) -> tuple[bytes, int]:
    """(`data` without its NUL bytes, how many there were): a NUL never belongs to a text or JSON format."""
    n = data.count(b"\x00")
    return (data.replace(b"\x00", b""), n) if n else (data, 0)


_NUL_RUN = re.compile(rb"\x00{8,}")


def binary_content(data: bytes) -> bool:
    """Binary, not text: NUL bytes scattered among the others (a struct, UTF-16, a pickle), mostly control bytes,
    or nothing but NULs. A *run* of NULs is a hole in a text file (a node crash, the front of a copytruncate'd
    log) and never makes it binary."""
    if not data:
        return False
    sample = _NUL_RUN.sub(b"", data[:65536])
    if not sample:
        return True
    if b"\x00" in sample or sample[:1] == b"\x80":
        return True
    sample = sample[:8192]
    ctrl = sum(sample.count(bytes([c])) for c in range(1, 32) if c not in (9, 10, 12, 13, 27))
    return ctrl > 0.1 * len(sample)


def has_nul_bytes(data: bytes) -> bool:
    """Binary content (``binary_content``), kept under its old name for callers outside the readers; NUL runs in
    text do not count."""
    return binary_content(data)


def binary_or_json(head: bytes) -> bool:
    """Pickles, binary data and JSON documents: never one of the text dump formats (a ``[rank0]:`` prefix is fine;
    NUL runs are holes, not binary)."""
    h = without_nuls(head)[0].lstrip()
    return h[:1] in (b"{", b"\x80") or binary_content(head) or re.match(rb"\[\s*[{\]]", h) is not None


def json_array_items(text: str, pos: int) -> list[Any]:
    """The complete values of the JSON array whose ``[`` ends just before `pos`, up to the first value cut short:
    what a dump truncated mid-write (a process killed while writing it) still holds."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return out
        try:
            item, pos = dec.raw_decode(text, pos)
        except ValueError:
            return out
        out.append(item)
