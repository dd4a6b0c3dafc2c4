"""The house rules every reader package keeps: the contract in its ``__init__``, one declared field-map type, stages
that import no private name from each other and inherit from no class of another module, 2 to 5 modules each."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from ranktrace.analyzers.inputs import collect as sources
from ranktrace.analyzers.readers import catalogue
from tests.readers.shared_reader_checks import READERS, REPO, check_field_map

READERS_DIR = REPO / "analyzers" / "readers"
SHARED = {"common", "text"}          # shared helpers, not readers


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("name", READERS)
def test_every_reader_keeps_the_contract_and_declares_its_field_map(name: str) -> None:
    module = importlib.import_module(name)
    short = name.rsplit(".", 1)[1]
    assert module.FORMAT == short
    check_field_map(module)
    if short in sources.STRUCTURED or short == "ranktrace_samples":
        assert callable(module.sniff) and callable(module.read)
    if any(family.module == name for family in catalogue.FAMILIES):
        assert callable(module.read_doc)


def test_every_format_is_a_package_of_two_to_five_modules() -> None:
    flat = [p.name for p in READERS_DIR.glob("*.py") if p.name not in ("__init__.py", "base.py", "catalogue.py")]
    assert flat == [], f"readers outside a package: {flat}"
    packages = {p.name for p in READERS_DIR.iterdir() if (p / "__init__.py").exists()} - SHARED
    assert packages == {name.rsplit(".", 1)[1] for name in READERS}
    for package in packages:
        n = len(list((READERS_DIR / package).glob("*.py")))
        assert 2 <= n <= 5, f"{package}: {n} modules"


def test_no_private_name_crosses_a_module_boundary_and_no_class_inherits_across_modules() -> None:
    problems = []
    for path in _modules(READERS_DIR):
        tree = ast.parse(path.read_text())
        local_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private:
                    problems.append(f"{path.relative_to(REPO)}:{node.lineno} imports {private} from {node.module}")
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id not in local_classes | {"NamedTuple", "Exception",
                                                                                       "Protocol"}:
                        problems.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} inherits {base.id}")
    assert problems == []


def test_module_docstrings_say_why_in_a_few_lines() -> None:
    long = []
    for path in _modules(READERS_DIR):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if path.name != "__init__.py" or path.parent != READERS_DIR:
            assert doc, f"{path.relative_to(REPO)} has no docstring"
        if doc and (len(doc.splitlines()) > 4 or "DESIGN §" in doc):
            long.append(f"{path.relative_to(REPO)}: {len(doc.splitlines())} lines")
    assert long == []
