"""The byte level of a read, no reader state: a file as chunks of whole lines (bounded memory, NUL bytes and sparse
holes skipped) and, for the bulk of big logs, the COLL records of a chunk parsed with numpy (exactly the lines
``grammar.COLL_RE`` would match; every other line is left to the regex loop)."""
from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["iter_chunks", "FastRows", "fast_rows", "inert", "word_view"]

_CHUNK = 4 << 20
_MAX_CARRY = 64 << 20          # a "line" longer than this is cut (binary junk without newlines)


def iter_chunks(f: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """Yield (pieces of whole lines of about ``_CHUNK`` bytes, NUL bytes dropped since the previous piece).

    NUL bytes are not text: they come from sparse holes or from a file truncated while its writer kept its offset
    (``logrotate copytruncate``), so they are dropped before lines are cut (a hole never fills the line buffer).
    The last piece may lack its newline; a "line" longer than ``_MAX_CARRY`` is cut.
    """
    carry: list[bytes | memoryview] = []
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


_MAX_PREFIX = 512             # longer text before "NCCL INFO" (glued garbage): the line goes to the regex loop
_TAIL = 1024                  # bytes a numpy-parsed COLL record may span after "NCCL" (tokens are capped below)


#: ``COLL_RE`` in RE2 syntax with the classes spelled out (bytes-pattern ``\w``, ``\S``, ``\d`` are ASCII), run by
#: pyarrow over the lines of a chunk. It may only reject more than ``COLL_RE`` (RE2 reads invalid UTF-8 bytes one
#: at a time, so ``[^ \t...]`` never swallows a space), and a line it rejects goes to the regex loop.
_COLL_RE2 = (r"NCCL INFO [0-9A-Za-z_]+: opCount [0-9a-fA-F]+ sendbuff [^ \t\n\r\x0b\x0c]+ "
             r"recvbuff [^ \t\n\r\x0b\x0c]+ count [0-9]+ datatype [0-9]+ op [0-9]+ root -?[0-9]+ "
             r"comm 0x[0-9a-fA-F]+ \[nranks=[0-9]+\]")
_U64 = np.uint64
#: keep the last k bytes of a little-endian 8-byte word (k = 0..8)
_KEEP = np.array([0] + [((1 << (8 * k)) - 1) << (8 * (8 - k)) for k in range(1, 9)], dtype=np.uint64)
_ZEROS8 = _U64(0x3030303030303030)


def _word(text: bytes) -> np.uint64:
    return _U64(int.from_bytes(text.ljust(8, b"\0"), "little"))


_MASK6 = _U64((1 << 48) - 1)
_INFO6 = _word(b" INFO ")
_OPCOUNT8 = _word(b"opCount ")
_BOOT8 = _word(b"Bootstra")
_BOOT8_LOWER = _word(b"bootstra")


def _rows(buf: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """Bytes ``buf[start + k]`` for k < width as a (rows, width) matrix (one row copy per start).

    Callers keep ``0 <= start`` and ``start + width <= buf.size``.
    """
    view = np.lib.stride_tricks.as_strided(buf, shape=(buf.size - width + 1, width), strides=(1, 1),
                                           writeable=False)
    return view[start]


def _swar8(word: np.ndarray, hexa: bool) -> np.ndarray:
    """Eight ASCII digits per uint64 (first digit in the lowest byte) → their value (SWAR, no per-digit loop)."""
    if hexa:
        x = (word & _U64(0x0F0F0F0F0F0F0F0F)) + _U64(9) * ((word >> _U64(6)) & _U64(0x0101010101010101))
        m1, m2, m3 = _U64(16), _U64(256), _U64(65536)
    else:
        x = word - _ZEROS8
        m1, m2, m3 = _U64(10), _U64(100), _U64(10000)
    x = (x * m1 + (x >> _U64(8))) & _U64(0x00FF00FF00FF00FF)
    x = (x * m2 + (x >> _U64(16))) & _U64(0x0000FFFF0000FFFF)
    return (x * m3 + (x >> _U64(32))) & _U64(0x00000000FFFFFFFF)


def word_view(chunk: bytes) -> np.ndarray:
    """``w[i]`` = the 8 bytes from offset i as a little-endian uint64 (an unaligned, overlapping view: no copy)."""
    return np.ndarray((len(chunk) - 7,), dtype="<u8", buffer=chunk, strides=(1,))


def _digits(words: np.ndarray, s: np.ndarray, e: np.ndarray, hexa: bool) -> np.ndarray:
    """Value of the 1..16 (validated) digits ``chunk[s:e]``; needs ``e >= 16``."""
    ln = e - s
    lo_n = np.minimum(ln, 8)
    hi_n = np.clip(ln - 8, 0, 8)
    keep = _KEEP[lo_n]
    lo = (words[e - 8] & keep) | (_ZEROS8 & ~keep)
    val = _swar8(lo, hexa).astype(np.int64)
    if hi_n.any():
        keep = _KEEP[hi_n]
        hi = _swar8((words[e - 16] & keep) | (_ZEROS8 & ~keep), hexa).astype(np.int64)
        val += hi << 32 if hexa else hi * 10**8
    return val


def _tokens(buf: np.ndarray, s: np.ndarray, e: np.ndarray) -> pa.Array:
    """The byte strings ``buf[s:e]`` as one Arrow binary array (gathered, so they can be hashed in C)."""
    ln = e - s
    offs = np.zeros(s.size + 1, dtype=np.int64)
    np.cumsum(ln, out=offs[1:])
    width = max(8, (int(ln.max()) + 7) & ~7) if ln.size else 8
    data = _rows(buf, s, width)[np.arange(width) < ln[:, None]]
    return pa.Array.from_buffers(pa.large_binary(), s.size, [None, pa.py_buffer(offs), pa.py_buffer(data)])


def _encode(arr: pa.Array) -> tuple[np.ndarray, list[bytes]]:
    """Dictionary-encode: (index per row, distinct values in order of first appearance)."""
    enc = arr.dictionary_encode()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


@dataclass
class FastRows:
    """COLL lines of one chunk parsed with numpy (exactly those ``COLL_RE`` would match, see ``fast_rows``)."""

    line: np.ndarray          # 0-based line number inside the chunk
    anchor: np.ndarray        # byte offset of "NCCL INFO"
    opc: np.ndarray
    count: np.ndarray
    dt: np.ndarray
    root: np.ndarray
    pre: np.ndarray           # index into pre_vals: the text from the line start to "NCCL INFO"
    pre_vals: list[bytes]
    comm: np.ndarray          # index into comm_vals
    comm_vals: list[bytes]
    op: np.ndarray            # index into op_vals (raw op name, without the colon)
    op_vals: list[bytes]


def inert(buf: np.ndarray, words: np.ndarray, sp: np.ndarray, nl: np.ndarray, nccl: np.ndarray,
           nccl_line: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Occurrences of "NCCL" (among ``which``, each the only one on its line) that provably start no match of
    ``SCAN_RE``: ``NCCL INFO <token>: <next>`` where <token> (no space) ends with the colon, <next> is not
    ``opCount`` and <token> does not start with ``Bootstrap``/``bootstrap``. TUNING lines (``AllReduce: 4096 Bytes
    -> Algo ...``) are the bulk of them. Every other alternative of ``SCAN_RE`` needs a space, a digit or a
    different word right after "INFO " or after the colon."""
    out = np.zeros(nccl.size, dtype=bool)
    idx = np.flatnonzero(which & (nccl + 40 <= buf.size))
    if not idx.size or not sp.size:
        return out
    a = nccl[idx]
    line_end = np.where(nccl_line[idx] < nl.size, nl[np.minimum(nccl_line[idx], max(nl.size - 1, 0))]
                        if nl.size else buf.size, buf.size)
    j = np.minimum(np.searchsorted(sp, a + 10), sp.size - 1)
    e2 = sp[j]
    ok = ((words[a + 4] & _MASK6) == _INFO6) & (e2 >= a + 11) & (e2 < line_end) & (e2 + 9 <= buf.size - 8)
    e2 = np.where(ok, e2, a + 11)
    ok &= (buf[e2 - 1] == 58) & (words[e2 + 1] != _OPCOUNT8)
    tok = words[a + 10]
    ok &= (tok != _BOOT8) & (tok != _BOOT8_LOWER)
    out[idx] = ok
    return out


def fast_rows(chunk: bytes, buf: np.ndarray, words: np.ndarray, sp: np.ndarray, nl: np.ndarray,
               nccl: np.ndarray, nccl_line: np.ndarray, single: np.ndarray) -> FastRows | None:
    """The COLL records among lines holding exactly one "NCCL", with their fields, parsed in bulk.

    RE2 (pyarrow) checks each line against ``_COLL_RE2``; on a line with one "NCCL" a match starts there, where
    ``COLL_RE`` would match too, and since its tokens are single-space separated, their bounds are the spaces
    after "NCCL". Numbers are read eight digits at a time. Lines with longer numbers or prefixes, or too close
    to the end of the chunk, are not taken: they go through the regex loop, so the result never changes.
    """
    size = buf.size
    a = nccl[single]
    li = nccl_line[single]
    keep = a + _TAIL <= size        # so that no window below reads past the chunk
    a, li = a[keep], li[keep]
    if not a.size:
        return None
    offsets = np.empty(nl.size + 2, dtype=np.int32 if size < 1 << 31 else np.int64)
    offsets[0] = 0
    offsets[1:-1] = nl + 1
    offsets[-1] = size
    n_lines = nl.size + 1
    lines = pa.Array.from_buffers(pa.binary() if offsets.dtype == np.int32 else pa.large_binary(), n_lines,
                                  [None, pa.py_buffer(offsets), pa.py_buffer(chunk)])
    try:
        matched = pc.match_substring_regex(lines, _COLL_RE2).to_numpy(zero_copy_only=False)
    except pa.ArrowNotImplementedError:  # a pyarrow built without RE2: the regex loop does it all
        return None
    keep = matched[li]
    a, li = a[keep], li[keep]
    if not a.size:
        return None
    b = sp[np.searchsorted(sp, a + 4)[:, None] + np.arange(19)]   # b[:, k]: the space after token k
    s = b[:, :-1] + 1                                               # s[:, k - 1]: start of token k (k = 1..18)
    line_start = offsets[li].astype(np.int64)
    ln = b[:, 1:] - s                                               # ln[:, k - 1]: length of token k
    root_s = s[:, 15] + (buf[s[:, 15]] == 45)                        # "-"
    keep = ((ln[:, 3] <= 15) & (ln[:, 9] <= 16) & (ln[:, 11] <= 16) & (b[:, 16] - root_s <= 16)
            & (ln[:, 17] <= 66) & (ln[:, 1] <= 65) & (a - line_start <= _MAX_PREFIX) & (b[:, 18] + 80 <= a + _TAIL))
    if not keep.all():
        a, li, b, s, line_start, root_s = a[keep], li[keep], b[keep], s[keep], line_start[keep], root_s[keep]
        if not a.size:
            return None
    opc = _digits(words, s[:, 3], b[:, 4], True)
    count = _digits(words, s[:, 9], b[:, 10], False)
    dt = _digits(words, s[:, 11], b[:, 12], False)
    root = _digits(words, root_s, b[:, 16], False)
    root = np.where(root_s > s[:, 15], -root, root)
    pre, pre_vals = _encode(_tokens(buf, line_start, a))
    comm, comm_vals = _encode(_tokens(buf, s[:, 17], b[:, 18]))
    op, op_vals = _encode(_tokens(buf, s[:, 1], b[:, 2] - 1))
    return FastRows(line=li, anchor=a, opc=opc, count=count, dt=dt, root=root, pre=pre, pre_vals=pre_vals, comm=comm,
                 comm_vals=comm_vals, op=op, op_vals=op_vals)
