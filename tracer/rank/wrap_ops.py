"""Wrappers of collective and p2p ops: torch.distributed functions and ProcessGroup methods share one span (the
reference the compiled fast path must match record for record).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from .fastpath import MODE_FUNCTION, MODE_PG_METHOD, with_fastpath
from .nvtx_ranges import range_text
from .optable import ALWAYS_ASYNC, OP_SPECS, SENDS
from .slotwriter import CAT, COMMIT, ERROR, F_ASYNC, F_CAPTURING, N32, N64, PACK, tail_store
from .spans import arg_positions, error_id, finish_wrapper, unwound
from .tracestate import TraceState, recording_thread

__all__ = ["Extract", "op_span", "make_op_wrapper", "make_pg_method_wrapper"]

# extract(args, kwargs) -> (pg or None, tensor-like, global peer or None, group peer or None, async_op)
Extract = Callable[[tuple, dict], tuple[Any, Any, Any, Any, bool]]


class _Skip(Exception):
    """Raised while preparing a record when the call must not be recorded (non-member rank)."""


def op_span(st: TraceState, name: str, category: str, orig: Callable[..., Any], extract: Extract, *,
            p2p: str | None = None, container: bool = False, self_is_pg: bool = False) -> Callable[..., Any]:
    """The recording wrapper of one collective/p2p entry point.

    p2p: None for collectives, "send" or "recv" for point-to-point (seq per (group, src, dst): the k-th send
    from A to B aligns with B's k-th recv from A).
    container: a span over other recorded ops (batch_isend_irecv): no seq, the depth guard stays open inside.
    self_is_pg: a ProcessGroup method, whose result is always a Work handle.

    Each call, in order: the guard; the call's arguments (group, tensor, peer, async); its call site; the group
    and, before the op, the backend counter (a jump = ops we never saw); its channel and seq (none while this
    thread captures a graph, or for a container); the tensor's ids; the ENTER record; the call itself under the
    depth guard; the backend counter after (backend_seq) and the EXIT record, or the ERROR record. The call-site
    walk, the cache hits and both slot writes are inlined here: this runs on every op the compiled path hands
    back (p2p, the first call from a call site, a capture, an NVTX tool), and each Python call costs ~50 ns.
    """
    cat = CAT[category]
    is_send = p2p == "send"
    nid = [0]
    check = not container
    groups = st.groups
    seqs = st.seq
    tensor_ids = st.tensor_ids
    last = st.bseq_last
    code_info = st.code_info
    pack = PACK
    commit = COMMIT

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            # the call's arguments
            pg, tens, peer, gpeer, aop = extract(args, kwargs)
            if pg is None:
                world = st.c10d_world
                pg = world._default_pg if world is not None else st._world_of()
            elif pg is st.non_member:
                raise _Skip
            tid = local.tid
            # its call site (CallInfo.callsite's hit path)
            frame = sys._getframe(1)
            while True:
                co = frame.f_code
                ci = code_info.get(id(co))
                if ci is None or ci[0] is not co:
                    ci = st.code_entry(co)
                if not ci[1]:
                    cs = ci[2].get(frame.f_lasti)
                    if cs is None:
                        cs = st.callsite_miss(frame, ci)
                    break
                frame = frame.f_back
                if frame is None:
                    cs = 0
                    break
            capturing = st.capturing
            if capturing is not None and tid != st.capture_tid:
                capturing = None  # another thread's op while a capture is open: not captured
            # its group, and the backend counter before it
            if pg is None:  # not initialised: the call will raise; record it without a group
                g = reader = None
                gid, gname = 0, ""
            else:
                g = groups.get(id(pg))
                if g is None or g[0]() is not pg:
                    g = st.group(pg)
                gid, gname, reader = g[1], g[2], g[4]
                if capturing is not None:
                    reader = None  # captured ops move the counter without running; no reads inside a capture
                elif reader is not None and check and st.capturing is None:
                    # the counter moved since our last op on this group ended: ops we never saw (not while another
                    # thread captures: its captured ops move the counter; the capture's end rebaselines)
                    try:
                        before = reader(pg)
                    except Exception:
                        before = None
                    prev = last.get(gid)
                    if prev is not None and before is not None and before > prev:
                        st.untraced(g, prev, before, cs, tid)
            # its channel and seq
            if p2p is not None:  # (group, src, dst), the peer given as a group rank mapped to its global rank
                if peer is None and gpeer is not None:
                    ranks = g[3] if g is not None else None
                    peer = ranks[gpeer] if ranks and 0 <= gpeer < len(ranks) else gpeer
                key: Any = (gname, st.rank, peer) if is_send else (gname, peer, st.rank)
            else:
                key = gname
            if capturing is not None or container:
                seq = N64  # captured ops do not advance seq; replays count per graph
                flags = F_CAPTURING if capturing is not None else 0
                graph = N32 if capturing is None else capturing
            else:
                seq = seqs.get(key, 0) + 1
                seqs[key] = seq
                flags = 0
                graph = N32
            if aop:
                flags |= F_ASYNC
            # its tensor (CallInfo.tensor's hit path)
            if tens is None:
                dt, sh, nb = 0, 0, N64
            else:
                ids = None
                if type(tens) is not list:
                    try:
                        ids = tensor_ids.get((tens.dtype, tens.shape))
                    except AttributeError:
                        pass
                dt, sh, nb = ids if ids is not None else st.tensor(tens)
            # the ENTER record (slotwriter's put, inlined: commit 0, record, commit idx + 1 last)
            name_id = nid[0] or st.name_id(name)
            nid[0] = name_id
            span = next(st._spans)
            parent = local.span
            peer_i = N32 if peer is None else peer
            ring = st.ring or st.open_ring()
            buf, nxt, base, slots, clock, toffs, tentry = ring
            idx = next(nxt)
            off = base + (idx % slots) * 128
            commit(buf, off, 0)
            pack(buf, off, 0, clock(), tid, 0, cat, flags, 0, name_id, gid, cs, dt, sh, 0, peer_i, graph, seq, N64,
                 nb, span, parent)
            commit(buf, off, idx + 1)
            tail_store(buf, toffs, tentry, cat, gid, peer_i, name_id, tid, 8, idx)
            nv = st.nv
            if nv is not None:
                nv.push(range_text(name, gname, seq, peer))
        except _Skip:
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        except Exception as e:  # ranktrace's own failure: never the job's
            st.fail(e)
            try:
                return orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        # the call
        if check:
            local.depth = 1
        local.span = span
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            local.depth = 0
            local.span = parent
            _op_failed(st, e, nv, cat, flags, name_id, gid, cs, dt, sh, peer_i, graph, seq, nb, span, parent, tid)
            unwound(e)
            raise
        local.depth = 0
        local.span = parent
        # the backend counter after it, and the EXIT record
        try:
            if nv is not None:
                nv.pop()
            bseq = N64
            if reader is not None:
                try:
                    bseq = reader(pg)
                except Exception:
                    last.pop(gid, None)
                else:
                    if bseq > last.get(gid, -1):
                        last[gid] = bseq
            if ring is st.ring:  # not forked in between (a fork gives the child its own ring)
                idx = next(nxt)
                off = base + (idx % slots) * 128
                commit(buf, off, 0)
                pack(buf, off, 0, clock(), tid, 1, cat, flags, 0, name_id, gid, cs, dt, sh, 0, peer_i, graph, seq,
                     bseq, nb, span, parent)
                commit(buf, off, idx + 1)
                tail_store(buf, toffs, tentry, cat, gid, peer_i, name_id, tid, 16, idx)
            if result is not None and (aop or self_is_pg):
                st.register_work(result, (span, name_id, cat, gid, seq, peer_i, graph, flags, g is not None and g[5]))
        except Exception as e:
            st.fail(e)
        return result

    return wrapper


def _op_failed(st: TraceState, err: BaseException, nv: Any, *rec: Any) -> None:
    """The op raised: its ERROR record (the caller re-raises the job's exception unchanged). An op that failed
    may or may not have moved the backend counter: the group's baseline is dropped."""
    cat, flags, name_id, gid, cs, dt, sh, peer_i, graph, seq, nb, span, parent, tid = rec
    try:
        if nv is not None:
            nv.pop()
        st.bseq_last.pop(gid, None)
        st.put(ERROR, cat, flags, name_id, gid, cs, dt, sh, error_id(st, err), peer_i, graph, seq, N64, nb, span,
               parent, tid)
    except Exception as e2:
        st.fail(e2)


def make_op_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.distributed function (all_reduce, send, batch_isend_irecv, ...)."""
    category, tensor_arg, _is_list, peer_args = OP_SPECS[name]
    pos = arg_positions(orig)
    big = 1 << 30
    gi = pos.get("group", big)
    ti = pos.get(tensor_arg, big) if tensor_arg else big
    ai = pos.get("async_op", big)
    pname = peer_args[0] if peer_args else None
    gpname = peer_args[1] if len(peer_args) > 1 else None
    pi = pos.get(pname, big) if pname else big
    gpi = pos.get(gpname, big) if gpname else big
    always_async = name in ALWAYS_ASYNC

    if name == "batch_isend_irecv":
        li = pos.get("p2p_op_list", 0)

        def extract_batch(args: tuple, kwargs: dict) -> tuple[Any, Any, Any, Any, bool]:
            ops = args[li] if li < len(args) else kwargs.get("p2p_op_list")
            pg = getattr(ops[0], "group", None) if ops else None
            return pg, None, None, None, True

        # a container: each P2POp inside is recorded by the isend/irecv wrappers (peer, per-pair seq) under it
        return finish_wrapper(op_span(st, name, category, orig, extract_batch, container=True), orig)

    def extract(args: tuple, kwargs: dict) -> tuple[Any, Any, Any, Any, bool]:
        n = len(args)
        if not kwargs:  # the common shape (dist.all_reduce(t)): no dict lookups
            tens = args[ti] if ti < n else None
            if not pname:
                return (args[gi] if gi < n else None), tens, None, None, \
                    always_async or (ai < n and bool(args[ai]))
            kwargs = {}
        pg = args[gi] if gi < n else kwargs.get("group")
        tens = (args[ti] if ti < n else kwargs.get(tensor_arg)) if tensor_arg else None
        peer = gpeer = None
        if pname:
            peer = args[pi] if pi < n else kwargs.get(pname)
            if peer is None and gpname:
                gpeer = args[gpi] if gpi < n else kwargs.get(gpname)
        aop = always_async or bool(args[ai] if ai < n else kwargs.get("async_op", False))
        return pg, tens, peer, gpeer, aop

    p2p = None if category != "p2p" else ("send" if name in SENDS else "recv")
    slow = op_span(st, name, category, orig, extract, p2p=p2p)
    if p2p is not None:
        return finish_wrapper(slow, orig)
    fast = with_fastpath(st, finish_wrapper(slow, orig), orig, name, MODE_FUNCTION, category,
                         gi if gi < big else -1, ti if ti < big else -1, ai if ai < big else -1, tensor_arg,
                         always_async)
    return finish_wrapper(fast, orig)


def make_pg_method_wrapper(st: TraceState, method: str, op: str, category: str, tensor_index: int | None,
                           peer_index: int | None, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``ProcessGroup.<method>(self, ...)`` called directly (``pg.allreduce([t])``): recorded under the
    torch.distributed name `op`, seq shared with the function wrappers; inner calls of dist.* stay unrecorded.

    `orig` is the unbound pybind function (called with self); peers passed to send/recv are group ranks."""

    def extract(args: tuple, kwargs: dict) -> tuple[Any, Any, Any, Any, bool]:
        n = len(args)
        tens = args[tensor_index] if tensor_index is not None and tensor_index < n else None
        gpeer = args[peer_index] if peer_index is not None and peer_index < n else None
        if gpeer is not None and not isinstance(gpeer, int):
            gpeer = None
        return (args[0] if n else None), tens, None, gpeer, True

    p2p = None if category != "p2p" else ("send" if op == "send" else "recv")
    wrapper = finish_wrapper(op_span(st, op, category, orig, extract, p2p=p2p, self_is_pg=True), orig, name=method,
                             qualname=f"ProcessGroup.{method}")
    if p2p is None:
        wrapper = with_fastpath(st, wrapper, orig, op, MODE_PG_METHOD, category,
                                ti=-1 if tensor_index is None else tensor_index)
    return finish_wrapper(wrapper, orig, name=method, qualname=f"ProcessGroup.{method}")
