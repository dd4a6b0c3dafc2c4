"""The job's own helpers that tests/test_capture_coverage.py names with ``trace run --hook``.

``Comm`` stands in for a pynccl / custom all-reduce wrapper (hooked as category collective: seq per object must
line up across ranks); ``load_weights`` for a serving engine's start-up phase (hooked as category phase);
``Scheduler.step`` for an engine's ``async def`` event-loop step (hooked as a phase: the wrapper must stay a
coroutine function, and its span must cover the awaits).
"""
from __future__ import annotations

import asyncio
import time

import torch
import torch.distributed as dist


class Comm:
    """A communicator object; each instance is its own group for ranktrace."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        return t


def load_weights(seconds: float = 0.05) -> str:
    time.sleep(seconds)
    return "loaded"


class Scheduler:
    """An asyncio engine loop's step."""

    async def step(self, seconds: float = 0.05) -> str:
        await asyncio.sleep(seconds)
        return "stepped"
