"""Lines in file order -> what they mean: communicators built and retired (Init, teardown), the COLL records
resolved to a communicator and numbered (``seq``), and the rarer lines as observations. One ``Reader`` holds the
state of a read; the regex loop is the reference and the numpy path must agree with it."""
from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.text import MAX_LINE_CHARS
from ranktrace.analyzers.readers.nccl_log.grammar import (API_RE, BARE_VERSION_RE, COLL_PREFIX_RE, COLL_RE,
                                                          CONNECT_FAIL_RE, CUDA_FAIL_RE, FIELD_RES, INIT_FAIL_RE,
                                                          INIT_RE, MARKER_RE, BARE_WARN_RE, NET_FAIL_RE, MISMATCH_RE, NRANKS_RE, P2P_RAW, RING_RE, SCAN_RE,
                                                          SETTING_RES, SUMMARY_RE, TEARDOWN_RE, TRAIL_RE,
                                                          TRANSPORT_RE, TUNING_MARK, TUNING_RE, normalize_comm_id,
                                                          parse_ts)
from ranktrace.analyzers.readers.nccl_log.scan import FastRows, fast_rows, inert, iter_chunks, word_view

__all__ = ["Comm", "META", "NMETA", "block", "Reader"]

_VEC_MIN_BYTES = 32 << 10     # smaller chunks go through the regex loop only
_VEC_MIN_ROWS = 48            # a run of fewer COLL lines between two rarer lines is not worth the numpy set-up
_PREFIX_CACHE_MAX = 200_000

_MAX_PREFIX = 4096   # a COLL line's host:pid:tid [dev] (and timestamp) prefix is read from at most this far back


@dataclass(slots=True)
class Comm:
    """One communicator life inside one process (``(host, pid, comm pointer)`` until destroyed)."""

    idx: int
    host: str
    pid: int
    ptr: str
    group: str
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    init_seen: bool = False
    started: bool = False
    completed: bool = False         # its Init COMPLETE line was seen
    init_line: int | None = None
    info: dict[str, str] = field(default_factory=dict)
    n_coll: int = 0
    first_coll_line: int | None = None
    p2p: dict[tuple[int | None, int | None], int] = field(default_factory=dict)


#: Integers kept per COLL row (one ``(rows, 9)`` int64 block per chunk: no Python object outlives its chunk).
META = ("line", "ii", "ci", "seq", "opc", "op", "dt", "count", "root")
NMETA = len(META)
_I63 = (1 << 63) - 1


def block(rows: int) -> np.ndarray:
    """An uninitialised (rows, NMETA) int64 block in Arrow's memory pool: once a block has become EVENTS rows and
    is dropped, the pool reuses its memory for the next rows (numpy's heap would keep it to itself)."""
    return np.frombuffer(pa.allocate_buffer(rows * NMETA * 8), dtype=np.int64).reshape(rows, NMETA)


class Reader:
    """The state of one read (see the ``nccl_log.read`` docstring for the rules): ``run`` walks a file chunk by
    chunk; small chunks and short runs go through the regex loop (``_scan_range``), runs of COLL lines through the
    numpy path (``_vector_run``), the rarer lines through ``_rare_line``, all in line order.
    ``nccl_log.tables`` turns the state into the result."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)
        self.skipped: list[Skipped] = []
        self.obs: list[dict[str, Any]] = []
        self.init_obs: list[tuple[dict[str, Any], Comm]] = []
        self.comms: dict[tuple[str, int, str], Comm] = {}
        self.all_comms: list[Comm] = []
        self.tid_comm: dict[tuple[str, int, int], Comm] = {}
        self.transport: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.hosts_by_pid: dict[int, list[str]] = {}
        self.idents: list[tuple[str, int, int, int | None]] = []
        self.ident_idx: dict[tuple[str, int, int, int | None], int] = {}
        # (text before " NCCL INFO", comm pointer) -> (ident index, communicator); cleared when comms change
        self.coll_cache: dict[tuple[bytes, bytes], tuple[int, Comm, int]] = {}
        self.versions: dict[str, int] = {}
        self.init_done: set[tuple[str, int]] = set()               # processes with a communicator Init COMPLETE
        self.failures: set[tuple[Any, ...]] = set()                # (host, pid, kind, name) already reported
        self.fallback_noted: set[tuple[str, int, str]] = set()
        self.bad_utf8_line: int | None = None
        self.nul_bytes = 0
        self.nul_line: int | None = None
        self.torn = 0
        self.n_marker_lines = 0
        self.batches: list[np.ndarray] = []     # (rows, NMETA) int64 blocks, one per chunk
        self.op_ids: dict[bytes, int] = {}
        self.settings: set[tuple[Any, ...]] = set()      # (host, pid, group, key, value) already reported
        # (host, pid, op, algo, proto) -> [calls, smallest bytes, largest bytes, first line, tid]
        self.tuning: dict[tuple[str, int, str, str, str], list[int]] = {}

    # ---- helpers

    def _host(self, host: str, pid: int) -> str:
        known = self.hosts_by_pid.get(pid)
        if known is None:
            self.hosts_by_pid[pid] = [host]
            return host
        if host in known:
            return host
        for h in known:
            if host.endswith(h):
                return h
        known.append(host)
        return host

    def _torn(self, line: int, reason: str) -> None:
        self.torn += 1
        if self.torn <= 50:
            self.skipped.append(Skipped(self.file, line, reason))

    def _new_comm(self, host: str, pid: int, ptr: str) -> Comm:
        c = Comm(idx=len(self.all_comms), host=host, pid=pid, ptr=ptr, group=f"comm:{ptr}")
        self.comms[(host, pid, ptr)] = c
        self.all_comms.append(c)
        self.coll_cache.clear()
        return c

    def p2p_by_op(self) -> np.ndarray:
        """Per op id: is it a p2p op (Send/Recv/...)?"""
        flags = np.zeros(len(self.op_ids), dtype=bool)
        for op, oi in self.op_ids.items():
            flags[oi] = op in P2P_RAW
        return flags

    # ---- chunk loop

    def run(self, f: BinaryIO) -> None:
        line = 1
        for chunk, nuls in iter_chunks(f):
            if nuls:
                self.nul_bytes += nuls
                if self.nul_line is None:
                    self.nul_line = line
            if chunk:
                line = self._chunk(chunk, line)

    def _chunk(self, chunk: bytes, first_line: int) -> int:
        """Parse one chunk of whole lines; returns the number of the line after it."""
        if self.bad_utf8_line is None and not chunk.isascii():
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad_utf8_line = first_line + chunk.count(b"\n", 0, e.start)
        blocks: list[np.ndarray] = []
        if len(chunk) < _VEC_MIN_BYTES:
            n = self._scan_range(chunk, 0, len(chunk), first_line, blocks)
            newlines = chunk.count(b"\n")
        else:
            n, newlines = self._vector_chunk(chunk, first_line, blocks)
        self.n_marker_lines += n
        if len(blocks) == 1:
            self.batches.append(blocks[0])
        elif blocks:
            merged = block(sum(len(b) for b in blocks))
            np.concatenate(blocks, out=merged)
            self.batches.append(merged)
        if chunk.count(b": opCount ") != n:
            self._find_torn_coll(chunk, first_line)
        if TUNING_MARK in chunk:
            self._tuning_lines(chunk, first_line)
        return first_line + newlines

    def _tuning_lines(self, chunk: bytes, first_line: int) -> None:
        """TUNING lines (``AllReduce: 4096 Bytes -> Algo RING proto LL ...``), counted per process, op, algorithm
        and protocol; the fast paths leave them alone (they are no COLL record and no rarer line)."""
        tuning = self.tuning
        for m in TUNING_RE.finditer(chunk):
            s = m.start()
            ls = chunk.rfind(b"\n", 0, s) + 1
            pm = COLL_PREFIX_RE.search(chunk, ls, s)
            if pm is None:
                continue
            pid = int(pm.group(3))
            host = self._host(pm.group(2).decode("utf-8", "replace"), pid)
            op, nbytes, algo, proto = m.group(1).decode(), int(m.group(2)), m.group(3).decode(), m.group(4).decode()
            key = (host, pid, op, algo, proto)
            got = tuning.get(key)
            if got is None:
                tuning[key] = [1, nbytes, nbytes, first_line + chunk.count(b"\n", 0, ls), int(pm.group(4))]
            else:
                got[0] += 1
                if nbytes < got[1]:
                    got[1] = nbytes
                if nbytes > got[2]:
                    got[2] = nbytes

    def _vector_chunk(self, chunk: bytes, first_line: int, blocks: list[np.ndarray]) -> tuple[int, int]:
        """Parse a chunk (returns COLL rows, newlines): COLL lines in bulk with numpy, the rest (and short runs)
        with the regex loop, in line order.

        Lines are processed in file order: the rarer lines (Init, teardown, ...) change the communicator state a
        COLL line is resolved against, so they split the COLL lines into runs, each handled at once.
        """
        buf = np.frombuffer(chunk, dtype=np.uint8)
        size = buf.size
        nl = np.flatnonzero(buf == 10)
        n_lines = nl.size + (0 if chunk.endswith(b"\n") else 1)
        nccl = np.flatnonzero(buf[: size - 3] == 78)             # "NCCL"
        nccl = nccl[(buf[nccl + 1] == 67) & (buf[nccl + 2] == 67) & (buf[nccl + 3] == 76)]
        if not nccl.size:
            return 0, nl.size
        nccl_line = np.searchsorted(nl, nccl)
        single = np.ones(nccl.size, dtype=bool)
        single[1:] &= nccl_line[1:] != nccl_line[:-1]
        single[:-1] &= nccl_line[:-1] != nccl_line[1:]
        sp = np.flatnonzero(buf == 32)
        words = word_view(chunk)
        fast = fast_rows(chunk, buf, words, sp, nl, nccl, nccl_line, single)

        def line_start(k: int) -> int:
            return 0 if k == 0 else int(nl[k - 1]) + 1

        def line_end(k: int) -> int:
            return int(nl[k]) if k < nl.size else size

        if fast is None:
            return self._scan_range(chunk, 0, size, first_line, blocks), nl.size
        # lines with "NCCL" that are not validated COLL lines: the regex decides which of them matter, except
        # for lines that provably cannot match (below)
        other = ~np.isin(nccl_line, fast.line, assume_unique=False)
        is_inert = inert(buf, words, sp, nl, nccl, nccl_line, single & other)
        check = nccl_line[other & ~is_inert]
        check = check[np.concatenate(([True], check[1:] != check[:-1]))] if check.size else check
        search = SCAN_RE.search
        special = [k for k in check.tolist() if search(chunk, line_start(k), line_end(k)) is not None]
        cuts = np.searchsorted(fast.line, np.asarray(special, dtype=np.int64))
        bounds = np.concatenate(([0], cuts, [fast.line.size]))
        sizes = np.diff(bounds)
        n = 0
        pos = 0  # next line not yet processed
        for g in np.flatnonzero(sizes >= _VEC_MIN_ROWS).tolist():
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            first, last = int(fast.line[lo]), int(fast.line[hi - 1])
            if pos < first:
                n += self._scan_range(chunk, line_start(pos), line_start(first), first_line + pos, blocks)
            got = self._vector_run(chunk, first_line, fast, lo, hi, blocks)
            if got is None:  # a prefix the resolver refuses: the regex loop names the torn lines
                got = self._scan_range(chunk, line_start(first), line_start(last + 1), first_line + first, blocks)
            n += got
            pos = last + 1
        if pos < n_lines:
            n += self._scan_range(chunk, line_start(pos), size, first_line + pos, blocks)
        return n, nl.size

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
        p2p_raw = P2P_RAW
        op_ids = self.op_ids
        n = 0
        for m in SCAN_RE.finditer(chunk, start, end):
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
            key = (chunk[max(ls, s - _MAX_PREFIX):s], comm)
            hit = cache.get(key)
            if hit is None:
                nr = NRANKS_RE.search(chunk, s)
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
            blk = block(n)
            blk.reshape(-1)[:] = np.frombuffer(meta, dtype=np.int64)
            blocks.append(blk)
        return n

    def _vector_run(self, chunk: bytes, first_line: int, fast: FastRows, lo: int, hi: int,
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
                nr = NRANKS_RE.search(chunk, int(fast.anchor[f]))
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
        is_p2p = self.p2p_by_op()[oi_a]
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
        out = block(rows)
        out[:, 0] = fast.line[lo:hi] + first_line
        out[:, 1] = ii
        out[:, 2] = ci
        out[:, 3] = seq
        out[:, 4] = fast.opc[lo:hi]
        out[:, 5] = oi_a
        out[:, 6] = fast.dt[lo:hi]
        out[:, 7] = fast.count[lo:hi]
        out[:, 8] = root
        blocks.append(out)
        return rows

    def _find_torn_coll(self, chunk: bytes, first_line: int) -> None:
        """Slow path, only for chunks where some ``: opCount `` text did not parse: name those lines."""
        for ln, raw in enumerate(chunk.split(b"\n"), start=first_line):
            n = raw.count(b": opCount ")
            if n and len(COLL_RE.findall(raw)) < n:
                self._torn(ln, "COLL record cut or interleaved (torn line): "
                           + raw.decode("utf-8", "replace")[:160])

    def _resolve(self, pre: bytes, comm_b: bytes, nranks_b: bytes, line: int) -> tuple[int, Comm, int] | None:
        """Identity (host, pid, tid, time) and communicator of a COLL line, from the text before " NCCL INFO"."""
        m = COLL_PREFIX_RE.search(pre)
        if m is None:
            return None
        ts, host_b, pid_b, tid_b, _dev = m.groups()
        pid = int(pid_b)
        host = self._host(host_b.decode("utf-8", "replace"), pid)
        ident = (host, pid, int(tid_b), parse_ts(ts.decode()) if ts else None)
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
    def _p2p_seq(c: Comm, op: bytes, root: bytes) -> int:
        peer = int(root)
        pair = (peer, c.rank) if op in (b"Recv", b"WaitSignal") else (c.rank, peer)
        seq = c.p2p.get(pair, 0) + 1
        c.p2p[pair] = seq
        return seq

    # ---- keyword lines

    def _rare_line(self, chunk: bytes, ls: int, line: int) -> None:
        le = chunk.find(b"\n", ls, ls + MAX_LINE_CHARS)  # a line is examined up to MAX_LINE_CHARS, as text is
        raw = chunk[ls:ls + MAX_LINE_CHARS] if le == -1 else chunk[ls:le]
        text = raw.decode("utf-8", "replace").rstrip("\r")
        marks = list(MARKER_RE.finditer(text))
        if not marks:
            vm = BARE_VERSION_RE.search(text)
            wm = BARE_WARN_RE.match(text) if vm is None and "NCCL WARN" in text else None
            if vm:
                self._version(vm.group("v"), None, None, None, line)
            elif wm:  # its writer is unknown (no host:pid:tid): what it says still counts, for no rank
                self.n_marker_lines += 1
                where = f"{wm.group('file')}:{wm.group('fline')}" if wm.group("file") else None
                self._warn(dict(host=None, pid=None, tid=None, wall_ns=None, line=line), wm.group("msg").strip(),
                           None, where)
            elif "NCCL" in text and ("NCCL INFO" in text or "NCCL WARN" in text):
                self._torn(line, "NCCL record without a host:pid:tid prefix (torn line): " + text[:160])
            return
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            msg = text[m.end():end]
            if i + 1 < len(marks) and not msg.strip():
                continue
            self.n_marker_lines += 1
            self._record(m, msg.rstrip(), line, glued=len(marks) > 1 and i + 1 < len(marks))

    def _version(self, v: str, host: str | None, pid: int | None, tid: int | None, line: int) -> None:
        if v not in self.versions:
            self.versions[v] = line
        self.obs.append(dict(host=host, pid=pid, tid=tid, kind="nccl_version", detail=v, line=line))

    def _record(self, m: re.Match[str], msg: str, line: int, glued: bool) -> None:
        pid = int(m.group("pid"))
        host = self._host(m.group("host"), pid)
        tid = int(m.group("tid"))
        ts = m.group("ts")
        wall = parse_ts(ts) if ts else None
        level = m.group("level")
        base = dict(host=host, pid=pid, tid=tid, wall_ns=wall, line=line)
        if level == "WARN":
            where = f"{m.group('file')}:{m.group('fline')}" if m.group("file") else None
            self._warn(base, msg.strip(), self.tid_comm.get((host, pid, tid)), where)
            return
        if msg.startswith(("Call to connect ", "socketPollConnect: ", "socketStartConnect: ")):
            # a connect retry (NCCL < 2.19 "Call to connect returned ..., retrying"; later "socketPollConnect:
            # connect returned No route to host, retrying (26/34) ...")
            self._failure(base, msg.strip(), self.tid_comm.get((host, pid, tid)), None)
            return
        if msg.startswith("NCCL version "):
            self._version(msg.split()[2], host, pid, tid, line)
            return
        if ": opCount " in msg:
            return  # COLL: handled by the fast path
        if self._setting(base, msg):
            return
        im = INIT_RE.search(msg)
        if im:
            self._init(base, msg, im.group(1), line)
            return
        tm = TEARDOWN_RE.search(msg)
        if tm:
            ptr, what = tm.group(1), f"{tm.group(4)} {tm.group(5)}"
            c = self.comms.get((host, pid, ptr))
            self.obs.append(dict(base, kind="nccl_destroy", name=ptr, detail=what,
                                 group=c.group if c else f"comm:{ptr}", rank=int(tm.group(2)),
                                 value=int(tm.group(3))))
            if what == "Destroy COMPLETE":
                self.obs.append(dict(base, kind="completion", name="nccl_destroy", detail=msg.strip()[:300],
                                     group=c.group if c else f"comm:{ptr}", rank=int(tm.group(2))))
            if c is not None and tm.group(5) == "COMPLETE":
                self.comms.pop((host, pid, ptr), None)
                self.coll_cache.clear()
            return
        sm = SUMMARY_RE.match(msg)
        if sm:
            c = self.comms.get((host, pid, sm.group(1)))
            if c is not None:
                c.info.update(nNodes=sm.group(4), localRanks=sm.group(5), localRank=sm.group(6))
                if sm.group(7) is not None:
                    c.info["MNNVL"] = sm.group(7)
            self.obs.append(dict(base, kind="nccl_topology", name="summary", detail=msg,
                                 group=c.group if c else f"comm:{sm.group(1)}", rank=int(sm.group(2)),
                                 value=int(sm.group(3))))
            return
        xm = TRANSPORT_RE.match(msg)
        if xm:
            self._transport(base, xm)
            return
        c = self.tid_comm.get((host, pid, tid))
        grp = c.group if c else None
        rank = c.rank if c else None
        rm = RING_RE.match(msg)
        if rm:
            self.obs.append(dict(base, kind="nccl_topology", name="ring", group=grp, rank=rank,
                                 detail=f"channels={int(rm.group(1))} ring0={' '.join(rm.group(2).split())}"))
            return
        if msg.startswith("Trees [0] "):
            first = msg[len("Trees [0] "):].split(" [", 1)[0]
            self.obs.append(dict(base, kind="nccl_topology", name="tree", group=grp, rank=rank,
                                 detail=f"tree0={first}"))
            return
        if "coll channels" in msg:
            self.obs.append(dict(base, kind="nccl_topology", name="channels", group=grp, rank=rank, detail=msg))
            return
        if msg.startswith(("Bootstrap", "bootstrap")):
            self.obs.append(dict(base, kind="nccl_bootstrap", group=grp, rank=rank, detail=msg))
            em = TRAIL_RE.match(msg)
            if em:   # "bootstrap.cc:270 -> 2": bootstrap failed
                self._failure(base, msg, c, f"{em.group('file')}:{em.group('line')}", trail=True)
            return
        em = TRAIL_RE.match(msg)
        if em:
            where = f"{em.group('file')}:{em.group('line')}"
            self.obs.append(dict(base, kind="nccl_warn", name=where, detail=msg, value=int(em.group("code")),
                                 group=grp, rank=rank))
            if "bootstrap" in em.group("file"):
                self._failure(base, msg, c, where, trail=True)
            return
        if glued and ("Init" in msg or " via " in msg):
            self._torn(line, "NCCL record cut by another record (torn line): " + msg[:160])

    def _setting(self, base: dict[str, Any], msg: str) -> bool:
        """An ``nccl_setting`` line (grammar.SETTING_RES): one row per process, communicator, key and value."""
        if not msg[:1].isupper() and not msg.startswith("cuda"):
            return False
        for key, rx in SETTING_RES:
            m = rx.match(msg)
            if m is None:
                continue
            if key == "env":
                key, value = m.group(1), m.group(2)
            elif key == "nvls_multicast":
                key, value = f"nvls_multicast dev {m.group(2)}", m.group(1)
            elif key == "p2p_disabled":
                key, value = "p2p_disabled", f"GPU {m.group(1)} - GPU {m.group(2)}"
            elif key == "ring_pxn_gdr":
                value = m.group(1) or "connected"
            elif key == "cuda_driver":
                v = int(m.group(1))
                value = f"{v // 1000}.{(v % 1000) // 10}"
            else:
                value = m.group(1)
            host, pid = base["host"], base["pid"]
            c = self.tid_comm.get((host, pid, base["tid"]))
            group = c.group if c is not None and key in ("ring_pxn_gdr", "p2p_type") else None
            dedup = (host, pid, group, key, value)
            if dedup not in self.settings:
                self.settings.add(dedup)
                self.obs.append(dict(base, kind="nccl_setting", name=key, detail=value, group=group,
                                     rank=c.rank if c is not None and group is not None else None))
            return True
        return False

    def _init(self, base: dict[str, Any], msg: str, what: str, line: int) -> None:
        host, pid, tid = base["host"], base["pid"], base["tid"]
        f: dict[str, str] = {}
        for k, rx in FIELD_RES.items():
            mm = rx.search(msg)
            if mm:
                f[k] = mm.group(1)
        ptr = f.get("comm")
        if ptr is None or "rank" not in f:
            self.skipped.append(Skipped(self.file, line, "unrecognised Init line: " + msg[:160]))
            return
        key = (host, pid, ptr)
        c = self.comms.get(key)
        if c is None or (what == "START" and c.started):  # a second START: the pointer was reused
            c = self._new_comm(host, pid, ptr)
        self.coll_cache.clear()
        if not c.init_seen:
            c.init_seen = True
            c.init_line = line
        if what == "START":
            c.started = True
        else:
            c.completed = True
            self.init_done.add((host, pid))
        c.rank = int(f["rank"])
        if "nranks" in f:
            c.nranks = int(f["nranks"])
        if "commId" in f:
            c.comm_id = normalize_comm_id(f["commId"])
            c.group = c.comm_id
        elif "parent" in f and c.comm_id is None:
            parent = self.comms.get((host, pid, f["parent"]))
            pid_key = parent.group if parent is not None else f"comm:{f['parent']}"
            c.group = f"split:{pid_key}:{f.get('color', '?')}"
        am = API_RE.match(msg)
        if am:
            c.info["api"] = am.group(1)
        for k in ("cudaDev", "nvmlDev", "busId", "parent", "color", "key"):
            if k in f:
                c.info[k] = f[k]
        self.tid_comm[(host, pid, tid)] = c
        row = dict(base, kind="nccl_init_start" if what == "START" else "nccl_init_complete", name=ptr,
                   rank=c.rank, value=c.nranks)
        self.obs.append(row)
        self.init_obs.append((row, c))

    def _warn(self, base: dict[str, Any], msg: str, c: Any, where: str | None) -> None:
        """A WARN line: ``nccl_warn``, the failure it may state, and NCCL's own mismatch check (``nccl_mismatch``:
        ``value`` = the rank it names "at and around", a hint only, never a culprit by itself)."""
        self.obs.append(dict(base, kind="nccl_warn", name=where, detail=msg,
                             group=c.group if c else None, rank=c.rank if c else None))
        mm = MISMATCH_RE.search(msg)
        if mm:
            self.obs.append(dict(base, kind="nccl_mismatch", name=where, detail=msg[:300],
                                 value=int(mm.group("rank")) if mm.group("rank") else None,
                                 group=c.group if c else None, rank=c.rank if c else None))
        self._failure(base, msg, c, where)

    def _failure(self, base: dict[str, Any], msg: str, c: Any, where: str | None, trail: bool = False) -> None:
        """A WARN (or a bootstrap error trail, a connect retry) that says set-up or the device failed: before the
        communicator's (else the process's first) Init COMPLETE an ``init_failure`` (stage ``connect`` for socket
        connects, ``nccl_init`` for bootstrap / system errors), after it a ``transport_error`` (``nccl_warn``);
        ``Cuda failure`` WARNs are ``transport_error`` ``cuda_error`` whenever they come. One row per process
        and kind of failure (the first line says it; NCCL repeats it on every retry and every thread)."""
        host, pid = base["host"], base["pid"]
        if CUDA_FAIL_RE.search(msg):
            kind, name = "transport_error", "cuda_error"
        elif NET_FAIL_RE.search(msg):   # the network transport failed a transfer: whenever it comes, never set-up
            kind, name = "transport_error", "net_error"
        else:
            connect = CONNECT_FAIL_RE.search(msg) is not None
            if not connect and not INIT_FAIL_RE.search(msg) and not trail:
                return
            before = (not c.completed) if c is not None else (host, pid) not in self.init_done
            if before:
                kind, name = "init_failure", "connect" if connect else "nccl_init"
            else:
                kind, name = "transport_error", "nccl_warn"
        key = (host, pid, kind, name)
        if key in self.failures or (trail and any(k[:3] == (host, pid, kind) for k in self.failures)):
            return
        self.failures.add(key)
        detail = f"{where}: {msg}" if where and not msg.startswith(where) else msg
        self.obs.append(dict(base, kind=kind, name=name, detail=detail[:300], group=c.group if c else None,
                             rank=c.rank if c else None))

    def _transport(self, base: dict[str, Any], xm: re.Match[str]) -> None:
        src, dst, tag, tail = int(xm.group(3)), int(xm.group(4)), xm.group(5), xm.group(6)
        parts = tail.split("/")
        if parts[0] == "P2P" and len(parts) > 1:
            kind = "P2P/" + parts[1].split()[0]
        elif parts[0] == "NET" and len(parts) > 1:
            kind = "NET/" + parts[1]
        else:
            kind = parts[0].split()[0]
        me = dst if tag == "receive" else src
        host, pid = base["host"], base["pid"]
        comm = None
        for c in reversed(self.all_comms):
            if c.host == host and c.pid == pid and c.rank == me:
                comm = c
                break
        grp = comm.group if comm else None
        key = (host, pid, grp, src, dst, kind)
        row = self.transport.get(key)
        if row is None:
            row = dict(base, kind="nccl_transport", name=f"{src}->{dst}", detail=kind, group=grp, rank=me, value=0)
            self.transport[key] = row
            self.obs.append(row)
        row["value"] += 1
