"""py-spy: ``py-spy dump`` output (text, ``--json``, SGLang-wrapped) and the in-rank agent's JSON dumps, read into
STACKS: where each rank's threads sat. Stages: :mod:`.scan_text` / :mod:`.scan_json` (a dump -> stack records) ->
:mod:`.rows` (pid, rank, snapshot; ``process`` observations)."""
from __future__ import annotations

import re
from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import (ColumnMap, ReadResult, ReaderError, Skipped, binary_content,
                                              decode_text, empty_file, read_file_bytes, without_nuls)
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.common.stacks import stacks_table
from ranktrace.analyzers.readers.pyspy.rows import process_rows, thread_records
from ranktrace.analyzers.readers.pyspy.scan_json import scan_json
from ranktrace.analyzers.readers.pyspy.scan_text import ANSI, classify_error, scan_text
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "sniff", "read", "read_doc", "classify_error"]

FORMAT = "pyspy"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("Process N / JSON pid", "pid", "int", "null", "0.3"),
    ColumnMap("Thread <decimal> / JSON os_thread_id", "tid", "int (OS tid)", "null", "0.3"),
    ColumnMap('Thread ...: "name" / JSON thread_name', "thread_name", "str", "null", "0.3"),
    ColumnMap("(idle|active|active+gil) / JSON active, owns_gil", "thread_state", "str", "unknown", "0.3"),
    ColumnMap("frame lines / JSON frames[name, short_filename, line]", "frames", "list[str] innermost first", "[]",
              "0.3"),
    ColumnMap("native frames present / SGLang --native", "native", "bool", "False", "0.3"),
    ColumnMap("[rankN]: prefix | cmdline rankN/TPn | file name", "rank", "int", "null", "-"),
    ColumnMap("file name + pid (+#k)", "snapshot", "str", "-", "-"),
    ColumnMap("(line of the Thread header; JSON: index of the thread)", "line", "int", "-", "-"),
    ColumnMap("Process N: cmdline", "OBSERVATIONS.kind=process detail", "pid=N by=pyspy cmd=<redacted>", "-", "0.3"),
)

_SNIFF_TEXT = re.compile(
    r"(?m)(^\S{0,80}?[ \t]{0,40}Process \d+: .*\r?\n\S{0,80}?[ \t]{0,40}Python v\d"
    r"|Pyspy dump for PID \d+|Pyspy failed|All pyspy dump attempts failed"
    r"|^\S{0,80}?[ \t]{0,40}Thread (?:0x[0-9a-fA-F]+|\d+) \((?:idle|active\+gil|active)\)"
    r"|^Permission Denied: Try running again with elevated permissions"
    r"|^Error: Failed to (?:get process executable name|find python version|get stack traces))"
)


def sniff(path: Path, head: bytes) -> bool:
    """py-spy text headers / SGLang wrapper / py-spy error text, or a JSON array of py-spy thread objects."""
    if binary_content(head):
        return False
    head = without_nuls(head)[0]
    h = head.lstrip()
    if h.startswith(b"["):
        if b'"thread_id"' in head and b'"frames"' in head and (b'"owns_gil"' in head or b'"os_thread_id"' in head):
            return True
    if h[:1] in (b"{", b"\x80"):
        return False
    return bool(_SNIFF_TEXT.search(ANSI.sub("", head.decode("utf-8", errors="replace"))))


def read(path: Path) -> ReadResult:
    """Read one file of py-spy output (text or JSON) into STACKS (and ``process`` OBSERVATIONS).

    Accepted shapes (formats.md §4):

    * text: ``Process N: cmdline`` / ``Python vX.Y.Z (exe)`` / ``[Parent Process N: cmd]`` headers, then
      ``Thread <tid|0xident> (idle|active|active+gil)[: "name"]`` and 4-space frame lines ``func (file:line)``
      (``func (lib.so)`` for native frames); ``--locals`` lines (8+ spaces) are skipped; several processes in one
      file (``--subprocesses`` with ``----`` separators, or dumps concatenated by a script); trimmed dumps (a thread
      header and only its top frames, with or without a ``Process`` header);
    * SGLang's watchdog wrapping: ``[ts] Pyspy dump for PID <pid>[ (<cmd>)]:`` followed by the dump, and its failure
      lines ``Pyspy failed to dump PID <pid>. Error: ...`` / ``Pyspy failed (<cmd>). Error: ...`` /
      ``All pyspy dump attempts failed for PID <pid>.``; other log lines in the file are ignored (counted once);
    * what people paste around and instead of a dump: the command above it (``$ py-spy dump --pid 123``: the pid of
      a dump cut before its ``Process`` line), a trimmed stack written at the margin with no thread header or with
      its frames' indentation lost (read as one thread, ``thread_state`` unknown, ``tid`` null);
    * any line may carry a launcher prefix (``[rank3]:``, ``[1,3]<stdout>:``); a common indentation (dumps pasted
      into markdown) is removed;
    * ``--json``: an array of thread objects (a truncated array keeps every complete thread); files named
      ``agent-<pid>.json`` are the in-rank agent's (``source="agent"``);
    * py-spy's own error output (stderr saved to a file): no rows, one ``Skipped`` naming py-spy's message and its
      class (permission_denied / no_such_process / not_python / other).

    Columns: ``frames`` innermost first exactly as py-spy's text prints them; ``thread_state`` from the header (JSON:
    ``owns_gil`` → ``active+gil``, ``active`` → ``active``, else ``idle``); ``tid`` = OS thread id when py-spy
    printed a decimal id (a ``0x`` id is a Python thread ident and gives null); ``native`` = the dump holds native
    frames; ``snapshot`` = ``<file name>[pid N]`` (``#k`` appended when the same pid is dumped again in one file).
    Rank: launcher prefix on the lines > ``rankN`` / ``TPn`` in the process command line > the file name, the latter
    only when the file holds one process; otherwise null (the lead maps pid → rank).

    Known limits: SGLang's timestamps are local time without a zone, so ``wall_ns`` stays null; ``idle`` is py-spy's
    OS level guess, not a statement about progress; a text dump's thread order is not meaningful.
    """
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT)
    text = decode_text(path, data, "binary data, not py-spy output")
    res = _from_text(path, text)
    nuls = data.count(b"\x00")
    if nuls:
        hole = Skipped(f, None, f"{nuls} NUL byte(s) dropped (a hole left by a crash or a copy)")
        res = ReadResult(res.file, res.format, res.version, res.events, res.stacks, res.observations,
                         (hole, *res.skipped), res.world_size)
    return res


def read_doc(doc: TextDoc) -> ReadResult:
    """The py-spy dumps found in a text input opened by the shared opener (prefixes already spelt one way)."""
    return _from_text(Path(doc.path), doc.canonical_text())


def _from_text(path: Path, text: str) -> ReadResult:
    f = str(path)
    file_rank = rank_from_name(path.name)

    if text.lstrip().startswith("["):
        head = text.lstrip()[:4096]
        if '"frames"' in head or '"thread_id"' in head:
            records, json_skipped = scan_json(path, text.lstrip(), file_rank)
            return ReadResult(file=f, format=FORMAT, stacks=stacks_table(records), skipped=tuple(json_skipped))
    if text.lstrip().startswith("{"):
        raise ReaderError(path, "JSON object, not py-spy output (py-spy --json writes an array)")

    procs, skipped, outside = scan_text(path, text)
    if not procs and not any(s.reason.startswith(("py-spy failed", "all py-spy")) for s in skipped):
        raise ReaderError(path, "no py-spy dump or py-spy error message found")
    for p in procs:
        if not p.threads:
            skipped.append(Skipped(f, p.line, f"py-spy dump of pid {p.pid} has no thread (cut after its header?)"))
    if outside:
        skipped.append(Skipped(f, None, f"{outside} line(s) outside py-spy dumps ignored (log text)"))
    return ReadResult(file=f, format=FORMAT, stacks=stacks_table(thread_records(path.name, procs, file_rank)),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, process_rows(f, procs, file_rank)),
                      skipped=tuple(skipped))
