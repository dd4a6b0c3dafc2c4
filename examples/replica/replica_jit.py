"""The replica's stale-JIT-lock fault (issue #29): what a start killed during a kernel build leaves behind.

torch's cpp_extension (and SGLang's JIT kernels through it) takes a FileBaton -- the file ``<build dir>/lock``,
created with O_EXCL -- for the build and removes it when done. A start SIGKILLed mid-build (an OOM kill, a scheduler's
preemption, Ctrl-C twice) leaves the file; every later start then polls for it to go away, forever, at 0% CPU, with
no error (pytorch/pytorch#189245, sgl-project/sglang#4389). `plant_stale_lock` makes that state for real: a process
takes the baton and is SIGKILLed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

NAME = "sampling_kernels"
_KILLED_START = ("import sys, time\nfrom torch.utils.file_baton import FileBaton\n"
                 "assert FileBaton(sys.argv[1]).try_acquire()\nprint('building', flush=True)\ntime.sleep(600)\n")


def build_root() -> Path:
    """TORCH_EXTENSIONS_DIR, set to a fresh folder when the caller did not choose one (never the user's cache)."""
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="replica_torch_extensions_")
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def plant_stale_lock() -> Path:
    """A previous start that took the build lock of NAME and was SIGKILLed before it released it."""
    lock = build_root() / NAME / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    source()  # written once here, before the ranks start (they all read it)
    p = subprocess.Popen([sys.executable, "-c", _KILLED_START, str(lock)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=""))
    assert p.stdout is not None and p.stdout.readline().strip() == "building", "the killed start did not start"
    p.send_signal(signal.SIGKILL)
    p.wait()
    return lock


def source() -> str:
    """The kernels' C++ source (what cpp_extension.load would compile if it got the lock)."""
    src = build_root() / f"{NAME}.cpp"
    if not src.exists():
        src.write_text("int sampling_kernels_version() { return 1; }\n")
    return str(src)
