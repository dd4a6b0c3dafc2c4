"""flight_recorder: PyTorch Flight Recorder dumps (pickle or JSON, gloo or NCCL, FR 2.x) read into EVENTS: each
rank's per-group op counters, the cheapest cross-rank evidence a hung job leaves. Stages, as torch's own analyzer:
:mod:`.load` (bytes -> raw dict, no pickle globals) -> :mod:`.records` (typed entries) -> :mod:`.rows`."""
from __future__ import annotations

import re
from pathlib import Path

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, Skipped, empty_file, read_file_bytes
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.flight_recorder.load import load_dump
from ranktrace.analyzers.readers.flight_recorder.records import (EntryWindow, Expander, FrEntry, parse_entry,
                                                                  pg_configs, text)
from ranktrace.analyzers.readers.flight_recorder.rows import dump_row, entry_rows, group_rows, status_rows, world_size

__all__ = [
    "FORMAT",
    "FIELD_MAP",
    "FrEntry",
    "sniff",
    "read",
    "rank_from_filename",
]

FORMAT = "flight_recorder"
_MAX_ENTRY_LINES = 20   # entries that cannot be used said one by one; the rest counted in one line


#: How FR fields become EVENTS columns (``since`` = first FR version seen with the field, formats.md §3).
FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("profiling_name", "name", "str -> canonical_op()", "required", "2.0"),
    ColumnMap("profiling_name prefix", "backend", "str (nccl|gloo|xccl)", "null", "2.0"),
    ColumnMap("is_p2p / profiling_name", "category", "p2p | collective", "collective", "2.4"),
    ColumnMap("process_group[0]", "group", "str", "null", "2.0"),
    ColumnMap("process_group[1]", "group_desc", "str", "null", "2.0"),
    ColumnMap("pg_config[group].ranks", "group_ranks", "list[int] via ast.literal_eval", "null", "2.0"),
    ColumnMap("collective_seq_id | p2p_seq_id", "seq", "int", "null", "2.0"),
    ColumnMap("collective_seq_id | p2p_seq_id", "backend_seq", "int", "null", "2.0"),
    ColumnMap("state", "state", "scheduled|started|completed", "null", "2.0"),
    ColumnMap("time_created_ns", "wall_ns", "int ns since epoch", "null", "2.0"),
    ColumnMap("time_discovered_completed_ns", "wall_ns (complete rows)", "int ns; JSON 0 = unknown", "null", "2.0"),
    ColumnMap("input_dtypes", "dtype", "c10 ScalarType -> torch name", "null", "2.3"),
    ColumnMap("input_sizes", "shape", "str of sizes", "null", "2.0"),
    ColumnMap("input_sizes x input_dtypes", "nbytes", "int, total input bytes", "null", "2.3"),
    ColumnMap("profiling_name send a->b / recv b<-a", "peer", "int, global when members known", "null", "2.0"),
    ColumnMap("frames", "callsite", "file:line of first frame outside torch", "null", "2.0 (pickle only)"),
    ColumnMap("record_id, op_id, timeout_ms, retired, duration_ms, thread_name", "detail", "k=v text", "", "2.0"),
    ColumnMap("(entry index in file)", "line", "int, 0-based", "required", "-"),
    ColumnMap("(file name)", "rank", "int via rank_from_filename", "null", "-"),
)


def sniff(path: Path, head: bytes) -> bool:
    """FR pickle (protocol marker + FR keys) or FR JSON object (FR keys in the first bytes)."""
    if head[:1] == b"\x80":
        return any(k.encode() in head for k in ("pg_config", "pg_status", "profiling_name", "collective_seq_id"))
    head = head.replace(b"\0", b"")  # NUL runs are holes in a JSON dump, never part of it
    h = head.lstrip()
    if not h.startswith(b"{"):
        return False
    if b'"traceEvents"' in h or b'"distributedInfo"' in h:  # a Kineto trace: its distributedInfo has a pg_config too
        return False
    if b'"pg_config"' in h or b'"pg_status"' in h:
        return True
    return b'"entries"' in h and b'"collective_seq_id"' in h and b'"profiling_name"' in h


def rank_from_filename(name: str) -> int | None:
    """Rank of an FR dump from its name: ``rankN`` markers first, then torch's ``<prefix><rank>`` trailing number."""
    r = rank_from_name(name)
    if r is not None:
        return r
    stem = re.sub(r"\.(json|pkl|pickle|txt)$", "", name, flags=re.IGNORECASE)
    m = re.search(r"(?<!pid)(?<!pid_)(?<!pid-)(?<!\d)(\d{1,6})$", stem)
    return int(m.group(1)) if m else None


def read(path: Path) -> ReadResult:
    """Read one FR dump (pickle or JSON) into EVENTS and OBSERVATIONS.

    What comes out:

    * EVENTS ``kind="group"`` per ``pg_config`` entry (members, so unobserved ranks can be named even with no entries).
    * EVENTS ``kind="enter"`` per entry, and a second row ``kind="complete"`` when FR says ``state == "completed"``.
      ``seq`` = ``collective_seq_id`` (``p2p_seq_id`` for p2p): in FR-only analysis this *is* the per-group counter
      that aligns ranks. ``backend_seq`` carries the same raw value so joins with watchdog / our own events still work.
    * OBSERVATIONS ``fr_pg_status`` per process group (``value`` = ``last_completed_collective``) and one ``fr_dump``
      row describing the dump (version, entry count, first / last ``record_id``: rings that wrapped start later).

    Safety: pickles are loaded with an unpickler that allows **no globals** (verified on real torch 2.13 gloo dumps:
    only dict / list / tuple / str / int / bool / None opcodes). A pickle that needs any global is refused with
    ``ReaderError``; nothing in it is executed.

    Known limits:

    * The global rank is not reliably inside a dump; it comes from the file name (``rank_from_filename``: a ``rankN``
      marker, then a trailing number of at most 6 digits: torch names dumps ``<prefix><rank>``). Otherwise null.
    * gloo (torch 2.13) leaves every entry ``state="scheduled"`` even after it finished, so gloo dumps produce no
      ``complete`` rows; ``retired=`` in ``detail`` and ``fr_pg_status`` are the only completion hints there.
    * gloo writes ``pg_config`` under the key ``""`` while entries name the group ``("0", "default_pg")``; an unnamed
      config is attached to the one group the entries name that has no config of its own (the default group first).
    * ``peer`` of p2p entries is mapped from group-local to global ranks only when the group's members are known.
    * Frames (pickle only) are the *enqueue* stacks of old ops, not where a thread is now, so they are not turned into
      STACKS rows (that would make a rank that moved on look stuck); ``callsite`` takes the first frame outside torch.
    * Per process group (its p2p apart) the first ``records.HEAD`` (500) and last ``records.TAIL`` (5,000) entries
      in record order are kept, the ones between only counted (one Skipped line says how many, per group); 16 past
      the first 64 groups, only counts past 10,000. A kept entry's seq is FR's own, so it stays true. Chosen with one
      cheap look per raw entry, before any parsing: a small pickle of a million references to one entry is bounded.
      At most ``records.MAX_FRAMES`` frames of an entry are looked at, strings are cut (``text``).
    * A truncated JSON dump yields every complete entry before the cut; a truncated pickle yields the entries the
      pure-Python unpickler had finished when the data ran out. Both are reported in ``skipped``.
    """
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT, "empty file (dump never written?)")
    raw, skipped, encoding = load_dump(path, data)

    version = raw.get("version")
    version = text(version, 40) if version is not None else None
    if version is not None and not version.startswith("2."):
        skipped.append(Skipped(f, None, f"Flight Recorder version {version} not verified (readers know 2.x)"))

    raw_entries = raw.get("entries") or []
    if not isinstance(raw_entries, list):
        skipped.append(Skipped(f, None, "'entries' is not a list"))
        raw_entries = []
    window = EntryWindow()   # #31: per group a bounded window of entries, chosen before any is parsed
    window.add_all(raw_entries)
    entries: list[FrEntry] = []
    expand = Expander()
    unusable = 0
    for i, r in window.kept():
        e = parse_entry(r, i, expand)
        if isinstance(e, str):
            unusable += 1
            if unusable <= _MAX_ENTRY_LINES:
                skipped.append(Skipped(f, i, e))
        else:
            entries.append(e)
    if unusable > _MAX_ENTRY_LINES:
        skipped.append(Skipped(f, None, f"and {unusable - _MAX_ENTRY_LINES:,} more entries that cannot be used "
                                        f"(one line each for the first {_MAX_ENTRY_LINES})"))

    if expand.note:
        skipped.append(Skipped(f, None, expand.note))
    bound = window.note()
    if bound:
        skipped.append(Skipped(f, None, bound))
    configs = pg_configs(raw.get("pg_config"), entries)
    rank = rank_from_filename(path.name)
    world = world_size(configs)

    events = [*group_rows(configs, rank, world, f), *(entry_rows(entries, configs, rank, world, f))]
    observations = [*status_rows(raw.get("pg_status"), entries, rank, f, skipped),
                    dump_row(raw, entries, encoding, rank, f, window.total)]
    return ReadResult(
        file=f,
        format=FORMAT,
        version=version,
        events=schema.table_from_rows(schema.EVENTS, events),
        observations=schema.table_from_rows(schema.OBSERVATIONS, observations),
        skipped=tuple(skipped),
        world_size=world,
    )
