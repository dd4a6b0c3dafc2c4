"""GPU samples through NVML, taken in a child process so that a wedged driver can never hang ``trace run``.

Why a child: an NVML call into a wedged driver (Xid 79, a GPU fallen off the bus) blocks in the kernel forever.
In-process, that would freeze the launcher's wait loop and the job's signal forwarding with it. So one long-lived
child (``python -m ranktrace.tracer.watch.gpu_sampler``; imports pynvml only, never torch) answers one JSON line per request on
stdout; the parent (:class:`GpuSampler`, driven from the monitor's tick) never blocks: it sends a request, picks
the answer up on a later tick, and gives up on the child — one stderr line, SIGKILL, no more tries — when the
hello or an answer is later than ``timeout_s``.

The child's first line is a hello: driver/CUDA versions and static facts per GPU (the launcher puts them in
meta.json, so NVML is opened once per run), or ``{"ok": false, "error": ...}`` when there is no NVML here, which
the parent reports as one line and never retries.

Per sample and device: utilisation (GPU, memory), memory used/total, power, SM clock, temperature, PCIe TX/RX
throughput, NVLink TX/RX data counters (field values, where supported), volatile ECC counts, and per-process GPU
memory; Xid events (critical Xid, double-bit ECC) are drained from an NVML event set without waiting. A call the
device does not support is not asked again.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["GpuSampler", "child_main"]


# ------------------------------------------------------------------------------------------------- the child

def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Nvml:
    """The child's NVML session: static facts once, then one sample per request."""

    def __init__(self, nvml: Any) -> None:
        self.n = nvml
        self.handles: list[Any] = []
        self.static: list[dict[str, Any]] = []
        self.unsupported: set[tuple[int, str]] = set()
        self.events: Any = None

    def hello(self) -> dict[str, Any]:
        n = self.n
        out: dict[str, Any] = {"ok": True, "driver": None, "cuda_driver": None, "gpus": []}
        try:
            out["driver"] = _s(n.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            v = n.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            self.handles.append(h)
            d: dict[str, Any] = {"index": i}
            for key, fn in (("name", lambda: _s(n.nvmlDeviceGetName(h))),
                            ("uuid", lambda: _s(n.nvmlDeviceGetUUID(h))),
                            ("compute_capability", lambda: ".".join(map(str, n.nvmlDeviceGetCudaComputeCapability(h)))),
                            ("memory_bytes", lambda: int(n.nvmlDeviceGetMemoryInfo(h).total)),
                            ("bus_id", lambda: _s(n.nvmlDeviceGetPciInfo(h).busId))):
                try:
                    d[key] = fn()
                except Exception:
                    pass
            self.static.append(d)
            out["gpus"].append(d)
        try:
            self.events = n.nvmlEventSetCreate()
            mask = getattr(n, "nvmlEventTypeXidCriticalError", 8) | getattr(n, "nvmlEventTypeDoubleBitEccError", 2)
            for h in self.handles:
                try:
                    n.nvmlDeviceRegisterEvents(h, mask, self.events)
                except Exception:
                    pass
        except Exception:
            self.events = None
        return out

    def _get(self, i: int, what: str, fn: Callable[[], Any]) -> Any:
        if (i, what) in self.unsupported:
            return None
        try:
            return fn()
        except self.n.NVMLError as e:
            if isinstance(e, getattr(self.n, "NVMLError_NotSupported", ())) or "Not Supported" in str(e):
                self.unsupported.add((i, what))
            return None
        except Exception:
            self.unsupported.add((i, what))
            return None

    def sample(self) -> dict[str, Any]:
        n = self.n
        wall, mono = time.time_ns(), time.monotonic_ns()
        rows: list[dict[str, Any]] = []
        for i, h in enumerate(self.handles):
            st = self.static[i]
            row: dict[str, Any] = {"kind": "device", "gpu": i, "uuid": st.get("uuid"), "bus_id": st.get("bus_id")}
            util = self._get(i, "util", lambda: n.nvmlDeviceGetUtilizationRates(h))
            if util is not None:
                row["util_gpu"], row["util_mem"] = int(util.gpu), int(util.memory)
            mem = self._get(i, "mem", lambda: n.nvmlDeviceGetMemoryInfo(h))
            if mem is not None:
                row["mem_used"], row["mem_total"] = int(mem.used), int(mem.total)
            row["power_mw"] = self._get(i, "power", lambda: int(n.nvmlDeviceGetPowerUsage(h)))
            row["sm_clock_mhz"] = self._get(i, "sm", lambda: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)))
            row["temperature_c"] = self._get(
                i, "temp", lambda: int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)))
            row["pcie_tx_kbps"] = self._get(
                i, "pcie_tx", lambda: int(n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)))
            row["pcie_rx_kbps"] = self._get(
                i, "pcie_rx", lambda: int(n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)))
            fv = self._get(i, "nvlink", lambda: n.nvmlDeviceGetFieldValues(
                h, [n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]))
            if fv is not None:
                for col, v in zip(("nvlink_tx_kib", "nvlink_rx_kib"), fv):
                    if getattr(v, "nvmlReturn", 1) == 0:
                        row[col] = int(getattr(v.value, "ullVal", 0))
            row["ecc_uncorrected"] = self._get(i, "ecc_u", lambda: int(n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)))
            row["ecc_corrected"] = self._get(i, "ecc_c", lambda: int(n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)))
            rows.append(row)
            procs = self._get(i, "procs", lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
            for p in procs or []:
                used = getattr(p, "usedGpuMemory", None)
                rows.append({"kind": "process", "gpu": i, "uuid": st.get("uuid"), "pid": int(p.pid),
                             "mem_used": int(used) if isinstance(used, int) else None})
        rows.extend(self._xids())
        for r in rows:
            r["wall_ns"], r["t_ns"] = wall, mono
        return {"ok": True, "rows": rows}

    def _xids(self) -> list[dict[str, Any]]:
        if self.events is None:
            return []
        n = self.n
        out: list[dict[str, Any]] = []
        wait = getattr(n, "nvmlEventSetWait_v2", None) or n.nvmlEventSetWait
        for _ in range(64):
            try:
                ev = wait(self.events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                break
            gpu = next((i for i, h in enumerate(self.handles) if _same_handle(h, ev.device)), None)
            out.append({"kind": "xid", "gpu": gpu, "xid": int(getattr(ev, "eventData", 0) or 0),
                        "detail": f"event_type={int(getattr(ev, 'eventType', 0))}"})
        return out


def _same_handle(a: Any, b: Any) -> bool:
    try:
        import ctypes

        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except Exception:
        return a == b


def child_main() -> int:
    """Answer one JSON line per stdin line until stdin closes. First line: the hello."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the job; the parent ends us
    out = sys.stdout

    def say(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    try:
        import pynvml
    except ImportError:
        say({"ok": False, "error": "pynvml (nvidia-ml-py) not installed"})
        return 0
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        say({"ok": False, "error": f"no NVIDIA driver reachable through NVML ({type(e).__name__})"})
        return 0
    session = _Nvml(pynvml)
    try:
        say(session.hello())
    except Exception as e:
        say({"ok": False, "error": f"NVML query failed ({type(e).__name__}: {e})"})
        return 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            say(session.sample())
        except Exception as e:
            say({"ok": True, "rows": [], "error": f"{type(e).__name__}: {e}"})
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return 0


# ------------------------------------------------------------------------------------------------ the parent

# a folder whose empty sitecustomize shadows the user's in this helper (tracer/watch/_quiet_site)
QUIET_SITE = str(Path(__file__).resolve().parent / "_quiet_site")


class GpuSampler:
    """Parent side: start the child, request samples, collect answers without ever blocking the caller.

    ``log`` gets at most one line for the whole run when NVML is absent or the child stops answering.
    """

    def __init__(self, *, log: Callable[[str], None], timeout_s: float = 10.0,
                 command: list[str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.timeout_s, self.clock = log, timeout_s, clock
        # -s: no user site (nor its usercustomize); QUIET_SITE first on the path: no sitecustomize of the user's
        self.command = command or [sys.executable, "-s", "-m", "ranktrace.tracer.watch.gpu_sampler"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        self.off: str | None = None            # why sampling is off (said once)
        self._buf = b""
        self._asked_at: float | None = None    # when the pending request (or the start) was made
        self._answers: list[dict[str, Any]] = []

    def start(self) -> None:
        if self.proc is not None or self.off is not None:
            return
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([QUIET_SITE, root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        except OSError as e:
            self._stop(f"GPU sampler could not start ({e}): no GPU samples")
            return
        os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
        self._asked_at = self.clock()

    @property
    def active(self) -> bool:
        return self.proc is not None and self.off is None

    def _lines(self) -> list[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        eof = False
        while True:
            try:
                r, _, _ = select.select([fd], [], [], 0)
                if not r:
                    break
                chunk = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self._buf += chunk
        out = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        if eof and not out and self.off is None:
            self._stop("GPU sampler exited unexpectedly: no more GPU samples")
        return out

    def poll(self) -> list[dict[str, Any]]:
        """Answers that arrived since the last call (rows of ``gpu.arrow``); never blocks."""
        if not self.active:
            return []
        rows: list[dict[str, Any]] = []
        for msg in self._lines():
            if self.hello is None:
                self.hello = msg
                self._asked_at = None
                if not msg.get("ok"):
                    self._stop(f"{msg.get('error') or 'NVML unavailable'}: no GPU samples and no GPU details "
                               f"in meta.json")
                    return []
                continue
            self._asked_at = None
            rows.extend(msg.get("rows") or [])
        if self._asked_at is not None and self.clock() - self._asked_at > self.timeout_s:
            what = "start" if self.hello is None else "answer"
            self._stop(f"NVML did not {what} within {self.timeout_s:.0f} s (wedged driver?): GPU sampling off")
        return rows

    def request(self) -> None:
        """Ask for one sample (ignored while one is pending or before the hello)."""
        if not self.active or self.hello is None or self._asked_at is not None:
            return
        try:
            self.proc.stdin.write(b"s\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            self._asked_at = self.clock()
        except OSError:
            self._stop("GPU sampler exited unexpectedly: no more GPU samples")

    def wait_hello(self, timeout_s: float) -> dict[str, Any] | None:
        """Block up to `timeout_s` for the hello (used once, at the end of a short run, for meta.json)."""
        deadline = time.monotonic() + timeout_s
        while self.active and self.hello is None and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.02)
        return self.hello

    def _stop(self, why: str) -> None:
        if self.off is None:
            self.off = why
            self.log(why)
        self._kill()

    def _kill(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            p.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGKILL)  # a child stuck in the driver may never die: don't wait on it
            except OSError:
                pass
        try:
            p.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """End the child (closing stdin ends a healthy one; SIGKILL one that does not go within 1 s)."""
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            try:
                p.kill()
                p.wait(timeout=0.2)
            except (OSError, subprocess.TimeoutExpired):
                pass


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(child_main())
