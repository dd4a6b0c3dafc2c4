"""Chunked reading of a log file: pieces of whole lines of about ``_CHUNK`` bytes, NUL bytes dropped.

Why separate: bounded input memory however big the file (only one chunk is held), and sparse holes are skipped
with ``SEEK_DATA``; this is plain file handling that knows nothing of NCCL lines.
"""
from __future__ import annotations

import errno
import io
import os
from typing import BinaryIO, Iterator

_CHUNK = 4 << 20
_MAX_CARRY = 64 << 20          # a "line" longer than this is cut (binary junk without newlines)


def _iter_chunks(f: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """Yield (pieces of whole lines of about ``_CHUNK`` bytes, NUL bytes dropped since the previous piece).

    NUL bytes are not text: they come from sparse holes or from a file truncated while its writer kept its offset
    (``logrotate copytruncate``), so they are dropped before lines are cut (a hole never fills the line buffer).
    The last piece may lack its newline; a "line" longer than ``_MAX_CARRY`` is cut.
    """
    carry: list[bytes] = []
    carry_len = 0
    nuls = 0
    while True:
        block = f.read(_CHUNK)
        if not block:
            break
        if b"\0" in block:
            k = block.count(b"\0")
            nuls += k
            if k == len(block):
                nuls += _skip_hole(f)
                continue
            block = block.translate(None, b"\0")
        cut = block.rfind(b"\n")
        if cut < 0:
            carry.append(block)
            carry_len += len(block)
            if carry_len >= _MAX_CARRY:
                yield b"".join(carry), nuls
                carry, carry_len, nuls = [], 0, 0
            continue
        if carry:
            carry.append(memoryview(block)[: cut + 1])
            piece = b"".join(carry)
        else:
            piece = block if cut == len(block) - 1 else block[: cut + 1]
        yield piece, nuls
        nuls = 0
        tail = block[cut + 1:]
        carry, carry_len = ([tail], len(tail)) if tail else ([], 0)
    if carry or nuls:
        yield b"".join(carry), nuls


def _skip_hole(f: BinaryIO) -> int:
    """After a block of NULs, jump over the rest of a sparse hole (``SEEK_DATA``); returns the bytes skipped.

    Reading a hole returns NULs anyway; skipping it just saves the time. Not available everywhere (then 0).
    """
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return 0
    try:
        here = f.tell()
        end = os.fstat(f.fileno()).st_size
        try:
            nxt = os.lseek(f.fileno(), here, seek_data)
        except OSError as e:
            if e.errno != errno.ENXIO:   # ENXIO: only a hole up to the end of the file
                return 0
            nxt = end
        nxt = min(max(nxt, here), end)
        f.seek(nxt)
        return nxt - here
    except (OSError, ValueError, io.UnsupportedOperation):
        return 0
