"""gdb's frame grammar: one ``#k`` frame line (or the tail gdb wrapped onto the next line) spelt as
``func (file:line)`` / ``func (lib.so)`` / ``func``, C++ parameter lists and call arguments dropped."""
from __future__ import annotations

import re

__all__ = ["frame_text", "with_location"]

_ADDR = re.compile(r"^0x[0-9A-Fa-f]+ in ")
_ADDR_ONLY = re.compile(r"^0x[0-9A-Fa-f]*(?: in)?$")
_AT = re.compile(r"^(.*) at (\S+:\d+)\s*$")
_FROM = re.compile(r"^(.*) from (\S+)\s*$")


def _balanced_tail(text: str) -> int | None:
    """Index of the '(' that opens the parenthesised group ending `text`, or None if unbalanced/absent."""
    if not text.endswith(")"):
        return None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return i
    return None


def _function(spec: str) -> str | None:
    """``func(params) (args)`` → ``func``; None when the parentheses do not balance (a torn line)."""
    spec = spec.strip()
    i = _balanced_tail(spec)
    if i is None:
        return spec if "(" not in spec and ")" not in spec and spec else None
    func = spec[:i].rstrip()
    if not func:
        return None
    j = _balanced_tail(func)  # demangled C++ parameter list: waitRecv(int*, ...) -> waitRecv
    if j is not None and j > 0 and not func.startswith("{"):
        func = func[:j]
    return func or None


def frame_text(rest: str) -> str | None:
    """Format one frame line (after ``#k``) as ``func (file:line)`` / ``func (lib)`` / ``func``; None if torn."""
    rest = _ADDR.sub("", rest.strip())
    if _ADDR_ONLY.match(rest):
        return None          # "0x00007f0" / "0x00007f.. in": cut before the function name
    loc = None
    m = _AT.match(rest)
    if m:
        rest, loc = m.group(1), m.group(2)
    else:
        m = _FROM.match(rest)
        if m:
            rest, loc = m.group(1), _lib(m.group(2))
    func = _function(rest)
    if func is None:
        return None
    return f"{func} ({loc})" if loc else func


def with_location(frame: str, lib: str | None, at: str | None) -> str:
    """A frame whose ``from lib`` / ``at file:line`` gdb wrapped onto the next line; a frame cut before its
    parentheses closed is completed as far as the tail allows."""
    loc = at if at else _lib(lib or "")
    if loc is None:
        return frame
    return f"{frame} ({loc})" if frame else f"?? ({loc})"


def _lib(path: str) -> str | None:
    """The library's base name; None for a path cut before its name ends (``.../lib/python3.9/s``)."""
    name = path.rsplit("/", 1)[-1]
    return name if "." in name else None
