"""Wrappers that record ENTER / EXIT / ERROR of every collective, p2p, init, wait, graph and sync call of a rank.

Every wrapper the tracer installs is defined here (tracer.pg_hooks, tracer.graphs and tracer.user_hooks only decide
*what* to patch), so a stack sampled inside a wrapper shows one tracer file that the analyzers know to skip.

How the patches reach every caller:
* torch's public c10d functions are ``_exception_logger`` closures whose ``func`` cell holds the real function; we
  swap that cell's content for our wrapper, so the *same function object* that ``from torch.distributed import
  all_reduce`` bound earlier records too. Functions that are not closures (``isend``, ``batch_isend_irecv``,
  ``monitored_barrier``) are replaced in ``distributed_c10d`` right after it executes, before ``torch.distributed``
  re-exports them (tracer.inject's post-import hook);
* ``ProcessGroup`` / ``Work`` methods (pybind classes) are replaced on the class (tracer.pg_hooks), which catches
  ``pg.allreduce([t])`` and ``work.wait()`` from any caller;
* ops Python never sees (DDP's reducer, functional collectives, compiled graphs) still move the backend's own
  counter: each traced op reads ``pg._get_sequence_number_for_group()`` before and after, and a counter that moved
  *between* two traced calls is recorded as an ``untraced_ops`` mark instead of going unnoticed.

Rules every wrapper keeps (DESIGN §2, "never hurt the job"):
* return what the call returns, raise what it raises (the ERROR record is written, then the same exception
  propagates unchanged);
* a failure inside ranktrace's own code is logged once to stderr and turns tracing off in this process;
* a thread-local depth guard records only the outermost call (``all_gather_object`` calls ``all_gather`` inside;
  ``dist.all_reduce`` calls ``ProcessGroup.allreduce``), so each op appears once. Containers (``batch_isend_irecv``,
  a ``_coalescing_manager`` block, ``--hook`` targets) record their own span and leave the guard open, so the ops
  inside them are recorded as their children;
* no CUDA call from ranktrace while a graph capture is open; never import torch eagerly.

``seq`` (DESIGN §3) is our 1-based per-group counter of outermost calls; p2p ops count per (group, src, dst) so the
k-th send from A to B aligns with B's k-th recv from A; ops issued during a graph capture take no seq (replays count
per graph instead). ``backend_seq`` is the backend's counter read after the call.

Cost (bench/bench_hooks.py, 2-vCPU VM): the collective, ProcessGroup-method and sync wrappers run behind a compiled
fast path (tracer/_fastspan.c) that records the common call in C and hands every other one to the Python wrapper
here: ~0.8 µs of CPU added per traced collective in isolation (pure Python: ~2.3 µs), ~0.2 µs per host sync.
Where the 0.8 µs goes: two backend-counter reads (~0.12-0.18 µs each: pybind dispatch; one exists for backend_seq,
the other makes untraced-op detection exact), the tensor's dtype/shape getters (~0.1 µs), the call site (frame
walk with a per-(code, offset) cache — hashing a code object or reading f_lineno would cost microseconds in a long
function), group / seq lookups and two 128-byte ring records (~40 ns each in C). The Python path's thread ids are
cached on a per-thread plain object (``threading.get_native_id()`` alone is ~175 ns). NVTX costs one ``is None``
test unless a tool is attached (then the Python path runs, ~0.6 µs per push/pop pair).
"""
from __future__ import annotations

import inspect
import itertools
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

from . import redact
from .recorder import Recorder

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
from .slotwriter import CAT, COMMIT, KIND, N32, N64, PACK, SLOT_SIZE, SlotWriter, ring_parts, slot_writer

__all__ = [
    "TraceState", "OP_SPECS", "INIT_OPS", "install_c10d", "make_pg_method_wrapper", "make_wait_wrapper",
    "make_graph_enter_wrapper", "make_graph_exit_wrapper", "make_capture_wrapper", "make_replay_wrapper",
    "make_sync_wrapper", "make_graphed_callables_wrapper", "make_user_wrapper", "UNTRACED", "MAX_GAP_NOTES",
    "fastpath_available", "FASTPATH_ENV", "FASTPATH_ERROR",
]

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
    "all_gather_coalesced": ("collective", "input_tensor_list", True, ()),
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
COALESCING_MANAGER = "_coalescing_manager"
_SENDS = frozenset({"send", "isend", "send_object_list"})
_ALWAYS_ASYNC = frozenset({"isend", "irecv"})
UNTRACED = "untraced_ops"
MAX_GAP_NOTES = 32        # untraced_ops marks with a readable detail in the meta region; later ones go to op slots
MAX_SHAPES = 4096         # distinct (dtype, shape) strings per process; later shapes are recorded by rank only
MAX_META_SPANS = 4096     # --hook phase enter/exit records in the meta region before they spill to op slots
_WORK_PURGE = 4096        # weak work -> op entries kept before dead ones are swept

_ENTER, _EXIT, _ERROR, _COMPLETE, _MARK = (KIND[k] for k in ("enter", "exit", "error", "complete", "mark"))
_C_COLL, _C_P2P, _C_GRAPH, _C_SYNC = CAT["collective"], CAT["p2p"], CAT["graph"], CAT["sync"]
_F_CAPTURING, _F_ASYNC = 1, 2  # tracer.ringformat FLAG_CAPTURING / FLAG_ASYNC
assert SLOT_SIZE == 128 and (_ENTER, _EXIT) == (0, 1)  # inlined in _op_span


class _Skip(Exception):
    """Raised while preparing a record when the call must not be recorded (non-member rank)."""


class _Thread:
    """Per-thread tracer state, a plain object: attribute access on a threading.local costs ~35 ns against ~7 here,
    and the op path touches it seven times."""

    __slots__ = ("depth", "span", "in_graph_ctx", "tid")

    def __init__(self) -> None:
        self.depth = 0         # >0 while inside a recorded call: inner calls are not recorded again
        self.span = 0          # span id of the innermost open recorded span (parent of the next record)
        self.in_graph_ctx = 0  # >0 inside torch.cuda.graph.__enter__/__exit__ (capture_begin/end belong to it)
        self.tid = threading.get_native_id()


class _TLS(threading.local):
    ts: _Thread | None = None  # a class default, so a new thread reads None instead of raising


# group tuple: (weakref to the pg, name id, name, member ranks, backend counter reader or None, backend is gloo)
_Group = tuple


class TraceState:
    """Everything the wrappers share in one process: recorder, identity, counters, caches."""

    def __init__(self, recorder_factory: Callable[[], Recorder], rank: int | None, world: int | None) -> None:
        self._factory = recorder_factory
        self._rec: Recorder | None = None
        self.put: SlotWriter = self._put_first
        self.ring: tuple[Any, ...] | None = None  # tracer.slotwriter.ring_parts of the recorder, once it exists
        self.rank = rank
        self.world = world
        self.enabled = True
        self.tls = _TLS()
        self._spans = itertools.count(1)
        self.seq: dict[Any, int] = {}
        self.groups: dict[int, _Group] = {}
        # id(code) -> (code, outside torch/ranktrace?, {bytecode offset: call-site string id})
        self.code_info: dict[int, tuple[Any, bool, dict[int, int]]] = {}
        self.tensor_ids: dict[tuple[Any, tuple[int, ...]], tuple[int, int, int]] = {}
        # frames a call site never names: ranktrace, and the stdlib plumbing between a caller and a wrapped call
        # (contextlib/functools wrappers; asyncio's loop, which runs a task whose creator is further back)
        lib = os.path.dirname(os.path.abspath(os.__file__))
        self.skip_prefixes: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)),) + tuple(
            os.path.join(lib, m) for m in ("contextlib", "functools", "asyncio"))
        self.c10d: Any = None
        self._world_of: Callable[[], Any] = lambda: None
        self.c10d_world: Any = None  # torch's _World, when its default_pg storage can be read directly
        self.non_member: Any = object()
        self._failed = False
        # graph id while a CUDA graph capture is open (tracer.graphs): process-wide, for the no-CUDA-call rule
        self.capturing: int | None = None
        self.capture_tid = 0  # the thread that opened it: only its ops are captured (capturing_for)
        self.capture_span = 0
        self.open_captures: dict[tuple[str, int], tuple[int, int, int, Any]] = {}
        self.graph_ids: dict[int, tuple[Any, int]] = {}
        self._next_graph = itertools.count(1)
        self.replays: dict[int, int] = {}
        self.works: dict[int, tuple[Any, ...]] = {}
        self.bseq_last: dict[int, int] = {}
        self.gap_notes = 0
        self.meta_spans = 0
        self.nv: Any = None          # tracer.nvtx_ranges.NvtxRanges while an NVTX tool is attached
        self._nv_loaded = False
        self.names: dict[str, int] = {}
        self.on_init: list[Callable[[], None]] = []  # run at each init_process_group entry (pending --hook targets)

    # --- recorder (created lazily: a process that never records writes no ring) ------------------------
    @property
    def rec(self) -> Recorder:
        if self.ring is None:
            if self._rec is None:
                self._rec = self._factory()  # the factory may set _rec itself first (tracer.inject's identity)
            inherited = getattr(self, "_inherited_strings", None)
            if inherited:  # a forked child: keep the parent's string ids (wrappers cache them) valid in our ring
                self._rec.adopt_strings(inherited)
                self._inherited_strings = None
            self.put = slot_writer(self._rec)
            self.ring = ring_parts(self._rec)
        return self._rec  # type: ignore[return-value]

    def open_ring(self) -> tuple[Any, ...]:
        self.rec  # noqa: B018  (creates the ring, binds self.ring)
        return self.ring  # type: ignore[return-value]

    def _put_first(self, *fields: int) -> None:
        """The writer until the ring exists: create it, then write through the bound writer."""
        self.rec  # noqa: B018  (creates the ring and binds self.put)
        self.put(*fields)

    @property
    def local(self) -> _Thread:
        """This thread's state (hot paths inline ``st.tls.ts`` instead of this property)."""
        ts = self.tls.ts
        if ts is None:
            ts = self.tls.ts = _Thread()
        return ts

    def capturing_for(self, tid: int) -> int | None:
        """The graph an op issued now by thread `tid` is captured into: the open capture's, when `tid` opened it.
        Another thread's op meanwhile (a background comm thread) runs for real: it keeps its seq."""
        gid = self.capturing
        return gid if gid is not None and tid == self.capture_tid else None

    def new_thread(self) -> _Thread:
        ts = self.tls.ts = _Thread()
        return ts

    def new_span(self) -> int:
        """Span ids are unique per ring (a forked child starts its own ring and its own count)."""
        return next(self._spans)

    def name_id(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = self.rec.intern(name)
        return nid

    def reset_after_fork(self, recorder_factory: Callable[[], Recorder]) -> None:
        """In a forked child: its own ring, fresh thread state; seq counters stay (the child inherits group state).

        Wrappers cache string ids (op names, group names) from the parent's ring; the child's ring adopts the
        parent's whole string table under the same ids, so those caches stay true."""
        self._factory = recorder_factory
        self._inherited_strings = dict(self._rec._strings) if self._rec is not None else None
        self._rec = None
        self.put = self._put_first
        self.ring = None
        self.tls = _TLS()
        self._spans = itertools.count(1)
        self.code_info.clear()
        self.tensor_ids.clear()
        self.groups.clear()
        self.names.clear()
        self.works.clear()
        self.bseq_last.clear()
        self.gap_notes = self.meta_spans = 0

    def fail(self, err: BaseException) -> None:
        """A failure in ranktrace itself: one line on stderr, tracing off in this process, the job goes on."""
        self.enabled = False
        if not self._failed:
            self._failed = True
            try:
                sys.stderr.write(f"[ranktrace] tracing disabled in pid {os.getpid()}: {type(err).__name__}: {err}\n")
            except Exception:
                pass

    def load_nvtx(self) -> None:
        """Import nvtx once, in-rank, after torch is in (never at interpreter start)."""
        if self._nv_loaded:
            return
        self._nv_loaded = True
        from . import nvtx_ranges

        self.nv = nvtx_ranges.load(lambda detail: self.note("nvtx", detail))

    def note(self, topic: str, detail: str) -> None:
        """One line in the ring meta about how tracing itself is doing (nvtx missing, a hook target, ...)."""
        self.rec.meta({"type": "note", "topic": topic, "detail": detail, "pid": os.getpid()})

    # --- identity and groups -----------------------------------------------------------------------------
    def identity(self, source: str) -> None:
        self.rec.meta(
            {
                "type": "identity", "rank": self.rank, "world": self.world, "source": source,
                "local_rank": _int_env("LOCAL_RANK"), "pid": os.getpid(), "ppid": os.getppid(),
                "argv": redact.redact_argv(sys.argv),
            }
        )

    def default_pg(self) -> Any:
        return self._world_of()

    def group(self, pg: Any) -> _Group:
        """Cached group tuple of a ProcessGroup (see _Group); records the group in the ring the first time."""
        hit = self.groups.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit
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
        reader = _counter_reader(pg)
        # A weak reference: holding the ProcessGroup would keep it alive past destroy_process_group and make
        # gloo/NCCL tear it down at interpreter exit instead (seen here: std::terminate, SIGABRT).
        entry = (weakref.ref(pg), nid, name, ranks, reader, backend == "gloo")
        self.groups[id(pg)] = entry
        return entry

    def group_info(self, pg: Any) -> tuple[int, str, list[int] | None]:
        g = self.group(pg)
        return g[1], g[2], g[3]

    # --- backend counter gaps (ops Python cannot see) ------------------------------------------------------
    def check_gap(self, g: _Group, pg: Any, callsite: int, tid: int) -> None:
        """Before a traced op: if the backend counter moved since the last traced op ended, someone issued ops we
        did not see (DDP's reducer, functional collectives, compiled graphs) — say so in the ring."""
        reader = g[4]
        if reader is None:
            return
        try:
            now = reader(pg)
        except Exception:
            return
        last = self.bseq_last.get(g[1])
        if last is not None and now > last:
            self.untraced(g, last, now, callsite, tid)
        self.bseq_last[g[1]] = now

    def untraced(self, g: _Group, before: int, now: int, callsite: int, tid: int) -> None:
        """An untraced_ops mark: readable detail in the meta region for the first MAX_GAP_NOTES, then op-slot marks
        (backend_seq = the counter now) so a DDP loop's one gap per step never fills the meta region."""
        if self.gap_notes < MAX_GAP_NOTES:
            self.gap_notes += 1
            rec = self.rec
            rec.meta({"type": "event", "kind": "mark", "name": UNTRACED, "category": "collective", "group": g[2],
                      "t_ns": rec.clock(), "tid": tid, "backend_seq": now, "backend_seq_before": before,
                      "detail": f"backend_seq jumped from {before} to {now} on group {g[2]}: {now - before} op(s) "
                                f"issued outside Python (DDP reducer, functional collectives, compiled graphs)"})
        else:
            self.put(_MARK, _C_COLL, 0, self.name_id(UNTRACED), g[1], callsite, 0, 0, 0, N32, N32, N64, now, N64, 0,
                     0, tid)

    def rebaseline(self, check: bool) -> None:
        """Around init/destroy calls and graph captures (which issue ops of their own on existing groups): with
        check, report what moved since the last traced op; then take every live group's counter as the new base."""
        tid = self.local.tid
        for key, g in list(self.groups.items()):
            pg = g[0]()
            if pg is None:
                self.groups.pop(key, None)
                continue
            if check:
                self.check_gap(g, pg, 0, tid)
            elif g[4] is not None:
                try:
                    self.bseq_last[g[1]] = g[4](pg)
                except Exception:
                    self.bseq_last.pop(g[1], None)

    # --- async work -> op ---------------------------------------------------------------------------------
    def register_work(self, work: Any, op: tuple[Any, ...]) -> None:
        """Remember which op a Work handle belongs to, weakly (Work objects take no attributes)."""
        works = self.works
        if len(works) >= _WORK_PURGE:
            for k in [k for k, v in works.items() if v[0]() is None]:
                del works[k]
        try:
            works[id(work)] = (weakref.ref(work),) + op
        except TypeError:  # not weak-referenceable: do not risk a stale id match
            pass

    # --- graphs ------------------------------------------------------------------------------------------
    def graph_id(self, graph: Any) -> int:
        """Our 1-based id of a CUDAGraph object, stable for its lifetime (no CUDA call involved)."""
        hit = self.graph_ids.get(id(graph))
        if hit is not None and (hit[0] is None or hit[0]() is graph):
            return hit[1]
        gid = next(self._next_graph)
        try:
            ref: Any = weakref.ref(graph)
        except TypeError:
            ref = None
        self.graph_ids[id(graph)] = (ref, gid)
        return gid

    # --- meta-region events (never evicted by the ring wrap) ---------------------------------------------
    def meta_event(self, kind: str, name: str, category: str, span: int, tid: int, **extra: Any) -> None:
        rec = self.rec
        rec.meta({"type": "event", "kind": kind, "name": name, "category": category, "t_ns": rec.clock(),
                  "tid": tid, "span_id": span, **extra})

    # --- per-call pieces -------------------------------------------------------------------------------
    def callsite(self, frame: Any) -> int:
        """String id of the first frame outside torch and ranktrace.

        Cached per code object (by id: hashing a code object hashes its whole bytecode and constants, microseconds
        for a long training function; the code object kept in the entry makes an id reused later miss) and then per
        bytecode offset (``f_lineno`` walks the line table, so it is read only on a miss). _op_span inlines the hit
        path of this loop."""
        info = self.code_info
        while frame is not None:
            co = frame.f_code
            ci = info.get(id(co))
            if ci is None or ci[0] is not co:
                ci = self.code_entry(co)
            if not ci[1]:
                sid = ci[2].get(frame.f_lasti)
                return sid if sid is not None else self.callsite_miss(frame, ci)
            frame = frame.f_back
        return 0

    def code_entry(self, co: Any) -> tuple[Any, bool, dict[int, int]]:
        fn = co.co_filename
        ci = (co, fn.startswith(self.skip_prefixes) or fn.startswith("<frozen"), {})
        self.code_info[id(co)] = ci
        return ci

    def callsite_miss(self, frame: Any, ci: tuple[Any, bool, dict[int, int]]) -> int:
        co = frame.f_code
        sid = self.rec.intern(f"{co.co_filename}:{frame.f_lineno} {co.co_name}")
        ci[2][frame.f_lasti] = sid
        return sid

    def tensor(self, t: Any) -> tuple[int, int, int]:
        """(dtype id, shape id, nbytes or N64) of a tensor, or of the first tensor of a (nested) list; cached per
        (dtype, shape) — _op_span inlines the hit path. (An identity cache is no faster on a hit and much slower for
        the fresh tensors tensor-parallel layers pass every call.)"""
        while type(t) is list or type(t) is tuple:
            if not t:
                return 0, 0, N64
            t = t[0]
        try:
            key = (t.dtype, t.shape)
        except AttributeError:
            return 0, 0, N64
        ids = self.tensor_ids.get(key)
        if ids is None:
            many = len(self.tensor_ids) >= MAX_SHAPES
            try:
                shape = tuple(key[1])
                n = 1
                for d in shape:
                    n *= d
                # Past MAX_SHAPES distinct shapes (dynamic shapes in a serving loop), a shape is written as its rank
                # only: the meta region, which never wraps, must not fill with shape strings (nbytes stays exact).
                text = f"<{len(shape)}-d, shape not kept>" if many else str(list(shape))
                ids = (self.rec.intern(str(key[0]).replace("torch.", "")), self.rec.intern(text),
                       n * t.element_size())
            except (AttributeError, TypeError):
                return 0, 0, N64
            if not many:
                self.tensor_ids[key] = ids
        return ids


def _counter_reader(pg: Any) -> Callable[[Any], int] | None:
    """pg -> backend counter, or None when this group has none (then no backend_seq and no gap check)."""
    fn = getattr(type(pg), "_get_sequence_number_for_group", None)
    if fn is None:
        return None
    try:
        fn(pg)
    except Exception:
        return None
    return fn


def _int_env(name: str) -> int | None:
    v = os.environ.get(name)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _positions(fn: Callable[..., Any]) -> dict[str, int]:
    try:
        return {p: i for i, p in enumerate(inspect.signature(fn).parameters)}
    except (TypeError, ValueError):
        return {}


def error_text(err: BaseException) -> str:
    """What a ring keeps of a job's exception: type and message, secrets redacted (a failed rendezvous names its
    URL, credentials included), cut to 500 characters. A message that cannot even be rendered is said so."""
    try:
        msg = str(err)
    except Exception as e:  # a broken __str__ of the job's exception must not become ranktrace's failure
        msg = f"<message not readable: {type(e).__name__}>"
    return redact.redact_value(f"{type(err).__name__}: {msg}")[:500]


def _error_id(st: TraceState, err: BaseException) -> int:
    return st.rec.intern(error_text(err))


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


# ============================================================================================================
# Work.wait: linked to the op whose handle it is
# ============================================================================================================
def make_wait_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait()``: a ``wait`` span (category sync) whose parent is the op the handle came from (same group,
    seq and peer); on gloo a wait that returned also completes that op (gloo does the work before wait returns;
    on NCCL wait only orders streams, so nothing is claimed there — DESIGN §2)."""
    nid = [0]

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(self, *args, **kwargs)
        try:
            tid = local.tid
            op = st.works.get(id(self))
            if op is not None and op[0]() is not self:
                op = None
            if op is not None:
                _ref, op_span, op_name, op_cat, gid, seq, peer, graph, flags, gloo = op
            else:
                op_span, op_name, op_cat, gid, seq, peer, graph, flags, gloo = 0, 0, 0, 0, N64, N32, N32, 0, False
            name_id = nid[0] or st.name_id("wait")
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            span = st.new_span()
            parent = op_span or local.span
            wflags = flags & _F_CAPTURING
            st.put(_ENTER, _C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push("wait" if seq == N64 else f"wait seq={seq}")
        except Exception as e:
            st.fail(e)
            return orig(self, *args, **kwargs)
        local.depth = 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.put(_ERROR, _C_SYNC, wflags, name_id, gid, cs, 0, 0, _error_id(st, e), peer, graph, seq, N64, N64,
                       span, parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            st.put(_EXIT, _C_SYNC, wflags, name_id, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, span, parent, tid)
            if op is not None and gloo and result is not False and not wflags:
                st.put(_COMPLETE, op_cat, flags, op_name, gid, cs, 0, 0, 0, peer, graph, seq, N64, N64, op_span, 0,
                       tid)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wait, orig, name="wait", qualname="Work.wait")


# ============================================================================================================
# _coalescing_manager: one span for the block, each call inside counted by its own wrapper
# ============================================================================================================
def _make_coalescing_wrapper(st: TraceState, orig_gen: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
    """Wraps the generator function inside ``@contextmanager _coalescing_manager``.

    The block is its own span (name ``coalesced``, no seq: each call inside advances seq by itself, DESIGN §3).
    torch's own set-up and the flush at block exit (``allreduce_coalesced`` / ``_end_coalescing`` / ``work.wait``)
    run with the depth guard closed, so the one backend op a block makes is not recorded a second time; the user's
    body runs with it open and its ops become children of the block span. Async handles the block hands out
    (``cm.works``) are linked to the block span for ``wait``.
    """
    pos = _positions(orig_gen)
    gi = pos.get("group", 0)
    ai = pos.get("async_ops", 1 << 30)
    nid = [0]

    def _coalescing_manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        gen = orig_gen(*args, **kwargs)
        if local.depth or not st.enabled:
            return (yield from gen)
        span = 0
        try:
            tid = local.tid
            pg = args[gi] if gi < len(args) else kwargs.get("group")
            if pg is None:
                pg = st._world_of()
            g = st.group(pg) if pg is not None else None
            gid = g[1] if g is not None else 0
            cs = st.callsite(sys._getframe(1))
            capturing = st.capturing_for(tid)
            if g is not None and capturing is None:
                st.check_gap(g, pg, cs, tid)
            name_id = nid[0] or st.name_id("coalesced")
            nid[0] = name_id
            span = st.new_span()
            parent = local.span
            aop = bool(args[ai] if ai < len(args) else kwargs.get("async_ops", False))
            flags = _F_ASYNC if aop else 0
            graph = N32
            if capturing is not None:
                flags |= _F_CAPTURING
                graph = capturing
            st.put(_ENTER, _C_COLL, flags, name_id, gid, cs, 0, 0, 0, N32, graph, N64, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push(f"coalesced group={g[2] if g is not None else ''}")
        except Exception as e:
            st.fail(e)
            return (yield from gen)

        def close(err: BaseException | None) -> None:
            try:
                if nv is not None:
                    nv.pop()
                bseq = N64
                if err is None and g is not None and capturing is None and g[4] is not None:
                    bseq = g[4](pg)
                    st.bseq_last[gid] = bseq
                elif g is not None:
                    st.bseq_last.pop(gid, None)
                st.put(_ERROR if err is not None else _EXIT, _C_COLL, flags, name_id, gid, cs, 0, 0,
                       _error_id(st, err) if err is not None else 0, N32, graph, N64, bseq, N64, span, parent, tid)
                if err is None and aop and cm is not None:
                    for work in getattr(cm, "works", None) or ():
                        st.register_work(work, (span, name_id, _C_COLL, gid, N64, N32, graph, flags,
                                                g is not None and g[5]))
            except Exception as e:
                st.fail(e)

        cm = None
        local.depth += 1
        try:
            cm = gen.send(None)  # torch's set-up (start coalescing)
        except StopIteration as stop:  # did not yield: contextmanager reports that, as without us
            local.depth -= 1
            close(None)
            return stop.value
        except BaseException as e:
            local.depth -= 1
            close(e)
            raise
        local.depth -= 1
        while True:
            local.span = span
            try:
                sent = yield cm
            except GeneratorExit:
                local.span = parent
                gen.close()
                close(None)
                raise
            except BaseException as e:  # the block's body raised: torch's generator sees it, as without us
                local.span = parent
                local.depth += 1
                try:
                    cm = gen.throw(e)
                except StopIteration as stop:
                    local.depth -= 1
                    close(None)
                    return stop.value
                except BaseException as e2:
                    local.depth -= 1
                    close(e2)
                    raise
                local.depth -= 1
                continue
            local.span = parent
            local.depth += 1
            try:
                cm = gen.send(sent)  # torch's flush: one coalesced backend op
            except StopIteration as stop:
                local.depth -= 1
                close(None)
                return stop.value
            except BaseException as e:
                local.depth -= 1
                close(e)
                raise
            local.depth -= 1

    return _finish(_coalescing_manager, orig_gen)


# ============================================================================================================
# init_process_group / new_group / destroy_process_group
# ============================================================================================================
def _make_init_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """Recorded in the non-wrapping region. Init calls issue backend ops of their own on existing groups, so the
    counter gap check runs before them and every live group is re-based after them."""
    pos = _positions(orig)

    def record(kind: str, span: int, extra: dict[str, Any]) -> None:
        st.meta_event(kind, name, "init", span, st.local.tid, **extra)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not st.enabled or st.local.depth:
            return orig(*args, **kwargs)
        span = 0
        nv = None
        try:
            for fn in st.on_init:
                fn()
            span = st.new_span()
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
            st.rebaseline(check=True)
            record("enter", span, extra)
            nv = st.nv
            if nv is not None:
                nv.push(name)
        except Exception as e:
            st.fail(e)
        st.local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            st.local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                record("error", span, {"error": error_text(e)})
            except Exception as e2:
                st.fail(e2)
            raise
        st.local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            if name == "init_process_group":
                st.rank, st.world = st.c10d.get_rank(), st.c10d.get_world_size()
                st.identity("init_process_group")
                st.group(st.c10d.GroupMember.WORLD)
            elif name == "new_group" and result is not None and result is not st.c10d.GroupMember.NON_GROUP_MEMBER:
                st.group(result)
            if name == "destroy_process_group":
                st.bseq_last.clear()  # groups are gone: never call into a destroyed backend
            else:
                st.rebaseline(check=False)
            record("exit", span, {})
            if name == "init_process_group":
                for fn in st.on_init:
                    fn()
        except Exception as e:
            st.fail(e)
        return result

    return _finish(wrapper, orig)


def _arg(pos: dict[str, int], args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    i = pos.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name, default)


def _callsite_text(st: TraceState, frame: Any) -> str | None:
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(st.skip_prefixes) and not fn.startswith("<frozen"):
            return f"{fn}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return None


# ============================================================================================================
# CUDA graphs and host syncs (tracer.graphs decides where these go)
# ============================================================================================================
CAPTURE = "cuda_graph_capture"


def _open_capture(st: TraceState, graph: Any, frame: Any) -> tuple[int, int, int, Any]:
    """Meta-region enter of a capture span; returns (span, graph id, parent, nvtx)."""
    local = st.tls.ts
    if local is None:
        local = st.new_thread()
    gid = st.graph_id(graph)
    span = st.new_span()
    parent = local.span
    st.meta_event("enter", CAPTURE, "graph", span, local.tid, graph_id=gid, callsite=_callsite_text(st, frame),
                  parent_span_id=parent or None)
    nv = st.nv
    if nv is not None:
        nv.push(f"{CAPTURE} graph={gid}")
    return span, gid, parent, nv


def _begin_capturing(st: TraceState, gid: int, span: int) -> None:
    """From here until the capture closes, ops get capturing=true + graph_id and no seq; ranktrace makes no CUDA
    call (it never does), and backend counters are not read (captured ops move them without running)."""
    st.capturing = gid
    st.capture_span = span
    st.capture_tid = st.local.tid
    st.local.span = span


def _close_capture(st: TraceState, span: int, gid: int, parent: int, nv: Any, err: BaseException | None) -> None:
    st.capturing = None
    st.capture_span = 0
    st.local.span = parent
    if nv is not None:
        nv.pop()
    extra: dict[str, Any] = {"graph_id": gid}
    if err is not None:
        extra["error"] = error_text(err)
    st.meta_event("error" if err is not None else "exit", CAPTURE, "graph", span, st.local.tid, **extra)
    st.rebaseline(check=False)  # captured collectives moved backend counters; they are not untraced ops


def make_graph_enter_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.graph.__enter__``: opens the capture span at the user's ``with`` line; torch's own
    synchronize / capture_begin inside it are not recorded separately."""

    def __enter__(self: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(self)
        try:
            graph = getattr(self, "cuda_graph", None)
            opened = _open_capture(st, graph if graph is not None else self, sys._getframe(1))
        except Exception as e:
            st.fail(e)
            return orig(self)
        local.depth += 1
        local.in_graph_ctx += 1
        try:
            result = orig(self)
        except BaseException as e:
            local.depth -= 1
            local.in_graph_ctx -= 1
            try:
                _close_capture(st, *opened, e)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth -= 1
        local.in_graph_ctx -= 1
        _begin_capturing(st, opened[1], opened[0])
        st.open_captures[("ctx", id(self))] = opened
        return result

    return _finish(__enter__, orig, name="__enter__")


def make_graph_exit_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.graph.__exit__``: closes the span opened by __enter__ (error kind when capture_end raised)."""

    def __exit__(self: Any, *args: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        opened = st.open_captures.pop(("ctx", id(self)), None)
        if opened is None or not st.enabled:
            return orig(self, *args)
        local.depth += 1
        local.in_graph_ctx += 1
        try:
            result = orig(self, *args)
        except BaseException as e:
            local.depth -= 1
            local.in_graph_ctx -= 1
            try:
                _close_capture(st, *opened, e)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth -= 1
        local.in_graph_ctx -= 1
        try:
            _close_capture(st, *opened, None)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(__exit__, orig, name="__exit__")


def make_capture_wrapper(st: TraceState, which: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.capture_begin`` / ``capture_end`` called directly (not from torch.cuda.graph, which records the
    span itself): the same capture span, opened by capture_begin and closed by capture_end."""
    begin = which == "capture_begin"

    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or local.in_graph_ctx or not st.enabled:
            return orig(self, *args, **kwargs)
        opened = None
        try:
            if begin:
                opened = _open_capture(st, self, sys._getframe(1))
            else:
                opened = st.open_captures.pop(("graph", id(self)), None)
        except Exception as e:
            st.fail(e)
            return orig(self, *args, **kwargs)
        local.depth += 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            local.depth -= 1
            try:
                if opened is not None:
                    _close_capture(st, *opened, e)
                else:
                    st.capturing = None
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth -= 1
        try:
            if begin:
                _begin_capturing(st, opened[1], opened[0])  # type: ignore[index]
                st.open_captures[("graph", id(self))] = opened  # type: ignore[assignment]
            elif opened is not None:
                _close_capture(st, *opened, None)
            else:
                st.capturing = None
        except Exception as e:
            st.fail(e)
        return result

    return _finish(capture, orig, name=which)


def make_replay_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.replay``: a ``replay`` span (category graph) with seq = this graph's replay count on this rank.
    Replay returns once the graph is launched, so an open replay span means the launch itself blocked."""
    nid = [0]

    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(self, *args, **kwargs)
        try:
            tid = local.tid
            gid = st.graph_id(self)
            seq = st.replays.get(gid, 0) + 1
            st.replays[gid] = seq
            name_id = nid[0] or st.name_id("replay")
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            span = st.new_span()
            parent = local.span
            st.put(_ENTER, _C_GRAPH, 0, name_id, 0, cs, 0, 0, 0, N32, gid, seq, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push(f"replay graph={gid} seq={seq}")
        except Exception as e:
            st.fail(e)
            return orig(self, *args, **kwargs)
        local.depth = 1
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.put(_ERROR, _C_GRAPH, 0, name_id, 0, cs, 0, 0, _error_id(st, e), N32, gid, seq, N64, N64, span,
                       parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            st.put(_EXIT, _C_GRAPH, 0, name_id, 0, cs, 0, 0, 0, N32, gid, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(replay, orig, name="replay")


def make_sync_wrapper(st: TraceState, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """A host sync (``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``): a span in category
    sync — on NCCL this is where a rank whose collective never completes actually blocks (DESIGN §2)."""
    nid = [0]

    def sync(*args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return orig(*args, **kwargs)
        try:
            tid = local.tid
            name_id = nid[0] or st.name_id(name)
            nid[0] = name_id
            cs = st.callsite(sys._getframe(1))
            span = st.new_span()
            parent = local.span
            capturing = st.capturing_for(tid)
            flags, graph = (0, N32) if capturing is None else (_F_CAPTURING, capturing)
            st.put(_ENTER, _C_SYNC, flags, name_id, 0, cs, 0, 0, 0, N32, graph, N64, N64, N64, span, parent, tid)
            nv = st.nv
            if nv is not None:
                nv.push(name)
        except Exception as e:
            st.fail(e)
            return orig(*args, **kwargs)
        local.depth = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as e:
            local.depth = 0
            try:
                if nv is not None:
                    nv.pop()
                st.put(_ERROR, _C_SYNC, flags, name_id, 0, cs, 0, 0, _error_id(st, e), N32, graph, N64, N64, N64,
                       span, parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        local.depth = 0
        try:
            if nv is not None:
                nv.pop()
            st.put(_EXIT, _C_SYNC, flags, name_id, 0, cs, 0, 0, 0, N32, graph, N64, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(_with_fastpath(st, _finish(sync, orig), orig, name, _MODE_SYNC, "sync"), orig)


def make_graphed_callables_wrapper(st: TraceState, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.make_graphed_callables``: a meta-region span (category graph); the warm-up and the captures it
    runs are recorded inside it (depth guard left open)."""

    def make_graphed_callables(*args: Any, **kwargs: Any) -> Any:
        return _meta_span_call(st, "make_graphed_callables", "graph", orig, args, kwargs, sys._getframe(1))

    return _finish(make_graphed_callables, orig)


def _meta_span_call(st: TraceState, name: str, category: str, orig: Callable[..., Any], args: tuple, kwargs: dict,
                    frame: Any) -> Any:
    """Call orig inside an enter/exit pair in the meta region (never evicted), children parented to it."""
    local = st.tls.ts
    if local is None:
        local = st.new_thread()
    if local.depth or not st.enabled:
        return orig(*args, **kwargs)
    try:
        span = st.new_span()
        parent = local.span
        st.meta_event("enter", name, category, span, local.tid, callsite=_callsite_text(st, frame),
                      parent_span_id=parent or None)
        nv = st.nv
        if nv is not None:
            nv.push(name)
    except Exception as e:
        st.fail(e)
        return orig(*args, **kwargs)
    local.span = span
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        local.span = parent
        try:
            if nv is not None:
                nv.pop()
            st.meta_event("error", name, category, span, local.tid, error=error_text(e))
        except Exception as e2:
            st.fail(e2)
        raise
    local.span = parent
    try:
        if nv is not None:
            nv.pop()
        st.meta_event("exit", name, category, span, local.tid)
    except Exception as e:
        st.fail(e)
    return result


# ============================================================================================================
# --hook MODULE:QUALNAME[=category] targets (tracer.user_hooks resolves them)
# ============================================================================================================
_GROUP_ATTRS = ("group", "pg", "process_group", "cpu_group", "device_group")


def make_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                      bound: bool) -> Callable[..., Any]:
    """A user-named function or method.

    collective: op records with group = "hook:<qualname>#<k>" where k is the k-th distinct bound object this rank
      called it on (module functions: "hook:<qualname>"), seq counted per (object, qualname) — so pynccl
      communicators and custom all-reduce objects, created in the same order on every rank, align across ranks;
    phase: enter/exit in the meta region like init events (analyzer's last_phase sees them);
    graph / sync / user: op records in that category.
    The depth guard is left open inside: torch.distributed calls the target makes are recorded as its children.
    """
    if inspect.isasyncgenfunction(orig):
        # a wrapper would have to re-yield every item and would hide that it is an async generator: not patched
        raise TypeError("async generator functions are not traced (hook the coroutine that iterates it)")
    if inspect.iscoroutinefunction(orig):
        return _make_async_user_wrapper(st, spec, qualname, category, orig, bound)
    if category == "phase":
        def phase_hook(*args: Any, **kwargs: Any) -> Any:
            if st.meta_spans >= MAX_META_SPANS:  # a hot "phase": stop spending the non-wrapping region on it
                return _slot_span_call(st, qualname, CAT["phase"], None, orig, args, kwargs, sys._getframe(1))
            st.meta_spans += 1
            return _meta_span_call(st, qualname, "phase", orig, args, kwargs, sys._getframe(1))

        return _finish(phase_hook, orig)
    cat = CAT[category]
    group_of = _bound_group_of(st, spec, qualname, bound)

    def user_hook(*args: Any, **kwargs: Any) -> Any:
        grp = None
        if cat == _C_COLL and st.enabled and not st.local.depth:
            try:
                grp = group_of(args[0] if bound and args else None)
            except Exception as e:
                st.fail(e)
        return _slot_span_call(st, qualname, cat, grp, orig, args, kwargs, sys._getframe(1))

    return _finish(user_hook, orig)


def _bound_group_of(st: TraceState, spec: str, qualname: str, bound: bool) -> Callable[[Any], tuple[int, str]]:
    """obj -> (group id, group name) of a collective --hook target: "hook:<qualname>#<k>" for the k-th distinct
    object this rank called it on, "hook:<qualname>" for a plain function."""
    groups: dict[int, tuple[Any, int, str]] = {}
    plain_group: list[tuple[int, str] | None] = [None]

    def group_of(obj: Any) -> tuple[int, str]:
        if not bound:
            if plain_group[0] is None:
                plain_group[0] = _user_group(st, f"hook:{qualname}", spec, None)
            return plain_group[0]
        hit = groups.get(id(obj))
        if hit is not None and (hit[0] is None or hit[0]() is obj):
            return hit[1], hit[2]
        k = sum(1 for _ in groups)  # the k-th distinct object on this rank
        gid, gname = _user_group(st, f"hook:{qualname}#{k}", spec, obj)
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        groups[id(obj)] = (ref, gid, gname)
        return gid, gname

    return group_of


def _make_async_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                             bound: bool) -> Callable[..., Any]:
    """An ``async def`` target (a serving engine's scheduler step, a request handler): the wrapper is itself a
    coroutine function — frameworks check ``inspect.iscoroutinefunction`` — and its span runs from the first step
    of the coroutine to its return, across every await. Other coroutines interleave on this thread meanwhile, so
    the span is not made the parent of what runs during it (the thread-wide current span would mis-parent them)."""
    group_of = _bound_group_of(st, spec, qualname, bound) if category == "collective" else None

    async def async_hook(*args: Any, **kwargs: Any) -> Any:
        local = st.tls.ts
        if local is None:
            local = st.new_thread()
        if local.depth or not st.enabled:
            return await orig(*args, **kwargs)
        try:
            tid, parent, span = local.tid, local.span, st.new_span()
            frame = sys._getframe(1)
            if category == "phase" and st.meta_spans < MAX_META_SPANS:
                st.meta_spans += 1
                meta = True
                st.meta_event("enter", qualname, "phase", span, tid, callsite=_callsite_text(st, frame),
                              parent_span_id=parent or None)
            else:
                meta = False
                cat = CAT[category]
                gid, seq = 0, N64
                if group_of is not None:
                    gid, gname = group_of(args[0] if bound and args else None)
                    seq = st.seq.get(gname, 0) + 1
                    st.seq[gname] = seq
                name_id, cs = st.name_id(qualname), st.callsite(frame)
                st.put(_ENTER, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
            return await orig(*args, **kwargs)
        try:
            result = await orig(*args, **kwargs)
        except BaseException as e:  # CancelledError included: the span ends where the task was cancelled
            try:
                if meta:
                    st.meta_event("error", qualname, "phase", span, tid, error=error_text(e))
                else:
                    st.put(_ERROR, cat, 0, name_id, gid, cs, 0, 0, _error_id(st, e), N32, N32, seq, N64, N64, span,
                           parent, tid)
            except Exception as e2:
                st.fail(e2)
            raise
        try:
            if meta:
                st.meta_event("exit", qualname, "phase", span, tid)
            else:
                st.put(_EXIT, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
        return result

    return _finish(async_hook, orig)


def _user_group(st: TraceState, name: str, spec: str, obj: Any) -> tuple[int, str]:
    ranks = None
    c10d = st.c10d
    if obj is not None and c10d is not None:
        for attr in _GROUP_ATTRS:
            pg = getattr(obj, attr, None)
            if pg is not None and hasattr(pg, "_get_sequence_number_for_group"):
                try:
                    ranks = list(c10d.get_process_group_ranks(pg))
                    break
                except Exception:
                    continue
    st.rec.meta({"type": "group", "name": name, "desc": f"--hook {spec}", "backend": "hook", "ranks": ranks})
    return st.rec.intern(name), name


def _slot_span_call(st: TraceState, name: str, cat: int, grp: tuple[int, str] | None, orig: Callable[..., Any],
                    args: tuple, kwargs: dict, frame: Any) -> Any:
    """Call orig inside an enter/exit op-record pair (children parented to it, depth guard left open)."""
    local = st.tls.ts
    if local is None:
        local = st.new_thread()
    if local.depth or not st.enabled:
        return orig(*args, **kwargs)
    try:
        tid = local.tid
        name_id = st.name_id(name)
        cs = st.callsite(frame)
        span = st.new_span()
        parent = local.span
        gid, seq = 0, N64
        capturing = st.capturing_for(tid)
        flags, graph = (0, N32) if capturing is None else (_F_CAPTURING, capturing)
        if grp is not None:
            gid = grp[0]
            if capturing is None:
                seq = st.seq.get(grp[1], 0) + 1
                st.seq[grp[1]] = seq
        st.put(_ENTER, cat, flags, name_id, gid, cs, 0, 0, 0, N32, graph, seq, N64, N64, span, parent, tid)
        nv = st.nv
        if nv is not None:
            nv.push(_nv_text(name, grp[1], seq, None) if grp is not None else name)
    except Exception as e:
        st.fail(e)
        return orig(*args, **kwargs)
    local.span = span
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        local.span = parent
        try:
            if nv is not None:
                nv.pop()
            st.put(_ERROR, cat, flags, name_id, gid, cs, 0, 0, _error_id(st, e), N32, graph, seq, N64, N64, span,
                   parent, tid)
        except Exception as e2:
            st.fail(e2)
        raise
    local.span = parent
    try:
        if nv is not None:
            nv.pop()
        st.put(_EXIT, cat, flags, name_id, gid, cs, 0, 0, 0, N32, graph, seq, N64, N64, span, parent, tid)
    except Exception as e:
        st.fail(e)
    return result


# ============================================================================================================
# patching helpers
# ============================================================================================================
def _finish(wrapper: Callable[..., Any], orig: Callable[..., Any], name: str | None = None,
            qualname: str | None = None) -> Callable[..., Any]:
    """Make the wrapper look like what it wraps (name, doc, module) and mark it as ours."""
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(orig, attr))
        except (AttributeError, TypeError):
            pass
    if name is not None and getattr(wrapper, "__name__", None) != name:
        wrapper.__name__ = name
    if qualname is not None:
        wrapper.__qualname__ = qualname
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
