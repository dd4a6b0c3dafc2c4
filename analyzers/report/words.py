"""What a person reads in place of the analyzer's internal names, and which findings a page or terminal shows.

The verdict JSON keeps its values (``in_collective``, ``blocked_other``, ... are the contract, DESIGN §5); only what
is rendered for a person says them in plain words. Shared by the terminal report, the HTML page and Perfetto.
"""
from __future__ import annotations

import re

from ranktrace.analyzers.verdict import Finding, Verdict

__all__ = ["STATE_WORDS", "state_text", "plain", "shown_findings", "PENDING_KINDS"]

#: host states (analyzers.hoststate.HOST_STATES) as a person says them
STATE_WORDS = {
    "in_init": "starting up (process group init)",
    "host_sync_wait": "waiting for the GPU",
    "in_collective": "waiting in a collective",
    "blocked_other": "blocked outside communication",
    "idle_loop": "idle, waiting for work",
    "running": "running",
    "stopped": "stopped (SIGSTOP / Ctrl-Z: it runs nothing)",
    "uninterruptible": "in uninterruptible sleep (/proc state D: inside the kernel)",
    "exited": "exited",
    "unknown": "unknown",
}

_STATE_RE = re.compile(r"\b(" + "|".join(k for k in STATE_WORDS if k not in ("running", "exited", "unknown", "stopped")) + r")\b")

#: verdict kinds in which some ranks wait for an op that others never finished or issued
PENDING_KINDS = frozenset({"missing_ranks", "collective_mismatch", "stuck_in_collective", "rank_exited",
                           "wait_cycle", "graph_capture", "init_hang"})


def state_text(state: str | None) -> str:
    """'blocked_other' -> 'blocked outside communication' (an unknown name is shown as it is)."""
    if not state:
        return ""
    return STATE_WORDS.get(state, state.replace("_", " "))


def plain(text: str) -> str:
    """A sentence of the analyzer's with the host-state names in it said in plain words
    ("rank 3 is in next_batch (blocked_other)" -> "... (blocked outside communication)")."""
    return _STATE_RE.sub(lambda m: STATE_WORDS[m.group(1)], text) if text else text


def _contradicts(f: Finding, v: Verdict) -> bool:
    """A secondary finding that says the opposite of the verdict: "no collective is pending" under a verdict whose
    ranks wait in a collective. Its evidence (the blocked rank's stack) is already the primary finding's."""
    if f.kind != "blocked_outside_collective" or v.kind == "blocked_outside_collective":
        return False
    return v.kind in PENDING_KINDS and bool(v.waiting_ranks or v.operation is not None)


def shown_findings(v: Verdict) -> tuple[Finding, ...]:
    """The findings a person is shown: every one of the verdict's except those that contradict it (verdict.json
    keeps them all)."""
    return tuple(f for f in v.findings if not _contradicts(f, v))
