"""The first question of `trace compare`: on what did each run run? Hardware, software, topology, environment and
the job itself, read from whatever the inputs hold (meta.json of our runs, NCCL log lines, nvidia-smi output, nsys
tables, pasted version listings), then set side by side with the differences first."""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import Analysis, FactDiff

__all__ = ["SECTIONS", "Fact", "run_facts", "context_diff", "env_known", "world_size", "ENV_PREFIXES"]

SECTIONS = ("hardware", "software", "topology", "environment", "job")
#: environment variables that change how NCCL, torch, CUDA or a serving framework behaves
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_", "GLOO_", "NVIDIA_", "SGLANG_", "VLLM_", "UCX_", "FI_",
                "OMP_", "MASTER_ADDR", "WORLD_SIZE", "TRITON_", "FLASHINFER_", "TRTLLM_")
#: set per run by ranktrace or the launcher, never a difference a person should read
_PER_RUN_ENV = frozenset({"NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "MASTER_PORT", "TORCH_FR_DUMP_TEMP_FILE",
                          "CUDA_CACHE_PATH"})
_VERSION_KEYS = {"torch": ("software", "torch"), "nccl": ("software", "NCCL"), "cuda": ("software", "CUDA (torch build)"),
                 "python": ("software", "python"), "torch_cuda": ("software", "CUDA (torch build)"),
                 "driver": ("hardware", "driver"), "cudnn": ("software", "cuDNN")}
_SKIP_VERSIONS = {"ranktrace", "python_launcher"}


@dataclass(frozen=True)
class Fact:
    value: str
    source: str


def _merge(values: dict[tuple[str, str], dict[str, set[str]]], section: str, key: str, value: Any,
           source: str) -> None:
    if value is None or value == "" or value == []:
        return
    values[(section, key)].setdefault(source, set()).add(str(value))


def _joined(vals: set[str]) -> str:
    return vals.pop() if len(vals) == 1 else "; ".join(sorted(vals))


def _gpu_summary(names: list[str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for n in names:
        counts[n] += 1
    return ", ".join(f"{c} x {n}" if c > 1 else n for n, c in sorted(counts.items()))


def _cuda_from_int(v: str) -> str:
    """12040 -> 12.4 (NCCL's cudaDriverVersion, nsys' CudaDriverVersion)."""
    return f"{int(v) // 1000}.{(int(v) % 1000) // 10}" if v.isdigit() and len(v) >= 4 else v


def world_size(an: Analysis) -> int | None:
    """The job's world size: the largest `world` any event states, else the ranks seen."""
    ev = an.events
    if ev.num_rows and ev["world"].null_count < ev.num_rows:
        w = pc.max(ev["world"]).as_py()
        if w:
            return int(w)
    ranks: set[int] = set()
    for h in an.hosts:
        for info in ((h.meta or {}).get("pids") or {}).values():
            if info.get("rank") is not None:
                ranks.add(int(info["rank"]))
    if ranks:
        return max(ranks) + 1
    if an.ops.num_rows and an.ops["rank"].null_count < an.ops.num_rows:
        return int(pc.max(an.ops["rank"]).as_py()) + 1
    return None


def _from_meta(an: Analysis, values: dict[tuple[str, str], dict[str, set[str]]]) -> None:
    for h in an.hosts:
        m = h.meta or {}
        src = f"meta.json ({h.host_dir.name})"
        gpus = m.get("gpus") or []
        if gpus:
            _merge(values, "hardware", "GPU model", _gpu_summary([str(g.get("name")) for g in gpus]), src)
            for g in gpus:
                _merge(values, "hardware", "compute capability", g.get("compute_capability"), src)
                if g.get("memory_bytes"):
                    _merge(values, "hardware", "GPU memory", f"{int(g['memory_bytes']) / 2**30:.0f} GiB", src)
        drv = m.get("driver") or {}
        _merge(values, "hardware", "driver", drv.get("version"), src)
        _merge(values, "hardware", "CUDA (driver)", drv.get("cuda"), src)
        for k, v in (m.get("versions") or {}).items():
            if k in _SKIP_VERSIONS:
                continue
            section, key = _VERSION_KEYS.get(k, ("software", k))
            _merge(values, section, key, v, src)
        for k, v in (m.get("env") or {}).items():
            if k.startswith(ENV_PREFIXES) and k not in _PER_RUN_ENV:
                _merge(values, "environment", k, v, src)
        cmd = m.get("command")
        if cmd:
            _merge(values, "job", "command", " ".join(map(str, cmd)), src)
        _merge(values, "job", "host", m.get("hostname"), src)
        system = m.get("system") or {}
        for key, label in (("topology", "GPU interconnect"), ("p2p", "P2P capability (NVML)"),
                           ("iommu", "IOMMU"), ("acs", "PCIe ACS"), ("kernel", "kernel")):
            _merge(values, "topology" if key != "kernel" else "software", label, system.get(key), src)


def _rows(obs: pa.Table, kinds: Iterable[str]) -> list[dict[str, Any]]:
    if not obs.num_rows:
        return []
    sub = obs.filter(pc.is_in(obs["kind"], value_set=pa.array(list(kinds))))
    return sub.select(["kind", "name", "detail", "value", "file", "line", "source", "rank", "host", "pid"]).to_pylist()


def _where(r: dict[str, Any]) -> str:
    f = Path(r["file"]).name if r.get("file") else r.get("source") or "?"
    return f"{f}:{r['line']}" if r.get("line") is not None else f


def _from_observations(an: Analysis, values: dict[tuple[str, str], dict[str, set[str]]]) -> None:
    links: dict[str, set[str]] = defaultdict(set)
    link_src: dict[str, str] = {}
    smi_models: dict[str, set[str]] = defaultdict(set)
    for r in _rows(an.observations, ("nccl_version", "nccl_setting", "version", "env", "gpu_util", "topology",
                                     "topology_link", "gpu_device", "nsys_system")):
        kind, name, detail, src = r["kind"], r["name"], r["detail"], _where(r)
        if kind == "nccl_version" and detail:
            ver, _, cuda = str(detail).partition("+cuda")
            _merge(values, "software", "NCCL", ver, src)
            _merge(values, "software", "CUDA (NCCL build)", cuda or None, src)
        elif kind == "nccl_setting":
            if name == "cuda_driver":
                _merge(values, "hardware", "CUDA (driver)", detail, src)
            elif name and name.startswith(ENV_PREFIXES) and name not in _PER_RUN_ENV:
                _merge(values, "environment", name, detail, src)
        elif kind == "version" and name:
            if name == "nccl":
                detail = str(detail).partition("+cuda")[0]
            section, key = _VERSION_KEYS.get(name, ("software", name))
            _merge(values, section, key, detail, src)
        elif kind == "env" and name and name.startswith(ENV_PREFIXES) and name not in _PER_RUN_ENV:
            _merge(values, "environment", name, detail, src)
        elif kind == "gpu_util" and detail:
            smi_models[src.rsplit(":", 1)[0]].add(str(detail))
        elif kind == "topology" and detail:
            _merge(values, "topology", "GPU interconnect", f"{detail} ({r['value']} GPUs, nvidia-smi topo -m)", src)
        elif kind == "topology_link" and name and detail:
            links[str(detail)].add(str(name))
            link_src.setdefault(str(detail), src)
        elif kind == "gpu_device" and detail and r["source"] == "nsys":
            parts = [p.strip() for p in str(detail).split(";")]
            if parts and parts[0] and not parts[0].startswith("{"):
                _merge(values, "hardware", "GPU model", parts[0], src)
            for p in parts[1:]:
                if p.startswith("sm "):
                    _merge(values, "hardware", "compute capability", p[3:], src)
        elif kind == "nsys_system" and detail:
            if name == "NvDriverVersion":
                _merge(values, "hardware", "driver", detail, src)
            elif name == "CudaDriverVersion":
                _merge(values, "hardware", "CUDA (driver)", _cuda_from_int(str(detail)), src)
            elif name == "OsDescription":
                _merge(values, "software", "OS", detail, src)
    for src, models in smi_models.items():
        _merge(values, "hardware", "GPU model", _joined(set(models)), src)
    if links:
        summary = ", ".join(f"{cell} x{len(pairs)}" for cell, pairs in sorted(links.items()))
        _merge(values, "topology", "GPU links (topo -m cells)", summary, next(iter(link_src.values())))


def run_facts(an: Analysis) -> dict[tuple[str, str], Fact]:
    """(section, key) -> the value this run states and where it was read. A key read from several sources keeps
    the first source in trust order (meta.json, then logs); values that differ between ranks are joined."""
    values: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(dict)
    _from_meta(an, values)
    _from_observations(an, values)
    w = world_size(an)
    if w:
        _merge(values, "job", "world size", w, "ranks seen")
    nodes = {h.host_dir.name for h in an.hosts}
    if len(nodes) > 1:
        _merge(values, "job", "nodes", len(nodes), "host dirs")
    out: dict[tuple[str, str], Fact] = {}
    for key, by_source in values.items():
        src, vals = next(iter(by_source.items()))
        out[key] = Fact(_joined(set(vals)), src)
    return out


_NUM = re.compile(r"\d+")


def _same(section: str, key: str, a: str, b: str) -> bool:
    if key == "command":  # the run directory or a port in the arguments is not a difference of the job
        strip = lambda s: re.sub(r"(?:-o|--output)[ =]\S+|--port[ =]\d+", "", s)  # noqa: E731
        return strip(a) == strip(b)
    return a == b


def env_known(an: Analysis) -> bool:
    """True when the run says its whole environment (meta.json of trace run): a variable it lacks was unset."""
    return any(isinstance((h.meta or {}).get("env"), dict) for h in an.hosts)


def context_diff(fa: dict[tuple[str, str], Fact], fb: dict[tuple[str, str], Fact], *, env_a: bool = False,
                 env_b: bool = False) -> list[FactDiff]:
    """Every fact either run states, differences first (then what only one side says, then what is the same), each
    group in section order. `env_a`/`env_b`: that run's environment is known whole, so a variable missing from it
    was unset there (a difference, not a gap)."""
    rows: list[FactDiff] = []
    unset = Fact("(unset)", "meta.json env")
    for section, key in set(fa) | set(fb):
        a, b = fa.get((section, key)), fb.get((section, key))
        if section == "environment":
            a = a if a is not None or not env_a else unset
            b = b if b is not None or not env_b else unset
        if a is not None and b is not None:
            status = "same" if _same(section, key, a.value, b.value) else "differs"
        else:
            status = "only_a" if a is not None else "only_b"
        rows.append(FactDiff(section, key, a.value if a else None, b.value if b else None, status,
                             a.source if a else None, b.source if b else None))
    order = {"differs": 0, "only_a": 1, "only_b": 1, "same": 2}
    rows.sort(key=lambda r: (order[r.status], SECTIONS.index(r.section), r.key))
    return rows
