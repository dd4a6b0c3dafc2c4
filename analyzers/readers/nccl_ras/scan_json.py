"""The JSON form of RAS output (NCCL ≥ 2.28.7: status documents and monitor-mode events, several concatenated
documents kept apart as snapshots) into rows."""
from __future__ import annotations

import json
import re
from typing import Any

from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_log import normalize_comm_id
from ranktrace.analyzers.readers.nccl_ras.rows import OP_TOTAL, ras_time

__all__ = ["scan_json"]


_RANK_KEY = re.compile(r'"rank"\s*:\s*(-?\d+)')


def scan_json(text: str, file: str, obs: list[dict[str, Any]], skipped: list[Skipped]) -> str | None:
    dec = json.JSONDecoder()
    pos, n = 0, len(text)
    snap = 0
    version: str | None = None
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        if text[pos] not in "{[":
            nl = text.find("\n", pos)
            skipped.append(Skipped(file, text.count("\n", 0, pos) + 1, "text between RAS JSON documents ignored"))
            pos = n if nl < 0 else nl + 1
            continue
        try:
            doc, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            skipped.append(Skipped(file, text.count("\n", 0, pos) + 1,
                                   f"RAS JSON document cut or invalid ({e.msg}); ignored from here"))
            break
        first_line = text.count("\n", 0, pos) + 1
        rank_lines = [first_line + text.count("\n", pos, m.start()) for m in _RANK_KEY.finditer(text, pos, end)]
        docs = doc if isinstance(doc, list) else [doc]
        for d in docs:
            if not isinstance(d, dict):
                continue
            if "communicators" in d:
                snap += 1
                version = version or (str(d["nccl_version"]) if d.get("nccl_version") is not None else None)
                _json_status(d, snap, first_line, rank_lines, obs)
            elif "event" in d:
                _json_event(d, first_line, obs)
        pos = end
    return version


def _json_status(d: dict[str, Any], snap: int, first_line: int, rank_lines: list[int],
                 obs: list[dict[str, Any]]) -> None:
    wall = ras_time(d.get("timestamp"))
    ri = 0

    def next_line() -> int:
        nonlocal ri
        ln = rank_lines[ri] if ri < len(rank_lines) else first_line
        ri += 1
        return ln

    for comm in d.get("communicators") or []:
        if not isinstance(comm, dict) or comm.get("hash") is None:
            continue
        grp = normalize_comm_id(str(comm["hash"]))
        size = comm.get("size")
        obs.append(dict(kind="_size", value=size))
        for r in comm.get("ranks") or []:
            ln = next_line()
            rank, host, pid = r.get("rank"), r.get("host"), r.get("pid")
            base = dict(group=grp, rank=rank, host=host, pid=pid, wall_ns=wall, line=ln, _size=size)
            counts = r.get("collective_counts") or {}
            total = 0
            for op, v in counts.items():
                if isinstance(v, int):
                    total += v
                    obs.append(dict(base, kind="ras_op_count", name=canonical_op(op), value=v,
                                    detail=f"snapshot={snap}"))
            if counts:
                obs.append(dict(base, kind="ras_op_count", name=OP_TOTAL, value=total,
                                detail=f"sum over {len(counts)} op types snapshot={snap}"))
            st = r.get("status") or {}
            if st:
                if st.get("abort_flag"):
                    state = "ABORT"
                elif st.get("finalize_called") or st.get("destroy_flag"):
                    state = "FINALIZE"
                elif st.get("init_state") == 0:
                    state = "RUNNING"
                else:
                    state = "INIT"
                obs.append(dict(base, kind="ras_rank_status", name=state, value=st.get("init_state"),
                                detail=" ".join(f"{k}={json.dumps(v)}" for k, v in st.items()) + f" snapshot={snap}"))
        for r in comm.get("missing_ranks") or []:
            ln = next_line()
            st = r.get("status") or {}
            base = dict(group=grp, rank=r.get("rank"), host=r.get("host"), pid=r.get("pid"), wall_ns=wall, line=ln,
                        _size=size)
            detail = " ".join(f"{k}={json.dumps(v)}" for k, v in st.items()) + f" snapshot={snap}"
            obs.append(dict(base, kind="ras_missing_rank", detail=detail.strip()))
            if st.get("considered_dead"):
                obs.append(dict(base, kind="ras_dead_rank", detail=detail.strip()))


def _json_event(d: dict[str, Any], line: int, obs: list[dict[str, Any]]) -> None:
    peer = d.get("peer") or {}
    wall = ras_time(d.get("timestamp"))
    if d.get("event") == "PEER_DEAD":
        obs.append(dict(kind="ras_dead_process", pid=peer.get("pid"), host=peer.get("host"), wall_ns=wall,
                        line=line, detail=f"gpus={peer.get('cuda_devs')} {d.get('details') or ''}".strip()))
    else:
        obs.append(dict(kind="ras_event", name=str(d.get("event")), pid=peer.get("pid"), host=peer.get("host"),
                        wall_ns=wall, line=line, detail=json.dumps(d, sort_keys=True)[:500]))
