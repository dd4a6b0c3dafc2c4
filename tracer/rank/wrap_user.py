"""Wrappers of the functions a profile or ``--hook MODULE:QUALNAME[=category]`` names (patch_user resolves them):
collective targets aligned per bound object, phases / set-up steps in the meta region with the argument that names
the instance (``bs=64``), ``@contextmanager`` targets spanning the ``with`` block, ``async def`` targets kept
coroutine functions, identity targets telling who the process is.

A wrapper passes its arguments through untouched (a changed signature only loses the detail), returns what the target
returns and raises what it raises; while torch.compile traces through one, it is the target alone.
"""
from __future__ import annotations

import contextlib
import inspect
import re
import sys
import weakref
from typing import Any, Callable

from .nvtx_ranges import range_text
from .slotwriter import C_COLL, CAT, ENTER, ERROR, EXIT, F_CAPTURING, N32, N64
from .spans import arg_positions, error_id, error_text, finish_wrapper, run_meta_span, run_slot_span, unwound
from .tracestate import TraceState, recording_thread

__all__ = ["make_user_wrapper", "make_identity_wrapper", "make_proctitle_wrapper", "MAX_META_SPANS", "compiling",
           "is_contextmanager"]

MAX_META_SPANS = 4096  # phase / set-up enter/exit records in the meta region before they spill to op slots
_GROUP_ATTRS = ("group", "pg", "process_group", "cpu_group", "device_group")
_META_CATEGORIES = ("phase", "init", "graph")  # rare, precious spans: never evicted by the ring wrap
_is_compiling: list[Any] = [None]


def compiling() -> bool:
    """True while torch.compile (dynamo) traces the caller: a wrapper then is only its target (dynamo reads
    torch.compiler.is_compiling() as a constant and never traces the recording branch)."""
    f = _is_compiling[0]
    if f is None:
        torch = sys.modules.get("torch")
        f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if f is None:
            return False
        _is_compiling[0] = f
    return bool(f())


def is_contextmanager(fn: Any) -> str | None:
    """"sync" / "async" when `fn` is what @contextlib.contextmanager / @asynccontextmanager returned."""
    inner = getattr(fn, "__wrapped__", None)
    code = getattr(fn, "__code__", None)
    if inner is None or code is None or code.co_name != "helper" or not code.co_filename.endswith("contextlib.py"):
        return None
    if inspect.isgeneratorfunction(inner):
        return "sync"
    if inspect.isasyncgenfunction(inner):
        return "async"
    return None


def _detail_of(fn: Callable[..., Any], names: tuple[str, ...]) -> Callable[[tuple, dict], str | None] | None:
    """(args, kwargs) -> "bs=64" from the first of `names` the call has (``a.b``: attribute b of argument a);
    None when the signature has none of them (a renamed parameter loses the detail, never the call)."""
    if not names:
        return None
    pos = arg_positions(fn)
    found = [(n, n.split(".")) for n in names if n.split(".")[0] in pos]
    if not found:
        return None

    def detail(args: tuple, kwargs: dict) -> str | None:
        for text, (head, *attrs) in found:
            if head in kwargs:
                v = kwargs[head]
            elif pos[head] < len(args):
                v = args[pos[head]]
            else:
                continue
            try:
                for a in attrs:
                    v = getattr(v, a)
                shown = v if isinstance(v, (int, str)) and not isinstance(v, bool) else repr(v)
            except Exception:
                continue
            return f"{text.split('.')[-1] if attrs else head}={str(shown)[:60]}"
        return None

    return detail


def make_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                      bound: bool, *, name: str | None = None, detail: tuple[str, ...] = (), comm: str | None = None,
                      group_desc: str | None = None, family: Any = None) -> Callable[..., Any]:
    """A profile or --hook target.

    collective: op records named `name` with group = "hook:<qualname>#<k>" where k is the k-th distinct bound object
      this rank called it on (module functions: "hook:<qualname>"), seq counted per (object, qualname) — also while
      a graph capture is open (the record says capturing), so pynccl communicators and custom all-reduce objects,
      created in the same order on every rank, align across ranks. Returning is not finishing: the analyzers take
      its exit as "issued" (DESIGN §2);
    phase / init / graph: enter/exit in the meta region (never evicted) with the detail argument (``bs=64``);
    user / sync: op records in that category.
    The depth guard is left open inside: torch.distributed calls the target makes are recorded as its children.
    `family` (a threading.local shared by a method's wrapper and its subclass overrides' wrappers): a call made
    while another member of the family runs on this thread (an override calling super()) is not recorded again.
    """
    shown = name or qualname
    desc = group_desc or comm
    cm = is_contextmanager(orig)
    if cm == "async":
        raise TypeError("async context managers are not traced (hook the coroutine that enters it)")
    if cm == "sync":
        return _make_cm_wrapper(st, spec, qualname, shown, category, orig, bound, detail, desc)
    if inspect.isasyncgenfunction(orig):
        # a wrapper would have to re-yield every item and would hide that it is an async generator: not patched
        raise TypeError("async generator functions are not traced (hook the coroutine that iterates it)")
    if inspect.iscoroutinefunction(orig):
        return _make_async_user_wrapper(st, spec, qualname, category, orig, bound, shown, desc)
    detail_of = _detail_of(orig, detail)
    if category in _META_CATEGORIES:
        def meta_hook(*args: Any, **kwargs: Any) -> Any:
            try:
                if compiling():
                    return orig(*args, **kwargs)
                extra = _extra(detail_of, args, kwargs)
                if st.meta_spans >= MAX_META_SPANS or not st.meta_room():  # hot spans: they go to op slots
                    return _slot_span_call(st, _spilled(shown, extra), CAT[category], None, False, orig, args,
                                           kwargs, sys._getframe(1))
                st.meta_spans += 1
                return run_meta_span(st, shown, category, orig, args, kwargs, sys._getframe(1), extra)
            except BaseException as e_:
                unwound(e_)
                raise

        return finish_wrapper(_in_family(meta_hook, orig, family), orig)
    cat = CAT[category]
    group_of = _bound_group_of(st, spec, qualname, bound, desc) if cat == C_COLL else None

    def user_hook(*args: Any, **kwargs: Any) -> Any:
        try:
            if compiling():
                return orig(*args, **kwargs)
            return _slot_span_call(st, shown, cat, group_of, bound, orig, args, kwargs, sys._getframe(1))
        except BaseException as e_:
            unwound(e_)
            raise

    return finish_wrapper(_in_family(user_hook, orig, family), orig)


def _in_family(hook: Callable[..., Any], orig: Callable[..., Any], family: Any) -> Callable[..., Any]:
    """`hook` unless a member of `family` already runs on this thread (then the call is the target alone)."""
    if family is None:
        return hook

    def family_hook(*args: Any, **kwargs: Any) -> Any:
        if getattr(family, "inside", False):
            return orig(*args, **kwargs)
        family.inside = True
        try:
            return hook(*args, **kwargs)
        finally:
            family.inside = False

    return family_hook


def _extra(detail_of: Callable[[tuple, dict], str | None] | None, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    if detail_of is None:
        return None
    d = detail_of(args, kwargs)
    return {"detail": d} if d else None


def _spilled(name: str, extra: dict[str, Any] | None) -> str:
    return f"{name} {extra['detail']}" if extra else name


def _make_cm_wrapper(st: TraceState, spec: str, qualname: str, shown: str, category: str, orig: Callable[..., Any],
                     bound: bool, detail: tuple[str, ...], desc: str | None) -> Callable[..., Any]:
    """An @contextmanager target: its generator is wrapped, so the span opens when the ``with`` block is entered and
    closes when it is left (a wrapper of the outer function would record the zero-length creation of the context
    manager object). The object the job gets is still contextlib's, built from the same generator."""
    gen_fn = orig.__wrapped__  # type: ignore[attr-defined]
    detail_of = _detail_of(gen_fn, detail)
    meta = category in _META_CATEGORIES
    group_of = _bound_group_of(st, spec, qualname, bound, desc) if category == "collective" else None

    def spanned(*args: Any, **kwargs: Any) -> Any:
        opened = None if compiling() else _cm_open(st, shown, category, meta, group_of, bound, detail_of, args,
                                                   kwargs)
        try:
            result = yield from gen_fn(*args, **kwargs)
        except BaseException as e:
            _cm_close(st, opened, e)
            raise
        _cm_close(st, opened, None)
        return result

    finish_wrapper(spanned, gen_fn)
    return finish_wrapper(contextlib.contextmanager(spanned), orig)


def _cm_open(st: TraceState, shown: str, category: str, meta: bool,
             group_of: Callable[[Any], tuple[int, str]] | None, bound: bool,
             detail_of: Callable[[tuple, dict], str | None] | None, args: tuple, kwargs: dict) -> tuple | None:
    """Enter record of a with-block span; (meta?, record, parent, local) or None when this call is not recorded."""
    local = recording_thread(st)
    if local is None:
        return None
    try:
        frame = sys._getframe(2)  # contextlib's __enter__ is skipped by the call-site walk
        extra = _extra(detail_of, args, kwargs) or {}
        span, parent, tid = st.new_span(), local.span, local.tid
        if meta and st.meta_spans < MAX_META_SPANS and st.meta_room():
            st.meta_spans += 1
            st.meta_event("enter", shown, category, span, tid, callsite=st.callsite_text(frame),
                          parent_span_id=parent or None, **extra)
            local.span = span
            return (True, (shown, category, span, tid), parent, local)
        gid, seq = 0, N64
        capturing = st.capturing_for(tid)
        flags, graph = (0, N32) if capturing is None else (F_CAPTURING, capturing)
        if group_of is not None:
            gid, gname = group_of(args[0] if bound and args else None)
            seq = st.seq.get(gname, 0) + 1
            st.seq[gname] = seq
        rec = (CAT[category], flags, st.name_id(_spilled(shown, extra or None)), gid, st.callsite(frame), 0, 0, 0,
               N32, graph, seq, N64, N64, span, parent, tid)
        st.put(ENTER, *rec)
        local.span = span
        return (False, rec, parent, local)
    except Exception as e:
        st.fail(e)
        return None


def _cm_close(st: TraceState, opened: tuple | None, err: BaseException | None) -> None:
    if opened is None:
        return
    meta, rec, parent, local = opened
    local.span = parent
    try:
        if meta:
            shown, category, span, tid = rec
            if err is None:
                st.meta_event("exit", shown, category, span, tid)
            else:
                st.meta_event("error", shown, category, span, tid, error=error_text(err))
        elif err is None:
            st.put(EXIT, *rec)
        else:
            st.put(ERROR, *rec[:7], error_id(st, err), *rec[8:])
    except Exception as e:
        st.fail(e)


def make_identity_wrapper(st: TraceState, source: str, mapping: dict[str, str],
                          orig: Callable[..., Any]) -> Callable[..., Any]:
    """A function whose arguments say who the process is (SGLang's run_scheduler_process(tp_rank, pp_rank, dp_rank),
    vLLM's WorkerProc(rank, local_rank)): an identity record with those roles, then the call, unchanged. A process
    with no RANK in its environment takes its rank from them until init_process_group says it."""
    pos = arg_positions(orig)

    def identity_hook(*args: Any, **kwargs: Any) -> Any:
        try:
            roles: dict[str, Any] = {}
            for role, arg in mapping.items():
                i = pos.get(arg)
                v = kwargs.get(arg) if arg in kwargs else (args[i] if i is not None and i < len(args) else None)
                if isinstance(v, int) and not isinstance(v, bool):
                    roles[role] = v
            if roles:
                record_roles(st, roles, source)
        except Exception as e:
            st.fail(e)
        return orig(*args, **kwargs)

    return finish_wrapper(identity_hook, orig)


def make_proctitle_wrapper(st: TraceState, patterns: list[str], orig: Callable[..., Any]) -> Callable[..., Any]:
    """``setproctitle.setproctitle``: a title the profile knows (sglang::scheduler_DP1_TP3_EP3, VLLM::Worker_TP3)
    names the process's roles; recorded after the title is set."""
    regexes = [re.compile(p) for p in patterns]

    def setproctitle(*args: Any, **kwargs: Any) -> Any:
        result = orig(*args, **kwargs)
        try:
            title = args[0] if args else kwargs.get("title")
            for rx in regexes:
                m = rx.match(str(title))
                if m:
                    roles = {k: int(v) for k, v in m.groupdict().items() if v is not None}
                    record_roles(st, roles, f"proctitle {title}")
                    break
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(setproctitle, orig)


def record_roles(st: TraceState, roles: dict[str, int], source: str) -> None:
    """Identity from roles: an explicit rank wins; else the TP rank of a process with no pipeline stage (SGLang's
    torch.distributed rank is pp * tp_size + tp); init_process_group corrects it later. A process title names only
    the roles that apply (PP/EP only when their size > 1), so once one was read it is the process's roles; roles
    from arguments leave out stage/expert/context ranks of 0, which every process has whether or not they apply."""
    if st.rank is None:
        if "rank" in roles:
            st.rank = roles["rank"]
        elif "tp" in roles and not roles.get("pp"):
            st.rank = roles["tp"]
    if source.startswith("proctitle"):
        st.roles, st.roles_from_title = dict(roles), True
    elif not getattr(st, "roles_from_title", False):
        st.roles = {**st.roles, **{k: v for k, v in roles.items() if v or k not in _ZERO_MEANS_NONE}}
    st.identity(source)


_ZERO_MEANS_NONE = ("pp", "ep", "attn_cp", "moe_dp", "pcp", "dcp")


def _bound_group_of(st: TraceState, spec: str, qualname: str, bound: bool,
                    desc: str | None = None) -> Callable[[Any], tuple[int, str]]:
    """obj -> (group id, group name) of a collective --hook target: "hook:<qualname>#<k>" for the k-th distinct
    object this rank called it on, "hook:<qualname>" for a plain function."""
    groups: dict[int, tuple[Any, int, str]] = {}
    plain_group: list[tuple[int, str] | None] = [None]

    def group_of(obj: Any) -> tuple[int, str]:
        if not bound:
            if plain_group[0] is None:
                plain_group[0] = _user_group(st, f"hook:{qualname}", desc or f"--hook {spec}", None)
            return plain_group[0]
        hit = groups.get(id(obj))
        if hit is not None and (hit[0] is None or hit[0]() is obj):
            return hit[1], hit[2]
        k = sum(1 for _ in groups)  # the k-th distinct object on this rank
        gid, gname = _user_group(st, f"hook:{qualname}#{k}", desc or f"--hook {spec}", obj)
        try:
            ref: Any = weakref.ref(obj)
        except TypeError:
            ref = None
        groups[id(obj)] = (ref, gid, gname)
        return gid, gname

    return group_of


def _make_async_user_wrapper(st: TraceState, spec: str, qualname: str, category: str, orig: Callable[..., Any],
                             bound: bool, shown: str | None = None, desc: str | None = None) -> Callable[..., Any]:
    """An ``async def`` target (a serving engine's scheduler step, a request handler): the wrapper is itself a
    coroutine function — frameworks check ``inspect.iscoroutinefunction`` — and its span runs from the first step
    of the coroutine to its return, across every await. Other coroutines interleave on this thread meanwhile, so
    the span is not made the parent of what runs during it (the thread-wide current span would mis-parent them)."""
    group_of = _bound_group_of(st, spec, qualname, bound, desc) if category == "collective" else None
    qualname = shown or qualname

    async def async_hook(*args: Any, **kwargs: Any) -> Any:
        local = recording_thread(st)
        if local is None:
            try:
                return await orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            tid, parent, span = local.tid, local.span, st.new_span()
            frame = sys._getframe(1)
            if category in _META_CATEGORIES and st.meta_spans < MAX_META_SPANS and st.meta_room():
                st.meta_spans += 1
                meta = True
                st.meta_event("enter", qualname, category, span, tid, callsite=st.callsite_text(frame),
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
                st.put(ENTER, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
            try:
                return await orig(*args, **kwargs)
            except BaseException as e_:
                unwound(e_)
                raise
        try:
            result = await orig(*args, **kwargs)
        except BaseException as e:  # CancelledError included: the span ends where the task was cancelled
            try:
                if meta:
                    st.meta_event("error", qualname, category, span, tid, error=error_text(e))
                else:
                    st.put(ERROR, cat, 0, name_id, gid, cs, 0, 0, error_id(st, e), N32, N32, seq, N64, N64, span,
                           parent, tid)
            except Exception as e2:
                st.fail(e2)
            unwound(e)
            raise
        try:
            if meta:
                st.meta_event("exit", qualname, category, span, tid)
            else:
                st.put(EXIT, cat, 0, name_id, gid, cs, 0, 0, 0, N32, N32, seq, N64, N64, span, parent, tid)
        except Exception as e:
            st.fail(e)
        return result

    return finish_wrapper(async_hook, orig)


def _user_group(st: TraceState, name: str, desc: str, obj: Any) -> tuple[int, str]:
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
    st.rec.meta({"type": "group", "name": name, "desc": desc, "backend": "hook", "ranks": ranks})
    return st.rec.intern(name), name


def _slot_span_call(st: TraceState, name: str, cat: int, group_of: Callable[[Any], tuple[int, str]] | None,
                    bound: bool, orig: Callable[..., Any], args: tuple, kwargs: dict, frame: Any) -> Any:
    """Call orig inside an enter/exit op-record pair (children parented to it, depth guard left open); with
    `group_of`, in the group of the object it is bound to (args[0]), seq counted per group."""
    local = recording_thread(st)
    if local is None:
        try:
            return orig(*args, **kwargs)
        except BaseException as e_:
            unwound(e_)
            raise
    try:
        grp = group_of(args[0] if bound and args else None) if group_of is not None else None
        tid = local.tid
        name_id = st.name_id(name)
        cs = st.callsite(frame)
        span = st.new_span()
        parent = local.span
        gid, seq = 0, N64
        capturing = st.capturing_for(tid)
        flags, graph = (0, N32) if capturing is None else (F_CAPTURING, capturing)
        if grp is not None:  # counted while a capture is open too: the ranks align by it there as well
            gid = grp[0]
            seq = st.seq.get(grp[1], 0) + 1
            st.seq[grp[1]] = seq
        rec = (cat, flags, name_id, gid, cs, 0, 0, 0, N32, graph, seq, N64, N64, span, parent, tid)
        st.put(ENTER, *rec)
        nv = st.nv
        if nv is not None:
            nv.push(range_text(name, grp[1], seq, None) if grp is not None else name)
    except Exception as e:
        st.fail(e)
        try:
            return orig(*args, **kwargs)
        except BaseException as e_:
            unwound(e_)
            raise
    try:
        return run_slot_span(st, local, orig, args, kwargs, rec, nv, guard=False)
    except BaseException as e_:
        unwound(e_)
        raise


