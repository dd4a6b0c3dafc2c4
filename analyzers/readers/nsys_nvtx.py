"""NVTX ranges and marks of an nsys export → EVENTS: enter/exit per range (enter only when open at capture end,
exit only when opened before capture), marks, ranktrace-domain op texts parsed into name/category/group/seq, NVTX
rank hints, and the op ranges remembered for kernel attribution.

Why separate: NVTX interpretation is the reader's largest piece of meaning (domains, ranktrace text grammar,
PyTorch/NCCL op-like ranges) and is independent of how kernels and API calls are read.
"""
from __future__ import annotations

from typing import Any

from ranktrace.analyzers.opnames import COLLECTIVE_OPS, P2P_OPS, canonical_op
from ranktrace.analyzers.readers.nsys_decode import (_BACKEND_PREFIX, _NVTX_DOMAIN_CREATE, _NVTX_END_ONLY, _NVTX_MARKS,
                                           _NVTX_OPEN, _NVTX_RANGES, _RANK_TOKEN, _RANKTRACE_TEXT,
                                           decode_global_tid)
from ranktrace.analyzers.readers.nsys_export import _ExportBase, _OpRange
from ranktrace.analyzers.readers.nsys_fields import NVTX_TOKENS, OPEN_AT_END, OPENED_BEFORE, RANKTRACE_DOMAIN


class _NvtxStages(_ExportBase):
    """Stage: NVTX ranges and marks (fills the op-range index)."""

    # -- NVTX

    def _nvtx(self) -> None:
        t = self._table("NVTX_EVENTS", ("start", "eventType", "globalTid"), "no NVTX ranges")
        if not t:
            return
        has = lambda c: self._has(t, c)  # noqa: E731
        text = "COALESCE(n.text, s.value)" if has("textId") and "StringIds" in self.columns else (
            "n.text" if has("text") else "NULL")
        join = "LEFT JOIN StringIds s ON s.id = n.textId" if "s.value" in text else ""
        end = 'n."end"' if has("end") else "NULL"
        dom = "n.domainId" if has("domainId") else "0"
        for batch in self._batches(f'SELECT n.globalTid, {dom}, {text} FROM "{t}" n {join} '
                                   f"WHERE n.eventType = {_NVTX_DOMAIN_CREATE}"):
            for gtid, domain_id, name in batch:
                pid, _ = decode_global_tid(gtid)
                if pid is not None and name:
                    self.domains[(pid, int(domain_id or 0))] = str(name)
        types = ",".join(str(x) for x in _NVTX_MARKS + _NVTX_RANGES + _NVTX_OPEN + _NVTX_END_ONLY)
        sql = (f'SELECT n.rowid, n.start, {end}, n.eventType, n.globalTid, {dom}, {text} FROM "{t}" n {join} '
               f"WHERE n.eventType IN ({types})")
        for batch in self._batches(sql):
            rows: list[dict[str, Any]] = []
            for rowid, start, stop, etype, gtid, domain_id, name in batch:
                pid, tid = decode_global_tid(gtid)
                if pid is not None:
                    self.active_pids.add(pid)
                domain = self.domains.get((pid or 0, int(domain_id or 0)))
                rows.extend(self._nvtx_rows(rowid, start, stop, int(etype), pid, tid, domain, name))
            self._emit_events(rows)
        for key, ranges in self.op_ranges.items():
            ranges.sort(key=lambda r: r.start)
            self.op_starts[key] = [r.start for r in ranges]

    def _nvtx_rows(self, rowid: int, start: int | None, stop: int | None, etype: int, pid: int | None,
                   tid: int | None, domain: str | None, text: Any) -> list[dict[str, Any]]:
        text = "" if text is None else str(text)
        # the domain-create row can be missing (sliced exports): fall back to the text's own shape
        is_ranktrace = (domain or "").lower() == RANKTRACE_DOMAIN or (domain is None and _RANKTRACE_TEXT.match(text)
                                                                      is not None)
        fields: dict[str, Any] = {}
        name, category = text, "user"
        if is_ranktrace:
            name, category, fields = self._ranktrace_text(text, pid)
        elif pid is not None:
            for m in _RANK_TOKEN.finditer(text):
                self.rank_hints[pid]["NVTX text rank="].add(int(m.group(1)))
        if etype in _NVTX_MARKS:
            return [self._event(pid, tid, start, "mark", name=name, category=category, line=rowid,
                                detail=_nvtx_detail(domain), **fields)]
        if etype in _NVTX_END_ONLY:
            t = stop if stop is not None else start
            return [self._event(pid, tid, t, "exit", name=name, category=category, line=rowid,
                                detail=OPENED_BEFORE, **fields)]
        is_open = etype in _NVTX_OPEN or stop is None
        self._remember_op_range(pid, tid, start, None if is_open else stop, name, category, fields, is_ranktrace,
                                text)
        if is_open:
            return [self._event(pid, tid, start, "enter", name=name, category=category, line=rowid,
                                detail=OPEN_AT_END, **fields)]
        detail = _nvtx_detail(domain)
        return [self._event(pid, tid, start, "enter", name=name, category=category, line=rowid, detail=detail,
                            **fields),
                self._event(pid, tid, stop, "exit", name=name, category=category, line=rowid, detail=detail,
                            **fields)]

    def _ranktrace_text(self, text: str, pid: int | None) -> tuple[str, str, dict[str, Any]]:
        """(name, category, fields) of a ranktrace-domain text ``<op> key=value ...``; rank/world become hints."""
        parts = text.split()
        head = parts[0] if parts else ""
        fields: dict[str, Any] = {}
        for tok in parts[1:]:
            key, sep, value = tok.partition("=")
            if not sep:
                continue
            key = key.lower()
            if key in ("rank", "world", "world_size"):
                if value.isdigit() and pid is not None:
                    if key == "rank":
                        self.rank_hints[pid]["ranktrace NVTX rank="].add(int(value))
                    else:
                        self.world_hints.add(int(value))
                continue
            spec = NVTX_TOKENS.get(key)
            if spec is None:
                continue
            column, typ = spec
            try:
                fields[column] = typ(value)
            except ValueError:
                continue
        op = canonical_op(head) if head else head
        if op in P2P_OPS:
            return op, "p2p", fields
        if op in COLLECTIVE_OPS:
            return op, "collective", fields
        return text, "user", fields

    def _remember_op_range(self, pid: int | None, tid: int | None, start: int | None, stop: int | None,
                           name: str, category: str, fields: dict[str, Any], ranktrace: bool, text: str) -> None:
        if pid is None or tid is None or start is None:
            return
        if not ranktrace:  # PyTorch emit_nvtx "nccl:all_reduce, op_id = 7" or NCCL's "ncclAllReduce"
            raw = text.split(",", 1)[0].strip()
            if _BACKEND_PREFIX.match(raw):
                op = canonical_op(raw)
            elif raw.startswith("nccl") and raw[4:5].isupper():
                op = canonical_op(raw[4:])
            else:
                return
            if op in P2P_OPS:
                name, category = op, "p2p"
            elif op in COLLECTIVE_OPS:
                name, category = op, "collective"
            else:
                return
        elif category == "user":
            return
        self.op_ranges[(pid, tid)].append(_OpRange(int(start), float("inf") if stop is None else int(stop),
                                                   name, category, tuple(fields.items()), ranktrace))


def _nvtx_detail(domain: str | None) -> str:
    return f"NVTX domain {domain}" if domain else "NVTX"
