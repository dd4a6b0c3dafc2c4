"""Walk a text input's lines into nccl-tests runs: the command, the parameters, the device list, the table rows and
the summary. One pass; lines that are not nccl-tests' (NCCL INFO lines, shell prompts) are passed over."""
from __future__ import annotations

from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_tests import signatures as sig
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["Row", "RankLine", "Run", "scan"]


@dataclass(frozen=True)
class Row:
    line: int
    fields: tuple[str, ...]
    stop: str               # full | oop (stopped after the size columns) | ip (after out-of-place) | cut

    @property
    def size(self) -> int | None:
        return int(self.fields[0]) if self.fields and self.fields[0].isdigit() else None


@dataclass(frozen=True)
class RankLine:
    line: int
    rank: int
    pid: int | None
    host: str | None
    device: int


@dataclass
class Run:
    first_line: int
    binary: str | None = None          # all_reduce (from all_reduce_perf), as the command or the banner says
    binary_line: int | None = None
    failed_in_op: int | None = None    # line of the failure trail's ``<op>.cu:N``: the test failed inside its op
    version: str | None = None
    max_bytes: int | None = None
    ranks: list[RankLine] = field(default_factory=list)
    header_line: int | None = None
    has_root: bool | None = None       # the table has a root column (2.x); None: not known yet
    rows: list[Row] = field(default_factory=list)
    oob: tuple[int, int, bool] | None = None      # (line, out-of-bounds count, OK)
    failures: list[tuple[int, str, str]] = field(default_factory=list)   # (line, NCCL|CUDA, "where: message")
    avg_bw: tuple[int, str] | None = None          # (line, value)

    @property
    def started(self) -> bool:
        return self.header_line is not None or bool(self.rows) or self.oob is not None or bool(self.failures)


def scan(doc: TextDoc) -> tuple[list[Run], list[Skipped]]:
    """
    A row is read by its whitespace-separated fields after mpirun's ``[0]`` tags are removed:
    ``size count type redop [root] | time algbw busbw #wrong | time algbw busbw #wrong``. Where the output stops
    inside the last row decides what it means (``Row.stop``): after the size columns (``oop``) or after the out-of-place
    part (``ip``) the op of that size was running; anywhere else the paste was cut inside a field (``cut``), which says
    nothing about the run.
    """
    runs: list[Run] = []
    skipped: list[Skipped] = []
    run: Run | None = None
    in_table = False

    def current(line: int, fresh: bool = False) -> Run:
        nonlocal run, in_table
        if run is None or (fresh and run.started):
            run = Run(first_line=line)
            runs.append(run)
            in_table = False
        return run

    for ln in doc.lines:
        text = ln.text
        head = text.lstrip()[:1]
        if head == "#" or "Rank" in text[:16] or "Using devices" in text[:24] or " type " in text[:60]:
            if _header_line(ln.no, text, current):
                if sig.TABLE_HEADER.match(text):
                    in_table = True
                continue
        if "failure" in text and "Test " in text:
            m = sig.TEST_FAILURE.search(text)
            if m:
                current(ln.no).failures.append((ln.no, m.group("what"),
                                                f"{m.group('where')} '{m.group('msg').strip()}'"))
                continue
            m = sig.TRAIL.match(text)
            if m:
                r = current(ln.no)
                if sig.op_of_binary(m.group("src")) is not None and r.failures:
                    r.failed_in_op = ln.no          # the failed call was made from the op's own test source
                    if r.binary is None:
                        r.binary, r.binary_line = m.group("src"), ln.no
                continue
        if "_perf" in text and head != "#":
            m = sig.COMMAND.search(text[:2000])
            if m and sig.op_of_binary(m.group("bin")) is not None:
                r = current(ln.no, fresh=True)
                r.binary, r.binary_line = m.group("bin"), ln.no
                continue
        if head.isdigit() or (head == "[" and "]" in text[:8]):
            row = _row(ln.no, text, run.has_root if run is not None else None, in_table)
            if row is not None:
                r = current(ln.no)
                if r.oob is not None:          # rows after a summary: another run without a banner
                    r = current(ln.no, fresh=True)
                if r.rows and r.rows[-1].stop != "full":
                    skipped.append(Skipped(doc.path, r.rows[-1].line, "nccl-tests row cut inside (a later row "
                                                                      "follows): not used"))
                    r.rows.pop()
                if r.has_root is None and row.stop == "full":
                    r.has_root = len(row.fields) == 13
                r.rows.append(row)
                in_table = True
    return runs, skipped


def _header_line(no: int, text: str, current) -> bool:
    """The ``#`` lines and the device list; True when `text` was one of them."""
    m = sig.STARTING.match(text)
    if m:
        r = current(no, fresh=True)
        r.binary, r.binary_line = m.group("bin"), no
        return True
    m = sig.VERSION.match(text)
    if m:
        current(no, fresh=True).version = m.group(1)
        return True
    m = sig.PARAMS.match(text)
    if m:
        r = current(no)
        if r.started:
            r = current(no, fresh=True)
        r.max_bytes = int(m.group(4))
        return True
    if sig.USING.match(text):
        current(no)
        return True
    m = sig.RANK.match(text)
    if m:
        current(no).ranks.append(RankLine(no, int(m.group("rank")), int(m.group("pid")) if m.group("pid") else None,
                                          m.group("host"), int(m.group("dev"))))
        return True
    m = sig.TABLE_HEADER.match(text)
    if m:
        r = current(no)
        r.header_line = no
        r.has_root = " root " in f" {m.group('rest')} "
        return True
    m = sig.OOB.match(text)
    if m:
        r = current(no)
        r.oob = (no, int(m.group(1)), m.group(2) != "FAILED" and int(m.group(1)) == 0)
        return True
    m = sig.AVG_BW.match(text)
    if m:
        current(no).avg_bw = (no, m.group(1))
        return True
    return False


def _row(no: int, text: str, has_root: bool | None, in_table: bool) -> Row | None:
    """A result row (or the part of one the output holds); None when `text` is not one."""
    if "[" in text:
        text = sig.MPI_TAG.sub(" ", text[:4000])
    if not sig.ROW_START.match(text):
        return None
    fields = tuple(text.split()[:20])
    if not all(f.isdigit() for f in fields[:2]):
        return None
    typed = len(fields) >= 4 and fields[2][:1].isalpha() and fields[3][:1].isalpha()
    if not typed and not in_table:
        return None                # a bare number outside a table is not a row
    base = 5 if has_root or (has_root is None and len(fields) in (5, 9, 13)) else 4
    n = len(fields)
    stop = {base: "oop", base + 4: "ip", base + 8: "full"}.get(n, "cut")
    if stop != "cut" and not typed:
        stop = "cut"
    return Row(no, fields, stop)
