"""Helpers shared by the NCCL RAS text and JSON parsers (``nccl_ras_text``, ``nccl_ras_json``).

Why separate: both parsers need the ``total`` op name and the RAS timestamp reader; keeping them here lets the two
parser modules stay independent of each other and of the ``nccl_ras`` entry point (no import cycle).
"""
from __future__ import annotations

from datetime import datetime, timezone

_OP_TOTAL = "total"


def _ts(s: str | None) -> int | None:
    if not s:
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return int(datetime.strptime(s.strip(), fmt).replace(tzinfo=timezone.utc).timestamp()) * 1_000_000_000
        except ValueError:
            continue
    return None
