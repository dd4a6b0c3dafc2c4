"""Per-process tracer state and what every wrapper shares: the op table, record constants, TraceState
(recorder, identity, groups, call sites, shapes, capture), error texts, and how a wrapper is made to look
like what it wraps. The wrappers themselves: tracer.wrap_ops, tracer.wrap_work, tracer.wrap_init,
tracer.wrap_graphs, tracer.wrap_user (see tracer.hooks for the rules they keep).
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

from .. import redact
from .recorder import Recorder
from .slotwriter import CAT, COMMIT, KIND, N32, N64, PACK, SLOT_SIZE, SlotWriter, ring_parts, slot_writer

__all__ = [  # everything, private names included: tracer.hooks re-exports this module whole
    "OP_SPECS", "INIT_OPS", "COALESCING_MANAGER", "_SENDS", "_ALWAYS_ASYNC", "UNTRACED", "MAX_GAP_NOTES",
    "MAX_SHAPES", "MAX_META_SPANS", "_WORK_PURGE", "_ENTER", "_EXIT", "_ERROR", "_COMPLETE", "_MARK", "_C_COLL",
    "_C_P2P", "_C_GRAPH", "_C_SYNC", "_F_CAPTURING", "_F_ASYNC", "_Skip", "_Thread", "_TLS", "_Group", "TraceState",
    "_counter_reader", "_int_env", "_positions", "error_text", "_error_id", "_run_slot_span", "_callsite_text",
    "_finish", "CAT",
    "COMMIT", "KIND", "N32", "N64", "PACK", "SLOT_SIZE", "SlotWriter", "ring_parts", "slot_writer", "redact",
    "Recorder",
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
        self.capture_pending = 0  # capture starts under way (torch.cuda.graph.__enter__ / capture_begin running)
        self.fr_lock = threading.Lock()  # see no_capture_starts
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

    @contextlib.contextmanager
    def no_capture_starts(self) -> Iterator[bool]:
        """Held by the agent while it asks torch for the Flight Recorder, which may read CUDA events: no capture
        can begin meanwhile (the capture-start wrappers wait for it, a few ms at most), and it tells whether one is
        open or starting — then the agent does not ask at all (DESIGN §2: no CUDA call while a capture is open)."""
        with self.fr_lock:
            yield self.capturing is not None or self.capture_pending > 0

    def capture_starting(self) -> None:
        """A capture-start wrapper is about to call torch: waits out an agent's Flight Recorder dump."""
        with self.fr_lock:
            self.capture_pending += 1

    def capture_started(self) -> None:
        """The capture-start call returned or raised (st.capturing is set by then when it opened). Under the lock:
        two threads starting captures at once must not lose a count (never waits on a dump: one cannot start
        while a capture start is pending)."""
        with self.fr_lock:
            self.capture_pending = max(0, self.capture_pending - 1)

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
        self.fr_lock = threading.Lock()  # the fork may have landed during the parent agent's dump: never held here
        self.capture_pending = 0
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



def _run_slot_span(st: TraceState, local: _Thread, orig: Callable[..., Any], args: tuple, kwargs: dict,
                   rec: tuple, nv: Any, *, guard: bool) -> Any:
    """The call half every op-record wrapper shares, after it wrote its ENTER record: call `orig`, then write EXIT —
    or ERROR with the exception's text and re-raise it unchanged. `rec` is the ENTER record's fields after the kind
    (category, flags, name, group, call site, dtype, shape, error, peer, graph, seq, backend_seq, nbytes, span,
    parent, tid). `guard`: hold the depth guard (a leaf span: calls inside are not recorded); otherwise make the
    span the thread's current one (a container: calls inside are recorded as its children). A failure of
    ranktrace's own here turns tracing off (TraceState.fail) and never reaches the job."""
    if guard:
        local.depth = 1
    else:
        local.span = rec[13]
    try:
        result = orig(*args, **kwargs)
    except BaseException as e:
        if guard:
            local.depth = 0
        else:
            local.span = rec[14]
        try:
            if nv is not None:
                nv.pop()
            st.put(_ERROR, *rec[:7], _error_id(st, e), *rec[8:])
        except Exception as e2:
            st.fail(e2)
        raise
    if guard:
        local.depth = 0
    else:
        local.span = rec[14]
    try:
        if nv is not None:
            nv.pop()
        st.put(_EXIT, *rec)
    except Exception as e:
        st.fail(e)
    return result


def _callsite_text(st: TraceState, frame: Any) -> str | None:
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(st.skip_prefixes) and not fn.startswith("<frozen"):
            return f"{fn}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return None



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
