"""Facts about this machine for meta.json: host key, GPUs via NVML, driver version.

Why a host key of hostname + boot id: two nodes with the same hostname (containers) or one node rebooted between
runs must not merge into one `<run>/<host>/` directory (DESIGN §3). NVML is optional: without a driver we say so
in one line and carry on.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["host_key", "clock_pair", "GpuInfo", "probe_gpus"]


def host_key() -> str:
    host = socket.gethostname() or "localhost"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:8]
    except OSError:
        boot = "noboot"
    return f"{host}-{boot}"


def clock_pair() -> dict[str, int]:
    """This host's clocks read together: CLOCK_MONOTONIC (what rings record), wall time and CLOCK_BOOTTIME. Two pairs
    (start and end of a run, in meta.json) show how the wall clock moved against the monotonic one meanwhile."""
    return {"mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns(),
            "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}


@dataclass
class GpuInfo:
    driver: str | None = None
    cuda_driver: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    unavailable: str | None = None  # one line saying why, when NVML could not be used


def probe_gpus() -> GpuInfo:
    """GPU name, compute capability, memory and bus id per device; never raises."""
    try:
        import pynvml
    except ImportError:
        return GpuInfo(unavailable="pynvml (nvidia-ml-py) not installed: no GPU details")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return GpuInfo(unavailable=f"no NVIDIA driver reachable through NVML ({type(e).__name__}): no GPU details")
    info = GpuInfo()
    try:
        info.driver = _s(pynvml.nvmlSystemGetDriverVersion())
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            info.cuda_driver = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            d: dict[str, Any] = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h))}
            try:
                d["compute_capability"] = ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h)))
            except Exception:
                pass
            try:
                d["memory_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:
                pass
            try:
                d["bus_id"] = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except Exception:
                pass
            info.gpus.append(d)
    except Exception as e:
        info.unavailable = f"NVML query failed ({type(e).__name__}: {e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
