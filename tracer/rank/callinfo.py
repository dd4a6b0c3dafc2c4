"""What a record says about the call besides the op: where it was called from and what tensor it carries.

Both are string ids in the ring, looked up on every traced call, so both are cached: the call site per code
object and bytecode offset, the tensor per (dtype, shape). Part of TraceState (tracestate.py).
"""
from __future__ import annotations

import os
from typing import Any

from .recorder import Recorder
from .slotwriter import N64

__all__ = ["CallInfo", "MAX_SHAPES"]

MAX_SHAPES = 4096  # distinct (dtype, shape) strings per process; later shapes are recorded by their rank only


class CallInfo:
    """The call-site and tensor caches of TraceState (wrap_ops and _fastspan.c inline their hit paths)."""

    rec: Recorder

    def init_call_info(self) -> None:
        # id(code) -> (code, outside torch/ranktrace?, {bytecode offset: call-site string id})
        self.code_info: dict[int, tuple[Any, bool, dict[int, int]]] = {}
        self.tensor_ids: dict[tuple[Any, tuple[int, ...]], tuple[int, int, int]] = {}
        # frames a call site never names: ranktrace, and the stdlib plumbing between a caller and a wrapped call
        # (contextlib/functools wrappers; asyncio's loop, which runs a task whose creator is further back);
        # torch's own directory is added once torch is imported (patch_c10d, inject)
        lib = os.path.dirname(os.path.abspath(os.__file__))
        self.skip_prefixes: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)),) + tuple(
            os.path.join(lib, m) for m in ("contextlib", "functools", "asyncio"))

    def forget_call_info(self) -> None:
        """A forked child's ring has its own string ids for call sites and shapes."""
        self.code_info.clear()
        self.tensor_ids.clear()

    def callsite(self, frame: Any) -> int:
        """String id of the first frame outside torch and ranktrace.

        Cached per code object (by id: hashing a code object hashes its whole bytecode and constants, microseconds
        for a long training function; the code object kept in the entry makes an id reused later miss) and then per
        bytecode offset (``f_lineno`` walks the line table, so it is read only on a miss)."""
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

    def callsite_text(self, frame: Any) -> str | None:
        """The call site as text, uncached (meta-region records: init, captures, phases)."""
        while frame is not None:
            fn = frame.f_code.co_filename
            if not fn.startswith(self.skip_prefixes) and not fn.startswith("<frozen"):
                return f"{fn}:{frame.f_lineno} {frame.f_code.co_name}"
            frame = frame.f_back
        return None

    def tensor(self, t: Any) -> tuple[int, int, int]:
        """(dtype id, shape id, nbytes or N64) of a tensor, or of the first tensor of a (nested) list; cached per
        (dtype, shape). (An identity cache is no faster on a hit and much slower for the fresh tensors
        tensor-parallel layers pass every call.)"""
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
