"""Wrappers around torch.distributed that record ENTER / EXIT / ERROR of every collective, p2p and init call.

How the patch reaches every caller: torch's public c10d functions are ``_exception_logger`` closures whose ``func``
cell holds the real function. We swap that cell's content for our wrapper of it, so the *same function object*
that ``from torch.distributed import all_reduce`` bound earlier now records too. Functions that are not closures
(``isend``, ``batch_isend_irecv``, ``monitored_barrier``) are replaced in ``distributed_c10d`` right after it
executes — before ``torch.distributed/__init__`` re-exports them — by the post-import hook in tracer.inject.

Rules the wrappers keep (DESIGN §2, "never hurt the job"):
* return what the call returns, raise what it raises (the ERROR record is written, then the same exception
  propagates unchanged);
* a failure inside ranktrace's own code is logged once to stderr and turns tracing off in this process;
* a thread-local depth guard records only the outermost call (``all_gather_object`` calls ``all_gather`` inside;
  ``dist.all_reduce`` calls ``ProcessGroup.allreduce``), so each op appears once;
* never import torch eagerly; this module is imported only when torch.distributed already is.

``seq`` (DESIGN §3) is our 1-based per-group counter of outermost calls; p2p ops count per (group, src, dst) so the
k-th send from A to B aligns with B's k-th recv from A. ``backend_seq`` is read from the process group after the call.
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import weakref
from typing import Any, Callable

from . import redact
from .recorder import Recorder

__all__ = ["TraceState", "OP_SPECS", "install_c10d"]

# name -> (category, input tensor argument, input is a list, peer argument names)
OP_SPECS: dict[str, tuple[str, str | None, bool, tuple[str, ...]]] = {
    "all_reduce": ("collective", "tensor", False, ()),
    "broadcast": ("collective", "tensor", False, ()),
    "reduce": ("collective", "tensor", False, ()),
    "all_gather": ("collective", "tensor", False, ()),
    "all_gather_into_tensor": ("collective", "input_tensor", False, ()),
    "reduce_scatter": ("collective", "input_list", True, ()),
    "reduce_scatter_tensor": ("collective", "input", False, ()),
    "all_to_all": ("collective", "input_tensor_list", True, ()),
    "all_to_all_single": ("collective", "input", False, ()),
    "gather": ("collective", "tensor", False, ()),
    "scatter": ("collective", "tensor", False, ()),
    "barrier": ("collective", None, False, ()),
    "monitored_barrier": ("collective", None, False, ()),
    "all_reduce_coalesced": ("collective", "tensors", True, ()),
    "all_gather_object": ("collective", None, False, ()),
    "broadcast_object_list": ("collective", None, False, ()),
    "gather_object": ("collective", None, False, ()),
    "scatter_object_list": ("collective", None, False, ()),
    "send": ("p2p", "tensor", False, ("dst", "group_dst")),
    "isend": ("p2p", "tensor", False, ("dst", "group_dst")),
    "recv": ("p2p", "tensor", False, ("src", "group_src")),
    "irecv": ("p2p", "tensor", False, ("src", "group_src")),
    "send_object_list": ("p2p", None, False, ("dst", "group_dst")),
    "recv_object_list": ("p2p", None, False, ("src", "group_src")),
    "batch_isend_irecv": ("p2p", None, False, ()),
}
INIT_OPS = ("init_process_group", "new_group", "destroy_process_group")
_SENDS = frozenset({"send", "isend", "send_object_list"})


class _Skip(Exception):
    """Raised inside `before` when a call must not be recorded (non-member rank)."""


class TraceState:
    """Everything the wrappers share in one process: recorder, identity, counters, caches."""

    def __init__(self, recorder_factory: Callable[[], Recorder], rank: int | None, world: int | None) -> None:
        self._factory = recorder_factory
        self._rec: Recorder | None = None
        self.rank = rank
        self.world = world
        self.enabled = True
        self.local = threading.local()
        self.seq: dict[Any, int] = {}
        self.groups: dict[int, tuple[Any, int, str, list[int] | None]] = {}  # id(pg) -> (weakref, name_id, name, ranks)
        self.skip_code: dict[Any, bool] = {}
        self.callsites: dict[tuple[Any, int], int] = {}
        self.tensor_ids: dict[tuple[Any, tuple[int, ...]], tuple[int, int, int]] = {}
        self.skip_prefixes: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)),)
        self.c10d: Any = None
        self._failed = False
        self.capturing: int | None = None  # graph id while a CUDA graph capture is open (tracer.graphs)

    # --- recorder (created lazily: a process that never issues an op writes no ring) -----------------
    @property
    def rec(self) -> Recorder:
        if self._rec is None:
            self._rec = self._factory()
        return self._rec

    def reset_after_fork(self, recorder_factory: Callable[[], Recorder]) -> None:
        """In a forked child: its own ring, fresh locks; counters stay (the child inherits group state)."""
        self._factory = recorder_factory
        self._rec = None
        self.local = threading.local()
        self.callsites.clear()
        self.tensor_ids.clear()
        self.groups.clear()

    def fail(self, err: BaseException) -> None:
        """A failure in ranktrace itself: one line on stderr, tracing off in this process, the job goes on."""
        self.enabled = False
        if not self._failed:
            self._failed = True
            try:
                sys.stderr.write(f"[ranktrace] tracing disabled in pid {os.getpid()}: {type(err).__name__}: {err}\n")
            except Exception:
                pass

    # --- identity and groups -----------------------------------------------------------------------------
    def identity(self, source: str) -> None:
        self.rec.meta(
            {
                "type": "identity", "rank": self.rank, "world": self.world, "source": source,
                "local_rank": _int_env("LOCAL_RANK"), "pid": os.getpid(), "ppid": os.getppid(),
                "argv": redact.redact_argv(sys.argv),
            }
        )

    def group_info(self, pg: Any) -> tuple[int, str, list[int] | None]:
        hit = self.groups.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit[1], hit[2], hit[3]
        c10d = self.c10d
        name = getattr(pg, "group_name", None) or str(id(pg))
        try:
            ranks = list(c10d.get_process_group_ranks(pg))
        except Exception:
            ranks = None
        try:
            backend = str(c10d.get_backend(pg))
        except Exception:
            backend = None
        desc = getattr(pg, "group_desc", None)
        self.rec.meta({"type": "group", "name": name, "desc": desc, "backend": backend, "ranks": ranks})
        nid = self.rec.intern(name)
        # A weak reference: holding the ProcessGroup would keep it alive past destroy_process_group and make
        # gloo/NCCL tear it down at interpreter exit instead (seen here: std::terminate, SIGABRT).
        self.groups[id(pg)] = (weakref.ref(pg), nid, name, ranks)
        return nid, name, ranks

    # --- per-call pieces -------------------------------------------------------------------------------
    def callsite(self, frame: Any) -> int:
        """String id of the first frame outside torch and ranktrace (cached per code object and line)."""
        skip = self.skip_code
        while frame is not None:
            co = frame.f_code
            s = skip.get(co)
            if s is None:
                s = co.co_filename.startswith(self.skip_prefixes) or co.co_filename.startswith("<frozen")
                skip[co] = s
            if not s:
                key = (co, frame.f_lineno)
                sid = self.callsites.get(key)
                if sid is None:
                    sid = self.rec.intern(f"{co.co_filename}:{frame.f_lineno} {co.co_name}")
                    self.callsites[key] = sid
                return sid
            frame = frame.f_back
        return 0

    def tensor(self, t: Any) -> tuple[int, int, int | None]:
        """(dtype id, shape id, nbytes) of a tensor, or of the first tensor of a list."""
        if isinstance(t, (list, tuple)):
            if not t:
                return 0, 0, None
            t = t[0]
        try:
            shape = tuple(t.shape)
            dtype = t.dtype
        except AttributeError:
            return 0, 0, None
        key = (dtype, shape)
        hit = self.tensor_ids.get(key)
        if hit is None:
            n = 1
            for d in shape:
                n *= d
            hit = (self.rec.intern(str(dtype).replace("torch.", "")), self.rec.intern(str(list(shape))),
                   n * t.element_size())
            self.tensor_ids[key] = hit
        return hit


def _int_env(name: str) -> int | None:
    v = os.environ.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _arg(pos: dict[str, int], args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    i = pos.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name, default)


def _make_op_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    category, tensor_arg, _is_list, peer_args = OP_SPECS[name]
    try:
        pos = {p: i for i, p in enumerate(inspect.signature(orig).parameters)}
    except (TypeError, ValueError):
        pos = {}
    is_send = name in _SENDS
    always_async = name in ("isend", "irecv", "batch_isend_irecv")

    def before(args: tuple, kwargs: dict, frame: Any) -> tuple:
        rec = st.rec
        c10d = st.c10d
        if name == "batch_isend_irecv":
            ops = _arg(pos, args, kwargs, "p2p_op_list") or []
            pg = getattr(ops[0], "group", None) if ops else None
        else:
            pg = _arg(pos, args, kwargs, "group")
        if pg is None:
            pg = c10d.GroupMember.WORLD
        elif pg is c10d.GroupMember.NON_GROUP_MEMBER:
            raise _Skip
        if pg is None:  # not initialised: the call will raise; record it without a group
            gid, gname, granks = 0, "", None
        else:
            gid, gname, granks = st.group_info(pg)
        peer = None
        capturing = st.capturing is not None
        if category == "p2p" and peer_args:
            peer = _arg(pos, args, kwargs, peer_args[0])
            if peer is None and len(peer_args) > 1:
                gpeer = _arg(pos, args, kwargs, peer_args[1])
                if gpeer is not None and granks:
                    peer = granks[gpeer]
            key = (gname, st.rank, peer) if is_send else (gname, peer, st.rank)
        else:
            key = gname
        if capturing:
            seq = None  # ops captured into a graph do not advance seq; replays count per graph (DESIGN §3)
        else:
            seq = st.seq.get(key, 0) + 1
            st.seq[key] = seq
        dt, sh, nb = st.tensor(_arg(pos, args, kwargs, tensor_arg)) if tensor_arg else (0, 0, None)
        async_op = always_async or bool(_arg(pos, args, kwargs, "async_op", False))
        span = rec.new_span()
        parent = getattr(st.local, "span", 0)
        tid = threading.get_native_id()
        cs = st.callsite(frame)
        rec.op("enter", category, name_ids[0], tid=tid, group_id=gid, callsite_id=cs, dtype_id=dt, shape_id=sh,
               peer=peer, seq=seq, nbytes=nb, span_id=span, parent_span_id=parent, capturing=capturing,
               graph_id=st.capturing, async_op=async_op)
        return (pg, gid, cs, dt, sh, nb, peer, seq, span, parent, tid, capturing, async_op)

    def after(pre: tuple, err: BaseException | None) -> None:
        pg, gid, cs, dt, sh, nb, peer, seq, span, parent, tid, capturing, async_op = pre
        bseq = None
        if err is None and pg is not None and not capturing:
            try:
                bseq = pg._get_sequence_number_for_group()
            except Exception:
                bseq = None
        eid = st.rec.intern(f"{type(err).__name__}: {err}"[:500]) if err is not None else 0
        st.rec.op("error" if err is not None else "exit", category, name_ids[0], tid=tid, group_id=gid,
                  callsite_id=cs, dtype_id=dt, shape_id=sh, error_id=eid, peer=peer, seq=seq, backend_seq=bseq,
                  nbytes=nb, span_id=span, parent_span_id=parent, capturing=capturing, graph_id=st.capturing,
                  async_op=async_op)

    name_ids = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        local = st.local
        if not st.enabled or getattr(local, "depth", 0):
            return orig(*args, **kwargs)
        try:
            if not name_ids[0]:
                name_ids[0] = st.rec.intern(name)
            pre = before(args, kwargs, sys._getframe(1))
        except _Skip:
            return orig(*args, **kwargs)
        except Exception as e:  # ranktrace's own failure: never the job's
            st.fail(e)
            return orig(*args, **kwargs)
        local.depth = 1
        local.span = pre[8]
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            local.depth = 0
            local.span = pre[9]
            try:
                after(pre, e)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        local.span = pre[9]
        try:
            after(pre, None)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wrapper, orig)


def _make_init_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """init_process_group / new_group / destroy_process_group: recorded in the non-wrapping region."""
    try:
        pos = {p: i for i, p in enumerate(inspect.signature(orig).parameters)}
    except (TypeError, ValueError):
        pos = {}

    def record(kind: str, span: int, extra: dict[str, Any]) -> None:
        rec = st.rec
        rec.meta({"type": "event", "kind": kind, "name": name, "category": "init", "t_ns": rec.clock(),
                  "tid": threading.get_native_id(), "span_id": span, **extra})

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not st.enabled or getattr(st.local, "depth", 0):
            return orig(*args, **kwargs)
        span = 0
        try:
            span = st.rec.new_span()
            extra: dict[str, Any] = {"callsite": _callsite_text(st, sys._getframe(1))}
            if name == "init_process_group":
                rank, world = _arg(pos, args, kwargs, "rank", -1), _arg(pos, args, kwargs, "world_size", -1)
                extra.update(backend=str(_arg(pos, args, kwargs, "backend")), rank=rank, world=world)
                if isinstance(rank, int) and rank >= 0:
                    st.rank = rank
                if isinstance(world, int) and world > 0:
                    st.world = world
                st.identity("init_args")
            elif name == "new_group":
                ranks = _arg(pos, args, kwargs, "ranks")
                extra.update(ranks=list(ranks) if ranks is not None else None)
            record("enter", span, extra)
        except Exception as e:
            st.fail(e)
        st.local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            st.local.depth = 0
            try:
                record("error", span, {"error": f"{type(e).__name__}: {e}"[:500]})
            except Exception as e2:
                st.fail(e2)
            raise
        st.local.depth = 0
        try:
            if name == "init_process_group":
                st.rank, st.world = st.c10d.get_rank(), st.c10d.get_world_size()
                st.identity("init_process_group")
                st.group_info(st.c10d.GroupMember.WORLD)
            elif name == "new_group" and result is not None and result is not st.c10d.GroupMember.NON_GROUP_MEMBER:
                st.group_info(result)
            record("exit", span, {})
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wrapper, orig)


def _callsite_text(st: TraceState, frame: Any) -> str | None:
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(st.skip_prefixes) and not fn.startswith("<frozen"):
            return f"{fn}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _finish(wrapper: Callable[..., Any], orig: Callable[..., Any]) -> Callable[..., Any]:
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(orig, attr))
        except (AttributeError, TypeError):
            pass
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__ranktrace__ = True  # type: ignore[attr-defined]
    return wrapper


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
    """Patch torch.distributed.distributed_c10d in place. Returns {function: how} for meta.json."""
    import torch  # already imported: c10d is being imported

    st.c10d = c10d
    st.skip_prefixes = st.skip_prefixes + (os.path.dirname(os.path.abspath(torch.__file__)),
                                           os.path.dirname(os.path.abspath(inspect.__file__)) + os.sep + "contextlib",
                                           os.path.dirname(os.path.abspath(inspect.__file__)) + os.sep + "functools")
    how: dict[str, str] = {}
    for name in OP_SPECS:
        how[name] = _swap(c10d, name, lambda f, n=name: _make_op_wrapper(st, n, f))
    for name in INIT_OPS:
        how[name] = _swap(c10d, name, lambda f, n=name: _make_init_wrapper(st, n, f))
    return how
