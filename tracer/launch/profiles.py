"""Profiles: which functions of a serving framework `trace run` wraps, kept as data (tracer/profiles/*.toml).

A profile lists targets by role (identity, init, collective, registration, phase, control_plane, sync), each with
alternative MODULE:QUALNAME spellings (the first that resolves in the running release is wrapped) and the releases
each was read from. The launcher picks one from the command (``-m sglang.launch_server``, ``sglang serve``,
``vllm serve``, ``-m vllm.entrypoints...``) or from ``--profile NAME|FILE``, parses it here (TOML, host side only)
and hands the ranks a resolved plain form: a JSON file in the run dir named by RANKTRACE_PROFILE, read in-rank with
the stdlib (tracer/rank/patch_user.py). Ranks never parse TOML.

Known limits: detection reads the command line only (a wrapper script that starts SGLang needs --profile); a profile
file's line numbers in error messages come from a scan of its text (tomllib reports none for valid TOML).
"""
from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 installs tomli (pyproject)
    import tomli as tomllib

__all__ = ["ProfileError", "Target", "Profile", "ROLES", "PROFILE_DIR", "ENV", "builtin_names", "load", "find",
           "detect", "choose", "plan", "write_plan", "apply"]

ENV = "RANKTRACE_PROFILE"  # read in-rank by tracer/rank/patch_user.py
PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"
# role -> the ring category its spans are recorded in (identity targets record who the process is, no span)
ROLES = {"identity": None, "init": "init", "collective": "collective", "registration": "graph", "phase": "phase",
         "control_plane": "user", "sync": "sync"}
_TOP = {"profile", "identity", "target"}
_PROFILE_KEYS = {"name", "description", "detect_module", "detect_command", "releases"}
_IDENTITY_KEYS = {"proctitle"}
_TARGET_KEYS = {"role", "name", "targets", "read_from", "detail", "comm", "identity", "note"}
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ProfileError(ValueError):
    """A profile that cannot be used: the message is one line naming the file and the line."""


@dataclass(frozen=True)
class Target:
    role: str
    name: str
    targets: tuple[str, ...]                 # MODULE:QUALNAME alternatives, first that resolves wins
    read_from: dict[str, tuple[str, ...]]    # alternative -> releases whose source defines it
    detail: tuple[str, ...] = ()             # argument names (a.b = attribute b of argument a), first present wins
    comm: str | None = None
    identity: dict[str, str] = field(default_factory=dict)
    line: int | None = None

    @property
    def category(self) -> str | None:
        return ROLES[self.role]


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str = ""
    detect_module: tuple[str, ...] = ()
    detect_command: tuple[str, ...] = ()
    releases: tuple[str, ...] = ()
    proctitle: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()


def builtin_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def find(name_or_file: str) -> Profile:
    """A shipped profile by name, or a profile file. ProfileError when neither."""
    p = Path(name_or_file)
    if name_or_file in builtin_names():
        return load(PROFILE_DIR / f"{name_or_file}.toml")
    if p.suffix == ".toml" or p.exists() or "/" in name_or_file:
        if not p.is_file():
            raise ProfileError(f"{p}: no such profile file")
        return load(p)
    raise ProfileError(f"{name_or_file!r}: not a profile name ({', '.join(builtin_names())}) nor a .toml file")


def load(path: Path) -> Profile:
    """Parse and check one profile file; ProfileError ('FILE:LINE: what is wrong') on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column \d+\)", str(e))
        line = m.group(1) if m else (str(len(text.splitlines())) if "end of document" in str(e) else None)
        where = f"{path}:{line}" if line else str(path)
        raise ProfileError(f"{where}: not valid TOML: {re.sub(r' *[(]at (line|end).*', '', str(e))}") from None
    lines = _Lines(path, text)
    for key in data:
        if key not in _TOP:
            raise lines.error(f"unknown key {key!r} (expected {', '.join(sorted(_TOP))})", key)
    head = _table(data.get("profile"), "profile", lines)
    for key in head:
        if key not in _PROFILE_KEYS:
            raise lines.error(f"unknown key {key!r} in [profile] (expected {', '.join(sorted(_PROFILE_KEYS))})", key)
    ident = _table(data.get("identity", {}), "identity", lines)
    for key in ident:
        if key not in _IDENTITY_KEYS:
            raise lines.error(f"unknown key {key!r} in [identity] (expected proctitle)", key)
    proctitle = _strings(ident.get("proctitle", []), "proctitle", lines)
    for rx in proctitle:
        try:
            re.compile(rx)
        except re.error as e:
            raise lines.error(f"proctitle is not a regular expression: {e}", "proctitle") from None
    name = head.get("name")
    if not isinstance(name, str) or not name:
        raise lines.error("[profile] needs name = \"...\"", "profile")
    raw_targets = data.get("target", [])
    if not isinstance(raw_targets, list):
        raise lines.error("target must be an array of tables: [[target]]", "target")
    targets = tuple(_target(i, t, lines) for i, t in enumerate(raw_targets))
    return Profile(name=name, path=path, description=str(head.get("description", "")),
                   detect_module=_strings(head.get("detect_module", []), "detect_module", lines),
                   detect_command=_strings(head.get("detect_command", []), "detect_command", lines),
                   releases=_strings(head.get("releases", []), "releases", lines), proctitle=proctitle,
                   targets=targets)


class _Lines:
    """Line numbers for messages about a parsed profile: where each [[target]] starts and where a key is set."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        self.target_starts = [i + 1 for i, ln in enumerate(self.lines) if ln.strip().startswith("[[target]]")]

    def line_of(self, key: str, target: int | None = None) -> int | None:
        lo, hi = 0, len(self.lines)
        if target is not None and target < len(self.target_starts):
            lo = self.target_starts[target] - 1
            hi = self.target_starts[target + 1] - 1 if target + 1 < len(self.target_starts) else hi
        pat = re.compile(rf"^\s*(\[\[?)?{re.escape(key)}\b")
        for i in range(lo, hi):
            if pat.match(self.lines[i]):
                return i + 1
        return self.target_starts[target] if target is not None and target < len(self.target_starts) else None

    def error(self, msg: str, key: str, target: int | None = None) -> ProfileError:
        line = self.line_of(key, target)
        return ProfileError(f"{self.path}:{line}: {msg}" if line else f"{self.path}: {msg}")


def _table(value: Any, name: str, lines: _Lines) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise lines.error(f"[{name}] must be a table", name)
    return value


def _strings(value: Any, key: str, lines: _Lines, target: int | None = None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise lines.error(f"{key} must be a string or a list of strings", key, target)
    return tuple(value)


def _target(i: int, raw: Any, lines: _Lines) -> Target:
    def bad(msg: str, key: str) -> ProfileError:
        return lines.error(f"target #{i + 1}: {msg}", key, i)

    if not isinstance(raw, dict):
        raise bad("must be a table", "target")
    for key in raw:
        if key not in _TARGET_KEYS:
            raise bad(f"unknown key {key!r} (expected {', '.join(sorted(_TARGET_KEYS))})", key)
    role = raw.get("role")
    if role not in ROLES:
        raise bad(f"role must be one of {', '.join(ROLES)} (got {role!r})", "role")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad("needs name = \"...\" (the op, step or phase a person reads)", "name")
    alts = _strings(raw.get("targets", []), "targets", lines, i)
    if not alts:
        raise bad("needs targets = [\"MODULE:QUALNAME\", ...]", "targets")
    for a in alts:
        module, colon, qual = a.partition(":")
        if not colon or not _DOTTED.match(module) or not _DOTTED.match(qual):
            raise bad(f"{a!r} is not MODULE:QUALNAME (dotted Python names)", "targets")
    read_from_raw = raw.get("read_from", {})
    if not isinstance(read_from_raw, dict):
        raise bad("read_from must be a table {\"MODULE:QUALNAME\" = [\"release\", ...]}", "read_from")
    read_from: dict[str, tuple[str, ...]] = {}
    for k, v in read_from_raw.items():
        if k not in alts:
            raise bad(f"read_from names {k!r}, which is not one of its targets", "read_from")
        read_from[k] = _strings(v, "read_from", lines, i)
    detail = raw.get("detail", "")
    if not isinstance(detail, str) or (detail and not all(_DOTTED.match(d) for d in detail.split("|"))):
        raise bad("detail must be argument names separated by | (e.g. \"bs|size\")", "detail")
    comm = raw.get("comm")
    if comm is not None and not isinstance(comm, str):
        raise bad("comm must be a string", "comm")
    identity = raw.get("identity", {})
    if not isinstance(identity, dict) or not all(isinstance(k, str) and isinstance(v, str) and _DOTTED.match(v)
                                                  for k, v in identity.items()):
        raise bad("identity must be a table of role = \"argument name\" (e.g. { tp = \"tp_rank\" })", "identity")
    if identity and role != "identity":
        raise bad("identity = {...} belongs to role = \"identity\" targets", "identity")
    return Target(role=role, name=name.strip(), targets=alts, read_from=read_from,
                  detail=tuple(d for d in detail.split("|") if d), comm=comm, identity=dict(identity),
                  line=lines.target_starts[i] if i < len(lines.target_starts) else None)


def _tokens(command: Sequence[str]) -> list[str]:
    """The command's words, with shell strings (bash -c "python -m ...") split too."""
    out: list[str] = []
    for arg in command:
        out.append(arg)
        if " " in arg:
            try:
                out.extend(shlex.split(arg))
            except ValueError:
                out.extend(arg.split())
    return out


def detect(command: Sequence[str], profiles: Sequence[Profile] | None = None) -> Profile | None:
    """The profile whose framework the command starts, or None. A framework's own profile wins over torch's (a
    torchrun that runs `-m sglang.launch_server` is an SGLang job)."""
    words = _tokens(command)
    modules = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
    modules += [w[2:] for w in words if w.startswith("-m") and len(w) > 2 and _DOTTED.match(w[2:])]
    names = [Path(w).name for w in words]
    found: list[Profile] = []
    for prof in profiles if profiles is not None else [load(PROFILE_DIR / f"{n}.toml") for n in builtin_names()]:
        hit = any(m == d or m.startswith(d + ".") for d in prof.detect_module for m in modules)
        for spec in prof.detect_command:
            parts = spec.split()
            for i in range(len(names) - len(parts) + 1):
                if names[i] == parts[0] and words[i + 1:i + len(parts)] == parts[1:]:
                    hit = True
        if hit:
            found.append(prof)
    found.sort(key=lambda p: p.name == "torch")
    return found[0] if found else None


def plan(profiles: Sequence[Profile]) -> dict[str, Any]:
    """The resolved, plain form the ranks read (JSON): every target of every profile, with its category."""
    targets = []
    for prof in profiles:
        for t in prof.targets:
            targets.append({"profile": prof.name, "role": t.role, "name": t.name, "category": t.category,
                            "targets": list(t.targets), "detail": list(t.detail), "comm": t.comm,
                            "identity": t.identity})
    return {"schema": "ranktrace.profile/1", "profiles": [p.name for p in profiles],
            "proctitle": [rx for p in profiles for rx in p.proctitle], "targets": targets}


def write_plan(host_dir: Path, resolved: dict[str, Any]) -> Path:
    path = host_dir / "profile.json"
    tmp = host_dir / ".profile.json.tmp"
    tmp.write_text(json.dumps(resolved, indent=1) + "\n")
    tmp.replace(path)
    return path


def choose(command: Sequence[str], asked: str | None) -> tuple[tuple[Profile, ...], str]:
    """The profiles for a run and how they were chosen: ``--profile none`` none; ``--profile NAME|FILE`` that one;
    else the one the command starts (none for a plain script). ProfileError for a bad name or file."""
    if asked is not None:
        if asked == "none":
            return (), "--profile none"
        return (find(asked),), "--profile"
    found = detect(command)
    return ((found,), "the command") if found is not None else ((), "")


def apply(host_dir: Path, profiles: Sequence[Profile], source: str) -> tuple[Path | None, dict[str, Any] | None]:
    """Write the ranks' plan into the host dir; (its path, what meta.json says about it). Nothing without a profile
    (or one with no targets, like torch's)."""
    if not profiles:
        return None, None
    info = {"names": [p.name for p in profiles], "chosen_by": source, "files": [str(p.path) for p in profiles],
            "targets": sum(len(p.targets) for p in profiles)}
    if not info["targets"] and not any(p.proctitle for p in profiles):
        return None, info
    return write_plan(host_dir, plan(profiles)), info
