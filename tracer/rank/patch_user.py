"""Functions ranktrace does not know by itself (pynccl communicators, custom all-reduce kernels, a serving engine's
phases): the targets of a profile (RANKTRACE_PROFILE, a JSON plan `trace run` wrote from tracer/profiles/*.toml) and
of ``--hook MODULE:QUALNAME[=category]`` (RANKTRACE_HOOKS), resolved and patched as their modules import; the
wrappers are in wrap_user.

A target has alternatives (a function renamed across releases): the first that resolves is wrapped. One that does
not resolve is said once per job on stderr and in the ring meta (-> meta.json hook_problems); the job runs on. A
profile target whose module is never imported (an optional back-end) is no problem; a --hook one is.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .tracestate import TraceState
from .wrap_user import make_identity_wrapper, make_proctitle_wrapper, make_user_wrapper

__all__ = ["ENV", "PROFILE_ENV", "CATEGORIES", "HookSpec", "SpecError", "Target", "parse_spec", "parse_env",
           "format_env", "load_plan", "UserHooks"]

ENV = "RANKTRACE_HOOKS"
PROFILE_ENV = "RANKTRACE_PROFILE"  # a JSON plan written by tracer/launch/profiles.py
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


@dataclass(frozen=True)
class Target:
    """One thing to wrap: alternative (module, qualname) spellings, what its records are (category; identity
    targets record who the process is), the name a person reads, the argument naming the instance."""

    key: str                                   # how problems name it
    alternatives: tuple[tuple[str, str], ...]
    category: str | None                       # None: an identity target
    name: str | None = None                    # None: the qualname (--hook)
    detail: tuple[str, ...] = ()
    comm: str | None = None
    identity: tuple[tuple[str, str], ...] = ()
    origin: str = "--hook"                     # "--hook" or "profile <name>"

    @property
    def from_hook(self) -> bool:
        return self.origin == "--hook"

    @classmethod
    def of_spec(cls, spec: HookSpec) -> "Target":
        return cls(spec.text, ((spec.module, spec.qualname),), spec.category)


def load_plan(path: str | None) -> tuple[list[Target], list[str], list[tuple[str, str]]]:
    """RANKTRACE_PROFILE -> (targets, proctitle patterns, [(what, problem)]): in-rank, with json only; a plan that
    cannot be read is a problem, never an exception."""
    if not path:
        return [], [], []
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
        targets = []
        for t in plan.get("targets", []):
            alts = tuple(tuple(a.split(":", 1)) for a in t["targets"])
            key = f"profile {t.get('profile')}: {t['targets'][0]}"
            targets.append(Target(key, alts, t.get("category"), t["name"], tuple(t.get("detail") or ()), t.get("comm"),
                                  tuple((t.get("identity") or {}).items()), f"profile {t.get('profile')}"))
        return targets, list(plan.get("proctitle") or []), []
    except Exception as e:  # the job runs on, untraced by the profile
        return [], [], [(f"profile plan {path}", f"cannot be read ({type(e).__name__}: {e})")]


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
    """The profile and --hook targets of one process: patched as their modules import, problems reported once."""

    def __init__(self, st: TraceState, specs: list[HookSpec] | list[Target], trace_dir: str | None,
                 proctitle: list[str] | None = None) -> None:
        self.st = st
        self.targets: list[Target] = [s if isinstance(s, Target) else Target.of_spec(s) for s in specs]
        self.trace_dir = trace_dir
        self.proctitle = list(proctitle or [])
        self.pending: list[Target] = []  # main-module targets not defined yet
        self.done: dict[str, str] = {}
        self.failed: dict[str, dict[tuple[str, str], str]] = {}  # target key -> {alternative: why it did not resolve}
        self.reported: set[str] = set()
        self.said = 0  # 1 once this process said the job's one line about profile targets (the rest: meta.json)

    @property
    def specs(self) -> list[Target]:  # the older name
        return self.targets

    def modules(self) -> list[str]:
        mods = {m for t in self.targets for m, _q in t.alternatives}
        if self.proctitle:
            mods.add("setproctitle")
        return sorted(mods)

    def on_module(self, module: Any) -> None:
        """Called right after `module` executed (or at once if it was imported before us)."""
        name = getattr(module, "__name__", None)
        if name == "setproctitle" and self.proctitle:
            self._patch_proctitle(module)
        for t in self.targets:
            if t.key in self.done:
                continue
            tried = False
            for alt in t.alternatives:
                if alt[0] == name or (alt[0] in _MAIN_MODULES and name in _MAIN_MODULES):
                    tried = True
                    self._apply(t, alt, module, final=alt[0] not in _MAIN_MODULES)
                    if t.key in self.done:
                        break
            if tried and t.key not in self.done and t.key in self.failed and self._all_alternatives_failed(t):
                self.problem(t.key, self._why(t))

    def retry_pending(self, final: bool = False) -> None:
        """Main-module targets: the script's classes exist once it has run its imports and definitions."""
        for t in list(self.pending):
            module = sys.modules.get(t.alternatives[0][0]) or sys.modules.get("__mp_main__")
            if module is not None:
                self._apply(t, t.alternatives[0], module, final=final)

    def report_unimported(self) -> None:
        """At exit of a rank: --hook targets whose module this rank never imported (a typo, most often), and profile
        targets that did not resolve where their module was imported."""
        if self.st.rank is None or self.st._rec is None:
            return
        for t in self.targets:
            if t.key in self.done or t.key in self.reported:
                continue
            if t in self.pending:
                self.problem(t.key, "not defined in the main script")
            elif t.key in self.failed:
                self.problem(t.key, self._why(t))
            elif t.from_hook:
                self.problem(t.key, f"module {t.alternatives[0][0]!r} was never imported by rank {self.st.rank}")

    def _why(self, t: Target) -> str:
        fails = self.failed.get(t.key, {})
        if t.from_hook:
            return next(iter(fails.values()), "not found")
        return "not found in the installed release (" + "; ".join(fails.values()) + ")"

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
        profile = target.startswith("profile ")
        if profile:
            # one line per job, whichever process finds the first: trace run counts and names them all at the end
            # (a profile's targets missing from a release are many, and every process would say its own)
            if self.said or not self._first_in_job("profile targets"):
                return
            self.said += 1
            line = (f"[ranktrace] {target.split(':', 1)[0]}: targets not in the installed release are not traced "
                    f"(the job runs on); trace run counts them when it ends, meta.json hook_problems lists them\n")
        elif self._first_in_job(target):
            line = f"[ranktrace] --hook {target}: {text}; not traced, the job runs on\n"
        else:
            return
        try:
            sys.stderr.write(line)
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

    def _apply(self, t: Target, alt: tuple[str, str], module: Any, final: bool) -> None:
        if t.key in self.done:
            return
        try:
            how = _patch_target(self.st, t, alt, module)
        except _Unresolved as e:
            if not final:
                if t not in self.pending:
                    self.pending.append(t)
                return
            self.failed.setdefault(t.key, {})[alt] = str(e)
            return
        except Exception as e:  # our own bug: say so, never break the user's import
            self.problem(t.key, f"could not patch ({type(e).__name__}: {e})")
            return
        if t in self.pending:
            self.pending.remove(t)
        self.done[t.key] = how
        try:
            self.st.rec.meta({"type": "hooks", "user": {t.key: how}})
        except Exception:
            pass

    def _all_alternatives_failed(self, t: Target) -> bool:
        """Every alternative was tried where its module exists (a module that does not exist in this release cannot
        resolve later; one that exists but is not imported yet still can)."""
        tried = self.failed.get(t.key, {})
        for alt in t.alternatives:
            if alt in tried:
                continue
            if alt[0] in sys.modules:
                return False  # imported and not tried yet: its own callback decides
            try:
                if importlib.util.find_spec(alt[0]) is not None:
                    return False
            except Exception:
                continue
        return True

    def _patch_proctitle(self, module: Any) -> None:
        fn = getattr(module, "setproctitle", None)
        if fn is None or getattr(fn, "__ranktrace__", False) or not callable(fn):
            return
        try:
            module.setproctitle = make_proctitle_wrapper(self.st, self.proctitle, fn)
        except Exception as e:
            self.problem("setproctitle:setproctitle", f"could not patch ({type(e).__name__}: {e})")


def _func_of(member: Any) -> Any:
    return member.__func__ if isinstance(member, (staticmethod, classmethod)) else member


def _ours(member: Any) -> bool:
    return bool(getattr(member, "__ranktrace__", False) or getattr(getattr(member, "__func__", None), "__ranktrace__",
                                                                   False))


_OVERRIDES = "__ranktrace_overrides__"


def _cover_overrides(owner: type, attr: str, wrapped: Callable[[Any], Any]) -> None:
    """Wrap `attr` where a subclass of `owner` defines its own: now in every subclass there is, and in each one
    created later (an `__init_subclass__` on `owner` that first does what the class did before). A class that takes
    no attributes (a C type) is left as it is."""
    def cover(cls: type) -> None:
        member = cls.__dict__.get(attr)
        if member is not None and not _ours(member) and callable(_func_of(member)) and not isinstance(member, type):
            try:
                setattr(cls, attr, wrapped(member))
            except (TypeError, AttributeError):
                pass

    seen: set[int] = set()
    todo = list(owner.__subclasses__())
    while todo:
        sub = todo.pop()
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        cover(sub)
        todo.extend(sub.__subclasses__())
    registry = owner.__dict__.get(_OVERRIDES)
    if registry is not None:
        registry.append((attr, wrapped))
        return
    registry = [(attr, wrapped)]
    prev = owner.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if prev is None:
            super(owner, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        elif isinstance(prev, classmethod):
            prev.__func__(cls, **kwargs)
        else:
            prev.__get__(None, cls)(**kwargs)
        for name, wrap in registry:
            member = cls.__dict__.get(name)
            if member is not None and not _ours(member) and callable(_func_of(member)) and not isinstance(member, type):
                try:
                    setattr(cls, name, wrap(member))
                except (TypeError, AttributeError):
                    pass

    try:
        setattr(owner, _OVERRIDES, registry)
        owner.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    except (TypeError, AttributeError):
        pass


class _Unresolved(Exception):
    """The target does not name a function or method (yet)."""


def _patch_target(st: TraceState, t: Target, alt: tuple[str, str], module: Any) -> str:
    mod_name, qualname = alt
    parts = qualname.split(".")
    owner = module
    for i, part in enumerate(parts[:-1]):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise _Unresolved(f"{'.'.join(parts[:i + 1])!r} not found in module {mod_name!r}") from None
    attr = parts[-1]

    # one per target: a subclass override that calls super() records once, as the outermost call
    family = threading.local() if isinstance(owner, type) and t.category not in (None, "collective") else None

    def make(fn: Callable[..., Any], bound: bool) -> Callable[..., Any]:
        if t.category is None:
            return make_identity_wrapper(st, t.origin, dict(t.identity), fn)
        return make_user_wrapper(st, t.key if t.from_hook else f"{mod_name}:{qualname}", qualname, t.category, fn,
                                 bound, name=t.name, detail=t.detail, comm=t.comm, family=family)

    if isinstance(owner, type):
        raw = None
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                raw = klass.__dict__[attr]
                break
        if raw is None:
            raise _Unresolved(f"class {owner.__qualname__!r} has no attribute {attr!r}")
        if _ours(raw):
            return "done"
        if isinstance(raw, property) or not callable(_func_of(raw)):
            raise _Unresolved(f"{qualname!r} is a {type(raw).__name__}, not a function or method")
        if isinstance(raw, type):
            raise _Unresolved(f"{qualname!r} is a class: name one of its methods")

        def wrapped(member: Any) -> Any:
            if isinstance(member, staticmethod):
                return staticmethod(make(member.__func__, False))
            if isinstance(member, classmethod):
                return classmethod(make(member.__func__, True))
            return make(member, True)

        setattr(owner, attr, wrapped(raw))
        if family is not None:
            # the instance may be of a subclass that overrides the method (vLLM's CPUWorker and CPUModelRunner
            # override gpu_worker.Worker's and GPUModelRunner's): its override is the method that runs, so it is
            # wrapped too — in subclasses defined already and, through __init_subclass__, in those defined later.
            # Collective targets are not followed (their seq is counted per wrapper: two would misalign ranks).
            _cover_overrides(owner, attr, wrapped)
        return "staticmethod" if isinstance(raw, staticmethod) else "classmethod" if isinstance(
            raw, classmethod) else "method"
    try:
        fn = inspect.getattr_static(owner, attr)
    except AttributeError:
        where = f"module {mod_name!r}" if owner is module else repr('.'.join(parts[:-1]))
        raise _Unresolved(f"{attr!r} not found in {where}") from None
    if getattr(fn, "__ranktrace__", False):
        return "done"
    if isinstance(fn, type):
        raise _Unresolved(f"{qualname!r} is a class: name one of its methods")
    if not callable(fn):
        raise _Unresolved(f"{qualname!r} is a {type(fn).__name__}, not a function")
    setattr(owner, attr, make(fn, False))
    return "function"
