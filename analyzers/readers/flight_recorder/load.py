"""Bytes of a Flight Recorder dump -> its raw top-level dict: pickle with no globals (nothing in a dump is ever
executed) or JSON, salvaging what a truncated pickle or JSON held before the cut. The only code that sees bytes."""
from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

from ranktrace.analyzers.readers.base import ReaderError, Skipped, json_array_items

__all__ = ["load_dump"]

_TOP_KEYS = ("entries", "pg_config", "pg_status")


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
        top["entries"] = json_array_items(text, m.end())
    if not any(k in top for k in _TOP_KEYS):
        return None
    return top


def load_dump(path: Path, data: bytes) -> tuple[dict[str, Any], list[Skipped], str]:
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
    if data.lstrip(b"\0 \t\r\n")[:1] == b"{" and b"\0" in data:  # JSON with a hole (crash, copytruncate)
        nuls = data.count(b"\0")
        data = data.replace(b"\0", b"")
        skipped.append(Skipped(f, None, f"{nuls} NUL byte(s) dropped (a hole left by a crash or a copy)"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data.lstrip(b" \t\r\n")[:1] != b"{":
            raise ReaderError(path, "binary data that is neither a pickle nor UTF-8 JSON") from exc
        # a JSON dump with a few bytes that are not UTF-8 (a frame name cut mid-character, a copy that damaged a
        # byte): every entry is still read, the bad bytes shown as U+FFFD and counted — never the whole dump lost
        text = data.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") - data.count("\ufffd".encode())
        skipped.append(Skipped(f, None, f"{bad} byte(s) that are not UTF-8 shown as \ufffd (at offset {exc.start} "
                                        "first)"))
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
