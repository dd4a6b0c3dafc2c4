"""JSON renderer: the verdict contract (DESIGN §5), exactly ``Verdict.to_dict``."""
from __future__ import annotations

import json

from ranktrace.analyzers.verdict import Verdict

__all__ = ["render", "EXTENSION", "BINARY"]

EXTENSION = ".json"
BINARY = False


def render(verdict: Verdict) -> str:
    return json.dumps(verdict.to_dict(), indent=2) + "\n"
