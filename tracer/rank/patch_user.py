"""``trace run --hook MODULE:QUALNAME[=category]``: resolve and patch functions ranktrace does not know by itself
(pynccl communicators, custom all-reduce kernels, a serving engine's phases); the wrappers are in wrap_user.

A target that does not resolve is said once per job on stderr and in the ring meta; the job runs on unchanged.
"""
from __future__ import annotations

import hashlib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from .tracestate import TraceState
from .wrap_user import make_user_wrapper

__all__ = ["ENV", "CATEGORIES", "HookSpec", "SpecError", "parse_spec", "parse_env", "format_env", "UserHooks"]

ENV = "RANKTRACE_HOOKS"
CATEGORIES = ("phase", "collective", "graph", "sync", "user")
DEFAULT_CATEGORY = "user"
_MAIN_MODULES = ("__main__", "__mp_main__")


class SpecError(ValueError):
    """A --hook value that is not MODULE:QUALNAME[=category]."""


@dataclass(frozen=True)
class HookSpec:
    module: str
    qualname: str
    category: str

    @property
    def text(self) -> str:
        return f"{self.module}:{self.qualname}={self.category}"


def parse_spec(text: str) -> HookSpec:
    """``pkg.mod:Class.method=collective`` -> HookSpec; SpecError with a sentence a user can act on."""
    raw = text.strip()
    target, sep, category = raw.partition("=")
    category = category.strip() if sep else DEFAULT_CATEGORY
    module, colon, qualname = target.partition(":")
    module, qualname = module.strip(), qualname.strip()
    if not colon or not module or not qualname:
        raise SpecError(f"{raw!r} is not MODULE:QUALNAME[=category] (e.g. mypkg.comm:PyNccl.all_reduce=collective)")
    if not all(p.isidentifier() for p in module.split(".")) or not all(p.isidentifier() for p in qualname.split(".")):
        raise SpecError(f"{raw!r}: module and qualname must be dotted Python names")
    if category not in CATEGORIES:
        raise SpecError(f"{raw!r}: category must be one of {', '.join(CATEGORIES)}")
    return HookSpec(module, qualname, category)


def format_env(specs: list[HookSpec]) -> str:
    return ",".join(s.text for s in specs)


def parse_env(value: str | None) -> tuple[list[HookSpec], list[tuple[str, str]]]:
    """RANKTRACE_HOOKS -> (specs, [(raw, problem)]) — in-rank, a bad entry is a problem, never an exception."""
    specs: list[HookSpec] = []
    problems: list[tuple[str, str]] = []
    for raw in (value or "").split(","):
        if not raw.strip():
            continue
        try:
            spec = parse_spec(raw)
        except SpecError as e:
            problems.append((raw.strip(), str(e)))
            continue
        if spec not in specs:
            specs.append(spec)
    return specs, problems


class UserHooks:
    """The --hook targets of one process: patched as their modules import, problems reported once."""

    def __init__(self, st: TraceState, specs: list[HookSpec], trace_dir: str | None) -> None:
        self.st = st
        self.specs = specs
        self.trace_dir = trace_dir
        self.pending: list[HookSpec] = []  # main-module targets not defined yet
        self.done: dict[str, str] = {}
        self.reported: set[str] = set()

    def modules(self) -> list[str]:
        return sorted({s.module for s in self.specs})

    def on_module(self, module: Any) -> None:
        """Called right after `module` executed (or at once if it was imported before us)."""
        name = getattr(module, "__name__", None)
        for spec in self.specs:
            if spec.module != name and not (spec.module in _MAIN_MODULES and name in _MAIN_MODULES):
                continue
            self._apply(spec, module, final=spec.module not in _MAIN_MODULES)

    def retry_pending(self, final: bool = False) -> None:
        """Main-module targets: the script's classes exist once it has run its imports and definitions."""
        for spec in list(self.pending):
            module = sys.modules.get(spec.module) or sys.modules.get("__mp_main__")
            if module is not None:
                self._apply(spec, module, final=final)

    def report_unimported(self) -> None:
        """At exit of a rank: targets whose module this rank never imported (a typo, most often)."""
        if self.st.rank is None or self.st._rec is None:
            return
        for spec in self.specs:
            if spec.text not in self.done and spec.text not in self.reported:
                what = "not defined in the main script" if spec in self.pending else \
                    f"module {spec.module!r} was never imported by rank {self.st.rank}"
                self.problem(spec.text, what)

    def problem(self, target: str, text: str) -> None:
        """Ring meta (-> meta.json hook_problems) and one stderr line per job; the job goes on."""
        if target in self.reported:
            return
        self.reported.add(target)
        try:
            self.st.rec.meta({"type": "hook_problem", "target": target, "problem": text, "pid": os.getpid(),
                              "rank": self.st.rank})
        except Exception:
            pass
        if self._first_in_job(target):
            try:
                sys.stderr.write(f"[ranktrace] --hook {target}: {text}; not traced, the job runs on\n")
            except Exception:
                pass

    def _first_in_job(self, target: str) -> bool:
        if not self.trace_dir:
            return True
        marker = os.path.join(self.trace_dir, ".hook-" + hashlib.sha1(target.encode()).hexdigest()[:16])
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            return False
        except OSError:
            return True

    def _apply(self, spec: HookSpec, module: Any, final: bool) -> None:
        if spec.text in self.done:
            return
        try:
            how = _patch_target(self.st, spec, module)
        except _Unresolved as e:
            if not final:
                if spec not in self.pending:
                    self.pending.append(spec)
                return
            self.problem(spec.text, str(e))
            return
        except Exception as e:  # our own bug: say so, never break the user's import
            self.problem(spec.text, f"could not patch ({type(e).__name__}: {e})")
            return
        if spec in self.pending:
            self.pending.remove(spec)
        self.done[spec.text] = how
        try:
            self.st.rec.meta({"type": "hooks", "user": {spec.text: how}})
        except Exception:
            pass


class _Unresolved(Exception):
    """The target does not name a function or method (yet)."""


def _patch_target(st: TraceState, spec: HookSpec, module: Any) -> str:
    parts = spec.qualname.split(".")
    owner = module
    for i, part in enumerate(parts[:-1]):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise _Unresolved(f"{'.'.join(parts[:i + 1])!r} not found in module {spec.module!r}") from None
    attr = parts[-1]

    def make(fn: Callable[..., Any], bound: bool) -> Callable[..., Any]:
        return make_user_wrapper(st, spec.text, spec.qualname, spec.category, fn, bound)

    if isinstance(owner, type):
        raw = None
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                raw = klass.__dict__[attr]
                break
        if raw is None:
            raise _Unresolved(f"class {owner.__qualname__!r} has no attribute {attr!r}")
        if getattr(raw, "__ranktrace__", False) or getattr(getattr(raw, "__func__", None), "__ranktrace__", False):
            return "done"
        if isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(make(raw.__func__, False)))
            return "staticmethod"
        if isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(make(raw.__func__, True)))
            return "classmethod"
        if isinstance(raw, property) or not callable(raw):
            raise _Unresolved(f"{spec.qualname!r} is a {type(raw).__name__}, not a function or method")
        if isinstance(raw, type):
            raise _Unresolved(f"{spec.qualname!r} is a class: name one of its methods")
        setattr(owner, attr, make(raw, True))
        return "method"
    try:
        fn = inspect.getattr_static(owner, attr)
    except AttributeError:
        where = f"module {spec.module!r}" if owner is module else repr('.'.join(parts[:-1]))
        raise _Unresolved(f"{attr!r} not found in {where}") from None
    if getattr(fn, "__ranktrace__", False):
        return "done"
    if isinstance(fn, type):
        raise _Unresolved(f"{spec.qualname!r} is a class: name one of its methods")
    if not callable(fn):
        raise _Unresolved(f"{spec.qualname!r} is a {type(fn).__name__}, not a function")
    setattr(owner, attr, make(fn, False))
    return "function"
