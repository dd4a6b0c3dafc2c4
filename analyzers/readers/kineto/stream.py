"""Streaming JSON for Kineto traces: the top-level keys and the ``traceEvents`` one element at a time, read in 1 MiB
chunks, so no trace is ever held whole; knows nothing of profiler events, only how a cut or corrupt file looks."""
from __future__ import annotations

import codecs
import json
import re
import sys
import zlib
from typing import IO, Any, Iterator

_CHUNK = 1 << 20
_MAX_VALUE_CHARS = 64 << 20       # one JSON value larger than this is treated as corrupt, not as "read more"

__all__ = ["Truncated", "NotJson", "JsonStream", "Gunzip", "Capped"]

_WS = re.compile(r"[ \t\r\n]*")


class Gunzip:
    """A gzip stream as a file to ``read(n)`` from: what a stream cut short still holds is returned up to the cut
    (``cut`` says so; gzip.GzipFile raised and lost the chunk it was decoding, up to 1 MiB), concatenated members
    are read, and no more than ``cap`` bytes come out (``capped``): a 4 MB gzip bomb inflates to 4 GiB of spaces."""

    def __init__(self, raw: IO[bytes], cap: int) -> None:
        self.raw, self.cap = raw, cap
        self.out = 0
        self.cut = self.capped = False
        self.damaged: str | None = None
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""
        self._done = False
        self._started = False   # the current member has begun (its end not seen yet)

    def read(self, n: int) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < n and not self._done:
            if self.out >= self.cap:
                self.capped = self._done = True
                break
            if not self._pending:
                self._pending = self.raw.read(1 << 16)
                if not self._pending:
                    self.cut = self._started   # the data ended inside a member
                    self._done = True
                    break
            try:
                data = self._d.decompress(self._pending, min(n - got, self.cap - self.out))
            except zlib.error as e:
                self.damaged, self._done = str(e), True
                break
            self._started = True
            self._pending = self._d.unconsumed_tail
            if self._d.eof:  # end of one member: another may follow (gzip files may be concatenated)
                self._pending = self._d.unused_data + self._pending
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._started = False
            chunks.append(data)
            got += len(data)
            self.out += len(data)
        return b"".join(chunks)

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> "Gunzip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Capped:
    """A plain file as a file to ``read(n)`` from, no more than ``cap`` bytes of it (``capped``: the file is larger,
    the rest is not read). #31: a plain trace had no byte bound, its time grew with its size."""

    def __init__(self, raw: IO[bytes], cap: int, size: int) -> None:
        self.raw, self.cap, self.size = raw, cap, size
        self.out = 0
        self.capped = size > cap

    def read(self, n: int) -> bytes:
        if self.out >= self.cap:
            self.capped = self.capped or bool(self.raw.read(1))   # a pipe or a file that grew: more is there
            return b""
        data = self.raw.read(min(n, self.cap - self.out))
        self.out += len(data)
        return data

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> "Capped":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Truncated(Exception):
    """The input ended inside a JSON value."""


class NotJson(Exception):
    """The input is not JSON (or not a trace's JSON) from `offset` on."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class JsonStream:
    """Incremental reader of one top-level JSON object (or array) that yields the ``traceEvents`` one by one.

    Items: ``("meta", key, value)`` for each top-level key other than ``traceEvents``, ``("event", index, dict)``
    for each element of ``traceEvents`` (or of a top-level array). Only the value being decoded is buffered.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.decoder = json.JSONDecoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # chars dropped from the front of buf
        self.eof = False
        self.nuls = 0     # NUL bytes dropped (the reader says so)

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.raw.read(_CHUNK)
        except (EOFError, zlib.error, OSError):  # cut gzip stream / bad CRC: treat as end of data
            chunk = b""
        if b"\0" in chunk:  # a hole (crash, copytruncate): NULs never belong to JSON
            self.nuls += chunk.count(b"\0")
            chunk = chunk.replace(b"\0", b"")
        if not chunk:
            self.eof = True
            self.buf += self.utf8.decode(b"", final=True)
            return False
        if self.pos > _CHUNK:
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += self.utf8.decode(chunk)
        return True

    def _peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # in C: a run of blank space is skipped at once
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise Truncated(f"at char {self.consumed + self.pos}")

    def _expect(self, chars: str) -> str:
        c = self._peek()
        if c not in chars:
            raise NotJson(f"expected {' or '.join(repr(x) for x in chars)}, found {c!r}", self.consumed + self.pos)
        self.pos += 1
        return c

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:  # [[[[... 100k deep: one line naming the bound, never "a ranktrace bug"
                raise NotJson(f"a JSON value nested deeper than the parser's bound ({sys.getrecursionlimit()} "
                              "levels): corrupt, or not a trace", self.consumed + self.pos) from None
            except json.JSONDecodeError as e:
                if len(self.buf) - self.pos > _MAX_VALUE_CHARS:
                    raise NotJson(f"one JSON value runs past {_MAX_VALUE_CHARS >> 20} MiB without ending ({e.msg}): "
                                   "corrupt, or not a trace", self.consumed + e.pos) from e
                if not self._fill():
                    if e.pos >= len(self.buf) - 1 or "Unterminated" in e.msg:
                        raise Truncated(f"at char {self.consumed + e.pos}") from e
                    raise NotJson(f"invalid JSON ({e.msg})", self.consumed + e.pos) from e
                continue
            if end >= len(self.buf) and not self.eof and self._fill():
                continue  # a number may continue in the next chunk: decode again with more text
            self.pos = end
            return value

    def items(self) -> Iterator[tuple[Any, ...]]:
        first = self._expect("{[")
        if first == "[":
            yield from self._array_events()
            return
        if self._peek() == "}":
            return
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise NotJson("object key is not a string", self.consumed + self.pos)
            self._expect(":")
            if key == "traceEvents" and self._peek() == "[":
                self.pos += 1
                yield ("meta", "traceEvents", None)
                yield from self._array_events()
            else:
                yield ("meta", key, self._value())
            if self._expect(",}") == "}":
                return

    def _array_events(self) -> Iterator[tuple[Any, ...]]:
        index = 0
        if self._peek() == "]":
            self.pos += 1
            return
        while True:
            yield ("event", index, self._value())
            index += 1
            if self._expect(",]") == "]":
                return
