"""Facts about the machine's GPU topology for `trace compare` (why the same job hangs here and not there): the
``nvidia-smi topo -m`` matrix (kept as text in ``<host>/logs/`` where the nvidia-smi reader reads it), P2P capability
per GPU pair from NVML, whether an IOMMU is on, PCIe ACS where ``lspci`` shows it (root), the kernel. Gathered in a
daemon thread while the job starts, every external call under a timeout; written to ``<host>/system.json``, which
the analysis shows as meta.json's ``system``. Nothing here can delay or fail the job."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

__all__ = ["Collector", "start", "iommu_state", "acs_state", "collect"]

_TIMEOUT_S = 10.0


def _run(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def iommu_state(sys_root: Path = Path("/sys"), cmdline: Path = Path("/proc/cmdline")) -> str:
    """"on: 2 IOMMU units, 87 groups; cmdline intel_iommu=on iommu=pt" | "off (...)"."""
    try:
        units = sorted(p.name for p in (sys_root / "class" / "iommu").iterdir())
    except OSError:
        units = []
    try:
        groups = sum(1 for _ in (sys_root / "kernel" / "iommu_groups").iterdir())
    except OSError:
        groups = 0
    try:
        args = [a for a in cmdline.read_text().split() if "iommu" in a]
    except OSError:
        args = []
    flags = f"; cmdline {' '.join(args)}" if args else ""
    if units or groups:
        return f"on: {len(units)} IOMMU unit{'s' if len(units) != 1 else ''}, {groups} groups{flags}"
    return f"off (no IOMMU units or groups in sysfs){flags}"


def acs_state(lspci_vvv: str | None) -> str:
    """ACS on PCIe bridges from ``lspci -vvv`` (its ACSCtl lines need root)."""
    if lspci_vvv is None:
        return "not visible (lspci missing or failed)"
    ctl = [line for line in lspci_vvv.splitlines() if "ACSCtl:" in line]
    if not ctl:
        denied = "<access denied>" in lspci_vvv
        return "not visible (lspci needs root)" if denied else "no ACS capability listed"
    on = [line for line in ctl if "SrcValid+" in line]
    return f"enabled (SrcValid+) on {len(on)} of {len(ctl)} ports" if on else f"disabled on all {len(ctl)} ports"


def _p2p_nvml() -> str | None:
    """P2P read capability per GPU pair (NVML), summarised; None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n < 2:
            return f"single GPU ({n})"
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        index = getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", 0)
        ok_code = getattr(pynvml, "NVML_P2P_STATUS_OK", 0)
        bad = []
        for i in range(n):
            for j in range(i + 1, n):
                try:
                    status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], index)
                except Exception:
                    status = -1
                if status != ok_code:
                    bad.append(f"GPU{i}-GPU{j}")
        pairs = n * (n - 1) // 2
        if not bad:
            return f"P2P read OK for all {pairs} GPU pairs"
        return f"P2P read not supported for {len(bad)} of {pairs} GPU pairs: {', '.join(bad[:8])}" + (
            " ..." if len(bad) > 8 else "")
    except Exception as e:
        return f"NVML P2P query failed ({type(e).__name__})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def collect(host_dir: Path) -> dict[str, Any]:
    """Gather the facts now (blocking; each call under a timeout) and write them."""
    facts: dict[str, Any] = {"kernel": os.uname().release, "iommu": iommu_state()}
    topo = _run(["nvidia-smi", "topo", "-m"])
    if topo:
        logs = host_dir / "logs"
        logs.mkdir(exist_ok=True)
        (logs / "nvidia-smi-topo.txt").write_text(topo)   # read by the nvidia-smi reader with the run
    facts["p2p"] = _p2p_nvml()
    facts["acs"] = acs_state(_run(["lspci", "-vvv"])) if shutil.which("lspci") else None
    tmp = host_dir / f".system.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({k: v for k, v in facts.items() if v is not None}, indent=2) + "\n")
    os.replace(tmp, host_dir / "system.json")
    return facts


class Collector:
    """`collect` in a daemon thread; `join` waits a little at the end of the run (never fails)."""

    def __init__(self, host_dir: Path) -> None:
        self.thread = threading.Thread(target=self._run, args=(host_dir,), name="ranktrace-sysfacts", daemon=True)
        self.thread.start()

    @staticmethod
    def _run(host_dir: Path) -> None:
        try:
            collect(host_dir)
        except Exception:  # facts for a comparison: never worth a line of the job's output
            pass

    def join(self, timeout: float = 5.0) -> None:
        self.thread.join(timeout)


def start(host_dir: Path) -> Collector:
    return Collector(host_dir)
