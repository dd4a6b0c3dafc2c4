"""NVTX ranges for every recorded span, so Nsight Systems timelines carry ranktrace's op names, groups and seqs.

Why this shape:
* ``nvtx`` (the PyPI package) is imported lazily, in-rank, only once torch.distributed is in use — never
  ``torch.cuda.nvtx``, which raises on CPU builds. When it cannot be imported in the job's interpreter, tracing goes
  on without ranges and the ring meta says so once.
* With no NVTX tool attached (the normal case) ``nvtx.get_domain`` hands back a dummy domain: we then return
  ``None`` and the wrappers skip NVTX with one ``is None`` test — no per-call cost at all.
* Under a tool (``nsys profile``), ranges go into the ``ranktrace`` domain with texts like
  ``all_reduce group=0 seq=5`` (analyzers/readers/nsys_nvtx.py parses the ``group=``/``seq=`` tokens). A constant text
  reuses one pre-built ``EventAttributes`` (tens of ns); a text that carries a seq is new on every call and costs
  one registered string (a few hundred ns, only while profiling).
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["NvtxRanges", "load", "DOMAIN"]

DOMAIN = "ranktrace"
_CACHE_LIMIT = 4096  # constant texts (no seq) kept as pre-built attributes


class NvtxRanges:
    """push(text) / pop() in the ranktrace domain of an enabled NVTX tool."""

    def __init__(self, domain: Any) -> None:
        """`domain`: an enabled ``nvtx.Domain`` (what ``nvtx.get_domain`` returns while a tool is attached)."""
        from nvtx._lib.lib import EventAttributes, RegisteredString  # type: ignore[import-not-found]

        self._domain = domain
        self._handle = domain.handle
        self._attrs_cls = EventAttributes
        self._string_cls = RegisteredString
        self._cached: dict[str, Any] = {}
        self._scratch = EventAttributes(domain, None)
        self._push = self._domain.push_range
        self.pop: Callable[[], None] = self._domain.pop_range

    def push(self, text: str) -> None:
        """Open a range; texts seen before reuse their pre-built attributes. A text with a seq is new every call:
        it goes through one reused scratch attributes object (the tool copies what it needs during the push)."""
        attrs = self._cached.get(text)
        if attrs is None:
            if " seq=" in text or len(self._cached) >= _CACHE_LIMIT:
                attrs = self._scratch
                attrs.message = self._string_cls(self._handle, text)
            else:
                attrs = self._cached[text] = self._attrs_cls(self._domain, self._string_cls(self._handle, text))
        self._push(attrs)


def load(note: Callable[[str], None]) -> NvtxRanges | None:
    """NvtxRanges when an NVTX tool is attached; None otherwise. `note` gets one line when nvtx is unusable."""
    try:
        import nvtx  # type: ignore[import-not-found]
    except Exception as e:  # not installed in the job's interpreter: ranges off, said once
        note(f"nvtx not importable in this interpreter ({type(e).__name__}: {e}); no NVTX ranges")
        return None
    try:
        from nvtx._lib.lib import DummyDomain  # type: ignore[import-not-found]

        domain = nvtx.get_domain(DOMAIN)
        if isinstance(domain, DummyDomain) or not hasattr(domain, "handle"):
            return None  # no tool attached: NVTX calls would be no-ops, so make none
        return NvtxRanges(domain)
    except Exception as e:  # an nvtx version with another inside: ranges off, said once
        note(f"nvtx {getattr(nvtx, '__version__', '?')} unusable ({type(e).__name__}: {e}); no NVTX ranges")
        return None
