"""The line walker: reads a file chunk by chunk and sends each line to the path that parses it, in line order.

Why separate: this is the control flow of a read and nothing else. Chunks come from ``nccl_log_chunks``; small
chunks go to the regex loop; in bigger ones numpy finds the COLL lines (``nccl_log_vector``), the rarer lines split
them into runs, and runs go to ``_vector_run`` or, when short, to the regex loop (``nccl_log_coll``). ``_Reader``
puts the parts together: COLL rows and rarer lines (``_CollRows``), tables at the end (``_Tables``).
"""
from __future__ import annotations

from typing import BinaryIO

import numpy as np

from ranktrace.analyzers.readers.nccl_log_chunks import _iter_chunks
from ranktrace.analyzers.readers.nccl_log_coll import _CollRows
from ranktrace.analyzers.readers.nccl_log_grammar import _SCAN_RE
from ranktrace.analyzers.readers.nccl_log_state import _block
from ranktrace.analyzers.readers.nccl_log_tables import _Tables
from ranktrace.analyzers.readers.nccl_log_vector import _fast_rows, _inert, _words

_VEC_MIN_BYTES = 32 << 10     # smaller chunks go through the regex loop only
_VEC_MIN_ROWS = 48            # a run of fewer COLL lines between two rarer lines is not worth the numpy set-up


class _Reader(_CollRows, _Tables):
    """State of one read; see the ``nccl_log`` module docstring for the rules."""

    # ---- chunk loop

    def run(self, f: BinaryIO) -> None:
        line = 1
        for chunk, nuls in _iter_chunks(f):
            if nuls:
                self.nul_bytes += nuls
                if self.nul_line is None:
                    self.nul_line = line
            if chunk:
                line = self._chunk(chunk, line)

    def _chunk(self, chunk: bytes, first_line: int) -> int:
        """Parse one chunk of whole lines; returns the number of the line after it."""
        if self.bad_utf8_line is None and not chunk.isascii():
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad_utf8_line = first_line + chunk.count(b"\n", 0, e.start)
        blocks: list[np.ndarray] = []
        if len(chunk) < _VEC_MIN_BYTES:
            n = self._scan_range(chunk, 0, len(chunk), first_line, blocks)
            newlines = chunk.count(b"\n")
        else:
            n, newlines = self._vector_chunk(chunk, first_line, blocks)
        self.n_marker_lines += n
        if len(blocks) == 1:
            self.batches.append(blocks[0])
        elif blocks:
            merged = _block(sum(len(b) for b in blocks))
            np.concatenate(blocks, out=merged)
            self.batches.append(merged)
        if chunk.count(b": opCount ") != n:
            self._find_torn_coll(chunk, first_line)
        return first_line + newlines

    def _vector_chunk(self, chunk: bytes, first_line: int, blocks: list[np.ndarray]) -> tuple[int, int]:
        """Parse a chunk (returns COLL rows, newlines): COLL lines in bulk with numpy, the rest (and short runs)
        with the regex loop, in line order.

        Lines are processed in file order: the rarer lines (Init, teardown, ...) change the communicator state a
        COLL line is resolved against, so they split the COLL lines into runs, each handled at once.
        """
        buf = np.frombuffer(chunk, dtype=np.uint8)
        size = buf.size
        nl = np.flatnonzero(buf == 10)
        n_lines = nl.size + (0 if chunk.endswith(b"\n") else 1)
        nccl = np.flatnonzero(buf[: size - 3] == 78)             # "NCCL"
        nccl = nccl[(buf[nccl + 1] == 67) & (buf[nccl + 2] == 67) & (buf[nccl + 3] == 76)]
        if not nccl.size:
            return 0, nl.size
        nccl_line = np.searchsorted(nl, nccl)
        single = np.ones(nccl.size, dtype=bool)
        single[1:] &= nccl_line[1:] != nccl_line[:-1]
        single[:-1] &= nccl_line[:-1] != nccl_line[1:]
        sp = np.flatnonzero(buf == 32)
        words = _words(chunk)
        fast = _fast_rows(chunk, buf, words, sp, nl, nccl, nccl_line, single)

        def line_start(k: int) -> int:
            return 0 if k == 0 else int(nl[k - 1]) + 1

        def line_end(k: int) -> int:
            return int(nl[k]) if k < nl.size else size

        if fast is None:
            return self._scan_range(chunk, 0, size, first_line, blocks), nl.size
        # lines with "NCCL" that are not validated COLL lines: the regex decides which of them matter, except
        # for lines that provably cannot match (below)
        other = ~np.isin(nccl_line, fast.line, assume_unique=False)
        inert = _inert(buf, words, sp, nl, nccl, nccl_line, single & other)
        check = nccl_line[other & ~inert]
        check = check[np.concatenate(([True], check[1:] != check[:-1]))] if check.size else check
        search = _SCAN_RE.search
        special = [k for k in check.tolist() if search(chunk, line_start(k), line_end(k)) is not None]
        cuts = np.searchsorted(fast.line, np.asarray(special, dtype=np.int64))
        bounds = np.concatenate(([0], cuts, [fast.line.size]))
        sizes = np.diff(bounds)
        n = 0
        pos = 0  # next line not yet processed
        for g in np.flatnonzero(sizes >= _VEC_MIN_ROWS).tolist():
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            first, last = int(fast.line[lo]), int(fast.line[hi - 1])
            if pos < first:
                n += self._scan_range(chunk, line_start(pos), line_start(first), first_line + pos, blocks)
            got = self._vector_run(chunk, first_line, fast, lo, hi, blocks)
            if got is None:  # a prefix the resolver refuses: the regex loop names the torn lines
                got = self._scan_range(chunk, line_start(first), line_start(last + 1), first_line + first, blocks)
            n += got
            pos = last + 1
        if pos < n_lines:
            n += self._scan_range(chunk, line_start(pos), size, first_line + pos, blocks)
        return n, nl.size
