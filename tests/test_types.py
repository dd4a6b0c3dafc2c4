"""Static types of ``analyzers/`` and ``ranktrace/`` are checked by the ordinary test run (issue #25).

CI runs pytest and nothing else, so a type check that lives in a separate command is one nobody runs: this test runs
``python -m mypy`` in a subprocess with the project's own configuration (``[tool.mypy]`` in pyproject.toml, which says
what is checked and how; mypy is pinned in the ``test`` extra) and asserts that it reports nothing, printing mypy's
report when it does. It runs from the repository root, so ``.typecheck/`` (the symlinks that give mypy the import
names ``ranktrace.analyzers.*`` / ``ranktrace.tracer.*``) is found whichever way the package was installed.

mypy keeps its cache in ``.cache/mypy`` (ignored by git): a fresh clone pays one cold run (10-25 s on a busy 2-core
machine, measured; torch is not read, see pyproject.toml), later runs re-check only what changed (1-2 s).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO


def test_mypy_reports_no_errors():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: pip install -e '.[test]' (it is pinned in the test extra)")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         stdin=subprocess.DEVNULL)
    report = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, f"mypy found type errors (python -m mypy, from {REPO}):\n{report}"
    assert report.startswith("Success:"), report
