"""Every target of the shipped profiles resolves in the real source of each release it says it was read from.

The sources are the pinned releases' wheels from PyPI, reduced to the .py files the profiles name
(.ci/fetch_releases.py, run by .ci/run, into .cache/releases/<pkg>-<ver>/); they are read with `ast`, never
imported. A release that could not be fetched (no network) is skipped with the reason; a fetched release where a
target's alternative does not resolve although the profile says it was read from that release — or resolves although
the profile does not list it — fails, naming the profile, the target and the release.
"""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from tests.helpers import REPO

CACHE = Path(os.environ.get("RANKTRACE_RELEASES", REPO / ".cache" / "releases"))


def _profiles() -> list:
    from ranktrace.tracer.launch import profiles

    return [profiles.find(n) for n in profiles.builtin_names()]


def _cases() -> list:
    return [pytest.param(p, r, id=f"{p.name}-{r}") for p in _profiles() for r in p.releases]


class _Source:
    """One release's source tree, parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.trees: dict[str, ast.Module | None] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self.trees:
            base = self.root / name.replace(".", "/")
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.is_file():
                    self.trees[name] = ast.parse(f.read_text(encoding="utf-8-sig"), str(f))
                    break
            else:
                self.trees[name] = None
        return self.trees[name]

    def resolve(self, target: str) -> str | None:
        """None when MODULE:QUALNAME is defined in this release, else why not. Module level looks inside if/try
        bodies too (platform branches); a class is searched in its own body only (what the wrapper patches)."""
        mod, qual = target.split(":")
        tree = self.module(mod)
        if tree is None:
            return f"no module {mod}"
        body: list[ast.stmt] = list(tree.body)
        for i, part in enumerate(qual.split(".")):
            found = None
            for node in _flatten(body) if i == 0 else body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                    found = node
            if found is None:
                return f"{'.'.join(qual.split('.')[:i]) or mod} has no {part!r}"
            body = found.body if isinstance(found, ast.ClassDef) else []
        return None


def _flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _flatten(node.body) + _flatten(node.orelse)
        elif isinstance(node, ast.Try):
            out += _flatten(node.body) + _flatten(node.orelse) + _flatten(node.finalbody)
            for h in node.handlers:
                out += _flatten(h.body)
    return out


@pytest.mark.parametrize("profile, release", _cases())
def test_every_target_resolves_in_the_releases_it_was_read_from(profile, release: str):
    pkg, ver = release.split("==")
    root = CACHE / f"{pkg}-{ver}"
    if not (root / ".complete.json").is_file():
        why = CACHE / "failed" / f"{pkg}-{ver}.txt"
        reason = why.read_text().strip() if why.is_file() else "not fetched"
        pytest.skip(f"{release}: source not in {CACHE} ({reason}); .ci/run fetches it with `python "
                    f".ci/fetch_releases.py` (pip download from PyPI)")
    src = _Source(root)
    problems = []
    for i, t in enumerate(profile.targets):
        listed = [a for a in t.targets if ver in t.read_from.get(a, ())]
        for alt in t.targets:
            why = src.resolve(alt)
            if alt in listed and why is not None:
                problems.append(f"target #{i + 1} {t.name} ({profile.path.name}:{t.line}): {alt} is listed as read "
                                f"from {release} but does not resolve there: {why}")
            elif alt not in listed and why is None and alt.split(".")[0] == pkg:
                problems.append(f"target #{i + 1} {t.name} ({profile.path.name}:{t.line}): {alt} resolves in "
                                f"{release}, which its read_from does not list")
    assert not problems, "\n".join(problems)
    meta = json.loads((root / ".complete.json").read_text())
    assert meta["release"] == release


def test_each_framework_pins_its_newest_release_and_one_of_the_older_layout():
    """SGLang: the newest and the newest with model_executor/cuda_graph_runner.py + speculative/eagle_worker.py;
    vLLM: the newest and one before its worker/executor reshuffle (vllm/worker/, vllm/executor/)."""
    by_name = {p.name: p for p in _profiles()}
    assert {"sglang==0.5.23", "sglang==0.5.12.post1"} <= set(by_name["sglang"].releases)
    assert {"vllm==0.33.0", "vllm==0.10.2"} <= set(by_name["vllm"].releases)
    old_layout = [a for t in by_name["sglang"].targets for a in t.targets
                  if "cuda_graph_runner:CudaGraphRunner" in a or "eagle_worker:EAGLEWorker" in a]
    assert old_layout and all("0.5.12.post1" in t.read_from.get(a, ()) for t in by_name["sglang"].targets
                              for a in t.targets if a in old_layout)
    for p in by_name.values():  # every target says where it was read from
        for t in p.targets:
            assert set(t.read_from) == set(t.targets) and all(t.read_from.values()), (p.name, t.name)
