"""Wrappers of collective / p2p ops (c10d functions and ProcessGroup methods share one span core, with the
compiled fast path of tracer/_fastspan.c in front of the common call); and install_c10d, which patches them,
tracer.wrap_work's coalescing wrapper and tracer.wrap_init's init wrappers into torch.distributed.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from .state import (CAT, COALESCING_MANAGER, COMMIT, INIT_OPS, N32, N64, OP_SPECS, PACK, TraceState, _ALWAYS_ASYNC,
    _ERROR, _F_ASYNC, _F_CAPTURING, _SENDS, _Skip, _error_id, _finish, _positions)
from .wrap_init import _make_init_wrapper
from .wrap_work import _make_coalescing_wrapper

__all__ = [  # everything, private names included: tracer.hooks re-exports this module whole
    "_FastSpan", "_MODE_FUNCTION", "_MODE_PG_METHOD", "_MODE_SYNC", "FASTPATH_ERROR", "FASTPATH_ENV",
    "fastpath_available", "_with_fastpath", "Extract", "_op_span", "_nv_text", "_make_op_wrapper",
    "make_pg_method_wrapper", "_swap", "install_c10d",
]


try:  # the compiled fast path of the collective and sync wrappers (tracer/_fastspan.c); optional
    from ._fastspan import FastSpan as _FastSpan
    from ._fastspan import MODE_FUNCTION as _MODE_FUNCTION
    from ._fastspan import MODE_PG_METHOD as _MODE_PG_METHOD
    from ._fastspan import MODE_SYNC as _MODE_SYNC
    FASTPATH_ERROR: str | None = None
except Exception as _e:  # not built here (no compiler, Python < 3.11): the pure-Python wrappers do everything
    _FastSpan = None
    _MODE_FUNCTION = _MODE_PG_METHOD = _MODE_SYNC = -1
    FASTPATH_ERROR = f"{type(_e).__name__}: {_e}"
FASTPATH_ENV = "RANKTRACE_FASTPATH"  # "0": pure-Python wrappers only (A/B benchmarks, parity tests)


def fastpath_available() -> bool:
    """Whether new wrappers get the compiled fast path (built, and not turned off by RANKTRACE_FASTPATH=0)."""
    return _FastSpan is not None and os.environ.get(FASTPATH_ENV, "1") != "0"


def _with_fastpath(st: TraceState, slow: Callable[..., Any], orig: Callable[..., Any], name: str, mode: int,
                   category: str, gi: int = -1, ti: int = -1, ai: int = -1, tensor_kw: str | None = None,
                   always_async: bool = False) -> Callable[..., Any]:
    """`slow` (a Python wrapper of this module) behind the compiled fast path, when there is one.

    The fast path does the common call itself and passes every other one to `slow` untouched, so `slow` keeps
    all the semantics (see tracer/_fastspan.c). Indexes are positions in the call's arguments, -1 for none."""
    if not fastpath_available():
        return slow
    try:
        return _FastSpan(st, slow, orig, name, mode, CAT[category], gi, ti, ai, tensor_kw, always_async, _error_id)
    except Exception as e:  # never the job's problem: the Python wrapper does the work
        st.note("fastpath", f"{name}: {type(e).__name__}: {e}")
        return slow


# ============================================================================================================
# Collective / p2p ops (c10d functions and ProcessGroup methods share one span core)
# ============================================================================================================
# extract(args, kwargs) -> (pg or None, tensor-like, global peer or None, group peer or None, async_op)
Extract = Callable[[tuple, dict], tuple[Any, Any, Any, Any, bool]]


def _op_span(st: TraceState, name: str, category: str, orig: Callable[..., Any], extract: Extract, *,
             p2p: str | None = None, container: bool = False, self_is_pg: bool = False) -> Callable[..., Any]:
    """The recording wrapper of one collective/p2p entry point.

    p2p: None for collectives, "send" or "recv" for point-to-point (seq per (group, src, dst)).
    container: a span over other recorded ops (batch_isend_irecv): no seq, the depth guard stays open inside.
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
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(*args, **kwargs)
        try:
            pg, tens, peer, gpeer, aop = extract(args, kwargs)
            if pg is None:
                world = st.c10d_world
                pg = world._default_pg if world is not None else st._world_of()
            elif pg is st.non_member:
                raise _Skip
            tid = local.tid
            frame = sys._getframe(1)
            while True:  # st.callsite's hit path, inlined
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
                    # the backend counter moved since our last op on this group ended: ops we never saw (not while
                    # another thread captures: its captured ops move the counter; the capture's end rebaselines)
                    try:
                        before = reader(pg)
                    except Exception:
                        before = None
                    prev = last.get(gid)
                    if prev is not None and before is not None and before > prev:
                        st.untraced(g, prev, before, cs, tid)
            if p2p is not None:
                if peer is None and gpeer is not None:
                    ranks = g[3] if g is not None else None
                    peer = ranks[gpeer] if ranks and 0 <= gpeer < len(ranks) else gpeer
                key: Any = (gname, st.rank, peer) if is_send else (gname, peer, st.rank)
            else:
                key = gname
            if capturing is not None or container:
                seq = N64  # ops captured into a graph do not advance seq; replays count per graph (DESIGN §3)
                flags = _F_CAPTURING if capturing is not None else 0
                graph = N32 if capturing is None else capturing
            else:
                seq = seqs.get(key, 0) + 1
                seqs[key] = seq
                flags = 0
                graph = N32
            if aop:
                flags |= _F_ASYNC
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
            name_id = nid[0] or st.name_id(name)
            nid[0] = name_id
            span = next(st._spans)
            parent = local.span
            peer_i = N32 if peer is None else peer
            ring = st.ring or st.open_ring()
            buf, nxt, base, slots, clock = ring
            idx = next(nxt)  # tracer.slotwriter's put, inlined: commit 0, record, commit idx + 1 last
            off = base + (idx % slots) * 128
            commit(buf, off, 0)
            pack(buf, off, 0, clock(), tid, 0, cat, flags, 0, name_id, gid, cs, dt, sh, 0, peer_i, graph, seq, N64,
                 nb, span, parent)
            commit(buf, off, idx + 1)
            nv = st.nv
            if nv is not None:
                nv.push(_nv_text(name, gname, seq, peer))
        except _Skip:
            return orig(*args, **kwargs)
        except Exception as e:  # ranktrace's own failure: never the job's
            st.fail(e)
            return orig(*args, **kwargs)
        if check:
            local.depth = 1
        local.span = span
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            local.depth = 0
            local.span = parent
            try:
                if nv is not None:
                    nv.pop()
                last.pop(gid, None)  # an op that failed may or may not have moved the counter
                st.put(_ERROR, cat, flags, name_id, gid, cs, dt, sh, _error_id(st, e), peer_i, graph, seq, N64, nb,
                       span, parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        local.span = parent
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
            if result is not None and (aop or self_is_pg):
                st.register_work(result, (span, name_id, cat, gid, seq, peer_i, graph, flags, g is not None and g[5]))
        except Exception as e:
            st.fail(e)
        return result

    return wrapper


def _nv_text(name: str, gname: str, seq: int, peer: int | None) -> str:
    text = f"{name} group={gname}"
    if seq != N64:
        text += f" seq={seq}"
    if peer is not None:
        text += f" peer={peer}"
    return text


def _make_op_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.distributed function (all_reduce, send, batch_isend_irecv, ...)."""
    category, tensor_arg, _is_list, peer_args = OP_SPECS[name]
    pos = _positions(orig)
    big = 1 << 30
    gi = pos.get("group", big)
    ti = pos.get(tensor_arg, big) if tensor_arg else big
    ai = pos.get("async_op", big)
    pname = peer_args[0] if peer_args else None
    gpname = peer_args[1] if len(peer_args) > 1 else None
    pi = pos.get(pname, big) if pname else big
    gpi = pos.get(gpname, big) if gpname else big
    always_async = name in _ALWAYS_ASYNC

    if name == "batch_isend_irecv":
        li = pos.get("p2p_op_list", 0)

        def extract_batch(args: tuple, kwargs: dict) -> tuple[Any, Any, Any, Any, bool]:
            ops = args[li] if li < len(args) else kwargs.get("p2p_op_list")
            pg = getattr(ops[0], "group", None) if ops else None
            return pg, None, None, None, True

        # a container: each P2POp inside is recorded by the isend/irecv wrappers (peer, per-pair seq) under it
        return _finish(_op_span(st, name, category, orig, extract_batch, container=True), orig)

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

    p2p = None if category != "p2p" else ("send" if name in _SENDS else "recv")
    slow = _op_span(st, name, category, orig, extract, p2p=p2p)
    if p2p is not None:
        return _finish(slow, orig)
    fast = _with_fastpath(st, _finish(slow, orig), orig, name, _MODE_FUNCTION, category,
                          gi if gi < big else -1, ti if ti < big else -1, ai if ai < big else -1, tensor_arg,
                          always_async)
    return _finish(fast, orig)


def make_pg_method_wrapper(st: TraceState, method: str, op: str, category: str, tensor_index: int | None,
                           peer_index: int | None, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``ProcessGroup.<method>(self, ...)`` called directly (``pg.allreduce([t])``): recorded under the
    torch.distributed name `op`, seq shared with the function hooks; inner calls of dist.* stay unrecorded (depth).

    `orig` is the unbound pybind function (called with self); peers passed to send/recv are group ranks."""

    def extract(args: tuple, kwargs: dict) -> tuple[Any, Any, Any, Any, bool]:
        n = len(args)
        tens = args[tensor_index] if tensor_index is not None and tensor_index < n else None
        gpeer = args[peer_index] if peer_index is not None and peer_index < n else None
        if gpeer is not None and not isinstance(gpeer, int):
            gpeer = None
        return (args[0] if n else None), tens, None, gpeer, True

    p2p = None if category != "p2p" else ("send" if op == "send" else "recv")
    wrapper = _finish(_op_span(st, op, category, orig, extract, p2p=p2p, self_is_pg=True), orig, name=method,
                      qualname=f"ProcessGroup.{method}")
    if p2p is None:
        wrapper = _with_fastpath(st, wrapper, orig, op, _MODE_PG_METHOD, category,
                                 ti=-1 if tensor_index is None else tensor_index)
    return _finish(wrapper, orig, name=method, qualname=f"ProcessGroup.{method}")



def _swap(module: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> str:
    """Route `module.name` through a wrapper. Returns how: 'cell' (reaches early-bound refs) or 'attr'."""
    fn = module.__dict__.get(name)
    if fn is None:
        return "absent"
    if getattr(fn, "__ranktrace__", False):
        return "done"
    inner = getattr(fn, "__wrapped__", None)
    closure = getattr(fn, "__closure__", None) or ()
    for cell in closure:
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        if inner is not None and content is inner and callable(content):
            if getattr(content, "__ranktrace__", False):
                return "done"
            cell.cell_contents = make(content)
            return "cell"
    module.__dict__[name] = make(fn)
    return "attr"


def install_c10d(st: TraceState, c10d: Any) -> dict[str, str]:
    """Patch torch.distributed.distributed_c10d in place. Returns {function: how} for the ring meta."""
    import torch  # already imported: c10d is being imported

    st.c10d = c10d
    st.skip_prefixes = st.skip_prefixes + (os.path.dirname(os.path.abspath(torch.__file__)),)
    st.non_member = getattr(c10d.GroupMember, "NON_GROUP_MEMBER", st.non_member)
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(type(world), "default_pg"):
        st._world_of = lambda: world.default_pg
        if hasattr(world, "_default_pg"):  # the property's own storage: read directly on the op path
            st.c10d_world = world
    else:
        st._world_of = lambda: c10d.GroupMember.WORLD
    st.load_nvtx()
    how: dict[str, str] = {}
    for name in OP_SPECS:
        how[name] = _swap(c10d, name, lambda f, n=name: _make_op_wrapper(st, n, f))
    for name in INIT_OPS:
        how[name] = _swap(c10d, name, lambda f, n=name: _make_init_wrapper(st, n, f))
    how[COALESCING_MANAGER] = _swap(c10d, COALESCING_MANAGER, lambda f: _make_coalescing_wrapper(st, f))
    return how
