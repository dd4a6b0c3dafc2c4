"""STAT-style merged stack tree: one prefix tree of all ranks' stacks, each node labelled with its rank set.

With 8 ranks the picture a person needs is "0-6 are here, 7 is there": the tree is built from the outermost frame
inwards, so ranks share a path until they diverge, and the branch where one rank leaves the others is visible at
a glance. Frames are normalised (paths shortened to their last two components) so py-spy and faulthandler
spellings of the same frame merge.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ranktrace.analyzers.verdict import compact_ranks

__all__ = ["StackNode", "merge", "render", "normalise_frame"]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+):(?P<line>\d+)\)$")


def normalise_frame(frame: str) -> str:
    """'func (/long/path/to/pkg/mod.py:12)' -> 'func (pkg/mod.py:12)'."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    parts = m["file"].replace("\\", "/").split("/")
    return f"{m['func']} ({'/'.join(parts[-2:])}:{m['line']})"


@dataclass
class StackNode:
    frame: str
    ranks: set[int] = field(default_factory=set)
    children: dict[str, "StackNode"] = field(default_factory=dict)


def merge(stacks: dict[int, tuple[str, ...]]) -> StackNode:
    """Prefix tree of {rank: frames innermost-first}."""
    root = StackNode("<all>")
    for rank, frames in stacks.items():
        root.ranks.add(rank)
        node = root
        for f in reversed(frames):
            f = normalise_frame(f)
            node = node.children.setdefault(f, StackNode(f))
            node.ranks.add(rank)
    return root


def render(root: StackNode, max_depth: int = 40) -> str:
    """Indented text; chains of frames shared by the same rank set are kept (they are the call path)."""
    lines: list[str] = []

    def walk(node: StackNode, depth: int) -> None:
        for child in sorted(node.children.values(), key=lambda c: (-len(c.ranks), min(c.ranks))):
            if depth >= max_depth:
                lines.append("  " * depth + f"[{compact_ranks(child.ranks)}] ...")
                continue
            lines.append("  " * depth + f"[{compact_ranks(child.ranks)}] {child.frame}")
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)
