"""COLL records to integer rows: communicator resolution and ``seq`` numbering, line by line or a run at a time.

Why separate: this is the core of the EVENTS rows. The regex loop (``_scan_range``, the reference, which also
hands the rarer lines it meets to ``_rare_line``) and the bulk path (``_vector_run`` over rows parsed by
``nccl_log_vector``) must resolve prefixes and count positions identically, so both live here with the shared
resolver (``_resolve``) and the torn-line finder.
"""
from __future__ import annotations

from array import array

import numpy as np

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_log_grammar import _COLL_PREFIX_RE, _COLL_RE, _NRANKS_RE, _P2P_RAW, _SCAN_RE, _parse_ts
from ranktrace.analyzers.readers.nccl_log_rare_lines import _RareLines
from ranktrace.analyzers.readers.nccl_log_state import _I63, _Comm, _block
from ranktrace.analyzers.readers.nccl_log_vector import _Fast

_PREFIX_CACHE_MAX = 200_000


class _CollRows(_RareLines):
    """COLL records of a chunk → ``(rows, _NMETA)`` int64 blocks (the regex loop dispatches rarer lines too)."""

    # ---- COLL records

    def _scan_range(self, chunk: bytes, start: int, end: int, first_line: int, blocks: list[np.ndarray]) -> int:
        """The regex loop over whole lines ``chunk[start:end]`` (``first_line`` = number of the line at start).

        One ``finditer`` finds COLL records and the rarer lines; returns the number of COLL rows it added.
        """
        cur_pos, cur_line = start, first_line
        last_rare = -1
        count = chunk.count
        rfind = chunk.rfind
        cache = self.coll_cache
        meta = array("q")
        meta_extend = meta.extend
        p2p_raw = _P2P_RAW
        op_ids = self.op_ids
        n = 0
        for m in _SCAN_RE.finditer(chunk, start, end):
            s = m.start()
            ls = rfind(b"\n", 0, s) + 1
            if ls != cur_pos:
                cur_line += count(b"\n", cur_pos, ls)
                cur_pos = ls
            op, opc, cnt, dt, root, comm = m.groups()
            if op is None:  # a rarer line: parsed whole, once
                if ls != last_rare:
                    last_rare = ls
                    self._rare_line(chunk, ls, cur_line)
                continue
            key = (chunk[ls:s], comm)
            hit = cache.get(key)
            if hit is None:
                nr = _NRANKS_RE.search(chunk, s)
                hit = self._resolve(key[0], comm, nr.group(1) if nr else b"0", cur_line)
                if hit is None:
                    self._torn(cur_line, "COLL record without a host:pid:tid prefix (torn line)")
                    continue
                if len(cache) > _PREFIX_CACHE_MAX:
                    cache.clear()
                cache[key] = hit
                if hit[1].first_coll_line is None:
                    hit[1].first_coll_line = cur_line
            ii, c, ci = hit
            opc_v = 0 if opc == b"0" else int(opc, 16)
            dt_v, cnt_v = int(dt), int(cnt)
            root_v = 0 if root == b"0" else int(root)
            if opc_v > _I63 or dt_v > _I63 or cnt_v > _I63 or not -_I63 <= root_v <= _I63:
                self._torn(cur_line, "COLL record with a number beyond 64 bits (garbled line): "
                           + chunk[ls:s + 120].decode("utf-8", "replace"))
                continue
            oi = op_ids.get(op)
            if oi is None:
                oi = op_ids[op] = len(op_ids)
            if op in p2p_raw:
                seq = self._p2p_seq(c, op, root)
            else:
                seq = c.n_coll = c.n_coll + 1
            meta_extend((cur_line, ii, ci, seq, opc_v, oi, dt_v, cnt_v, root_v))
            n += 1
        if n:
            blk = _block(n)
            blk.reshape(-1)[:] = np.frombuffer(meta, dtype=np.int64)
            blocks.append(blk)
        return n

    def _vector_run(self, chunk: bytes, first_line: int, fast: _Fast, lo: int, hi: int,
                    blocks: list[np.ndarray]) -> int | None:
        """COLL rows ``lo:hi`` of ``fast`` (no rarer line between them) → one block; None if one is unresolvable."""
        rows = hi - lo
        pre, comm, op = fast.pre[lo:hi], fast.comm[lo:hi], fast.op[lo:hi]
        keys = pre * len(fast.comm_vals) + comm
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        ii_u = np.empty(uniq.size, dtype=np.int64)
        ci_u = np.empty(uniq.size, dtype=np.int64)
        cache = self.coll_cache
        for u in np.argsort(first, kind="stable").tolist():
            f = lo + int(first[u])
            key = (fast.pre_vals[fast.pre[f]], fast.comm_vals[fast.comm[f]])
            hit = cache.get(key)
            if hit is None:
                line = first_line + int(fast.line[f])
                nr = _NRANKS_RE.search(chunk, int(fast.anchor[f]))
                hit = self._resolve(key[0], key[1], nr.group(1) if nr else b"0", line)
                if hit is None:
                    return None
                if len(cache) > _PREFIX_CACHE_MAX:
                    cache.clear()
                cache[key] = hit
                if hit[1].first_coll_line is None:
                    hit[1].first_coll_line = line
            ii_u[u], ci_u[u] = hit[0], hit[2]
        inv = inv.reshape(-1)
        ii, ci = ii_u[inv], ci_u[inv]
        # op ids in order of first appearance, as the regex loop assigns them
        op_u, op_first = np.unique(op, return_index=True)
        op_map = np.zeros(len(fast.op_vals), dtype=np.int64)
        for k in op_u[np.argsort(op_first, kind="stable")].tolist():
            raw = fast.op_vals[k]
            oi = self.op_ids.get(raw)
            if oi is None:
                oi = self.op_ids[raw] = len(self.op_ids)
            op_map[k] = oi
        oi_a = op_map[op]
        is_p2p = self._p2p_by_op()[oi_a]
        root = fast.root[lo:hi]
        seq = np.empty(rows, dtype=np.int64)
        comms = self.all_comms
        # collectives: line order per communicator
        idx = np.flatnonzero(~is_p2p)
        if idx.size:
            order = idx[np.argsort(ci[idx], kind="stable")]
            sc = ci[order]
            starts = np.flatnonzero(np.concatenate(([True], sc[1:] != sc[:-1])))
            counts = np.diff(np.append(starts, sc.size))
            base = np.empty(starts.size, dtype=np.int64)
            for i, (c_idx, cnt) in enumerate(zip(sc[starts].tolist(), counts.tolist())):
                c = comms[c_idx]
                base[i] = c.n_coll
                c.n_coll += cnt
            seq[order] = np.repeat(base - starts, counts) + np.arange(sc.size) + 1
        # p2p: per (communicator, src, dst)
        idx = np.flatnonzero(is_p2p)
        if idx.size:
            none = -(1 << 62)
            rank = np.array([none if c.rank is None else c.rank for c in comms], dtype=np.int64)[ci[idx]]
            recv_ops = np.zeros(len(self.op_ids), dtype=bool)
            for raw in (b"Recv", b"WaitSignal"):
                if raw in self.op_ids:
                    recv_ops[self.op_ids[raw]] = True
            recv = recv_ops[oi_a[idx]]
            peer = root[idx]
            src = np.where(recv, peer, rank)
            dst = np.where(recv, rank, peer)
            cidx = ci[idx]
            o = np.lexsort((np.arange(idx.size), dst, src, cidx))
            order = idx[o]
            k_ci, k_src, k_dst = cidx[o], src[o], dst[o]
            change = np.concatenate(([True], (k_ci[1:] != k_ci[:-1]) | (k_src[1:] != k_src[:-1])
                                     | (k_dst[1:] != k_dst[:-1])))
            starts = np.flatnonzero(change)
            counts = np.diff(np.append(starts, order.size))
            base = np.empty(starts.size, dtype=np.int64)
            for i, (c_idx, a_, b_, cnt) in enumerate(zip(k_ci[starts].tolist(), k_src[starts].tolist(),
                                                         k_dst[starts].tolist(), counts.tolist())):
                pair = (None if a_ == none else a_, None if b_ == none else b_)
                c = comms[c_idx]
                had = c.p2p.get(pair, 0)
                base[i] = had
                c.p2p[pair] = had + cnt
            seq[order] = np.repeat(base - starts, counts) + np.arange(order.size) + 1
        block = _block(rows)
        block[:, 0] = fast.line[lo:hi] + first_line
        block[:, 1] = ii
        block[:, 2] = ci
        block[:, 3] = seq
        block[:, 4] = fast.opc[lo:hi]
        block[:, 5] = oi_a
        block[:, 6] = fast.dt[lo:hi]
        block[:, 7] = fast.count[lo:hi]
        block[:, 8] = root
        blocks.append(block)
        return rows

    def _find_torn_coll(self, chunk: bytes, first_line: int) -> None:
        """Slow path, only for chunks where some ``: opCount `` text did not parse: name those lines."""
        for ln, raw in enumerate(chunk.split(b"\n"), start=first_line):
            n = raw.count(b": opCount ")
            if n and len(_COLL_RE.findall(raw)) < n:
                self._torn(ln, "COLL record cut or interleaved (torn line): "
                           + raw.decode("utf-8", "replace")[:160])

    def _resolve(self, pre: bytes, comm_b: bytes, nranks_b: bytes, line: int) -> tuple[int, _Comm, int] | None:
        """Identity (host, pid, tid, time) and communicator of a COLL line, from the text before " NCCL INFO"."""
        m = _COLL_PREFIX_RE.search(pre)
        if m is None:
            return None
        ts, host_b, pid_b, tid_b, _dev = m.groups()
        pid = int(pid_b)
        host = self._host(host_b.decode("utf-8", "replace"), pid)
        ident = (host, pid, int(tid_b), _parse_ts(ts.decode()) if ts else None)
        ii = self.ident_idx.get(ident)
        if ii is None:
            ii = self.ident_idx[ident] = len(self.idents)
            self.idents.append(ident)
        ptr = comm_b.decode()
        c = self.comms.get((host, pid, ptr))
        if c is None:
            c = self._new_comm(host, pid, ptr)
            c.nranks = int(nranks_b)
            key = (host, pid, ptr)
            if key not in self.fallback_noted:
                self.fallback_noted.add(key)
                self.skipped.append(Skipped(
                    self.file, line,
                    f"no Init line for comm {ptr} of pid {pid} on {host}: its ops are grouped as comm:{ptr} "
                    f"and cannot be matched with other ranks' ops (enable NCCL_DEBUG_SUBSYS=INIT)"))
        return ii, c, c.idx

    @staticmethod
    def _p2p_seq(c: _Comm, op: bytes, root: bytes) -> int:
        peer = int(root)
        pair = (peer, c.rank) if op in (b"Recv", b"WaitSignal") else (c.rank, peer)
        seq = c.p2p.get(pair, 0) + 1
        c.p2p[pair] = seq
        return seq
