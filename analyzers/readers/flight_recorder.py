"""Read one PyTorch Flight Recorder (FR) dump — pickle or JSON, gloo or NCCL, FR versions 2.x — into EVENTS.

Why: FR is the cheapest cross-rank evidence a hung job leaves. Every rank records each collective / p2p launch with
a per-process-group counter (``collective_seq_id``, ``p2p_seq_id``), so comparing the newest entry per group across
ranks names the ranks that never issued an op (DESIGN §2, formats.md §3).

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

* The global rank is not reliably inside a dump; it comes from the file name (``rankinfer.rank_from_name``, then a
  trailing number of at most 6 digits: torch names dumps ``<prefix><rank>``). Otherwise ``rank`` is null.
* gloo (torch 2.13) leaves every entry ``state="scheduled"`` even after it finished, so gloo dumps produce no
  ``complete`` rows; ``retired=`` in ``detail`` and ``fr_pg_status`` are the only completion hints there.
* gloo writes ``pg_config`` under the key ``""`` while entries name the group ``("0", "default_pg")``; an unnamed
  config is attached to the one group the entries name that has no config of its own (the default group first).
* ``peer`` of p2p entries is mapped from group-local to global ranks only when the group's members are known.
* Frames (pickle only) are the *enqueue* stacks of old ops, not where a thread is now, so they are not turned into
  STACKS rows (that would make a rank that moved on look stuck); ``callsite`` takes the first frame outside torch.
* A truncated JSON dump yields every complete entry before the cut; a truncated pickle yields the entries the
  pure-Python unpickler had finished when the data ran out. Both are reported in ``skipped``.
"""
from __future__ import annotations

import ast
import io
import json
import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from analyzers import schema
from analyzers.opnames import P2P_OPS, canonical_op
from analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped, empty_file, read_file_bytes
from analyzers.readers.rankinfer import rank_from_name

__all__ = [
    "FORMAT",
    "COLUMN_MAP",
    "ColumnMap",
    "FrEntry",
    "sniff",
    "read",
    "rank_from_filename",
]

FORMAT = "flight_recorder"


#: How FR fields become EVENTS columns (``since`` = first FR version seen with the field, formats.md §3).
COLUMN_MAP: tuple[ColumnMap, ...] = (
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

# c10::toString(ScalarType) -> (torch dtype name, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "Byte": ("uint8", 1), "Char": ("int8", 1), "Short": ("int16", 2), "Int": ("int32", 4), "Long": ("int64", 8),
    "Half": ("float16", 2), "Float": ("float32", 4), "Double": ("float64", 8), "ComplexHalf": ("complex32", 4),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16), "Bool": ("bool", 1),
    "QInt8": ("qint8", 1), "QUInt8": ("quint8", 1), "QInt32": ("qint32", 4), "BFloat16": ("bfloat16", 2),
    "Float8_e5m2": ("float8_e5m2", 1), "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1), "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "Float8_e8m0fnu": ("float8_e8m0fnu", 1), "Float4_e2m1fn_x2": ("float4_e2m1fn_x2", 1),
    "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8),
}

_TOP_KEYS = ("entries", "pg_config", "pg_status")
_SEND = re.compile(r"\bsend\s+(\d+)\s*->\s*(\d+)")
_RECV = re.compile(r"\brecv\s+(\d+)\s*<-\s*(\d+)")


# --------------------------------------------------------------------------------------------- loading (no globals)

class _NoGlobals(pickle.Unpickler):
    """C unpickler that refuses every global and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Flight Recorder dump")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in a Flight Recorder dump")


class _NoGlobalsPy(pickle._Unpickler):
    """Pure-Python unpickler with the same restrictions; its ``stack``/``metastack`` survive a truncated input."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Flight Recorder dump")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in a Flight Recorder dump")


def _is_entry(obj: Any) -> bool:
    return isinstance(obj, dict) and "profiling_name" in obj


def _salvage_pickle(data: bytes) -> dict[str, Any] | None:
    """Rebuild what a truncated FR pickle held before the cut, from the pure-Python unpickler's stacks."""
    up = _NoGlobalsPy(io.BytesIO(data))
    try:
        obj = up.load()
        return obj if isinstance(obj, dict) else None
    except pickle.UnpicklingError as exc:
        if "not allowed" in str(exc):
            return None
    except Exception:  # noqa: BLE001 - truncated / torn data: fall through to salvage
        pass
    frames: list[list[Any]] = [*getattr(up, "metastack", []), getattr(up, "stack", [])]
    top: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for frame in frames:
        for i, obj in enumerate(frame):
            if isinstance(obj, str) and i + 1 < len(frame) and obj in ("version", *_TOP_KEYS[1:]) and obj not in top:
                top[obj] = frame[i + 1]
            candidates = obj if isinstance(obj, list) else [obj]
            for c in candidates:
                if _is_entry(c) and id(c) not in seen:
                    seen.add(id(c))
                    entries.append(c)
    if not entries and not top:
        return None
    top["entries"] = entries
    return top


def _salvage_json(text: str) -> dict[str, Any] | None:
    """Parse the top-level fields and every complete entry of a truncated FR JSON dump."""
    dec = json.JSONDecoder()
    top: dict[str, Any] = {}
    for key in ("version", "pg_config", "pg_status", "comm_lib_version", "nccl_version"):
        m = re.search(r'"%s"\s*:\s*' % key, text)
        if m:
            try:
                top[key] = dec.raw_decode(text, m.end())[0]
            except ValueError:
                pass
    m = re.search(r'"entries"\s*:\s*\[', text)
    if m:
        entries: list[Any] = []
        pos = m.end()
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                obj, pos = dec.raw_decode(text, pos)
            except ValueError:
                break
            entries.append(obj)
        top["entries"] = entries
    if not any(k in top for k in _TOP_KEYS):
        return None
    return top


def _load(path: Path, data: bytes) -> tuple[dict[str, Any], list[Skipped], str]:
    """Return (raw dump dict, skipped, encoding) or raise ReaderError when this is not an FR dump."""
    f = str(path)
    skipped: list[Skipped] = []
    if data[:1] == b"\x80":
        try:
            obj = _NoGlobals(io.BytesIO(data)).load()
        except pickle.UnpicklingError as exc:
            if "not allowed" in str(exc):
                raise ReaderError(path, f"pickle is not a Flight Recorder dump ({exc}); refused to load it") from exc
            obj = None
        except Exception:  # noqa: BLE001 - EOFError, ValueError, ... on truncated data
            obj = None
        if obj is None:
            obj = _salvage_pickle(data)
            if obj is None:
                raise ReaderError(path, "unreadable pickle (truncated before any Flight Recorder entry, or not FR)")
            skipped.append(Skipped(f, None, f"truncated pickle: kept {len(obj.get('entries', []))} complete entries"))
        if not isinstance(obj, dict) or not any(k in obj for k in _TOP_KEYS):
            raise ReaderError(path, "pickle holds no Flight Recorder keys (entries / pg_config / pg_status)")
        return obj, skipped, "pickle"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReaderError(path, "binary data that is neither a pickle nor UTF-8 JSON") from exc
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        raise ReaderError(path, "not a Flight Recorder dump (expected a pickle or a JSON object)")
    try:
        obj = json.loads(stripped)
    except ValueError:
        obj = _salvage_json(stripped)
        if obj is None:
            raise ReaderError(path, "JSON that is neither a Flight Recorder dump nor a truncated one") from None
        skipped.append(Skipped(f, None, f"truncated JSON: kept {len(obj.get('entries', []))} complete entries"))
    if not isinstance(obj, dict) or not any(k in obj for k in _TOP_KEYS):
        raise ReaderError(path, "JSON object without Flight Recorder keys (entries / pg_config / pg_status)")
    return obj, skipped, "json"


# --------------------------------------------------------------------------------------------- typed records

@dataclass(frozen=True)
class PgConfig:
    """One ``pg_config`` item."""

    name: str
    desc: str | None
    ranks: tuple[int, ...] | None


@dataclass(frozen=True)
class FrEntry:
    """One FR entry, typed (raw dicts stay inside this module)."""

    index: int
    record_id: int | None
    pg_id: int | None
    group: str | None
    group_desc: str | None
    profiling_name: str
    collective_seq_id: int | None
    p2p_seq_id: int | None
    op_id: int | None
    is_p2p: bool | None
    state: str | None
    time_created_ns: int | None
    time_started_ns: int | None
    time_completed_ns: int | None
    duration_ms: float | None
    input_sizes: tuple[tuple[int, ...], ...] | None
    input_dtypes: tuple[str, ...] | None
    timeout_ms: int | None
    retired: bool | None
    thread_name: str | None
    frames: tuple[tuple[str, str, int], ...]


def _int(v: Any) -> int | None:
    """int from int / numeric string; None for None, "", 0-as-unknown handled by callers."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _time(v: Any) -> int | None:
    """FR discovery times: None in pickle, 0 in JSON mean unknown."""
    t = _int(v)
    return t if t else None


def _sizes(v: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(v, (list, tuple)):
        return None
    out = []
    for s in v:
        if not isinstance(s, (list, tuple)) or not all(isinstance(d, int) for d in s):
            return None
        out.append(tuple(s))
    return tuple(out)


def _frames(v: Any) -> tuple[tuple[str, str, int], ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    out = []
    for fr in v:
        if isinstance(fr, dict):
            out.append((str(fr.get("name", "?")), str(fr.get("filename", "?")), _int(fr.get("line")) or 0))
    return tuple(out)


def _parse_entry(raw: Any, index: int) -> FrEntry | str:
    """A typed entry, or the reason it cannot be used."""
    if not isinstance(raw, dict):
        return f"entry {index} is a {type(raw).__name__}, not a dict"
    name = raw.get("profiling_name")
    if not isinstance(name, str) or not name:
        return f"entry {index} has no profiling_name"
    pg = raw.get("process_group")
    group = desc = None
    if isinstance(pg, (list, tuple)) and pg:
        group = str(pg[0])
        desc = str(pg[1]) if len(pg) > 1 and pg[1] is not None else None
    dtypes = raw.get("input_dtypes")
    duration = raw.get("duration_ms")
    return FrEntry(
        index=index,
        record_id=_int(raw.get("record_id")),
        pg_id=_int(raw.get("pg_id")),
        group=group,
        group_desc=desc,
        profiling_name=name,
        collective_seq_id=_int(raw.get("collective_seq_id")),
        p2p_seq_id=_int(raw.get("p2p_seq_id")),
        op_id=_int(raw.get("op_id")),
        is_p2p=raw.get("is_p2p") if isinstance(raw.get("is_p2p"), bool) else None,
        state=raw.get("state") if isinstance(raw.get("state"), str) else None,
        time_created_ns=_time(raw.get("time_created_ns")),
        time_started_ns=_time(raw.get("time_discovered_started_ns")),
        time_completed_ns=_time(raw.get("time_discovered_completed_ns")),
        duration_ms=float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
        input_sizes=_sizes(raw.get("input_sizes")),
        input_dtypes=tuple(str(d) for d in dtypes) if isinstance(dtypes, (list, tuple)) else None,
        timeout_ms=_int(raw.get("timeout_ms")),
        retired=raw.get("retired") if isinstance(raw.get("retired"), bool) else None,
        thread_name=str(raw["thread_name"]) if raw.get("thread_name") is not None else None,
        frames=_frames(raw.get("frames")),
    )


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v.strip()) if v.strip() else None
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple, set)) and all(isinstance(r, int) for r in v):
        return tuple(v) if v else None
    return None


def _pg_configs(raw: Any, entries: list[FrEntry]) -> dict[str, PgConfig]:
    """pg name -> config; gloo's unnamed ("") config is attached to the group the entries name without config."""
    out: dict[str, PgConfig] = {}
    unnamed: list[PgConfig] = []
    if isinstance(raw, dict):
        for key, cfg in raw.items():
            if not isinstance(cfg, dict):
                continue
            name = str(cfg.get("name") or key or "")
            pc = PgConfig(name=name, desc=(str(cfg["desc"]) if cfg.get("desc") else None),
                          ranks=_parse_ranks(cfg.get("ranks")))
            if name:
                out[name] = pc
            else:
                unnamed.append(pc)
    if len(unnamed) == 1:
        named_by_entries: dict[str, str | None] = {}
        for e in entries:
            if e.group is not None and e.group not in out:
                named_by_entries.setdefault(e.group, e.group_desc)
        default = [g for g, d in named_by_entries.items() if d == "default_pg"]
        target = default[0] if default else (next(iter(named_by_entries)) if len(named_by_entries) == 1 else None)
        if target is None and not named_by_entries and "0" not in out:
            target = "0"  # no entries at all: gloo's default group is named "0"
        if target is not None:
            u = unnamed[0]
            out[target] = PgConfig(name=target, desc=u.desc or named_by_entries.get(target) or "default_pg",
                                   ranks=u.ranks)
    return out


# --------------------------------------------------------------------------------------------- public API

def sniff(path: Path, head: bytes) -> bool:
    """FR pickle (protocol marker + FR keys) or FR JSON object (FR keys in the first bytes)."""
    if head[:1] == b"\x80":
        return any(k.encode() in head for k in ("pg_config", "pg_status", "profiling_name", "collective_seq_id"))
    h = head.lstrip()
    if not h.startswith(b"{"):
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
    """Read one FR dump (pickle or JSON) into EVENTS and OBSERVATIONS."""
    path = Path(path)
    data = read_file_bytes(path)
    f = str(path)
    if not data.strip():
        return empty_file(f, FORMAT, "empty file (dump never written?)")
    raw, skipped, encoding = _load(path, data)

    version = raw.get("version")
    version = str(version) if version is not None else None
    if version is not None and not version.startswith("2."):
        skipped.append(Skipped(f, None, f"Flight Recorder version {version} not verified (readers know 2.x)"))

    raw_entries = raw.get("entries") or []
    if not isinstance(raw_entries, list):
        skipped.append(Skipped(f, None, "'entries' is not a list"))
        raw_entries = []
    entries: list[FrEntry] = []
    for i, r in enumerate(raw_entries):
        e = _parse_entry(r, i)
        if isinstance(e, str):
            skipped.append(Skipped(f, i, e))
        else:
            entries.append(e)

    configs = _pg_configs(raw.get("pg_config"), entries)
    rank = rank_from_filename(path.name)
    world = _world(configs)

    events = [*_group_rows(configs, rank, world, f), *(_entry_rows(entries, configs, rank, world, f))]
    observations = [*_status_rows(raw.get("pg_status"), entries, rank, f, skipped),
                    _dump_row(raw, entries, encoding, rank, f)]
    return ReadResult(
        file=f,
        format=FORMAT,
        version=version,
        events=schema.table_from_rows(schema.EVENTS, events),
        observations=schema.table_from_rows(schema.OBSERVATIONS, observations),
        skipped=tuple(skipped),
        world_size=world,
    )


# --------------------------------------------------------------------------------------------- rows

def _world(configs: dict[str, PgConfig]) -> int | None:
    for pc in configs.values():
        if pc.desc == "default_pg" and pc.ranks:
            return len(pc.ranks)
    pc0 = configs.get("0")
    return len(pc0.ranks) if pc0 and pc0.ranks else None


def _backend(profiling_name: str) -> str | None:
    head, sep, _ = profiling_name.partition(":")
    return head.strip().lower() if sep and head.strip() else None


def _dtype(dtypes: tuple[str, ...] | None) -> str | None:
    if not dtypes:
        return None
    names = []
    for d in dtypes:
        n = _DTYPES.get(d, (d.lower(), 0))[0]
        if n not in names:
            names.append(n)
    return ",".join(names)


def _nbytes(sizes: tuple[tuple[int, ...], ...] | None, dtypes: tuple[str, ...] | None) -> int | None:
    if not sizes or not dtypes:
        return None
    if len(dtypes) == 1:
        dtypes = dtypes * len(sizes)
    if len(dtypes) != len(sizes) or any(d not in _DTYPES for d in dtypes):
        return None
    return sum(math.prod(s) * _DTYPES[d][1] for s, d in zip(sizes, dtypes))


def _shape(sizes: tuple[tuple[int, ...], ...] | None) -> str | None:
    if sizes is None:
        return None
    if len(sizes) == 1:
        return str(list(sizes[0]))
    return str([list(s) for s in sizes])


def _callsite(frames: tuple[tuple[str, str, int], ...]) -> str | None:
    for _name, filename, line in frames:
        norm = filename.replace("\\", "/")
        if "/torch/" in norm or norm.startswith("torch/"):
            continue
        return f"{filename}:{line}"
    return None


def _peer(e: FrEntry, name: str, pc: PgConfig | None) -> int | None:
    """Global rank of the other side of a p2p entry (profiling names carry group-local ranks)."""
    if name in ("send", "isend"):
        m = _SEND.search(e.profiling_name)
        local = int(m.group(2)) if m else None
    elif name in ("recv", "irecv"):
        m = _RECV.search(e.profiling_name)
        local = int(m.group(2)) if m else None
    else:
        return None
    if local is None:
        return None
    if pc is not None and pc.ranks:
        return pc.ranks[local] if 0 <= local < len(pc.ranks) else None
    if e.group_desc == "default_pg":
        return local
    return None


def _group_rows(configs: dict[str, PgConfig], rank: int | None, world: int | None, f: str) -> list[dict[str, Any]]:
    return [
        {"rank": rank, "world": world, "kind": "group", "name": pc.desc or name, "category": "init", "group": name,
         "group_desc": pc.desc, "group_ranks": list(pc.ranks) if pc.ranks else None, "source": "fr", "file": f,
         "line": None, "detail": "from pg_config"}
        for name, pc in configs.items()
    ]


def _entry_rows(entries: Iterable[FrEntry], configs: dict[str, PgConfig], rank: int | None, world: int | None,
                f: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for e in entries:
        name = canonical_op(e.profiling_name)
        p2p = bool(e.is_p2p) or name in P2P_OPS
        seq = e.p2p_seq_id if p2p else e.collective_seq_id
        pc = configs.get(e.group) if e.group is not None else None
        detail = [f"record_id={e.record_id}", f"op_id={e.op_id}", f"timeout_ms={e.timeout_ms}"]
        if e.retired is not None:
            detail.append(f"retired={e.retired}")
        if e.duration_ms is not None:
            detail.append(f"duration_ms={e.duration_ms:g}")
        if e.thread_name:
            detail.append(f"thread={e.thread_name}")
        if p2p or " " in e.profiling_name:
            detail.append(f"profiling_name={e.profiling_name!r}")
        row = {
            "rank": rank, "world": world, "kind": "enter", "name": name, "category": "p2p" if p2p else "collective",
            "group": e.group, "group_desc": e.group_desc, "backend": _backend(e.profiling_name),
            "group_ranks": list(pc.ranks) if pc and pc.ranks else None, "seq": seq, "backend_seq": seq,
            "peer": _peer(e, name, pc) if p2p else None, "wall_ns": e.time_created_ns,
            "nbytes": _nbytes(e.input_sizes, e.input_dtypes), "dtype": _dtype(e.input_dtypes),
            "shape": _shape(e.input_sizes), "callsite": _callsite(e.frames), "state": e.state,
            "detail": " ".join(detail), "source": "fr", "file": f, "line": e.index,
        }
        rows.append(row)
        # gloo never moves an entry past "scheduled" (torch 2.13), but retires it once the work is done
        if e.state == "completed" or (row["backend"] == "gloo" and e.retired is True):
            rows.append({**row, "kind": "complete", "wall_ns": e.time_completed_ns})
    return rows


def _status_rows(raw: Any, entries: list[FrEntry], rank: int | None, f: str,
                 skipped: list[Skipped]) -> list[dict[str, Any]]:
    if not isinstance(raw, dict):
        return []
    names: dict[int, tuple[str | None, str | None]] = {}
    for e in entries:
        if e.pg_id is not None:
            names.setdefault(e.pg_id, (e.group, e.group_desc))
    rows = []
    for key, st in raw.items():
        if not isinstance(st, dict):
            skipped.append(Skipped(f, None, f"pg_status[{key!r}] is not a dict"))
            continue
        enq, sta, com = (_int(st.get(k)) for k in
                         ("last_enqueued_collective", "last_started_collective", "last_completed_collective"))
        pg_id = _int(key)
        group, desc = names.get(pg_id, (str(key), None)) if pg_id is not None else (str(key), None)
        rows.append({
            "rank": rank, "kind": "fr_pg_status", "name": desc, "group": group, "value": com,
            "detail": f"enqueued={enq} started={sta} completed={com} pg_id={key}",
            "source": "fr", "file": f, "line": None,
        })
    return rows


def _dump_row(raw: dict[str, Any], entries: list[FrEntry], encoding: str, rank: int | None,
              f: str) -> dict[str, Any]:
    rec = [e.record_id for e in entries if e.record_id is not None]
    lib = raw.get("comm_lib_version", raw.get("nccl_version"))
    return {
        "rank": rank, "kind": "fr_dump", "name": str(raw.get("version")), "value": len(entries),
        "detail": (f"encoding={encoding} entries={len(entries)} first_record_id={min(rec) if rec else None} "
                   f"last_record_id={max(rec) if rec else None} comm_lib_version={lib!r}"),
        "source": "fr", "file": f, "line": None,
    }
