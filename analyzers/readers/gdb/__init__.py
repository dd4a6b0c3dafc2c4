"""gdb: gdb / cuda-gdb ``thread apply all bt`` output read into STACKS: the native stacks only a debugger sees
(gloo's runloop in ``waitRecv``, NCCL's watchdog, a main thread in ``Work::wait``). Stages: :mod:`.scan` (lines ->
threads per process) with :mod:`.frames` (one frame's spelling) -> this module (pid, rank, snapshot per process)."""
from __future__ import annotations

from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import (ColumnMap, ReadResult, ReaderError, Skipped, binary_or_json,
                                              read_text_file)
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.common.stacks import StackRecord, stacks_table
from ranktrace.analyzers.readers.gdb.frames import frame_text
from ranktrace.analyzers.readers.gdb.scan import SNIFF, Scan, scan
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "sniff", "read", "read_doc", "frame_text"]

FORMAT = "gdb"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("Thread N (... (LWP L) ...)", "tid", "int LWP", "null", "gdb 7"),
    ColumnMap('Thread N (... "name")', "thread_name", "str", "null", "gdb 8"),
    ColumnMap("#k [0xADDR in ]FUNC (ARGS) [at FILE:LINE | from LIB]", "frames", "func (file:line) | func (lib) | func",
              "[]", "gdb 7"),
    ColumnMap("Attaching to process N / [Inferior 1 (process N) detached]", "pid", "int", "LWP of thread 1", "gdb 7"),
    ColumnMap("[rankN]: prefix | file name", "rank", "int", "null", "-"),
    ColumnMap("(line of the Thread header)", "line", "int", "-", "-"),
    ColumnMap("Attaching to process N + Reading symbols from EXE (no backtrace)",
              "OBSERVATIONS.kind=process pid detail", "pid=N by=gdb cmd=EXE", "-", "gdb 7"),
)


def sniff(path: Path, head: bytes) -> bool:
    """gdb thread headers (``Thread N (Thread 0x.. (LWP n)``) or ``#k  0x... in func`` frame lines."""
    if binary_or_json(head):
        return False
    return bool(SNIFF.search(head.decode("utf-8", errors="replace")))


def read(path: Path) -> ReadResult:
    """Read gdb ``thread apply all bt`` output (one or several processes) into STACKS.

    Accepted text::

        Thread 4 (Thread 0x7f6b1767e6c0 (LWP 5969) "pt_gloo_runloop"):
        #0  __futex_abstimed_wait_common64 (private=0, ...) at ./nptl/futex-internal.c:57
        #5  0x00007f6b2479c856 in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, ...) () from /.../libtorch_cpu.so
        Thread 2 (LWP 777):                                   (no pthread id)

    Several processes in one file (a loop of ``gdb -p``) are split at ``Attaching to process N`` / ``gdb -p N`` /
    ``[Inferior 1 (process N) detached]``; gdb's start-up chatter, cuda-gdb's focus lines and ``Backtrace stopped``
    lines are ignored; ``[rankN]:`` prefixes are honoured.

    Pasted shapes also read: frames with no ``Thread`` header (a single-thread ``bt``, or a dump cut above its first
    header: one thread per ``#0`` run, ``tid`` null); the ``from lib`` / ``at file:line`` tail gdb wraps onto the
    next line; ``info threads`` tables (one row per thread holding only its current frame); a frame cut before its
    function name (``#4  0x00007fd0``) or inside its library path (``from /usr/lib/python3.9/s``: the frame without
    a library) is skipped / kept without the location; a paste that stops after gdb attached (``Attaching to
    process N``, no backtrace) gives one ``process`` OBSERVATIONS row (pid, the executable gdb read symbols from)
    instead of nothing.

    Columns: ``frames`` innermost first as ``"func (file:line)"`` for frames with source, ``"func (lib.so)"`` for
    ``from lib`` frames (library base name, like py-spy ``--native``), else ``"func"``; C++ parameter lists and call
    arguments are dropped (``c10d::Work::wait (libtorch_cpu.so)``). ``tid`` = LWP (OS thread id), ``thread_name`` =
    the quoted name, ``native`` True, ``thread_state`` ``unknown``, ``pid`` from the attach/detach lines, else the
    LWP of gdb's thread 1 (the main thread), ``snapshot`` ``<file name>[pid N]``.

    Known limits: device (CUDA kernel) backtraces from cuda-gdb are read like host ones (their frame names keep the
    ``<<<grid,block>>>`` launch text); Python frames are only visible as ``_PyEval_EvalFrameDefault`` unless the user
    ran ``py-bt`` (not parsed); a frame line cut in the middle is skipped (reported), so that stack has a gap.
    """
    return read_text_file(path, FORMAT, "binary data (a core file?), not gdb text output", _from_text)


def read_doc(doc: TextDoc) -> ReadResult:
    """The same, on a text input opened by the shared opener (launcher prefixes spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)
    found = scan(path, text)
    skipped: list[Skipped] = []
    if not found.threads:
        if found.section_pid:
            return _attached_only(f, found, skipped)
        raise ReaderError(path, "no gdb thread backtrace found")
    if found.torn:
        no, first = found.torn[0]
        skipped.append(Skipped(f, no, f"{len(found.torn)} torn frame line(s) skipped (stack has a gap), "
                                      f"first: {first[:120]!r}"))
    if found.outside:
        skipped.append(Skipped(f, None, f"{found.outside} unrecognized line(s) outside thread backtraces ignored"))
    return ReadResult(file=f, format=FORMAT, stacks=stacks_table(_per_process(path.name, found)),
                      skipped=tuple(skipped))


def _per_process(name: str, found: Scan) -> list[StackRecord]:
    """Each section's threads with its pid (attach/detach line, else the LWP of gdb's thread 1), snapshot and
    rank (the line's prefix, else the file name's when the file holds one process)."""
    file_rank = rank_from_name(name)
    sections = sorted({s for s, _ in found.threads})
    out: list[StackRecord] = []
    for s in sections:
        members = [t for sec, t in found.threads if sec == s]
        pid = found.section_pid.get(s)
        if pid is None:
            main = [t for t in members if t.ident == "1" and t.tid is not None]
            pid = main[0].tid if main else None
        for t in members:
            if t.rank is None and len(sections) == 1:
                t.rank = file_rank
            t.pid = pid
            t.snapshot = f"{name}[pid {pid}]" if pid is not None else f"{name}[process {s}]"
            out.append(t)
    return out


def _attached_only(f: str, found: Scan, skipped: list[Skipped]) -> ReadResult:
    """gdb attached (``Attaching to process N``, ``gdb -p N``) but the paste stops before any backtrace: the
    process it attached to is all the file says (a ``process`` row)."""
    obs = []
    for s, pid in sorted(found.section_pid.items()):
        exe = found.section_exe.get(s)
        obs.append({"pid": pid, "kind": "process", "name": None, "source": "gdb", "file": f,
                    "detail": f"pid={pid} by=gdb" + (f" cmd={exe}" if exe else "") + " (attached, no backtrace in "
                              "the file)"})
    skipped.append(Skipped(f, None, "gdb attached but the file holds no backtrace (cut after the preamble?)"))
    return ReadResult(file=f, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(skipped))
