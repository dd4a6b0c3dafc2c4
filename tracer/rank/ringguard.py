"""The Python side of the ring guard (tracer/rank/_ringguard.c): a ring file truncated by someone else (a cleanup
script, `: > 1234.ring`, a copytruncate rotation) makes the next store into its mapping fault with SIGBUS, which
ends the rank inside its own call. Guarded, that fault turns the mapping into anonymous memory: the rank runs on,
its ring is lost from then on, and the host side reads the file as the truncation left it.

faulthandler.enable() after the ring exists (torchrun's ``@record`` calls it in main()) puts faulthandler's handler
on top of ours, and faulthandler ends the process for any SIGBUS: the enable is wrapped so the guard goes back on
top, handing every SIGBUS that is not a ring's on to faulthandler as before.
"""
from __future__ import annotations

import mmap
from typing import Any

_ERRORS = (ImportError, OSError, TypeError, ValueError, BufferError)


def _module() -> Any:
    from . import _ringguard  # type: ignore[attr-defined]

    return _ringguard


def guard(buf: mmap.mmap) -> bool:
    """Guard this mapping; False where the guard is not built here (trace run says so once) or its table is full."""
    try:
        ok = bool(_module().guard(buf))
    except _ERRORS:
        return False
    if ok:
        _wrap_faulthandler()
    return ok


def release(buf: mmap.mmap) -> None:
    """Before the mapping goes: a later mapping at the same address is not ours to replace."""
    try:
        _module().release(buf)
    except _ERRORS:
        pass


def lost() -> int:
    """How many of this process's guarded rings a SIGBUS turned into anonymous memory."""
    try:
        return int(_module().lost())
    except _ERRORS:
        return 0


_wrapped = False


def _wrap_faulthandler() -> None:
    global _wrapped
    if _wrapped:
        return
    import faulthandler

    original = faulthandler.enable

    def enable(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        try:
            _module().on_top()
        except _ERRORS:
            pass

    enable.__wrapped__ = original  # type: ignore[attr-defined]
    enable.__doc__ = original.__doc__
    try:
        faulthandler.enable = enable  # type: ignore[assignment]
    except (AttributeError, TypeError):
        return
    _wrapped = True
    if faulthandler.is_enabled():  # enabled after import but before this ring: put the guard on top now
        try:
            _module().on_top()
        except _ERRORS:
            pass
