"""Shared test fixtures: where the real sample files live."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RANKTRACE_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real files to test readers on). CI lays a copy of shared/ beside the clone."""
    p = SHARED / "data"
    if not p.is_dir():
        pytest.fail(f"shared data not found at {p}: CI lays ../shared beside the clone")
    return p
