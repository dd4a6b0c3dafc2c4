"""Which code may import what, read from the source with ``ast`` (lazy imports inside functions included).

tracer/rank runs inside every rank of the user's job, loaded under the private name ``_ranktrace_tracer``: it may
import the stdlib, itself (relatively) and the two modules both sides share (tracer/ringformat.py,
tracer/redact.py), which import the stdlib only. The analyzers read evidence and never reach into the host side of
capture. The one import name a user's environment gets is ``ranktrace``: nothing imports top-level ``tracer`` or
``analyzers`` (other projects' names on PyPI).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

TRACER = REPO / "tracer"
RANK = TRACER / "rank"
SHARED = ("tracer.ringformat", "tracer.redact")
# The job's own modules in-rank code may touch, and only inside a function, once the job has imported them itself:
JOB_MODULES = {
    "torch": "patch_c10d reads torch's directory while distributed_c10d is being imported",
    "nvtx": "NVTX ranges, imported lazily in-rank and optional",
}
SKIP_DIRS = {".git", ".venv", ".cache", ".typecheck", ".mypy_cache", "build", "traces", "__pycache__", ".pytest_cache"}


def imports(path: Path) -> list[tuple[ast.stmt, str, bool]]:
    """(node, absolute dotted name, inside a function?) of every import in `path`; relative names are resolved
    against the file's place under the repository (tracer/rank/x.py is package ``tracer.rank``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(REPO).parent.parts)
    out: list[tuple[ast.stmt, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((child, a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                    if child.module:
                        out.append((child, mod, in_function))
                    else:  # from . import x, y: each name is a module of that package
                        out.extend((child, f"{mod}.{a.name}", in_function) for a in child.names)
                elif child.module != "__future__":
                    out.append((child, child.module or "", in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(REPO).parts))


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def where(path: Path, node: ast.stmt) -> str:
    return f"{path.relative_to(REPO)}:{node.lineno}"


def test_in_rank_code_imports_the_stdlib_itself_and_the_shared_modules_only():
    files = python_files(RANK)
    assert len(files) > 10, files
    bad = []
    for path in files:
        for node, name, in_function in imports(path):
            if name.startswith("_ranktrace_tracer."):  # the injected sitecustomize names the private package
                name = "tracer." + name[len("_ranktrace_tracer."):]
            ok = (is_stdlib(name) or name == "tracer.rank" or name.startswith("tracer.rank.") or name in SHARED
                  or (in_function and name.split(".")[0] in JOB_MODULES))
            if not ok:
                bad.append(f"{where(path, node)} imports {name}" + ("" if in_function else " at module level"))
    assert not bad, "\n".join(bad)


def test_the_shared_modules_import_the_stdlib_only():
    bad = [f"{where(p, node)} imports {name}" for p in (TRACER / "ringformat.py", TRACER / "redact.py")
           for node, name, _ in imports(p) if not is_stdlib(name)]
    assert not bad, "\n".join(bad)


def test_analyzers_never_import_the_host_side_of_capture():
    bad = [f"{where(p, node)} imports {name}" for p in python_files(REPO / "analyzers")
           for node, name, _ in imports(p)
           if name.startswith(("ranktrace.tracer.launch", "ranktrace.tracer.watch"))]
    assert not bad, "\n".join(bad)


def test_nothing_imports_top_level_tracer_or_analyzers():
    bad = [f"{where(p, node)} imports {name}" for p in python_files(REPO)
           for node, name, _ in imports(p)
           if name.split(".")[0] in ("tracer", "analyzers") and not getattr(node, "level", 0)]
    assert not bad, "\n".join(bad)
