"""The knob catalogue (tracer/launch/bisect/knobs.toml) against the releases it claims to be read from.

Every SGLang / vLLM flag a knob adds, removes or halves is looked up in the argument parser of each pinned release
its variant names, read from that release's source with ``ast`` (nothing is imported): ``parser.add_argument``
calls (SGLang's server_args.py, vLLM's engine/arg_utils.py) and, for SGLang 0.5.23, the flags its
``add_cli_args_from_dataclass`` generates from the ``A[...]`` fields of sglang/srt/arg_groups/fields/*.py. A variant
valid `since` a release must be absent before it; one valid `until` a release must be gone or deprecated from it on.
Environment knobs are looked up in SGLang's environ.py / vLLM's envs.py, TORCH_NCCL_* in the installed torch's
ProcessGroupNCCL headers.

The release trees come from RANKTRACE_RELEASE_CACHE, else .cache/releases: ``<pkg>-<version>/`` trees of the files
read here, filled by ``.ci/fetch_releases.py`` (``pip download --no-deps``, run by .ci/run); a release not there is
skipped and said.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

from ranktrace.tracer.launch.bisect import knobs

PINNED = {"sglang": ("0.5.23", "0.5.12.post1"), "vllm": ("0.33.0", "0.21.0")}
CACHE = os.environ.get("RANKTRACE_RELEASE_CACHE") or str(Path(__file__).resolve().parents[1] / ".cache" / "releases")
PARSERS = {"sglang": ("sglang/srt/server_args.py",), "vllm": ("vllm/engine/arg_utils.py",)}
ENV_FILES = {"sglang": "sglang/srt/environ.py", "vllm": "vllm/envs.py"}


def release(pkg: str, version: str) -> Path:
    if not CACHE:
        pytest.skip("RANKTRACE_RELEASE_CACHE is not set: no unpacked SGLang / vLLM release trees to check the knob "
                    "catalogue against (CI's `pip download --no-deps` step fills it)")
    root = Path(CACHE) / f"{pkg}-{version}"
    if not root.is_dir():
        pytest.skip(f"{root} is absent: RANKTRACE_RELEASE_CACHE holds no {pkg} {version} tree")
    return root


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8-sig"), str(path))


def _const_strings(nodes: list[ast.expr]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _add_argument_flags(tree: ast.Module) -> dict[str, str]:
    """flag -> 'deprecated' when its action is a Deprecated* action, else 'argparse'."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            action = next((ast.unparse(k.value) for k in node.keywords if k.arg == "action"), "")
            for flag in _const_strings(node.args):
                if flag.startswith("-"):
                    out[flag] = "deprecated" if "Deprecated" in action else "argparse"
    return out


def _dataclass_flags(tree: ast.Module) -> dict[str, str]:
    """What SGLang's add_cli_args_from_dataclass makes of each ``name: A[T, "help" | Arg(...)]`` field: --name-with-
    dashes (or Arg's cli_name) and Arg's aliases; none for Arg(no_cli=True)."""
    out: dict[str, str] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                    and isinstance(st.annotation, ast.Subscript)
                    and ast.unparse(st.annotation.value) in ("A", "Annotated", "typing.Annotated")):
                continue
            parts = st.annotation.slice.elts if isinstance(st.annotation.slice, ast.Tuple) else [st.annotation.slice]
            meta = parts[1:]
            if not meta:
                continue
            arg = next((m for m in meta if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg"), None)
            names = [f"--{st.target.id.replace('_', '-')}"]
            if arg is not None:
                kw = {k.arg: k.value for k in arg.keywords}
                if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                    continue
                if isinstance(kw.get("cli_name"), ast.Constant):
                    names = [kw["cli_name"].value]
                if isinstance(kw.get("aliases"), ast.List):
                    names += _const_strings(kw["aliases"].elts)
            elif not _const_strings(meta):
                continue  # no help string and no Arg: not a CLI field
            out.update({n: "dataclass" for n in names})
    return out


@functools.lru_cache(maxsize=None)
def parser_flags(pkg: str, version: str) -> dict[str, str]:
    root = release(pkg, version)
    flags: dict[str, str] = {}
    for rel in PARSERS[pkg]:
        flags.update(_add_argument_flags(_parse(root / rel)))
    fields = root / "sglang/srt/arg_groups/fields"
    if pkg == "sglang" and (root / "sglang/srt/arg_groups/arg_utils.py").exists():
        assert "def add_cli_args_from_dataclass" in (root / "sglang/srt/arg_groups/arg_utils.py").read_text()
        for f in sorted(fields.glob("*.py")):
            for flag, how in _dataclass_flags(_parse(f)).items():
                flags.setdefault(flag, how)
    assert len(flags) > 100, f"{pkg} {version}: only {len(flags)} flags read; the parser moved?"
    return flags


@functools.lru_cache(maxsize=None)
def env_names(pkg: str, version: str) -> set[str]:
    tree = _parse(release(pkg, version) / ENV_FILES[pkg])
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for node in ast.walk(tree):  # SGLang: class Envs: SGLANG_X = EnvBool(...)
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) \
                    else []
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def attr_exists(root: Path, spec: str) -> bool:
    """'path.py:Class.attr': the class body assigns or annotates attr."""
    rel, _, qual = spec.partition(":")
    cls_name, _, attr = qual.partition(".")
    for node in ast.walk(_parse(root / rel)):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for st in node.body:
                targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) \
                    else []
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                    return True
    return False


def accepts(pkg: str, version: str, flag: str) -> bool:
    """A registered option, or (what users type: SGLang's `--tp 8`) an unambiguous prefix of exactly one, which
    argparse accepts unless the parser was made with allow_abbrev=False."""
    flags = parser_flags(pkg, version)
    if flag in flags:
        return True
    parsers = "".join((release(pkg, version) / rel).read_text() for rel in PARSERS[pkg])
    return "allow_abbrev=False" not in parsers and len([f for f in flags if f.startswith(flag)]) == 1


CATALOGUE = knobs.load_catalogue()
FRAMEWORK_KNOBS = [k for k in CATALOGUE if k.framework in PINNED]
CASES = [(pkg, v) for pkg, vs in PINNED.items() for v in vs]


def test_every_framework_knob_names_pinned_releases():
    assert {k.framework for k in FRAMEWORK_KNOBS} == {"sglang", "vllm"}
    for k in FRAMEWORK_KNOBS:
        for v in k.variants:
            assert v.read_from, f"{k.name}: no release its flags were read from"
            assert set(v.read_from) <= set(PINNED[k.framework]), (k.name, v.read_from)


@pytest.mark.parametrize("pkg,version", CASES, ids=[f"{p}-{v}" for p, v in CASES])
def test_knob_flags_and_variables_exist_in_the_release_they_were_read_from(pkg: str, version: str):
    flags = parser_flags(pkg, version)
    envs = env_names(pkg, version)
    checked = 0
    for k in FRAMEWORK_KNOBS:
        if k.framework != pkg:
            continue
        for v in k.variants:
            if version not in v.read_from:
                continue
            missing = [f for f in v.flags() if not accepts(pkg, version, f)]
            assert not missing, f"{k.name}: {missing} not in {pkg} {version}'s argument parser"
            assert all(flags[f] != "deprecated" for f in v.add if f in flags), f"{k.name}: deprecated in {version}"
            assert all(attr_exists(release(pkg, version), a) for a in v.attrs), (k.name, v.attrs)
            assert all(name in envs for name, _ in k.env), f"{k.name}: not in {pkg} {version}'s {ENV_FILES[pkg]}"
            checked += 1
    assert checked >= 5, f"only {checked} knob variants name {pkg} {version}"


@pytest.mark.parametrize("pkg,version", CASES, ids=[f"{p}-{v}" for p, v in CASES])
def test_each_spelling_belongs_to_its_releases(pkg: str, version: str):
    """SGLang 0.5.23: --cuda-graph-max-bs is gone (renamed -decode / -prefill) and --disable-cuda-graph deprecated,
    so the catalogue's older spellings say until = "0.5.23" and its newer ones since = "0.5.23"."""
    flags = parser_flags(pkg, version)
    key = knobs.version_key(version)
    for k in FRAMEWORK_KNOBS:
        if k.framework != pkg:
            continue
        for v in k.variants:
            added = [f for f in v.add if f.startswith("--")]
            if v.since and key < knobs.version_key(v.since):
                assert not [f for f in added if f in flags], f"{k.name}: {added} already in {pkg} {version}"
            if v.until and key >= knobs.version_key(v.until):
                live = [f for f in added if flags.get(f) not in (None, "deprecated")]
                assert not live, f"{k.name}: {live} still a live flag in {pkg} {version} (until {v.until})"


def test_torch_knobs_exist_in_torch():
    torch = pytest.importorskip("torch")
    headers = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d"
    if not headers.is_dir():
        pytest.skip(f"this torch build ships no c10d headers ({headers})")
    text = "".join(p.read_text(errors="replace") for p in headers.glob("*.hpp"))
    names = [name for k in CATALOGUE for name, _ in k.env if name.startswith("TORCH_")]
    assert names and all(n in text for n in names), [n for n in names if n not in text]
