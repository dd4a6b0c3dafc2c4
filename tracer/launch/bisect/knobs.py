"""The knobs `trace bisect` may turn: the catalogue (knobs.toml) and a user's knobs file, the framework a command
runs, which knobs change that command, the order the verdict says to try them in, and what a configuration (a set
of knobs) does to the command line and the environment. Pure: nothing here runs anything."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["AREAS", "KnobError", "Variant", "Knob", "Candidate", "Framework", "Hint", "KnobsFile", "Applied",
           "load_catalogue", "load_knobs_file", "merge", "detect_framework", "parse_framework", "version_key",
           "candidates", "narrower", "alternative", "hints", "order", "apply"]

CATALOGUE = Path(__file__).with_name("knobs.toml")

# Areas in the order tried when the verdict points at none of them.
AREAS = ("p2p", "custom_ar", "graph", "nvls", "cumem", "shm", "registration", "algo", "proto", "net", "spec",
         "overlap", "compile", "tp")
P2P_OPS = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "sendrecv")
# Words in a verdict (summary, stacks, evidence) that point at an area. Lower case.
AREA_WORDS: dict[str, tuple[str, ...]] = {
    "custom_ar": ("custom_all_reduce", "custom all-reduce", "customallreduce", "custom_ar", "register_ipc",
                  "ipc_buffer", "register_graph_buffers", "register_buffer", "quick_all_reduce", "one_shot"),
    "graph": ("cuda_graph", "cudagraph", "graph capture", "capture_begin", "graph_capture"),
    "p2p": ("via p2p", "p2p/ipc", "p2p/cumem", "p2p transport", "cudamemcpypeer", "p2p_copy"),
    "nvls": ("nvls",),
    "cumem": ("cumem",),
    "shm": ("via shm", "/dev/shm", "shm_open"),
    "net": ("net/ib", "via net", "ibv_", "roce"),
    "spec": ("speculative", "eagle", "draft_model", "draft_worker"),
}
# A verdict kind with no more specific hint: where such hangs usually live.
KIND_AREAS: dict[str, tuple[tuple[str, ...], str]] = {
    "init_hang": (("p2p", "shm", "cumem", "nvls", "net"), "the hang is in NCCL init: transports are set up there"),
    "stuck_in_collective": (("algo", "proto", "nvls", "p2p", "custom_ar"),
                            "every rank is inside the same collective: a transport or algorithm stall"),
}
_USAGE_ARG_KEYS = {"add", "remove", "remove_with_value", "halve"}


class KnobError(ValueError):
    """A catalogue or knobs file that cannot be used (a usage error: exit 2)."""


@dataclass(frozen=True)
class Variant:
    """One spelling of a knob's command-line edits, and the releases it was read from."""

    add: tuple[str, ...] = ()                 # appended
    remove: tuple[str, ...] = ()              # switches dropped
    remove_with_value: tuple[str, ...] = ()   # options dropped with the value after them (or --opt=value)
    halve: tuple[str, ...] = ()               # spellings of one integer option; the first present is halved
    since: str | None = None                  # first release with this spelling
    until: str | None = None                  # first release without it
    read_from: tuple[str, ...] = ()           # pinned releases whose argument parser these flags were read from
    attrs: tuple[str, ...] = ()               # "path.py:Class.field" a value refers to (checked like the flags)
    note: str = ""

    def flags(self) -> list[str]:
        """Every option this variant names (what the release check looks up)."""
        out = [a for a in self.add if a.startswith("-") and not a.lstrip("-")[:1].isdigit()]
        return out + list(self.remove) + list(self.remove_with_value) + list(self.halve)

    def edits(self) -> bool:
        return bool(self.add or self.remove or self.remove_with_value or self.halve)


@dataclass(frozen=True)
class Knob:
    name: str
    area: str
    suggests: str
    framework: str = "any"                    # any | sglang | vllm | ...
    env: tuple[tuple[str, str], ...] = ()
    variants: tuple[Variant, ...] = (Variant(),)
    narrows: str | None = None
    origin: str = "catalogue"                 # catalogue | knobs file


@dataclass(frozen=True)
class Candidate:
    """A knob in one of its variants, as applied to one command: `label` says what it changes there."""

    knob: Knob
    variant: int
    label: str

    @property
    def name(self) -> str:
        return self.knob.name

    @property
    def key(self) -> str:
        return f"{self.knob.name}#{self.variant}"

    @property
    def slot(self) -> str:
        """Knobs that set the same variable or edit the same option cannot both be in one configuration."""
        v = self.knob.variants[self.variant]
        names = [k for k, _ in self.knob.env] + v.flags()
        return names[0] if names else self.knob.name


@dataclass(frozen=True)
class Framework:
    name: str                 # sglang | vllm | torch | python | unknown
    version: str | None
    why: str


@dataclass(frozen=True)
class Hint:
    area: str
    reason: str


@dataclass
class KnobsFile:
    add: list[Knob] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)   # knob names or "area:NAME"
    only: list[str] = field(default_factory=list)
    first: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Applied:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]         # variables set for this configuration (beyond the base environment)
    changes: tuple[str, ...]                 # what changed, one line each


# ---- loading ----------------------------------------------------------------------------------------------------

def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise KnobError(f"{path}: reading TOML needs Python >= 3.11; write the knobs file as JSON (.json)") from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise KnobError(f"{path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise KnobError(f"{path}: not valid TOML: {e}") from None


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(x, (str, int, float)) for x in value):
        raise KnobError(f"{what}: expected a list of strings, got {value!r}")
    return tuple(str(x) for x in value)


def _variant(d: Mapping[str, Any], where: str, inherited: Sequence[str] = ()) -> Variant:
    known = _USAGE_ARG_KEYS | {"since", "until", "read_from", "attrs", "note"}
    extra = set(d) - known
    if extra:
        raise KnobError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    return Variant(add=_strings(d.get("add", []), f"{where}.add"),
                   remove=_strings(d.get("remove", []), f"{where}.remove"),
                   remove_with_value=_strings(d.get("remove_with_value", []), f"{where}.remove_with_value"),
                   halve=_strings(d.get("halve", []), f"{where}.halve"),
                   since=d.get("since"), until=d.get("until"),
                   read_from=_strings(d.get("read_from", list(inherited)), f"{where}.read_from"),
                   attrs=_strings(d.get("attrs", []), f"{where}.attrs"), note=str(d.get("note", "")))


def _knob(d: Mapping[str, Any], where: str, origin: str) -> Knob:
    if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not d["name"]:
        raise KnobError(f"{where}: every knob needs a name")
    name = d["name"]
    where = f"{where} {name!r}"
    known = {"name", "area", "suggests", "framework", "env", "variant", "narrows"} | _USAGE_ARG_KEYS | {
        "read_from", "since", "until", "attrs", "note"}
    extra = set(d) - known
    if extra:
        raise KnobError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    env = d.get("env", {})
    if not isinstance(env, Mapping):
        raise KnobError(f"{where}: env must be a table of NAME = \"value\"")
    read_from = _strings(d.get("read_from", []), f"{where}.read_from")
    if "variant" in d:
        if _USAGE_ARG_KEYS & set(d):
            raise KnobError(f"{where}: give the command-line edits either in [[knob.variant]] or on the knob")
        raw = d["variant"]
        if not isinstance(raw, list) or not raw:
            raise KnobError(f"{where}: variant must be a non-empty list of tables")
        variants = tuple(_variant(v, f"{where} variant {i + 1}", read_from) for i, v in enumerate(raw))
    else:
        variants = (_variant({k: d[k] for k in d if k in _USAGE_ARG_KEYS | {"since", "until", "attrs", "note"}},
                             where, read_from),)
    knob = Knob(name=name, area=str(d.get("area", "user")), suggests=str(d.get("suggests", "")),
                framework=str(d.get("framework", "any")), env=tuple((str(k), str(v)) for k, v in env.items()),
                variants=variants, narrows=d.get("narrows"), origin=origin)
    if not knob.env and not any(v.edits() for v in variants):
        raise KnobError(f"{where}: changes nothing (give env, add, remove, remove_with_value or halve)")
    return knob


def load_catalogue(path: Path = CATALOGUE) -> list[Knob]:
    doc = _load_toml(path)
    knobs = [_knob(d, f"{path.name} knob", "catalogue") for d in doc.get("knob", [])]
    _check_names(knobs, path.name)
    return knobs


def _check_names(knobs: Sequence[Knob], where: str) -> None:
    seen: set[str] = set()
    for k in knobs:
        if k.name in seen:
            raise KnobError(f"{where}: two knobs are named {k.name!r}")
        seen.add(k.name)
    for k in knobs:
        if k.narrows is not None and k.narrows not in seen:
            raise KnobError(f"{where}: {k.name!r} narrows {k.narrows!r}, which is no knob")


def load_knobs_file(path: Path) -> KnobsFile:
    """A user's knobs file (TOML, or JSON when it ends in .json): [[knob]] tables add candidates (same fields as
    the catalogue); `remove` drops knobs by name or whole areas ("area:net"); `only` keeps just the knobs named;
    `first` tries the knobs named before anything the verdict points at."""
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise KnobError(f"{path}: {e}") from None
    else:
        doc = _load_toml(path)
    if not isinstance(doc, dict):
        raise KnobError(f"{path}: expected a table at the top")
    extra = set(doc) - {"knob", "remove", "only", "first", "schema"}
    if extra:
        raise KnobError(f"{path}: unknown key(s) {', '.join(sorted(extra))} (knob, remove, only, first)")
    raw = doc.get("knob", [])
    if not isinstance(raw, list):
        raise KnobError(f"{path}: knob must be a list of tables ([[knob]])")
    return KnobsFile(add=[_knob(d, f"{path.name} knob", "knobs file") for d in raw],
                     remove=list(_strings(doc.get("remove", []), f"{path.name} remove")),
                     only=list(_strings(doc.get("only", []), f"{path.name} only")),
                     first=list(_strings(doc.get("first", []), f"{path.name} first")))


def merge(catalogue: Sequence[Knob], kf: KnobsFile | None) -> tuple[list[Knob], list[str]]:
    """The knobs to consider and the names `first` puts ahead. A knob added under a catalogue name replaces it."""
    if kf is None:
        return list(catalogue), []
    added = {k.name for k in kf.add}
    knobs = [k for k in catalogue if k.name not in added] + list(kf.add)
    names = {k.name for k in knobs}
    areas = {k.area for k in knobs}
    for what, listed in (("remove", kf.remove), ("only", kf.only), ("first", kf.first)):
        for n in listed:
            if n.startswith("area:") and what == "remove":
                if n[5:] not in areas:
                    raise KnobError(f"knobs file: {what} names area {n[5:]!r}, which no knob has")
            elif n not in names:
                raise KnobError(f"knobs file: {what} names {n!r}, which is neither in the catalogue nor added")
    gone = {n for n in kf.remove if not n.startswith("area:")}
    gone_areas = {n[5:] for n in kf.remove if n.startswith("area:")}
    keep = set(kf.only) | set(kf.first) if kf.only else None
    out = [k for k in knobs if k.name not in gone and k.area not in gone_areas and (keep is None or k.name in keep)]
    kept = {k.name for k in out}
    out = [k if k.narrows is None or k.narrows in kept else _unnarrowed(k) for k in out]
    return out, [n for n in kf.first if n in kept]


def _unnarrowed(k: Knob) -> Knob:
    """A narrower knob whose broader one was removed is tried on its own."""
    from dataclasses import replace

    return replace(k, narrows=None)


# ---- the framework --------------------------------------------------------------------------------------------------

def detect_framework(command: Sequence[str]) -> Framework:
    """Which serving framework (or launcher) `command` runs, from the command alone (no version: see
    runner.probe_version)."""
    names = [Path(a).name for a in command]
    for i, (arg, name) in enumerate(zip(command, names)):
        if "sglang.launch_server" in arg or "sglang.cli" in arg or (name == "sglang" and "serve" in command[i + 1:]):
            return Framework("sglang", None, f"the command runs {arg}")
        if "vllm.entrypoints" in arg or (name == "vllm" and "serve" in command[i + 1:]):
            return Framework("vllm", None, f"the command runs {arg}")
    for arg, name in zip(command, names):
        if name == "torchrun" or arg in ("torch.distributed.run", "torch.distributed.launch"):
            return Framework("torch", None, f"the command runs {arg}")
    if names and re.fullmatch(r"python[0-9.]*", names[0]):
        return Framework("python", None, "a Python command")
    return Framework("unknown", None, "not recognised from the command")


def parse_framework(text: str) -> Framework:
    """--framework NAME or NAME==VERSION."""
    name, _, version = text.partition("==")
    name = name.strip().lower()
    if name not in ("sglang", "vllm", "torch", "python", "unknown"):
        raise KnobError(f"--framework {text!r}: expected sglang, vllm, torch, python or unknown [==VERSION]")
    return Framework(name, version.strip() or None, "given with --framework")


def version_key(v: str) -> tuple[int, ...]:
    """'0.5.12.post1' < '0.5.13' < '0.5.23'; pre-releases before their release, post-releases after."""
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", v.strip())
    if not m:
        return (0,)
    nums = [int(x) for x in m.group(1).split(".")][:4]
    nums += [0] * (4 - len(nums))
    rest = m.group(2).lower()
    n = int((re.findall(r"\d+", rest) or ["0"])[0])
    tag = 1 if "post" in rest else (-1 if re.search(r"a|b|rc|dev", rest) else 0)
    return (*nums, tag, n)


def _in_range(v: Variant, version: str) -> bool:
    k = version_key(version)
    return (v.since is None or version_key(v.since) <= k) and (v.until is None or k < version_key(v.until))


# ---- what a knob does to a command --------------------------------------------------------------------------------

def _present(argv: Sequence[str], flag: str) -> int | None:
    for i, a in enumerate(argv):
        if a == flag or a.startswith(flag + "="):
            return i
    return None


def _edit(argv: list[str], v: Variant) -> list[str]:
    """Apply one variant's edits to `argv` in place; returns what changed."""
    changes: list[str] = []
    for flag in v.remove:
        while (i := _present(argv, flag)) is not None:
            changes.append(f"- {argv.pop(i)}")
    for flag in v.remove_with_value:
        while (i := _present(argv, flag)) is not None:
            if argv[i] == flag and i + 1 < len(argv):
                changes.append(f"- {argv[i]} {argv[i + 1]}")
                del argv[i:i + 2]
            else:
                changes.append(f"- {argv.pop(i)}")
    for flag in v.halve:
        i = _present(argv, flag)
        if i is None:
            continue
        inline = argv[i] != flag
        raw = argv[i].split("=", 1)[1] if inline else (argv[i + 1] if i + 1 < len(argv) else "")
        if raw.isdigit() and int(raw) >= 2:
            new = str(int(raw) // 2)
            if inline:
                argv[i] = f"{flag}={new}"
            else:
                argv[i + 1] = new
            changes.append(f"{flag} {raw} -> {new}")
        break
    if v.add and _present(argv, v.add[0]) is None:
        argv.extend(v.add)
        changes.append("+ " + " ".join(_quote(a) for a in v.add))
    return changes


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w@%+=:,./-]+", a) else "'" + a.replace("'", "'\\''") + "'"


def apply(command: Sequence[str], base_env: Mapping[str, str], chosen: Iterable[Candidate]) -> Applied:
    """The command line and the environment variables of a configuration."""
    argv = list(command)
    env: dict[str, str] = {}
    changes: list[str] = []
    for c in chosen:
        for k, val in c.knob.env:
            if base_env.get(k) != val and env.get(k) != val:
                env[k] = val
                changes.append(f"{k}={val}")
        changes += _edit(argv, c.knob.variants[c.variant])
    return Applied(tuple(argv), tuple(env.items()), tuple(changes))


def _candidate(knob: Knob, variant: int, command: Sequence[str], base_env: Mapping[str, str]) -> Candidate | None:
    probe = Candidate(knob, variant, knob.name)
    a = apply(command, base_env, [probe])
    if not a.changes:
        return None
    return Candidate(knob, variant, "; ".join(a.changes))


def _variant_order(knob: Knob, fw: Framework) -> list[int]:
    idx = list(range(len(knob.variants)))
    if fw.version is None:
        return idx  # listed newest first; a spelling the command rejects falls back to the next
    return [i for i in idx if _in_range(knob.variants[i], fw.version)]


def _applies(knob: Knob, fw: Framework) -> bool:
    return knob.framework == "any" or knob.framework == fw.name


def candidates(knobs: Sequence[Knob], command: Sequence[str], base_env: Mapping[str, str],
               fw: Framework) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The knobs tried one at a time (narrower ones wait for their broader knob), each in its first variant that
    changes this command; and (name, why not) for the knobs left out."""
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    for k in knobs:
        if k.narrows is not None:
            continue
        c = _first_variant(k, command, base_env, fw, skipped)
        if c is not None:
            out.append(c)
    return out, skipped


def _first_variant(k: Knob, command: Sequence[str], base_env: Mapping[str, str], fw: Framework,
                   skipped: list[tuple[str, str]] | None = None) -> Candidate | None:
    def skip(why: str) -> None:
        if skipped is not None:
            skipped.append((k.name, why))

    if not _applies(k, fw):
        skip(f"a {k.framework} knob; the command runs {fw.name}")
        return None
    order = _variant_order(k, fw)
    if not order:
        skip(f"no spelling for {fw.name} {fw.version}")
        return None
    for i in order:
        c = _candidate(k, i, command, base_env)
        if c is not None:
            return c
    skip("changes nothing in this command (already set, or nothing to remove)")
    return None


def narrower(knobs: Sequence[Knob], broad: Candidate, command: Sequence[str], base_env: Mapping[str, str],
             fw: Framework) -> list[Candidate]:
    """Knobs that narrow `broad` (tried once it fixed the hang), in catalogue order."""
    out = []
    for k in knobs:
        if k.narrows == broad.name:
            c = _first_variant(k, command, base_env, fw)
            if c is not None:
                out.append(c)
    return out


def alternative(c: Candidate, command: Sequence[str], base_env: Mapping[str, str],
                fw: Framework) -> Candidate | None:
    """The knob's next spelling after `c` was rejected by the command (an older or newer release)."""
    order = _variant_order(c.knob, fw)
    later = order[order.index(c.variant) + 1:] if c.variant in order else []
    for i in later:
        alt = _candidate(c.knob, i, command, base_env)
        if alt is not None:
            return alt
    return None


# ---- which knobs first: what the verdict points at ----------------------------------------------------------------

def _verdict_text(v: Mapping[str, Any]) -> str:
    parts = [str(v.get("summary", "")), str(v.get("stack_tree", ""))]
    for f in v.get("findings") or []:
        parts.append(str(f.get("summary", "")))
        parts += [str(e.get("detail", "")) for e in f.get("evidence") or []]
    for r in (v.get("ranks") or {}).values():
        parts += [str(r.get("where", "")), str(r.get("phase", ""))] + [str(s) for s in r.get("stack") or []]
    parts += [str(p.get("name", "")) for p in v.get("phases") or []]
    return "\n".join(parts).lower()


def hints(verdicts: Sequence[Mapping[str, Any]]) -> list[Hint]:
    """Areas the failing runs' verdicts point at, strongest first, each with the reason a person reads."""
    out: list[Hint] = []

    def add(area: str, reason: str) -> None:
        if all(h.area != area for h in out):
            out.append(Hint(area, reason))

    for v in verdicts:  # the kind and the operation first: they are the verdict's own claim
        op = v.get("operation") or {}
        phase = str(op.get("phase") or "")
        if v.get("kind") == "graph_capture" or "graph" in phase or "capture" in phase:
            add("graph", f"the hang is in CUDA graph capture ({v.get('kind')}{', phase ' + phase if phase else ''})")
        name = str(op.get("name") or "")
        if name in P2P_OPS or (op.get("peer") is not None and name):
            add("p2p", f"the hang is in a p2p op ({name})")
    for v in verdicts:
        text = _verdict_text(v)
        for area, words in AREA_WORDS.items():
            # a word starts where no letter or digit precedes it ("roce" is no hint in "process")
            hit = next((w for w in words if re.search(r"(?<![a-z0-9])" + re.escape(w), text)), None)
            if hit:
                add(area, f"the verdict mentions {hit.strip()!r}")
    for v in verdicts:
        areas, why = KIND_AREAS.get(str(v.get("kind")), ((), ""))
        for a in areas:
            add(a, why)
    return out


def order(cands: Sequence[Candidate], hinted: Sequence[Hint], first: Sequence[str] = ()) -> list[Candidate]:
    """`first` (the knobs file's), then the areas the verdict points at, then knobs of areas the catalogue does
    not know (a knobs file's own), then the rest in the default order; a knobs file's knob before the
    catalogue's in the same area."""
    rank = {h.area: i for i, h in enumerate(hinted)}
    base = len(rank) + 1
    for i, a in enumerate(AREAS):
        rank.setdefault(a, base + 1 + i)

    def key(ic: tuple[int, Candidate]) -> tuple[int, int, int, int]:
        i, c = ic
        pos = first.index(c.name) if c.name in first else len(first)
        return (pos, rank.get(c.knob.area, base), 0 if c.knob.origin != "catalogue" else 1, i)

    return [c for _, c in sorted(enumerate(cands), key=key)]
