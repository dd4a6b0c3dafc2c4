"""Which code may import what, read from the source with ``ast`` (lazy imports inside functions included).

tracer/rank runs inside every rank of the user's job, loaded under the private name ``_ranktrace_tracer``: it may
import the stdlib, itself (relatively) and the two on-disk contracts it writes (tracer/formats/ringformat.py,
tracer/formats/redact.py), which import the stdlib only. tracer/formats states what is on disk once for both wings
(stdlib, numpy, pyarrow). The analysis wing is staged (docs/ARCHITECTURE.md): inputs find and read files, the model
is built from their records, the rules (diagnose) and the arbitration read the model alone. The one import name a
user's environment gets is ``ranktrace``: nothing imports top-level ``tracer`` or ``analyzers`` (other projects'
names on PyPI).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

TRACER = REPO / "tracer"
RANK = TRACER / "rank"
SHARED = ("tracer.formats", "tracer.formats.ringformat", "tracer.formats.redact")
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
                    out.extend((child, _module_of(mod, a.name), in_function) for a in child.names)
                elif child.module != "__future__":
                    out.extend((child, _module_of(child.module or "", a.name), in_function) for a in child.names)
            visit(child, inner)

    visit(tree, False)
    return out


def _module_of(package: str, name: str) -> str:
    """`from package import name`: ``package.name`` where that is a module of this repository, else ``package``."""
    parts = package.split(".")
    if parts[0] == "ranktrace" and len(parts) > 1 and parts[1] in ("tracer", "analyzers"):
        parts = parts[1:]
    elif parts[0] == "_ranktrace_tracer":  # the in-rank package's private name for tracer/
        parts = ["tracer"] + parts[1:]
    base = REPO.joinpath(*parts, name)
    if parts[0] in ("tracer", "analyzers") and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
        return f"{package}.{name}"
    return package


def type_checking_lines(path: Path) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: type names only, nothing loaded at run time."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                out.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
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


def test_the_contracts_the_ranks_write_import_the_stdlib_only():
    files = [TRACER / "formats" / "ringformat.py", TRACER / "formats" / "redact.py", TRACER / "formats" / "__init__.py"]
    bad = [f"{where(p, node)} imports {name}" for p in files for node, name, _ in imports(p) if not is_stdlib(name)]
    assert not bad, "\n".join(bad)


def test_formats_import_the_stdlib_numpy_pyarrow_and_themselves_only():
    files = python_files(TRACER / "formats")
    assert len(files) >= 6, files
    bad = [f"{where(p, node)} imports {name}" for p in files for node, name, _ in imports(p)
           if not (is_stdlib(name) or name.split(".")[0] in ("numpy", "pyarrow")
                   or name.startswith(("ranktrace.tracer.formats", "tracer.formats")))]
    assert not bad, "\n".join(bad)


def test_analyzers_take_from_the_tracer_only_its_formats():
    bad = [f"{where(p, node)} imports {name}" for p in python_files(REPO / "analyzers")
           for node, name, _ in imports(p)
           if name.startswith("ranktrace.tracer") and not name.startswith("ranktrace.tracer.formats")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("stage", ["model", "diagnose", "arbitrate.py"])
def test_the_model_and_the_rules_never_find_or_read_files(stage: str):
    """model/ is built from the readers' records and the rules read the model: neither imports inputs/ (finding
    and reading files) nor a reader, so no rule can go back to the disk (type names under TYPE_CHECKING aside)."""
    root = REPO / "analyzers" / stage
    files = python_files(root) if root.is_dir() else [root]
    assert files, root
    bad = []
    for p in files:
        typing_only = type_checking_lines(p)
        bad += [f"{where(p, node)} imports {name}" for node, name, _ in imports(p)
                if name.startswith(("ranktrace.analyzers.inputs", "ranktrace.analyzers.readers"))
                and node.lineno not in typing_only]
    assert not bad, "\n".join(bad)


def test_the_rules_never_import_the_api_or_the_renderers():
    """Rules return findings; what becomes of them (arbitration, reports) is decided after them."""
    bad = [f"{where(p, node)} imports {name}" for p in python_files(REPO / "analyzers" / "diagnose")
           for node, name, _ in imports(p)
           if name.startswith(("ranktrace.analyzers.api", "ranktrace.analyzers.report", "ranktrace.analyzers.compare"))]
    assert not bad, "\n".join(bad)


# What the capture side may reach of the analysis: its one entry (api), the values it hands out, the renderers, the
# comparison, the exports, and the watchdog's one stack question (hoststate: did a sampled stack move?).
CAPTURE_MAY_IMPORT = ("ranktrace.analyzers.api", "ranktrace.analyzers.model.values",
                      "ranktrace.analyzers.model.hoststate", "ranktrace.analyzers.report", "ranktrace.analyzers.verdict",
                      "ranktrace.analyzers.compare", "ranktrace.analyzers.export")
# Known exceptions, each to move into tracer/formats: the RAS sampler reads its own answer with the samples reader
# (finalize's ring conversion and events index moved there with issue #28).
CAPTURE_EXCEPTIONS = {
    "tracer/watch/ras.py": {"ranktrace.analyzers.readers.ranktrace_samples"},
}


def test_the_capture_side_reaches_the_analysis_through_its_api():
    bad = []
    for p in python_files(TRACER / "launch") + python_files(TRACER / "watch") + [REPO / "ranktrace" / "cli.py"]:
        allowed = CAPTURE_EXCEPTIONS.get(str(p.relative_to(REPO)), set())
        for node, name, _ in imports(p):
            if not name.startswith("ranktrace.analyzers") or name == "ranktrace.analyzers" or name in allowed:
                continue
            if not any(name == a or name.startswith(a + ".") for a in CAPTURE_MAY_IMPORT):
                bad.append(f"{where(p, node)} imports {name}")
    assert not bad, "\n".join(bad)


def test_nothing_imports_top_level_tracer_or_analyzers():
    bad = [f"{where(p, node)} imports {name}" for p in python_files(REPO)
           for node, name, _ in imports(p)
           if name.split(".")[0] in ("tracer", "analyzers") and not getattr(node, "level", 0)]
    assert not bad, "\n".join(bad)
