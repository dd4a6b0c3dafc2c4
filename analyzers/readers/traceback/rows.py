"""Records -> rows: a STACKS record per traceback, an ``exception`` observation, an EVENTS ``enter`` when it was
raised inside a torch.distributed op, an ``init_failure`` when inside process-group set-up at a stage the frames
name; for torch's "Segfault encountered" report, a native stack and a ``rank_exit`` (segfault)."""
from __future__ import annotations

import os
import re
from typing import Any

from ranktrace.analyzers.readers.common.stacks import StackRecord
from ranktrace.analyzers.readers.common.torch_text import clip
from ranktrace.analyzers.readers.traceback.frames import (cpp_init_stage, find_op, init_stage, is_app, launcher_kind,
                                                          short_file)
from ranktrace.analyzers.readers.traceback.scan import CppBacktrace, Traceback

__all__ = ["build"]

_MSG_RANK = re.compile(r"^(?:\[(\d{1,9})\] is setting up NCCL|.{0,200}?aborted on rank (\d{1,9})|\[Rank (\d{1,9})\]|"
                       r"Rank (\d{1,9}) (?:is running|successfully reached))")
_WATCHDOG_SYMS = ("ncclCommWatchdog", "Watchdog::run", "workCleanupLoop", "watchdogHandler", "checkTimeout")


def build(records: list[Traceback | CppBacktrace], file: str,
          source: str) -> tuple[list[dict[str, Any]], list[StackRecord], list[dict[str, Any]]]:
    """(EVENTS rows, stack records, OBSERVATIONS rows).

    Worked example (pytorch-131781-b, rank 13)::

        [rank13]: Traceback (most recent call last):
        [rank13]:   File "/home/ubuntu/test.py", line 9, in run
        [rank13]:     dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        [rank13]:   File ".../site-packages/torch/distributed/c10d_logger.py", line 75, in wrapper
        [rank13]:   File ".../site-packages/torch/distributed/distributed_c10d.py", line 2219, in all_reduce
        [rank13]:     work = group.allreduce([tensor], opts)
        [rank13]: torch.distributed.DistBackendError: NCCL error in: ...NCCL.cpp:1970, unhandled system error

        STACKS       rank 13, frames ["all_reduce (torch/distributed/distributed_c10d.py:2219)",
                     "wrapper (torch/distributed/c10d_logger.py:75)", "run (/home/ubuntu/test.py:9)", ...], exception
        OBSERVATIONS exception rank 13, name DistBackendError, group all_reduce, detail "NCCL error in: ..."
        EVENTS       enter rank 13, all_reduce (collective), callsite "run (/home/ubuntu/test.py:9)", error "Dist..."

    Rank: the launcher prefix, else the spawn index ("-- Process 3 terminated with the following error:"), else the
    file name, else a rank the message states ("[1] is setting up NCCL communicator", "aborted on rank 3",
    "[Rank 3] ..."); a launcher's own traceback (torchrun, spawn's join) has none.
    """
    events: list[dict[str, Any]] = []
    stacks: list[StackRecord] = []
    obs: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    base = os.path.basename(file)
    k = 0
    for r in records:
        if isinstance(r, Traceback) and r.segfault is not None:
            k += 1
            _segfault(r, k, base, file, source, stacks, obs)
        elif isinstance(r, Traceback) and _of_a_tool(r):
            continue           # a diagnosis tool's own crash (torch's fr_trace on odd dumps): not the job's
        elif isinstance(r, Traceback):
            frames = list(reversed(r.frames))            # innermost first
            rank = _rank(r)
            spelled = [f"{f.func} ({short_file(f.file)}:{f.lineno})" for f in frames]
            ident = (rank, tuple(spelled), r.exc_type, r.exc_msg)
            if ident in seen:
                continue       # the same traceback printed twice (a rank's stderr and the launcher's copy)
            seen.add(ident)
            k += 1
            launcher = launcher_kind([(f.file, f.lineno, f.func, f.code) for f in frames])
            if launcher:
                rank = r.who.prefix_rank
            short = r.exc_type.rsplit(".", 1)[-1] if r.exc_type else None
            interrupted = short == "KeyboardInterrupt"
            stacks.append(StackRecord(source, file, r.line, spelled, host=r.who.host, pid=r.who.pid, rank=rank,
                                      thread_name=launcher or r.thread,
                                      state="interrupted" if interrupted else "exception", snapshot=f"{base}#tb{k}"))
            tuples = [(f.file, f.lineno, f.func, f.code) for f in frames]
            op = None if launcher else find_op(tuples, cut_bottom=r.exc_type is None)
            message = clip(r.exc_msg) if r.exc_msg else ""
            if r.exc_type is not None:
                detail = message
                if r.chained:
                    detail = (detail + " (raised while handling an earlier exception)").strip()
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="exception", name=short,
                                group=op.name if op else None, detail=detail, source=source, file=file,
                                line=r.exc_line))
            if op is not None:
                if short:
                    error = f"{short}: {message}" if message else short
                else:
                    error = "(traceback cut before its exception line)"
                # the op frame's callers; for an op read from a code line, that frame itself is the call site
                first = op.index if op.via == "code" else op.index + 1
                callsite = next((s for f, s in zip(frames[first:], spelled[first:]) if is_app(f.file)), None)
                at = frames[op.index]
                detail = f"raised in {spelled[op.index]}" + (f" via={op.via}" if op.via != "distributed_c10d" else "")
                events.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="enter", name=op.name,
                                   category=op.category, callsite=callsite, error=clip(error), detail=detail,
                                   source=source, file=file, line=at.line))
                if op.category == "init" and op.name != "destroy_process_group":
                    stage = init_stage(tuples[:op.index + 1])
                    if stage is not None:
                        obs.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="init_failure",
                                        name=stage[0], detail=clip(f"{op.name} raised in {stage[1]}: {error}"),
                                        source=source, file=file, line=r.exc_line or at.line))
        elif isinstance(r, CppBacktrace):
            k += 1
            rank = r.who.global_rank
            frames = [f"{s} ({lib})" for s, lib in zip(r.symbols, r.libs)]
            watchdog = any(w in s for s in r.symbols for w in _WATCHDOG_SYMS)
            stacks.append(StackRecord(source, file, r.line, frames, host=r.who.host, pid=r.who.pid, rank=rank,
                                      thread_name="pt_nccl_watchdg" if watchdog else None, state="exception",
                                      native=True, snapshot=f"{base}#cpp{k}"))
            stage = None if watchdog else cpp_init_stage(list(r.symbols))
            if stage is not None:
                obs.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="init_failure", name=stage[0],
                                detail=clip(f"C++ backtrace of an exception raised inside {stage[1]}"
                                            + (f" (raised from {r.raised_from})" if r.raised_from else "")),
                                source=source, file=file, line=r.line))
    return events, stacks, obs


def _segfault(r: Traceback, k: int, base: str, file: str, source: str, stacks: list[StackRecord],
              obs: list[dict[str, Any]]) -> None:
    """torch's fatal-signal report: native frames already innermost first, the process dies of SIGSEGV."""
    rank = _rank(r)
    spelled = [f"{f.func} ({f.file})" if f.lineno == 0 else f"{f.func} ({short_file(f.file)}:{f.lineno})"
               for f in r.frames]
    stacks.append(StackRecord(source, file, r.line, spelled, host=r.who.host, pid=r.who.pid, rank=rank,
                              state="exception", native=True, snapshot=f"{base}#segv{k}"))
    obs.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="rank_exit", name="segfault", value=11,
                    detail=clip(f"Segfault encountered in {spelled[0]}"), source=source, file=file, line=r.line))
    stage = cpp_init_stage([f.func for f in r.frames])
    if stage is not None:
        obs.append(dict(host=r.who.host, pid=r.who.pid, rank=rank, kind="init_failure", name=stage[0],
                        detail=clip(f"segfault inside {stage[1]}"), source=source, file=file, line=r.line))


_TOOLS = ("flight_recorder/", "torchfrtrace", "fr_trace.py", "/py_spy/", "ranktrace/")


def _of_a_tool(r: Traceback) -> bool:
    return any(any(tool in (f.file or "") for tool in _TOOLS) for f in r.frames)


def _rank(r: Traceback) -> int | None:
    who = r.who
    if who.prefix_rank is not None:
        return who.prefix_rank
    if r.spawn_index is not None:
        return r.spawn_index
    if who.name_rank is not None:
        return who.name_rank
    m = _MSG_RANK.match(r.exc_msg or "")
    if m:
        return int(next(g for g in m.groups() if g is not None))
    return None
