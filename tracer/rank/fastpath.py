"""The compiled fast path (_fastspan.c) put in front of a Python wrapper, where it is built and not turned off.

It records the common call (caches warm, no capture, no NVTX tool, not p2p) in C and hands every other call to
the Python wrapper, which stays the reference: both write the same records.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .slotwriter import CAT
from .spans import error_id
from .tracestate import TraceState

__all__ = ["with_fastpath", "fastpath_available", "FASTPATH_ERROR", "FASTPATH_ENV", "MODE_FUNCTION",
           "MODE_PG_METHOD", "MODE_SYNC"]

try:
    from ._fastspan import MODE_FUNCTION, MODE_PG_METHOD, MODE_SYNC
    from ._fastspan import FastSpan as _FastSpan
    FASTPATH_ERROR: str | None = None
except Exception as _e:  # not built here (no compiler, Python < 3.11): the pure-Python wrappers do everything
    _FastSpan = None
    MODE_FUNCTION = MODE_PG_METHOD = MODE_SYNC = -1
    FASTPATH_ERROR = f"{type(_e).__name__}: {_e}"
FASTPATH_ENV = "RANKTRACE_FASTPATH"  # "0": pure-Python wrappers only (A/B benchmarks, parity tests)


def fastpath_available() -> bool:
    """Whether new wrappers get the compiled fast path (built, and not turned off by RANKTRACE_FASTPATH=0)."""
    return _FastSpan is not None and os.environ.get(FASTPATH_ENV, "1") != "0"


def with_fastpath(st: TraceState, slow: Callable[..., Any], orig: Callable[..., Any], name: str, mode: int,
                  category: str, gi: int = -1, ti: int = -1, ai: int = -1, tensor_kw: str | None = None,
                  always_async: bool = False) -> Callable[..., Any]:
    """`slow` (a Python wrapper) behind the compiled fast path, when there is one; else `slow` itself.

    Indexes are positions in the call's arguments, -1 for none."""
    if not fastpath_available():
        return slow
    try:
        return _FastSpan(st, slow, orig, name, mode, CAT[category], gi, ti, ai, tensor_kw, always_async, error_id)
    except Exception as e:  # never the job's problem: the Python wrapper does the work
        st.note("fastpath", f"{name}: {type(e).__name__}: {e}")
        return slow
