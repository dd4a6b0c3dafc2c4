"""Small checks shared by the reader tests (contract of analyzers/readers/base.py, declared field maps)."""
from __future__ import annotations

import importlib.util
import pickle
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.inputs import collect as sources
from ranktrace.analyzers.readers import catalogue
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult

__all__ = ["REPO", "READERS", "check_contract", "check_field_map", "load_script", "rows"]

REPO = Path(__file__).resolve().parents[2]

#: Every reader package: the structured formats inputs/collect.py sniffs, the text families of the catalogue, and the
#: monitor's samples (read from a host dir by inputs/collect.py).
READERS: tuple[str, ...] = tuple(sorted(
    {f"ranktrace.analyzers.readers.{name}" for name in (*sources.STRUCTURED, "ranktrace_samples")}
    | {family.module for family in catalogue.FAMILIES}))


def check_contract(result: ReadResult, fmt: str, source: str, file: Path) -> None:
    """A ReadResult keeps the reader contract: typed tables, provenance on every row, picklable."""
    assert result.format == fmt
    assert result.file == str(file)
    assert result.events.schema.equals(schema.EVENTS)
    assert result.stacks.schema.equals(schema.STACKS)
    assert result.observations.schema.equals(schema.OBSERVATIONS)
    for table in (result.events, result.observations):
        if table.num_rows:
            assert set(table.column("source").to_pylist()) == {source}
            assert set(table.column("file").to_pylist()) == {str(file)}
    kinds = set(result.events.column("kind").to_pylist())
    assert kinds <= set(schema.EVENT_KINDS), kinds
    categories = set(result.events.column("category").to_pylist()) - {None}
    assert categories <= set(schema.CATEGORIES), categories
    pickle.loads(pickle.dumps(result))


def check_field_map(module: ModuleType) -> None:
    """A reader's declared mapping is a tuple of ``ColumnMap`` (one type for every reader, every field a string),
    and every ``EVENTS.x`` / ``OBSERVATIONS.x`` / ``STACKS.x`` it names is a real column."""
    assert isinstance(module.FIELD_MAP, tuple) and module.FIELD_MAP
    for entry in module.FIELD_MAP:
        assert type(entry) is ColumnMap, f"{module.__name__}: {entry!r} is not a ColumnMap"
        assert all(isinstance(v, str) for v in (entry.raw, entry.column, entry.type, entry.default, entry.since))
        assert entry.raw and entry.since
        for table, column in re.findall(r"\b(EVENTS|OBSERVATIONS|STACKS)\.(\w+)", entry.column):
            names = getattr(schema, table).names
            assert column in names, f"{module.__name__}: {entry.raw} → {table}.{column} is not a column"


def load_script(path: Path) -> ModuleType:
    """Import a helper script that lives outside the package (e.g. a scenario's make.py)."""
    spec = importlib.util.spec_from_file_location(path.stem + "_" + path.parent.name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True   # no __pycache__ inside tests/data
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


def rows(table: Any, **where: Any) -> list[dict[str, Any]]:
    """Rows of an Arrow table as dicts, filtered by column == value."""
    return [r for r in table.to_pylist() if all(r.get(k) == v for k, v in where.items())]
