"""Read NCCL RAS client output (``ncclras`` / ``echo status | nc localhost 28028``), text or JSON, NCCL ≥ 2.24.

Why: RAS is the cheapest live view of a hung NCCL job: per communicator it says how many collective operations
each rank has *launched*, which ranks did not answer, and which processes are dead (formats.md §1.10; NCCL
``docs/userguide/source/troubleshooting/ras.rst``; output code in ``src/ras/client_support.cc``).

What comes out (OBSERVATIONS only, ``source="ras"``; ``group`` is the communicator hash spelled like NCCL's Init
lines, ``0x`` + lower-case hex, see ``nccl_log.normalize_comm_id``; ``rank`` is the communicator rank):

* ``ras_op_count`` — ``value`` = operations launched by that rank; ``name`` = ``total`` (2.24/2.25 text, and the
  sum over types in JSON) or the canonical op (``all_reduce``, ... : 2.26+ per-type counts).
* ``ras_missing_rank`` / ``ras_dead_rank`` — a rank RAS got no data from / whose process RAS declared dead.
* ``ras_missing_process`` / ``ras_dead_process`` — the same per process (``pid``, ``host``; no rank).
* ``ras_rank_status`` — ``name`` = RUNNING | INIT | FINALIZE | ABORT | NOCOMM | UNKNOWN per rank.
* ``ras_mismatch`` — one per ``#g-c (hash) MISMATCH`` reason; ``detail`` lists the value groups
  (``6650x26 6649x6``). ``ras_error`` — ``#g-c (hash) ERROR`` blocks. ``ras_comm_status`` — the summary table
  rows (``name`` = ``#<group>``, ``value`` = ranks per communicator).
* ``ras_event`` — monitor-mode events other than PEER_DEAD; ``rank_space`` for communicators smaller than the
  largest one (their ranks are communicator-local).

Text output lists rank numbers only for *outlier* groups (at most 25 % of the ranks and at most 10 of them;
< 50 % in verbose mode) — and the outliers may be the ranks that are **ahead**, not behind: the listed ranks are
tagged ``listed`` and every count is kept, so the analyzer compares values rather than trusting "who is listed".
When exactly one value group of a communicator is unlisted and the communicator size is known from the summary
table, its ranks are inferred (all ranks minus the listed ones, tagged ``inferred``); otherwise the group is kept
as one row with ``rank`` null and ``detail`` ``ranks=N unlisted``.

Several queries in one file (repeated ``ncclras`` runs, monitor streams, concatenated JSON documents) are kept
apart with ``snapshot=<n>`` in ``detail``: a count that does not move between snapshots is the hang signal.

Known limits: the text format changes between releases (the docs say so; JSON is preferred); pre-2.26 text has a
single "collective operation counts" mismatch per communicator; monitor-mode text events other than PEER_DEAD
are kept as ``ras_event`` only; JSON/monitor timestamps are local time of the node, read as UTC.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from analyzers import schema
from analyzers.opnames import canonical_op
from analyzers.readers.base import ColumnMap, ReadResult, ReaderError, Skipped
from analyzers.readers.nccl_log import normalize_comm_id

__all__ = ["FORMAT", "COLUMN_MAP", "ColumnMap", "OBSERVATION_KINDS", "sniff", "read"]

FORMAT = "nccl_ras"


#: How RAS fields become OBSERVATIONS columns.
COLUMN_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("#g-c (hash) | communicators[].hash", "group", "str 0x<hex>", "required", "2.24"),
    ColumnMap("Rank N | ranks[].rank | missing_ranks[].rank", "rank", "int, communicator rank", "null", "2.24"),
    ColumnMap("launched up to operation V | collective_counts", "value", "int", "null", "2.24 (JSON 2.28.7)"),
    ColumnMap("different <Op> operation counts | collective_counts key", "name", "canonical op | total",
              "total", "2.26"),
    ColumnMap("managed by process P on node H | pid, host", "pid, host", "int, str", "null", "2.24"),
    ColumnMap("status{init_state,...} | ranks have status X", "name (ras_rank_status)", "str", "null", "2.24"),
    ColumnMap("timestamp (JSON, monitor)", "wall_ns", "ns, local time read as UTC", "null", "2.28.7"),
    ColumnMap("(query index in file)", "detail snapshot=<n>", "int", "1", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "ras_op_count": "group=comm hash, rank, name=total|<op>, value=ops launched, detail=snapshot, listed/inferred",
    "ras_missing_rank": "group, rank, pid/host when printed; detail=unresponsive/considered_dead",
    "ras_dead_rank": "group, rank of a process RAS considers dead",
    "ras_missing_process": "pid, host, detail=GPUs of a process RAS got no data from",
    "ras_dead_process": "pid, host, detail=GPUs of a process RAS considers dead",
    "ras_rank_status": "group, rank, name=RUNNING|INIT|FINALIZE|ABORT|NOCOMM|UNKNOWN, value=init_state (JSON)",
    "ras_mismatch": "group, name=what differs, detail=value groups 'VALUExCOUNT ...'",
    "ras_error": "group, detail=the ERROR block text",
    "ras_comm_status": "name=#<group>, value=ranks per comm, detail=comms/nodes/status/errors",
    "ras_event": "monitor event: name=event, detail=peer/details",
    "rank_space": "communicator smaller than the largest: group, detail=comm:<hash>, value=size",
}

_OP_TOTAL = "total"

# ---- text patterns (client_support.cc)
_TABLE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z]+)\s*$")
_COMM_HDR = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-Fx]+)\) (MISMATCH|INCOMPLETE|ERROR)\s*$")
_DIFF_COUNTS = re.compile(r"^\s*Communicator ranks have different (\w+) operation counts")
_DIFF_STATUS = re.compile(r"^\s*Communicator ranks have different status")
_N_LAUNCHED = re.compile(r"^\s*(\d+) ranks have launched up to operation (\d+)")
_N_NONE = re.compile(r"^\s*(\d+) ranks have not launched any operations")
_N_STATUS = re.compile(r"^\s*(\d+) ranks have status (\w+)")
_RANK_LAUNCHED = re.compile(r"^\s*Rank (\d+) has launched up to operation (\d+)")
_RANK_NONE = re.compile(r"^\s*Rank (\d+) has not launched any operations")
_RANK_STATUS = re.compile(r"^\s*Rank (\d+) has status (\w+)")
_RANK_MEMBER = re.compile(r"^\s*Rank (\d+) --")
_PROC_INFO = re.compile(r"GPUs? (\S+) managed by process (\d+) on node (\S+)")
_PROCESS = re.compile(r"^\s*Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_MISSING_LIST = re.compile(r"^\s*The missing ranks?: (.+?)\s*$")
_PEER_DEAD = re.compile(r"^\s*(?:\[([^\]]+)\] )?PEER_DEAD: Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_MON_EVENT = re.compile(r"^\s*\[([^\]]+)\] ([A-Z_]+): (.*)$")
_SECTION = re.compile(r"^(Errors|Warnings|Job summary|Communicators\.\.\..*)\s*$")


@dataclass
class _Snapshot:
    """One RAS answer (text): what it says, in the order it says it."""

    index: int
    group_size: dict[int, int] = field(default_factory=dict)    # table group -> ranks per comm
    dead_pids: set[tuple[int, str]] = field(default_factory=set)


def _looks_binary(data: bytes) -> bool:
    return b"\x00" in data[:65536]


def sniff(path: Path, head: bytes) -> bool:
    """True for RAS text (``Job summary`` / ``Communicators...`` / ``#0-0 (hash) MISMATCH`` / monitor banner) or
    RAS JSON (``"communicators"`` with ``"collective_counts"``/``"missing_ranks"``, or a monitor event)."""
    if not head or _looks_binary(head):
        return False
    h = head.lstrip()
    if h.startswith(b"{") or h.startswith(b"["):
        return (b'"communicators"' in head and (b'"ranks"' in head or b'"hash"' in head)) or (
            b'"event"' in head and b'"group"' in head and b'"peer"' in head)
    return bool(
        (b"Job summary" in head and b"Communicators" in head)
        or re.search(rb"(?m)^#\d+-\d+ \([0-9a-f]{8,16}\) (?:MISMATCH|INCOMPLETE|ERROR)", head)
        or b"RAS Monitor Mode" in head
        or re.search(rb"PEER_DEAD: Process \d+ on node", head))


def read(path: Path) -> ReadResult:
    """Read one file of RAS output. Raises ``ReaderError`` if it cannot be opened or holds no RAS output."""
    path = Path(path)
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ReaderError(path, f"cannot open: {e.strerror or e}") from e
    if not data.strip():
        return ReadResult(file=file, format=FORMAT, skipped=(Skipped(file, None, "empty file"),))
    if _looks_binary(data):
        raise ReaderError(path, "binary content, not NCCL RAS output")
    skipped: list[Skipped] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", "replace")
        skipped.append(Skipped(file, data.count(b"\n", 0, e.start) + 1,
                               "bytes that are not UTF-8 (mixed encodings); decoded with replacement characters"))
    obs: list[dict[str, Any]] = []
    version: str | None = None
    if text.lstrip().startswith(("{", "[")):
        version = _read_json(text, file, obs, skipped)
    else:
        _read_text(text, file, obs, skipped)
    if not obs:
        raise ReaderError(path, "no NCCL RAS communicator, rank or process information found")
    sizes = [r["value"] for r in obs if r["kind"] == "_size" and r["value"]]
    obs = [r for r in obs if r["kind"] != "_size"]
    world = max(sizes) if sizes else None
    if world:
        seen: set[str] = set()
        for r in [r for r in obs if r.get("group")]:
            size = r.get("_size")
            if size and size < world and r["group"] not in seen:
                seen.add(r["group"])
                obs.append(dict(kind="rank_space", group=r["group"], detail=f"comm:{r['group']}", value=size,
                                line=r.get("line")))
    for r in obs:
        for k in [k for k in r if k.startswith("_")]:
            del r[k]
        r.setdefault("source", "ras")
        r.setdefault("file", file)
    return ReadResult(file=file, format=FORMAT, version=version,
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(skipped),
                      world_size=world)


# --------------------------------------------------------------------------------------------------- text

def _read_text(text: str, file: str, obs: list[dict[str, Any]], skipped: list[Skipped]) -> None:
    snap = _Snapshot(index=0)
    started = False
    section = ""
    block: dict[str, Any] | None = None      # the current "#g-c (hash) ..." block
    proc_block: str | None = None            # INCOMPLETE / DEAD process lists
    lines = text.splitlines()

    def close_block() -> None:
        nonlocal block
        if block is not None:
            _finish_block(block, snap, file, obs)
        block = None

    for ln, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        if not line.strip():
            proc_block = None
            continue
        if line.startswith("Job summary") or (line.startswith("Communicators") and not started):
            if line.startswith("Job summary") or snap.index == 0:
                close_block()
                snap = _Snapshot(index=snap.index + 1)
                started = True
        sm = _SECTION.match(line)
        if sm:
            close_block()
            section = sm.group(1).split(".")[0]
            proc_block = None
            continue
        if set(line.strip()) == {"="}:
            continue
        if snap.index == 0:
            snap.index = 1
        pd = _PEER_DEAD.match(line)
        if pd:
            obs.append(dict(kind="ras_dead_process", pid=int(pd.group(2)), host=pd.group(3),
                            detail=f"gpus={pd.group(4)} snapshot={snap.index}", wall_ns=_ts(pd.group(1)), line=ln))
            continue
        me = _MON_EVENT.match(line)
        if me:
            obs.append(dict(kind="ras_event", name=me.group(2), detail=me.group(3), wall_ns=_ts(me.group(1)),
                            line=ln))
            continue
        tr = _TABLE_ROW.match(line)
        if tr and section.startswith("Communicators"):
            grp, size = int(tr.group(1)), int(tr.group(5))
            snap.group_size[grp] = size
            obs.append(dict(kind="ras_comm_status", name=f"#{grp}", value=size, line=ln,
                            detail=f"comms={tr.group(2)} nodes={tr.group(3)} ranks_per_node={tr.group(4)} "
                                   f"ranks_in_group={tr.group(6)} status={tr.group(7)} errors={tr.group(8)} "
                                   f"snapshot={snap.index}"))
            obs.append(dict(kind="_size", value=size))
            continue
        ch = _COMM_HDR.match(line)
        if ch:
            close_block()
            proc_block = None
            block = dict(g=int(ch.group(1)), c=int(ch.group(2)), group=normalize_comm_id(ch.group(3)),
                         what=ch.group(4), line=ln, mode=None, op=None, groups=[], cur=None, text=[])
            continue
        if block is None and line.strip() in ("INCOMPLETE", "DEAD", "TIMEOUT"):
            proc_block = line.strip()
            continue
        if proc_block is not None and block is None:
            pm = _PROCESS.match(line)
            if pm:
                pid, host = int(pm.group(1)), pm.group(2)
                kind = "ras_dead_process" if proc_block == "DEAD" else "ras_missing_process"
                if proc_block == "DEAD":
                    snap.dead_pids.add((pid, host))
                obs.append(dict(kind=kind, pid=pid, host=host, detail=f"gpus={pm.group(3)} snapshot={snap.index}",
                                line=ln))
            elif proc_block == "TIMEOUT":
                obs.append(dict(kind="ras_event", name="TIMEOUT", detail=line.strip(), line=ln))
            continue
        if block is not None:
            _block_line(block, line, ln, snap, file, obs, skipped)
            continue
    close_block()


def _block_line(block: dict[str, Any], line: str, ln: int, snap: _Snapshot, file: str,
                obs: list[dict[str, Any]], skipped: list[Skipped]) -> None:
    """One line inside a ``#g-c (hash) ...`` block."""
    block["text"].append(line.strip())
    grp = block["group"]
    proc = _PROC_INFO.search(line)
    pid = int(proc.group(2)) if proc else None
    host = proc.group(3) if proc else None
    if block["what"] == "INCOMPLETE":
        ml = _MISSING_LIST.match(line)
        if ml:
            for r in _rank_list(ml.group(1)):
                _missing(obs, grp, r, None, None, snap, ln)
            return
        rm = _RANK_MEMBER.match(line)
        if rm:
            _missing(obs, grp, int(rm.group(1)), pid, host, snap, ln)
        return
    if block["what"] == "ERROR":
        rm = _RANK_MEMBER.match(line)
        if rm:
            block.setdefault("error_ranks", []).append((int(rm.group(1)), pid, host, ln))
        return
    # MISMATCH
    m = _DIFF_COUNTS.match(line)
    if m:
        _close_mismatch(block, snap, obs)
        op = m.group(1)
        block.update(mode="counts", op=_OP_TOTAL if op == "collective" else canonical_op(op), groups=[], cur=None,
                     reason=line.strip(), reason_line=ln)
        return
    if _DIFF_STATUS.match(line):
        _close_mismatch(block, snap, obs)
        block.update(mode="status", op=None, groups=[], cur=None, reason=line.strip(), reason_line=ln)
        return
    if block["mode"] == "counts":
        hm = _N_LAUNCHED.match(line) or _N_NONE.match(line)
        if hm:
            value = int(hm.group(2)) if hm.re is _N_LAUNCHED else 0
            g = dict(value=value, count=int(hm.group(1)), ranks=[], line=ln)
            block["groups"].append(g)
            block["cur"] = g
            return
        sm = _RANK_LAUNCHED.match(line) or _RANK_NONE.match(line)
        if sm:
            value = int(sm.group(2)) if sm.re is _RANK_LAUNCHED else 0
            g = dict(value=value, count=1, ranks=[(int(sm.group(1)), pid, host, ln)], line=ln)
            block["groups"].append(g)
            block["cur"] = None
            return
        rm = _RANK_MEMBER.match(line)
        if rm and block["cur"] is not None:
            block["cur"]["ranks"].append((int(rm.group(1)), pid, host, ln))
            return
    elif block["mode"] == "status":
        hm = _N_STATUS.match(line)
        if hm:
            g = dict(value=hm.group(2), count=int(hm.group(1)), ranks=[], line=ln)
            block["groups"].append(g)
            block["cur"] = g
            return
        sm = _RANK_STATUS.match(line)
        if sm:
            block["groups"].append(dict(value=sm.group(2), count=1, ranks=[(int(sm.group(1)), pid, host, ln)],
                                        line=ln))
            block["cur"] = None
            return
        rm = _RANK_MEMBER.match(line)
        if rm and block["cur"] is not None:
            block["cur"]["ranks"].append((int(rm.group(1)), pid, host, ln))
            return
    skipped.append(Skipped(file, ln, f"RAS line not understood in {block['what']} block: {line.strip()[:120]}"))


def _close_mismatch(block: dict[str, Any], snap: _Snapshot, obs: list[dict[str, Any]]) -> None:
    """Emit the rows of the finished mismatch sub-block (counts or status)."""
    mode, groups = block.get("mode"), block.get("groups") or []
    if not mode or not groups:
        block.update(mode=None, groups=[], cur=None)
        return
    grp = block["group"]
    size = snap.group_size.get(block["g"])
    summary = " ".join(f"{g['value']}x{g['count']}" for g in groups)
    obs.append(dict(kind="ras_mismatch", group=grp, name=block["reason"], detail=f"{summary} snapshot={snap.index}",
                    line=block["reason_line"], _size=size))
    listed = {r[0] for g in groups for r in g["ranks"]}
    unlisted = [g for g in groups if not g["ranks"]]
    inferred: list[int] | None = None
    if size and len(unlisted) == 1 and size - len(listed) == unlisted[0]["count"]:
        inferred = [r for r in range(size) if r not in listed]
    kind = "ras_op_count" if mode == "counts" else "ras_rank_status"
    for g in groups:
        if g["ranks"]:
            for rank, pid, host, ln in g["ranks"]:
                row = dict(kind=kind, group=grp, rank=rank, pid=pid, host=host, line=ln, _size=size,
                           detail=f"listed group_size={g['count']} snapshot={snap.index}")
                if mode == "counts":
                    row.update(name=block["op"], value=g["value"])
                else:
                    row.update(name=g["value"])
                obs.append(row)
        elif inferred is not None:
            for rank in inferred:
                row = dict(kind=kind, group=grp, rank=rank, line=g["line"], _size=size,
                           detail=f"inferred group_size={g['count']} snapshot={snap.index}")
                if mode == "counts":
                    row.update(name=block["op"], value=g["value"])
                else:
                    row.update(name=g["value"])
                obs.append(row)
        else:
            row = dict(kind=kind, group=grp, rank=None, line=g["line"], _size=size,
                       detail=f"ranks={g['count']} unlisted snapshot={snap.index}")
            if mode == "counts":
                row.update(name=block["op"], value=g["value"])
            else:
                row.update(name=g["value"])
            obs.append(row)
    block.update(mode=None, groups=[], cur=None)


def _finish_block(block: dict[str, Any], snap: _Snapshot, file: str, obs: list[dict[str, Any]]) -> None:
    if block["what"] == "MISMATCH":
        _close_mismatch(block, snap, obs)
    elif block["what"] == "ERROR":
        ranks = block.get("error_ranks") or [(None, None, None, block["line"])]
        for rank, pid, host, ln in ranks:
            obs.append(dict(kind="ras_error", group=block["group"], rank=rank, pid=pid, host=host, line=ln,
                            detail=" | ".join(block["text"])[:500] + f" snapshot={snap.index}",
                            _size=snap.group_size.get(block["g"])))
    elif block["what"] == "INCOMPLETE":
        # ranks whose process is listed as dead are dead, not only missing
        for r in [r for r in obs if r["kind"] == "ras_missing_rank" and r.get("group") == block["group"]
                  and r.get("_snap") == snap.index and r.get("pid") is not None]:
            if any(pid == r["pid"] for pid, _ in snap.dead_pids):
                obs.append(dict(kind="ras_dead_rank", group=r["group"], rank=r["rank"], pid=r["pid"],
                                host=r["host"], line=r["line"], detail=f"process dead snapshot={snap.index}"))
        for r in obs:
            if r.get("group") == block["group"] and r["kind"] == "ras_missing_rank":
                r.setdefault("_size", snap.group_size.get(block["g"]))


def _missing(obs: list[dict[str, Any]], grp: str, rank: int, pid: int | None, host: str | None, snap: _Snapshot,
             ln: int) -> None:
    obs.append(dict(kind="ras_missing_rank", group=grp, rank=rank, pid=pid, host=host, line=ln, _snap=snap.index,
                    detail=f"no data from this rank snapshot={snap.index}"))


def _rank_list(s: str) -> list[int]:
    out: list[int] = []
    for part in re.split(r"[,\s]+", s.strip()):
        if not part:
            continue
        if "-" in part:
            a, _, b = part.partition("-")
            if a.isdigit() and b.isdigit():
                out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def _ts(s: str | None) -> int | None:
    if not s:
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return int(datetime.strptime(s.strip(), fmt).replace(tzinfo=timezone.utc).timestamp()) * 1_000_000_000
        except ValueError:
            continue
    return None


# --------------------------------------------------------------------------------------------------- JSON

_RANK_KEY = re.compile(r'"rank"\s*:\s*(-?\d+)')


def _read_json(text: str, file: str, obs: list[dict[str, Any]], skipped: list[Skipped]) -> str | None:
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
    wall = _ts(d.get("timestamp"))
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
                obs.append(dict(base, kind="ras_op_count", name=_OP_TOTAL, value=total,
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
    wall = _ts(d.get("timestamp"))
    if d.get("event") == "PEER_DEAD":
        obs.append(dict(kind="ras_dead_process", pid=peer.get("pid"), host=peer.get("host"), wall_ns=wall,
                        line=line, detail=f"gpus={peer.get('cuda_devs')} {d.get('details') or ''}".strip()))
    else:
        obs.append(dict(kind="ras_event", name=str(d.get("event")), pid=peer.get("pid"), host=peer.get("host"),
                        wall_ns=wall, line=line, detail=json.dumps(d, sort_keys=True)[:500]))
