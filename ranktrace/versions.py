"""`ranktrace --version`: the versions a bug report needs (ranktrace, torch and its NCCL, python).

torch is imported here only, and only when asked: every other command stays fast.
"""
from __future__ import annotations

import platform

__all__ = ["ranktrace_version", "versions_text"]


def ranktrace_version() -> str:
    try:
        from importlib.metadata import version

        return version("ranktrace")
    except Exception:  # run from a checkout that was never installed
        return "0+unknown"


def _torch_lines() -> list[str]:
    try:
        import torch
    except Exception as e:  # not installed, or broken: say which, never a traceback
        return [f"torch: not importable here ({type(e).__name__}: {e})"]
    lines = [f"torch {getattr(torch, '__version__', '?')}"]
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if not cuda:
        return lines + ["NCCL: not in this torch build"]
    try:
        nccl = torch.cuda.nccl.version()
    except Exception as e:  # a CUDA build whose NCCL cannot be loaded here
        return lines + [f"NCCL: unknown ({type(e).__name__}: {e})"]
    return lines + ["NCCL " + (".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))]


def versions_text() -> str:
    return "\n".join([f"ranktrace {ranktrace_version()}", *_torch_lines(), f"python {platform.python_version()}"])
