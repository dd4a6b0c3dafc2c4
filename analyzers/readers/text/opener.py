"""The one way a text input is opened: bytes (plain or gzip) -> lines every family's parser can read. Everything
readable is kept; what had to be dropped or changed (NUL holes, mixed encodings, ANSI colours, wrapped or giant
lines) becomes a note naming the file and line, never an error."""
from __future__ import annotations

import os
import re
import stat
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

from ranktrace.analyzers.readers.base import ReaderError, Skipped
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.text.holes import MAX_SCAN_BYTES, Holes, read_past_holes, strip_nuls
from ranktrace.analyzers.readers.text.prefixes import (SRUN_PREFIX, LinePrefix, split_prefixes, strip_ansi,
                                                       strip_collector)

__all__ = ["Line", "TextDoc", "open_text", "text_of_bytes", "canonical_prefix", "MAX_TEXT_BYTES", "MAX_LINE_CHARS",
           "MAX_TEXT_LINES"]

MAX_TEXT_BYTES = 256 << 20   # a text input larger than this is read up to here (notes say so)
MAX_LINE_CHARS = 64 << 10    # a line is examined up to here: every pattern stays linear in what it reads
MAX_TEXT_LINES = 2_000_000   # lines of one text input read (its first and last half: _numbering)
_NO_PREFIX = LinePrefix()


@dataclass(frozen=True)
class Line:
    """One line of a text input as the family parsers see it."""

    no: int                # 1-based line number in the file (a joined wrapped line keeps its first line's)
    text: str              # the message: ANSI codes and launcher prefixes removed
    prefix: LinePrefix     # who wrote it, as far as the prefixes say
    raw: str = ""          # the line as the job printed it, for parsers of their own prefixes (ANSI codes, a
    #                        quote and a log collector's stamp or pod prefix removed: those came after the job)

    @property
    def rank(self) -> int | None:
        return self.prefix.rank


@dataclass
class TextDoc:
    """A text input, opened once and shared by every family that finds its signatures in it."""

    path: str
    lines: list[Line]
    name_rank: int | None = None                 # the rank the file name states (rank3.log, tp1, ...)
    notes: list[Skipped] = field(default_factory=list)
    srun: bool = False                           # lines carry srun -l task prefixes

    def canonical_text(self, with_pid: bool = False) -> str:
        """The lines with one prefix spelling every parser knows (``[rankN]:``, ``[defaultN]:``; with `with_pid`
        also ``(tag pid=N, ip=H)``) in front of the message; same line count as the file, so line numbers stay
        true (the messages of one glued line stay on it, each with its own prefix)."""
        return self._text(lambda ln: canonical_prefix(ln.prefix, with_pid) + ln.text, " ")

    def raw_text(self) -> str:
        """The lines as written (ANSI codes removed, wrapped lines joined), same line count as the file."""
        return self._text(lambda ln: ln.raw, "")

    def _text(self, line_text: "Callable[[Line], str]", glue: str) -> str:
        out: list[str] = []
        last = 0
        for ln in self.lines:
            if ln.no == last and out:  # a second message glued on the same line of the file
                out[-1] += glue + line_text(ln)
                continue
            # the empty lines before it as one string (a gap of millions of lines: _numbering), not one item each
            out.append("\n" * (ln.no - last - 1) + line_text(ln) if ln.no > last + 1 else line_text(ln))
            last = ln.no
        return "\n".join(out) + "\n"

    def ranks(self) -> set[int]:
        return {ln.prefix.rank for ln in self.lines if ln.prefix.rank is not None}


def canonical_prefix(p: LinePrefix, with_pid: bool = False) -> str:
    """``[rankN]:`` / ``[defaultN]:`` (and ``(tag pid=N, ip=H) `` with `with_pid`) for a line's prefix facts."""
    if p is _NO_PREFIX:
        return ""
    s = ""
    if p.rank is not None:
        s += f"[rank{p.rank}]:"
    elif p.local_rank is not None:
        s += f"[default{p.local_rank}]:"
    if with_pid and p.pid is not None:
        s += f"({p.tag or 'worker'} pid={p.pid}" + (f", ip={p.host}" if p.host else "") + ") "
    return s


def open_text(path: str | Path) -> TextDoc:
    """Open `path` as text. ReaderError only when it cannot be read at all (missing, a FIFO, a directory)."""
    path = Path(path)
    data, notes = _read_bytes(path)
    return text_of_bytes(str(path), data, notes)


def text_of_bytes(name: str, data: bytes, notes: list[Skipped] | None = None) -> TextDoc:
    """A TextDoc of bytes already read (`name` is what notes and evidence call the input)."""
    notes = list(notes or [])
    if b"\x00" in data:  # bytes that did not come through _read_bytes (gzip, an archive member, a caller's)
        holes = Holes()
        kept = bytearray()
        view = memoryview(data)
        for at in range(0, len(data), 1 << 20):
            kept += strip_nuls(view[at:at + (1 << 20)], at, len(kept), holes)
        data = bytes(kept)
        notes.extend(holes.notes(name, data))
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in data:
        bad = text[:text.index("\ufffd")].count("\n") + 1
        notes.append(Skipped(name, bad, "bytes that are not UTF-8 (mixed encodings) read as replacement characters"))
    raw_lines, number = _split_lines(name, text, notes)
    cut = 0
    lines: list[str] = []
    for i, raw in enumerate(raw_lines):
        if len(raw) > MAX_LINE_CHARS:
            cut += 1
            if cut == 1:
                notes.append(Skipped(name, i + 1, f"line of {len(raw):,} characters examined up to "
                                                  f"{MAX_LINE_CHARS:,} (and any other such line)"))
            raw = raw[:MAX_LINE_CHARS]
        if "\r" in raw:  # progress bars rewrite a line with \r: what a terminal shows is the last segment
            raw = raw.rstrip("\r")
            if "\r" in raw:
                raw = raw[raw.rindex("\r") + 1:] or raw
        lines.append(_unmarked(strip_ansi(raw)))
    lines = _dedented(_unquoted(lines))
    srun = _srun_prefixed(lines)
    srun_ranks = not srun or _srun_tasks(lines) > 1
    joined = _unwrap(lines)
    split: list[tuple[int, LinePrefix, str, str]] = []
    for i, s in enumerate(joined):
        if s is None or not s.strip():
            continue
        pieces = _unglue_srun(s)
        for k, piece in enumerate(pieces or _unglue(s)):
            prefix, rest = split_prefixes(
                piece, srun=srun or (pieces is not None and (k > 0 or SRUN_PREFIX.match(piece) is not None)),
                srun_ranks=srun_ranks)
            split.append((i + 1, prefix, rest, strip_collector(piece)))
    out = [Line(number(no), rest, prefix if prefix != _NO_PREFIX else _NO_PREFIX, s)
           for no, prefix, rest, s in _join_soft_wraps(split, lines)]
    return TextDoc(name, out, rank_from_name(os.path.basename(name)), notes, srun)


def _split_lines(name: str, text: str, notes: list[Skipped]) -> tuple[list[str], Callable[[int], int]]:
    """The text's lines, and the file line number of each one's 1-based position. Past MAX_TEXT_LINES lines (a line
    costs ~200 bytes once split and prefixed: 125M short lines took 8 GB and never ended), only the first and last
    MAX_TEXT_LINES // 2 are split, with one blank line between them so nothing is joined across the gap, and a
    note says which lines were not read."""
    total = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if total <= MAX_TEXT_LINES:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return lines, lambda k: k
    half = MAX_TEXT_LINES // 2
    head_end = -1
    for _ in range(half):
        head_end = text.index("\n", head_end + 1)
    tail_start = len(text) - (1 if text.endswith("\n") else 0)
    for _ in range(half):  # the newline before the last `half` lines, from the end
        tail_start = text.rindex("\n", 0, tail_start)
    tail = text[tail_start + 1:].split("\n")
    if tail and tail[-1] == "":
        tail.pop()
    notes.append(Skipped(name, half + 1, f"{total:,} lines: the first and last {half:,} are read, lines "
                                         f"{half + 1:,}-{total - half:,} are not (the bound: {MAX_TEXT_LINES:,} "
                                         f"lines per text input)"))
    return text[:head_end].split("\n") + [""] + tail, lambda k: k if k <= half else k - half - 1 + (total - half)


def _join_soft_wraps(split: list[tuple[int, LinePrefix, str, str]],
                     physical: list[str]) -> list[tuple[int, LinePrefix, str, str]]:
    """In a file whose lines carry launcher prefixes, a bare line right after a long prefixed one is that line
    wrapped by a terminal or a ticket (``...Process group watchdog thread terminated`` / ``with exception: [Rank 6]
    Watchdog caught ...``): it is joined to it, so a message is read whole. A bare line that starts like a record of
    its own (a stack frame, a traceback line, a bracketed tag) is never joined."""
    if len(split) < 2:
        return split
    prefixed = sum(1 for _no, p, _r, _s in split if p != _NO_PREFIX)
    if prefixed < 0.4 * len(split):
        return split
    out: list[tuple[int, LinePrefix, str, str]] = []
    for no, prefix, rest, s in split:
        if out and prefix == _NO_PREFIX and not _OWN_RECORD.match(rest):
            pno, pprefix, prest, ps = out[-1]
            last_physical = physical[no - 2] if no >= 2 else ""
            if pprefix != _NO_PREFIX and len(last_physical) >= 100:
                glue = "" if prest.endswith(" ") or _cut_mid_token(prest, rest.lstrip()) else " "
                out[-1] = (pno, pprefix, prest + glue + rest.lstrip(), ps + s)
                continue
        out.append((no, prefix, rest, s))
    return out


def _cut_mid_token(prev: str, nxt: str) -> bool:
    """The wrap cut a number or a word in two (``NumelOut=1`` / ``29280,``, ``NCCL wor`` / ``k: 151721``), so the
    halves join without a space; a wrap at a space between words (``terminated`` / ``with``) gets the space back."""
    if not prev or not nxt:
        return False
    if prev[-1].isdigit() and nxt[0].isdigit():
        return True
    return prev[-1].isalpha() and _WORD_TAIL.match(nxt) is not None


_WORD_TAIL = re.compile(r"[a-z]{1,3}[^\w\s]")


_OWN_RECORD = re.compile(r"\s{0,200}(?:File \"|frame #\d|#\d+ |Thread |Traceback|\[|\(|[A-Z][\w.]{0,200}(?:Error|Exception):)")


_GLUED = re.compile(r"(?<=\S)(?=\[(?:rank|default)\d{1,6}\]:)")


def _unglue(s: str) -> list[str]:
    """Split a line where a torchrun prefix starts mid-line: a tqdm bar (no newline) glued to the next log line."""
    if "]:" not in s or ("[rank" not in s[1:] and "[default" not in s[1:]):
        return [s]
    parts = [p for p in _GLUED.split(s) if p]
    return parts if len(parts) > 1 else [s]


#: an srun -l task prefix (``10: ``) mid-line, after a space: a paste whose newlines were lost keeps the prefixes
_GLUED_SRUN = re.compile(r"(?<=\S)(?<!GPU)(?<![Rr]ank)(?<![Dd]evice)(?<![Nn]ode)(?<![Ww]orker)(?<!cuda)(?<![Ss]tep)"
                         r" (\d{1,6}): (?=\S)")


def _unglue_srun(s: str) -> list[str] | None:
    """Split a line whose newlines were lost in a paste (``File "..", line 1906, in broadcast 10: work = ...
    10: torch.distributed.DistBackendError: ...``): the same srun task prefix recurs mid-line at least twice, so each
    occurrence starts a line of its own. None when the line is no such paste."""
    if len(s) < 80 or ": " not in s:
        return None
    marks = list(_GLUED_SRUN.finditer(s))
    if len(marks) < 2:
        return None
    task, n = Counter(m.group(1) for m in marks).most_common(1)[0]
    if n < 2:
        return None
    cuts = [m.start() + 1 for m in marks if m.group(1) == task]
    pieces = [s[a:b].rstrip() for a, b in zip([0] + cuts, cuts + [len(s)])]
    return [p for p in pieces if p.strip()] or None


def _read_bytes(path: Path) -> tuple[bytes, list[Skipped]]:
    try:
        st = path.stat()
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if stat.S_ISDIR(st.st_mode):
        raise ReaderError(path, "a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ReaderError(path, "not a regular file (a FIFO, socket or device): not read, it could block forever")
    notes: list[Skipped] = []
    holes = Holes()
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                return _gunzip(path, f, notes), notes
            # NUL holes (a crash, copytruncate) are dropped as they are read, so they count against no bound of
            # the text and a hole of any size leaves the text after it readable
            data, passed, scanned = read_past_holes(f, MAX_TEXT_BYTES, holes)
    except OSError as e:
        raise ReaderError(path, f"cannot read: {e.strerror or e}") from e
    if len(data) > MAX_TEXT_BYTES:
        data = data[:MAX_TEXT_BYTES]
    notes.extend(holes.notes(str(path), data))
    if passed:
        notes.append(Skipped(str(path), None, f"only the first {MAX_TEXT_BYTES >> 20} MiB were read"))
    if scanned:
        notes.append(Skipped(str(path), None, f"only the first {MAX_SCAN_BYTES >> 20} MiB were read (NUL bytes "
                                              "stored on disk included: the bound on what one text input reads)"))
    return data, notes


def _gunzip(path: Path, f, notes: list[Skipped]) -> bytes:
    """Gzip text up to MAX_TEXT_BYTES of output; a truncated stream keeps everything before the cut."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    while len(out) <= MAX_TEXT_BYTES:
        chunk = f.read(1 << 20)
        if not chunk:
            if not d.eof:
                notes.append(Skipped(str(path), None, "gzip stream cut short: everything before the cut is used"))
            break
        try:
            out += d.decompress(chunk, MAX_TEXT_BYTES + 1 - len(out))
            while d.unconsumed_tail and len(out) <= MAX_TEXT_BYTES:
                out += d.decompress(d.unconsumed_tail, MAX_TEXT_BYTES + 1 - len(out))
        except zlib.error as e:
            notes.append(Skipped(str(path), None, f"gzip data damaged ({e}): everything before it is used"))
            break
        if d.eof:
            break
    if len(out) > MAX_TEXT_BYTES:
        notes.append(Skipped(str(path), None, f"only the first {MAX_TEXT_BYTES >> 20} MiB of the decompressed "
                                              "text were read"))
        del out[MAX_TEXT_BYTES:]
    return bytes(out)


_QUOTED = re.compile(r"(?:>[ \t]?)+")


#: Markdown a ticket wraps around a pasted line: an inline-code backtick at either end (not a ``` fence), and bold
#: markers a reporter put around the words that matter (``**Watchdog caught collective operation timeout:**``) --
#: only in pairs, a word inside them and none glued outside, so a C++ ``char**`` stays as it is
_TICK_ENDS = re.compile(r"^`(?!`)|(?<!`)`\s*$")
_BOLD = re.compile(r"(?<![\w*])\*\*(?=[^\s*])(.{1,300}?)(?<=[^\s*])\*\*(?![\w*])")


def _unmarked(line: str) -> str:
    """`line` without the Markdown marks of a paste (see _BOLD); unchanged when it has none (the usual case)."""
    if "`" in line[:1] or line.rstrip().endswith("`"):
        line = _TICK_ENDS.sub("", line)
    if "**" in line:
        line = _BOLD.sub(r"\1", line)
    return line


def _unquoted(lines: list[str]) -> list[str]:
    """A file quoted whole (``> `` in front of most lines: an e-mail reply, a Markdown quote in a ticket): the
    markers come off first, so a line a terminal wrapped inside the quote is joined as it would be outside it.
    (split_prefixes peels a quote off a single line too.)"""
    body = [s for s in lines if s.strip()]
    if not body or sum(1 for s in body if s.startswith(">")) < 0.6 * len(body):
        return lines
    return [_QUOTED.sub("", s, count=1) if s.startswith(">") else s for s in lines]


def _dedented(lines: list[str]) -> list[str]:
    """A file indented whole by 4 or more spaces (a Markdown code block, a quoted reply): that common indentation
    comes off, so a record that starts a line (``Thread 0x...``, ``Traceback``) starts it again; what is indented
    inside the block stays indented."""
    body = [s for s in lines if s.strip()]
    if not body or not body[0].startswith("    "):
        return lines
    common = min(len(s) - len(s.lstrip(" ")) for s in body)
    if common < 4:
        return lines
    return [s[common:] if s.strip() else s for s in lines]


def _srun_prefixed(lines: list[str]) -> bool:
    """Most lines start with ``N: `` (srun -l, pdsh): those are task prefixes, not message text."""
    body = [s for s in lines if s.strip()]
    if len(body) < 3:
        return False
    hits = sum(1 for s in body if SRUN_PREFIX.match(strip_collector(s)))  # a collector stamps in front of srun
    return hits >= 0.6 * len(body)


def _srun_tasks(lines: list[str]) -> int:
    """How many distinct srun task numbers the lines carry (one: a single task wrote the file, its number is no
    rank)."""
    tasks = set()
    for s in lines:
        m = SRUN_PREFIX.match(strip_collector(s))
        if m:
            tasks.add(m.group(1))
            if len(tasks) > 1:
                break
    return len(tasks)


def _unwrap(lines: list[str]) -> list[str | None]:
    """Join lines a terminal wrapped at a fixed width: when most long lines have exactly one width W, a line of
    width W that does not end in a space continues on the next line, if that line reads as the rest of a word or
    sentence (``_continues``). The continuation's slot becomes None so line numbers stay those of the file.

    Records of one fixed width are common and are no wrap: a table (nvidia-smi, nccl-tests rows), the same log
    message from every rank (``[rank3]:[E626 ...] ... before timing out.``). Their next line starts a record of its
    own (``[``, a space, an upper-case word, a date), so it is never joined; a wrapped line that a terminal happened
    to cut before such a character stays two lines (a torn line, which every family tolerates)."""
    lengths = Counter(len(s) for s in lines if len(s) >= 60)
    if not lengths:
        return list(lines)
    width, n = lengths.most_common(1)[0]
    long_lines = sum(lengths.values())
    longer = sum(1 for s in lines if len(s) > width)  # a fence or a quote glued to a line or two is no objection
    if n < 3 or n < 0.3 * long_lines or longer > max(2, 0.05 * len(lines)):
        return list(lines)
    out: list[str | None] = list(lines)
    i = 0
    while i < len(out):
        s = out[i]
        j = i
        while s is not None and len(lines[j]) == width and not lines[j].endswith(" ") and j + 1 < len(lines) \
                and _continues(lines[j], lines[j + 1], lines[i]):
            j += 1
            s = s + lines[j]
            out[j] = None
        out[i] = s
        i = j + 1
    return out


_CONTINUATION_PUNCT = frozenset(",.;:)]}/_-=\"'")


def _continues(prev: str, nxt: str, first: str) -> bool:
    """`nxt` reads as the rest of `prev` cut by a terminal: it does not start like the record the chain began with
    (`first`: the same two characters start the next record of a log: ``[r``, ``no`` of ``node1:12:34``, a
    table's spaces), and it starts in lower case, with punctuation that cannot start a record, with one space before
    a word, or with a digit after a digit / a capital after a capital (a number or word cut in two)."""
    if not nxt or nxt[:2] == first[:2]:
        return False
    c, last = nxt[0], prev[-1:]
    if c.islower() or c in _CONTINUATION_PUNCT:
        return True
    if c == " ":
        return nxt[1:2] not in ("", " ", "\t")
    if c.isupper() and _LEVEL.match(nxt):  # ``...closing signal SIGTERM`` then ``ERROR:torch...``: a new record
        return False
    return (c.isdigit() and last.isdigit()) or (c.isupper() and last.isupper())


_LEVEL = re.compile(r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE)\b")
