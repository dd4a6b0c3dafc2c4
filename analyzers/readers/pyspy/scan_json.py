"""``py-spy dump --json`` (and the in-rank agent's ``agent-<pid>.json``, written in the same layout): an array of
thread objects, read into stack records; a truncated array keeps every complete thread."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ranktrace.analyzers.readers.base import ReaderError, Skipped, json_array_items
from ranktrace.analyzers.readers.common.ranks import rank_from_name
from ranktrace.analyzers.readers.common.stacks import StackRecord

__all__ = ["scan_json"]


def _json_frame(fr: Any) -> str | None:
    if not isinstance(fr, dict) or not fr.get("name"):
        return None
    loc = fr.get("short_filename") or fr.get("filename") or fr.get("module") or "?"
    line = fr.get("line")
    return f"{fr['name']} ({loc}:{line})" if isinstance(line, int) and line > 0 else f"{fr['name']} ({loc})"


def _json_threads(text: str) -> tuple[list[Any], bool]:
    """Thread objects of a py-spy JSON array; (objects, truncated)."""
    try:
        obj = json.loads(text)
        return (obj if isinstance(obj, list) else [obj]), False
    except ValueError:
        pass
    return json_array_items(text, text.index("[") + 1), True


def scan_json(path: Path, text: str, file_rank: int | None) -> tuple[list[StackRecord], list[Skipped]]:
    """One record per thread object (JSON frames spelt as py-spy's text prints them, from ``short_filename``);
    ReaderError when the array holds no py-spy thread object."""
    f = str(path)
    items, truncated = _json_threads(text)
    skipped: list[Skipped] = []
    if not items or not all(isinstance(t, dict) and "frames" in t and ("thread_id" in t or "pid" in t)
                            for t in items):
        if truncated and not items:
            raise ReaderError(path, "JSON array holds no complete py-spy thread object")
        raise ReaderError(path, "JSON that is not py-spy --json output (no thread objects with frames)")
    if truncated:
        skipped.append(Skipped(f, None, f"truncated JSON: kept {len(items)} complete thread(s)"))
    records: list[StackRecord] = []
    pids = {t.get("pid") for t in items}
    # ranktrace's in-rank agent (tracer.agent) writes the same layout into agent-<pid>.json
    source = "agent" if path.name.startswith("agent-") else "pyspy"
    for i, t in enumerate(items):
        frames = [s for s in (_json_frame(fr) for fr in t.get("frames") or []) if s is not None]
        native = any(isinstance(fr, dict) and (fr.get("module") or fr.get("line") == 0) for fr in t.get("frames") or [])
        info = t.get("process_info") if isinstance(t.get("process_info"), dict) else {}
        cmd = info.get("command_line") if isinstance(info.get("command_line"), str) else None
        rank = rank_from_name(cmd) if cmd else None
        if rank is None and len(pids) == 1:
            rank = file_rank
        state = "active+gil" if t.get("owns_gil") else ("active" if t.get("active") else "idle")
        if "active" not in t and "owns_gil" not in t:
            state = "unknown"
        pid = t.get("pid") if isinstance(t.get("pid"), int) else None
        tid = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else None
        ident = t.get("thread_id")
        records.append(StackRecord(source, f, i, frames, ident=None if ident is None else str(ident), tid=tid,
                                   thread_name=t.get("thread_name"), state=state, native=native, pid=pid, rank=rank,
                                   snapshot=f"{path.name}[pid {pid}]"))
    return records, skipped
