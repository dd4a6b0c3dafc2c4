"""The text form of RAS output (summary table, ``#g-c (hash)`` blocks, monitor mode; the larger, release-dependent
half) into rows; value groups whose ranks RAS did not list are inferred when the communicator size allows."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_log import normalize_comm_id
from ranktrace.analyzers.readers.nccl_ras.rows import OP_TOTAL, ras_time

__all__ = ["scan_text"]

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



def scan_text(text: str, file: str, obs: list[dict[str, Any]], skipped: list[Skipped]) -> None:
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
                            detail=f"gpus={pd.group(4)} snapshot={snap.index}", wall_ns=ras_time(pd.group(1)), line=ln))
            continue
        me = _MON_EVENT.match(line)
        if me:
            obs.append(dict(kind="ras_event", name=me.group(2), detail=me.group(3), wall_ns=ras_time(me.group(1)),
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
        block.update(mode="counts", op=OP_TOTAL if op == "collective" else canonical_op(op), groups=[], cur=None,
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

    def emit(g: dict[str, Any], rank: int | None, line: int, how: str, **where: Any) -> None:
        """One row per rank of a group: counts carry the op and its count, status rows the status as name."""
        value = dict(name=block["op"], value=g["value"]) if mode == "counts" else dict(name=g["value"])
        obs.append(dict(kind=kind, group=grp, rank=rank, line=line, _size=size, **where, **value,
                        detail=f"{how} snapshot={snap.index}"))

    for g in groups:
        if g["ranks"]:
            for rank, pid, host, ln in g["ranks"]:
                emit(g, rank, ln, f"listed group_size={g['count']}", pid=pid, host=host)
        elif inferred is not None:
            for rank in inferred:
                emit(g, rank, g["line"], f"inferred group_size={g['count']}")
        else:
            emit(g, None, g["line"], f"ranks={g['count']} unlisted")
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
