"""Walk a text input's lines into version and setting statements (``Fact``). One pass; each line is tried against
the few patterns whose literal it holds."""
from __future__ import annotations

from dataclasses import dataclass

from ranktrace.analyzers.readers.env_versions import signatures as sig
from ranktrace.analyzers.readers.text import Line, TextDoc

__all__ = ["Fact", "scan"]

_COLLECT_ENV = {"PyTorch version": "torch", "CUDA runtime version": "cuda", "Nvidia driver version": "driver",
                "CUDA used to build PyTorch": "torch_cuda", "vLLM Version": "vllm", "Python version": "python"}
_CHECK_ENV = {"PyTorch": "torch", "sglang": "sglang", "vllm": "vllm", "flashinfer": "flashinfer",
              "CUDA Driver Version": "driver", "NCCL": "nccl"}


@dataclass(frozen=True)
class Fact:
    line: int
    kind: str            # version | env
    name: str
    value: str
    rank: int | None
    how: str             # collect_env | check_env | pip | pip_list | installed | nccl | nvidia-smi | shell | nccl_log


def scan(doc: TextDoc) -> list[Fact]:
    out: list[Fact] = []
    for ln in doc.lines:
        text = ln.text[:8000]
        if not text.strip():
            continue
        _versions(out, ln, text)
        _settings(out, ln, text)
    return out


def _add(out: list[Fact], ln: Line, kind: str, name: str | None, value: str, how: str) -> None:
    if name and value:
        out.append(Fact(ln.no, kind, name, value, ln.prefix.rank, how))


def _versions(out: list[Fact], ln: Line, text: str) -> None:
    if ":" in text[:60]:
        m = sig.COLLECT_ENV.match(text)
        if m and m.group("v")[:1].isdigit():
            _add(out, ln, "version", _COLLECT_ENV[m.group("key")], m.group("v"), "collect_env")
            return
        m = sig.CHECK_ENV.match(text)
        if m:
            _add(out, ln, "version", _CHECK_ENV[m.group("key")], m.group("v").rstrip(","), "check_env")
            return
    m = sig.PIP_TAG.match(text)
    rest, how = (m.group("rest"), "pip") if m else (text, "pip")
    if "==" in rest:
        m = sig.PIP_FREEZE.match(rest)
        if m:
            _add(out, ln, "version", sig.package_name(m.group("name")), m.group("v"), how)
            return
    m = sig.PIP_LIST.match(rest)
    if m and sig.package_name(m.group("name")):
        _add(out, ln, "version", sig.package_name(m.group("name")), m.group("v"), "pip_list")
        return
    if "Successfully installed " in text:
        m = sig.INSTALLED.search(text)
        for token in (m.group("rest").split() if m else ()):
            name, _, version = token.rpartition("-")
            if version[:1].isdigit():
                _add(out, ln, "version", sig.package_name(name), version, "installed")
    if "NCCL version " in text:
        m = sig.NCCL_VERSION.search(text)
        if m:
            _add(out, ln, "version", "nccl", m.group("v").rstrip(".,;)"), "nccl")
    if "using nccl==" in text:
        m = sig.VLLM_NCCL.search(text)
        if m:
            _add(out, ln, "version", "nccl", m.group("v"), "vllm")
    if "Driver Version:" in text:
        m = sig.DRIVER.search(text)
        if m:
            _add(out, ln, "version", "driver", m.group("v"), "nvidia-smi")


def _settings(out: list[Fact], ln: Line, text: str) -> None:
    if "set by environment to " in text:
        m = sig.SET_BY_ENV.search(text)
        if m:
            _add(out, ln, "env", m.group("name"), m.group("v"), "nccl_log")
        return
    if "=" not in text:
        return
    m = sig.ASSIGNMENTS.match(text)
    if not m:
        return
    pos = m.end()
    for _ in range(64):                       # NAME=value NAME=value ... command
        a = sig.ASSIGNMENT.match(text, pos)
        if not a:
            break
        name = a.group("name")
        if name.startswith(sig.ENV_PREFIXES) or name in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "OMP_NUM_THREADS",
                                                         "LOCAL_WORLD_SIZE"):
            _add(out, ln, "env", name, a.group("v") or '""', "shell")
        pos = a.end()
