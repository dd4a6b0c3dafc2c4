"""NVTX ranges for every recorded span, so Nsight Systems timelines carry ranktrace's op names, groups and seqs.

``nvtx`` is imported lazily, in-rank, once torch.distributed is in use; with no NVTX tool attached, load() returns
None and the wrappers skip NVTX with one ``is None`` test. Range texts are parsed by analyzers/readers/nsys_nvtx.py.
"""
from __future__ import annotations

from typing import Any, Callable

from .slotwriter import N64

__all__ = ["NvtxRanges", "load", "range_text", "DOMAIN"]

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


def range_text(name: str, gname: str, seq: int, peer: int | None) -> str:
    """The text of an op's range: ``all_reduce group=0 seq=5`` (``peer=`` for p2p; no seq inside a capture)."""
    text = f"{name} group={gname}"
    if seq != N64:
        text += f" seq={seq}"
    if peer is not None:
        text += f" peer={peer}"
    return text
