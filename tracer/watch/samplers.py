"""Periodic samples of a running job, written to ``<run>/<host>/samples/{proc,stacks,gpu}.arrows`` (Arrow IPC streams).

Why these live next to the progress model: the monitor already has to read each rank's ring, its /proc counters and
(when quiet) its stacks to decide whether the job is progressing. The samplers are the same reads, kept: one read of
/proc serves both the progress decision and ``proc.arrows``; one non-blocking py-spy dump serves both the "did the
stack change" decision and ``stacks.arrows``; nothing is read twice for the same moment. Memory stays bounded:
pending rows are flushed early past a cap.

One module per source, this one the single import for the monitor:

* :mod:`tracer.sample_log` — the schemas and the append-only Arrow stream writer (``ArrowStreamLog``);
* :mod:`tracer.proc_sampler` — ``proc.arrows`` (process and thread rows);
* :mod:`tracer.stack_sampler` — ``stacks.arrows`` (py-spy dumps, the ranks' agents);
* :mod:`tracer.ring_tail` — :class:`RingTail`, a live ring followed incrementally;
* ``gpu.arrows`` is written by :mod:`tracer.gpu_sampler`.
"""
from __future__ import annotations

from ranktrace.tracer.watch.proc_sampler import THREAD_KEYFRAME_S, ProcCounters, ProcSampler
from ranktrace.tracer.watch.ring_tail import RingTail
from ranktrace.tracer.watch.sample_log import GPU_SCHEMA, PROC_SCHEMA, SCHEMAS, STACKS_SCHEMA, ArrowStreamLog
from ranktrace.tracer.watch.stack_sampler import StackDump, StackSampler, agent_dumps, dump_all, frame_text, pyspy_dump

__all__ = [
    "PROC_SCHEMA", "STACKS_SCHEMA", "GPU_SCHEMA", "SCHEMAS", "ArrowStreamLog", "ProcSampler", "ProcCounters",
    "StackSampler", "StackDump", "pyspy_dump", "dump_all", "agent_dumps", "frame_text", "RingTail",
    "THREAD_KEYFRAME_S",
]
