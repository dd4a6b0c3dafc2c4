"""Wrappers that record ENTER / EXIT / ERROR of every collective, p2p, init, wait, graph and sync call of a rank.

This module is the one name the rest of ranktrace uses for them; the code lives in tracer.state (TraceState, the op
table, shared helpers), tracer.wrap_ops (collectives, p2p, ProcessGroup methods; install_c10d), tracer.wrap_work
(Work.wait, coalesced blocks), tracer.wrap_init (init/new_group/destroy), tracer.wrap_graphs (CUDA graphs, host
syncs) and tracer.wrap_user (--hook targets). tracer.pg_hooks,
tracer.graphs and tracer.user_hooks only decide *what* to patch. A stack sampled inside a wrapper shows one of these
files, which the analyzers know to skip (analyzers.hoststate.TRACER_FRAME).

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

from .state import *  # noqa: F401,F403
from .wrap_graphs import *  # noqa: F401,F403
from .wrap_init import *  # noqa: F401,F403
from .wrap_ops import *  # noqa: F401,F403
from .wrap_user import *  # noqa: F401,F403
from .wrap_work import *  # noqa: F401,F403
