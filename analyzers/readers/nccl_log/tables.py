"""The end of a read: the accumulated state as Arrow tables (EVENTS built block by block from the COLL rows, each
block freed once converted, so the peak is the EVENTS table plus one block), the seq basis per communicator, and
the ``ReadResult``."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.tracer.formats import schema
from ranktrace.tracer.formats.opnames import canonical_op
from ranktrace.analyzers.readers.base import ReadResult, Skipped
from ranktrace.analyzers.readers.nccl_log.grammar import (NCCL_DTYPES, P2P_RAW, ROOTED_RAW, TUNING_ALGOS,
                                                          TUNING_PROTOS)
from ranktrace.analyzers.readers.nccl_log.interpret import NMETA, Reader, block

__all__ = ["build_result", "NUL_NOTE"]

NUL_NOTE = " (a sparse hole, or the file was truncated while being written)"   # ends the NUL note: read_doc's key

_BATCH_ROWS = 1 << 16       # small blocks are merged up to this many rows per record batch of the result


def build_result(st: Reader, fmt: str) -> ReadResult:
    """The read's result: EVENTS from the COLL row blocks, OBSERVATIONS with the per-communicator ``nccl_seq_basis``
    and ``rank_space`` rows, the notes (mixed versions, bad UTF-8, NUL bytes, torn lines) and the world size."""
    sizes = [c.nranks for c in st.all_comms if c.nranks]
    world = max(sizes) if sizes else None
    for row, c in st.init_obs:
        row["group"] = c.group
        row["detail"] = " ".join(f"{k}={v}" for k, v in
                                 ([("nranks", c.nranks)] + sorted(c.info.items())) if v is not None)
    _repair_hosts(st)
    events, basis = _events(st, world)
    for c in st.all_comms:
        if c.idx in basis:
            b, first_line, n = basis[c.idx]
            st.obs.append(dict(host=c.host, pid=c.pid, kind="nccl_seq_basis", name=c.ptr, group=c.group,
                               rank=c.rank, detail=b, value=n, line=first_line))
        if world is not None and c.nranks is not None and c.nranks < world:
            st.obs.append(dict(host=c.host, pid=c.pid, kind="rank_space", name=c.ptr, group=c.group,
                               rank=c.rank, detail=f"comm:{c.group}", value=c.nranks, line=c.init_line))
    for (host, pid, op, algo, proto), (calls, lo, hi, line, tid) in st.tuning.items():
        algo = TUNING_ALGOS[int(algo)] if algo.isdigit() and int(algo) < len(TUNING_ALGOS) else algo
        proto = TUNING_PROTOS[int(proto)] if proto.isdigit() and int(proto) < len(TUNING_PROTOS) else proto
        comm = _tuning_comm(st, host, pid, tid)
        st.obs.append(dict(host=host, pid=pid, tid=tid, kind="nccl_tuning", name=canonical_op(op),
                           detail=f"{algo}/{proto} bytes={lo}..{hi}", value=calls, line=line,
                           group=comm.group if comm else None, rank=comm.rank if comm else None))
    if len(st.versions) > 1:
        vs = sorted(st.versions.items(), key=lambda kv: kv[1])
        st.skipped.append(Skipped(st.file, vs[1][1],
                                  "mixed NCCL versions in one file: "
                                  + ", ".join(f"{v} (first at line {ln})" for v, ln in vs)
                                  + "; version reported as the first one"))
    if st.bad_utf8_line is not None:
        st.skipped.append(Skipped(st.file, st.bad_utf8_line,
                                  "bytes that are not UTF-8 (mixed encodings) from this line on; "
                                  "decoded with replacement characters"))
    if st.nul_bytes:
        st.skipped.append(Skipped(st.file, st.nul_line,
                                  f"{st.nul_bytes} NUL bytes ignored, the first near this line{NUL_NOTE}"))
    if st.torn > 50:
        st.skipped.append(Skipped(st.file, None, f"{st.torn} torn lines in all (first 50 listed)"))
    for r in st.obs:
        r.setdefault("source", "nccl")
        r.setdefault("file", st.file)
    obs = schema.table_from_rows(schema.OBSERVATIONS, st.obs)
    version = min(st.versions.items(), key=lambda kv: kv[1])[0] if st.versions else None
    return ReadResult(file=st.file, format=fmt, version=version, events=events, observations=obs,
                      skipped=tuple(st.skipped), world_size=world)


def _tuning_comm(st: Reader, host: str, pid: int, tid: int) -> Any:
    """The communicator a TUNING line is about: the one whose Init the same thread printed last, else the only one
    of the process; None when that is unclear (TUNING lines do not name their communicator)."""
    c = st.tid_comm.get((host, pid, tid))
    if c is not None:
        return c
    mine = [c for c in st.all_comms if c.host == host and c.pid == pid]
    return mine[0] if len(mine) == 1 else None


def _repair_hosts(st: Reader) -> None:
    """A host first seen with garbage glued in front is renamed to the clean host of the same pid."""
    fix: dict[tuple[str, int], str] = {}
    for pid, hosts in st.hosts_by_pid.items():
        for h in hosts:
            for g in hosts:
                if h != g and h.endswith(g):
                    fix[(h, pid)] = g
    if not fix:
        return
    for r in st.obs:
        k = (r.get("host"), r.get("pid"))
        if k in fix:
            r["host"] = fix[k]  # type: ignore[index]
    st.idents = [(fix.get((h, p), h), p, t, w) for h, p, t, w in st.idents]
    for c in st.all_comms:
        c.host = fix.get((c.host, c.pid), c.host)


def _events(st: Reader, world: int | None) -> tuple[pa.Table, dict[int, tuple[str, int, int]]]:
    """COLL rows → EVENTS, vectorised; also the seq basis per communicator (idx → (basis, first line, n)).

    The table is built block by block from the integer rows (each block freed once converted), so the memory
    peak is the EVENTS table plus one block, not the table plus all rows.
    """
    if not st.batches:
        return schema.empty(schema.EVENTS), {}
    comms = st.all_comms
    p2p_by_op = st.p2p_by_op()
    # seq basis per communicator (nccl_log docstring, rules 1-3); opCount statistics only for those without Init
    no_init = np.array([not c.init_seen for c in comms], dtype=bool)
    stats: dict[int, tuple[int, int, bool]] = {}
    if no_init.any():
        parts = []
        for blk in st.batches:
            m = no_init[blk[:, 2]] & ~p2p_by_op[blk[:, 5]]
            if m.any():
                parts.append(blk[m][:, [2, 4]])
        if parts:
            sub = np.concatenate(parts)
            order = np.argsort(sub[:, 0], kind="stable")
            ci_s, opc_s = sub[order, 0], sub[order, 1]
            starts = np.flatnonzero(np.concatenate(([True], ci_s[1:] != ci_s[:-1])))
            maxes = np.maximum.reduceat(opc_s, starts)
            drops = np.flatnonzero((opc_s[1:] < opc_s[:-1]) & (ci_s[1:] == ci_s[:-1]))
            bad = set(ci_s[drops + 1].tolist())
            counts = np.diff(np.append(starts, ci_s.size))
            for c_idx, n_c, mx in zip(ci_s[starts].tolist(), counts.tolist(), maxes.tolist()):
                stats[c_idx] = (n_c, mx, c_idx not in bad)
    basis: dict[int, tuple[str, int, int]] = {}
    use_opcount = np.zeros(len(comms), dtype=bool)
    frozen = _opcount_frozen(st.versions, stats)
    for c in comms:
        nrows = c.n_coll + sum(c.p2p.values())
        if not nrows or c.first_coll_line is None:
            continue
        cidx, first = c.idx, c.first_coll_line
        if c.init_seen:
            basis[cidx] = ("line", first, nrows)
            continue
        n_c, mx, nondecreasing = stats.get(cidx, (0, 0, True))
        if n_c > 0 and mx > 0 and nondecreasing and not frozen:
            basis[cidx] = ("opcount", first, nrows)
            use_opcount[cidx] = True
            st.skipped.append(Skipped(st.file, first, f"{c.group} (pid {c.pid}): no Init line, seq = "
                                    "opCount + 1 (log starts mid-run; grouped ops share a position)"))
        else:
            basis[cidx] = ("line_from_log_start", first, nrows)
            why = f"opCount is not a position from NCCL 2.27 on ({frozen})" if frozen and mx > 0 else \
                "no usable opCount"
            st.skipped.append(Skipped(st.file, first, f"{c.group} (pid {c.pid}): no Init line and {why}; seq counts "
                                    "COLL lines from the start of this file"))
    # small lookup tables, indexed by op id / comm index / identity index / NCCL datatype
    raw_ops = [o.decode() for o, _ in sorted(st.op_ids.items(), key=lambda kv: kv[1])]
    look = {
        "name": pa.array([canonical_op(r) for r in raw_ops], pa.string()),
        "category": pa.array(["p2p" if r.encode() in P2P_RAW else "collective" for r in raw_ops], pa.string()),
        "group": pa.array([c.group for c in comms], pa.string()),
        "rank": pa.array([c.rank for c in comms], pa.int32()),
        "detail": pa.array([f"comm={c.ptr}" for c in comms], pa.string()),
        "host": pa.array([x[0] for x in st.idents], pa.string()),
        "pid": pa.array([x[1] for x in st.idents], pa.int64()),
        "tid": pa.array([x[2] for x in st.idents], pa.int64()),
        "wall_ns": pa.array([x[3] for x in st.idents], pa.int64()),
        "dtype": pa.array([NCCL_DTYPES[i][0] for i in range(len(NCCL_DTYPES))], pa.string()),
    }
    dt_size = np.array([NCCL_DTYPES[i][1] for i in range(len(NCCL_DTYPES))], dtype=np.int64)
    rooted_op = np.array([r in ROOTED_RAW for r in raw_ops], dtype=bool)
    batches = []
    while st.batches:
        blocks = [st.batches.pop(0)]
        rows = len(blocks[0])
        while st.batches and rows + len(st.batches[0]) <= _BATCH_ROWS:
            rows += len(st.batches[0])
            blocks.append(st.batches.pop(0))
        if len(blocks) == 1:
            blk = blocks[0]
        else:
            blk = block(rows)
            np.concatenate(blocks, out=blk)
        del blocks
        batches.append(_event_batch(st, blk, world, look, dt_size, rooted_op, p2p_by_op, use_opcount))
        del blk
    return pa.Table.from_batches(batches, schema=schema.EVENTS), basis


def _event_batch(st: Reader, blk: np.ndarray, world: int | None, look: dict[str, pa.Array], dt_size: np.ndarray,
                 rooted_op: np.ndarray, p2p_by_op: np.ndarray, use_opcount: np.ndarray) -> pa.RecordBatch:
    n = len(blk)
    line, ii, ci, seq, opc, oi, dt, cnt, root = (np.ascontiguousarray(blk[:, k]) for k in range(NMETA))
    is_p2p = p2p_by_op[oi]
    if use_opcount.any():
        seq = np.where(use_opcount[ci] & ~is_p2p, opc + 1, seq)
    dt_bad = (dt < 0) | (dt >= dt_size.size)
    dt_idx = pa.array(np.where(dt_bad, 0, dt), mask=dt_bad)
    nbytes = pa.array(cnt * dt_size[np.where(dt_bad, 0, dt)], mask=dt_bad)
    peer_bad = ~is_p2p | (root < -(1 << 31)) | (root >= 1 << 31)
    peer = pa.array(np.where(peer_bad, 0, root).astype(np.int32), mask=peer_bad)
    ci_a, ii_a, oi_a = pa.array(ci), pa.array(ii), pa.array(oi)
    detail = look["detail"].take(ci_a)
    rooted = rooted_op[oi]
    if rooted.any():
        mask = pa.array(rooted)
        sub = pc.binary_join_element_wise(pc.filter(detail, mask), " root=",
                                          pa.array(root[rooted]).cast(pa.string()), "")
        detail = pc.replace_with_mask(detail, mask, sub)
    nccl = pa.repeat(pa.scalar("nccl"), n)
    nulls: dict[pa.DataType, pa.Array] = {}
    cols: dict[str, Any] = {
        "host": look["host"].take(ii_a),
        "pid": look["pid"].take(ii_a),
        "tid": look["tid"].take(ii_a),
        "wall_ns": look["wall_ns"].take(ii_a),
        "rank": look["rank"].take(ci_a),
        "world": pa.nulls(n, pa.int32()) if world is None else pa.repeat(pa.scalar(world, pa.int32()), n),
        "kind": pa.repeat(pa.scalar("enter"), n),
        "name": look["name"].take(oi_a),
        "category": look["category"].take(oi_a),
        "group": look["group"].take(ci_a),
        "backend": nccl,
        "seq": pa.array(seq),
        "backend_seq": pa.array(opc),
        "peer": peer,
        "nbytes": nbytes,
        "dtype": look["dtype"].take(dt_idx),
        "detail": detail,
        "source": nccl,
        "file": pa.repeat(pa.scalar(st.file), n),
        "line": pa.array(line),
    }
    arrays = []
    for f in schema.EVENTS:
        col = cols.get(f.name)
        if col is None:   # one all-null array per type, shared by the columns of that type
            col = nulls.get(f.type)
            if col is None:
                col = nulls[f.type] = pa.nulls(n, f.type)
        elif col.type != f.type:
            col = col.cast(f.type)
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema.EVENTS)


#: opCount stays 0 from NCCL 2.27 on for communicators without network work (a single-node one, or some ranks of a
#: multi-node one: NVIDIA/nccl#2021, "2.27+ single node, opCount always 0"), so no rank's opCount is a position
#: another rank's can be matched with; a file of an older NCCL with a communicator whose COLL lines all say 0 is the
#: same sign
_FROZEN_FROM = (2, 27)
_ZERO_RUN = 3


def _opcount_frozen(versions: dict[str, int], stats: dict[int, tuple[int, int, bool]]) -> str:
    """Why opCount cannot be matched across ranks in this file ("" when it can)."""
    for v in versions:
        parts = v.split("+", 1)[0].split(".")
        try:
            if (int(parts[0]), int(parts[1])) >= _FROZEN_FROM:
                return f"NCCL {v}"
        except (ValueError, IndexError):
            continue
    if any(n >= _ZERO_RUN and mx == 0 for n, mx, _ in stats.values()):
        return "a communicator whose COLL lines all say opCount 0"
    return ""
