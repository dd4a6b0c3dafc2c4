"""The rarer NCCL lines, parsed whole: version, Init, teardown, topology, transports, bootstrap, WARN and error trail.

Why separate: these lines are few but varied; they build and retire communicators (which COLL lines resolve
against) and become OBSERVATIONS rows. COLL records never come here (``nccl_log_coll`` handles them); the
regex loop hands each rarer line to ``_rare_line`` once, in line order.
"""
from __future__ import annotations

import re
from typing import Any

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.nccl_log_grammar import (
    _API_RE,
    _CONNECT_FAIL_RE,
    _CUDA_FAIL_RE,
    _INIT_FAIL_RE,
    _BARE_VERSION_RE,
    _FIELD_RES,
    _INIT_RE,
    _MARKER_RE,
    _RING_RE,
    _SUMMARY_RE,
    _TEARDOWN_RE,
    _TRAIL_RE,
    _TRANSPORT_RE,
    _parse_ts,
    normalize_comm_id,
)
from ranktrace.analyzers.readers.nccl_log_state import _ReaderState


class _RareLines(_ReaderState):
    """Parsing of the non-COLL lines into communicator state and observations."""

    # ---- keyword lines

    def _rare_line(self, chunk: bytes, ls: int, line: int) -> None:
        le = chunk.find(b"\n", ls)
        raw = chunk[ls:] if le == -1 else chunk[ls:le]
        text = raw.decode("utf-8", "replace").rstrip("\r")
        marks = list(_MARKER_RE.finditer(text))
        if not marks:
            vm = _BARE_VERSION_RE.search(text)
            if vm:
                self._version(vm.group("v"), None, None, None, line)
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
        wall = _parse_ts(ts) if ts else None
        level = m.group("level")
        base = dict(host=host, pid=pid, tid=tid, wall_ns=wall, line=line)
        if level == "WARN":
            where = f"{m.group('file')}:{m.group('fline')}" if m.group("file") else None
            c = self.tid_comm.get((host, pid, tid))
            self.obs.append(dict(base, kind="nccl_warn", name=where, detail=msg.strip(),
                                 group=c.group if c else None, rank=c.rank if c else None))
            self._failure(base, msg.strip(), c, where)
            return
        if msg.startswith("Call to connect "):
            self._failure(base, msg.strip(), self.tid_comm.get((host, pid, tid)), None)
            return
        if msg.startswith("NCCL version "):
            self._version(msg.split()[2], host, pid, tid, line)
            return
        if ": opCount " in msg:
            return  # COLL: handled by the fast path
        im = _INIT_RE.search(msg)
        if im:
            self._init(base, msg, im.group(1), line)
            return
        tm = _TEARDOWN_RE.search(msg)
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
        sm = _SUMMARY_RE.match(msg)
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
        xm = _TRANSPORT_RE.match(msg)
        if xm:
            self._transport(base, xm)
            return
        c = self.tid_comm.get((host, pid, tid))
        grp = c.group if c else None
        rank = c.rank if c else None
        rm = _RING_RE.match(msg)
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
            em = _TRAIL_RE.match(msg)
            if em:   # "bootstrap.cc:270 -> 2": bootstrap failed
                self._failure(base, msg, c, f"{em.group('file')}:{em.group('line')}", trail=True)
            return
        em = _TRAIL_RE.match(msg)
        if em:
            where = f"{em.group('file')}:{em.group('line')}"
            self.obs.append(dict(base, kind="nccl_warn", name=where, detail=msg, value=int(em.group("code")),
                                 group=grp, rank=rank))
            if "bootstrap" in em.group("file"):
                self._failure(base, msg, c, where, trail=True)
            return
        if glued and ("Init" in msg or " via " in msg):
            self._torn(line, "NCCL record cut by another record (torn line): " + msg[:160])

    def _init(self, base: dict[str, Any], msg: str, what: str, line: int) -> None:
        host, pid, tid = base["host"], base["pid"], base["tid"]
        f: dict[str, str] = {}
        for k, rx in _FIELD_RES.items():
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
        am = _API_RE.match(msg)
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

    def _failure(self, base: dict[str, Any], msg: str, c: Any, where: str | None, trail: bool = False) -> None:
        """A WARN (or a bootstrap error trail, a connect retry) that says set-up or the device failed: before the
        communicator's (else the process's first) Init COMPLETE an ``init_failure`` (stage ``connect`` for socket
        connects, ``nccl_init`` for bootstrap / system errors), after it a ``transport_error`` (``nccl_warn``);
        ``Cuda failure`` WARNs are ``transport_error`` ``cuda_error`` whenever they come. One row per process
        and kind of failure (the first line says it; NCCL repeats it on every retry and every thread)."""
        host, pid = base["host"], base["pid"]
        if _CUDA_FAIL_RE.search(msg):
            kind, name = "transport_error", "cuda_error"
        else:
            connect = _CONNECT_FAIL_RE.search(msg) is not None
            if not connect and not _INIT_FAIL_RE.search(msg) and not trail:
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
