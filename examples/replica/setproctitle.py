"""Stand-in for the `setproctitle` package (the replica runs where it is not installed): the title goes to the
kernel's 15-character process name; the full title is kept for ``getproctitle``."""
from __future__ import annotations

import ctypes

_title = ""


def setproctitle(title: str) -> None:
    global _title
    _title = title
    try:
        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def getproctitle() -> str:
    return _title
