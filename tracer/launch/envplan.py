"""The environment every rank gets: how ranktrace is injected, and observability-only debug settings.

Rules (DESIGN §2): the user's values always win; we set only variables that make the job *tell* more, never ones
that change how it runs or dies — no TORCH_NCCL_ASYNC_ERROR_HANDLING, *_BLOCKING_WAIT, CUDA_LAUNCH_BLOCKING or
TORCH_DISTRIBUTED_DEBUG=DETAIL (8x slower collectives here). What we added is returned separately so meta.json
can say exactly what ranktrace changed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["EnvPlan", "plan_environment", "INJECT_DIR", "FORBIDDEN", "curated_subset", "HOOKS_ENV", "hooks_value",
           "untraceable_reason"]

HOOKS_ENV = "RANKTRACE_HOOKS"  # read in-rank by tracer/rank/patch_user.py
PROFILE_ENV = "RANKTRACE_PROFILE"  # likewise: the JSON plan of the profile trace run picked

INJECT_DIR = str(Path(__file__).resolve().parents[1] / "rank" / "_inject")
# Never set by ranktrace: each changes the job's behaviour or speed.
FORBIDDEN = frozenset(
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT", "CUDA_LAUNCH_BLOCKING",
     "TORCH_DISTRIBUTED_DEBUG", "NCCL_ASYNC_ERROR_HANDLING"}
)
NCCL_DEFAULT_SUBSYS = "INIT,BOOTSTRAP,ENV"
_CURATED_PREFIXES = (
    "NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVIDIA_", "GLOO_", "OMP_", "MASTER_", "SLURM_", "PMI_", "OMPI_",
    "SGLANG_", "VLLM_", "HF_", "TRANSFORMERS_", "UCX_", "FI_", "RANKTRACE_", "TORCHELASTIC_", "LOCAL_",
)
_CURATED_NAMES = frozenset({"RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "PYTHONPATH", "LD_LIBRARY_PATH",
                            "PATH", "HOSTNAME", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV"})


@dataclass(frozen=True)
class EnvPlan:
    env: dict[str, str]    # the complete environment for the job
    added: dict[str, str]  # what ranktrace set or changed (for meta.json)


def plan_environment(
    base: Mapping[str, str], host_dir: Path, *, nccl_debug: str | None = None, nccl_coll: bool = False,
    hooks: Sequence[str] = (), profile_plan: Path | None = None,
) -> EnvPlan:
    """Environment for the job started under `trace run`, writing into `host_dir`.

    `hooks` are ``--hook MODULE:QUALNAME[=category]`` values (already validated by the CLI); they reach the ranks
    as RANKTRACE_HOOKS (comma-separated), after any the user's environment already named. `profile_plan`: the
    resolved profile (tracer/launch/profiles.py) the ranks read, as RANKTRACE_PROFILE.
    """
    added: dict[str, str] = {}

    def put(name: str, value: str) -> None:
        assert name not in FORBIDDEN, name
        if name not in base:
            added[name] = value

    pp = base.get("PYTHONPATH")
    added["PYTHONPATH"] = INJECT_DIR + (os.pathsep + pp if pp else "")
    added["RANKTRACE_DIR"] = str(host_dir)
    user_nccl = "NCCL_DEBUG" in base or "NCCL_DEBUG_FILE" in base
    put("NCCL_DEBUG", nccl_debug or "INFO")
    subsys = NCCL_DEFAULT_SUBSYS + (",COLL" if nccl_coll else "")
    put("NCCL_DEBUG_SUBSYS", subsys)
    if nccl_debug and "NCCL_DEBUG" in base and base["NCCL_DEBUG"] != nccl_debug:
        added["NCCL_DEBUG"] = nccl_debug  # an explicit --nccl-debug is the user speaking
    if not user_nccl:
        added["NCCL_DEBUG_FILE"] = str(host_dir / "nccl" / "%h.%p.log")
    # Flight Recorder: keep a buffer and record start times; both only observe. Only the current name: torch 2.13
    # prints a deprecation warning into every rank's stderr for TORCH_NCCL_TRACE_BUFFER_SIZE.
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in base and "TORCH_FR_BUFFER_SIZE" not in base:
        put("TORCH_FR_BUFFER_SIZE", "2000")
    put("TORCH_NCCL_ENABLE_TIMING", "1")
    put("PYTHONFAULTHANDLER", "1")
    if hooks:
        added[HOOKS_ENV] = hooks_value(base, hooks)
    if profile_plan is not None:
        added[PROFILE_ENV] = str(profile_plan)
    env = dict(base)
    env.update(added)
    return EnvPlan(env=env, added=added)


def hooks_value(base: Mapping[str, str], hooks: Sequence[str]) -> str:
    """RANKTRACE_HOOKS for the ranks: the environment's own entries first, then `hooks`, each once."""
    entries = [h for h in base.get(HOOKS_ENV, "").split(",") if h.strip()]
    entries += [h for h in hooks if h not in entries]
    return ",".join(entries)


def curated_subset(env: Mapping[str, str]) -> dict[str, str]:
    """The variables worth keeping in meta.json (not yet redacted)."""
    return {k: v for k, v in sorted(env.items()) if k in _CURATED_NAMES or k.startswith(_CURATED_PREFIXES)}


# Python options that take the next argument as their value (so it is no flag cluster): -c/-m end the options.
_PY_ARG_OPTIONS = frozenset("WXQ")
_PY_FLAG_TEXT = {"I": "-I (isolated mode) ignores PYTHONPATH and the site hooks",
                 "E": "-E ignores PYTHONPATH", "S": "-S skips the site module (and with it sitecustomize)"}


def untraceable_reason(command: Sequence[str]) -> str | None:
    """One line when the command is a Python started so that ranktrace cannot load into it (``python -I``, ``-E``,
    ``-S``: ranktrace enters through PYTHONPATH's sitecustomize), else None. The job runs as given either way; the
    line says that its ranks will not be traced, instead of a run that looks traced and recorded nothing."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    found: list[str] = []
    args = list(command[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg.startswith("--") or arg == "-":
            break  # the script (or an option of python's own long form): python's options end here
        i += 1
        for k, ch in enumerate(arg[1:], 1):
            if ch in "cm":  # -c CODE / -m MODULE: what follows is the program's
                return _untraced_text(found)
            if ch in _PY_ARG_OPTIONS:  # -W ignore, -X dev, -Wignore: the value is this option's
                i += 1 if k == len(arg) - 1 else 0
                break
            if ch in _PY_FLAG_TEXT and ch not in found:
                found.append(ch)
    return _untraced_text(found)


def _untraced_text(found: list[str]) -> str | None:
    if not found:
        return None
    why = "; ".join(_PY_FLAG_TEXT[ch] for ch in found)
    return (f"python {' '.join('-' + ch for ch in found)}: {why}, so ranktrace cannot load into this process and its "
            f"ranks will not be traced (drop the option to trace them; the job runs as given)")
