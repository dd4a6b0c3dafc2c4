"""A host-side wait the seed story points at (issue #29): a start killed during a JIT build leaves torch's
cpp_extension lock file behind, and every later start waits in FileBaton.wait forever, at 0% CPU, with no error.

A real process under `trace run` polls a stale lock exactly as torch.utils.cpp_extension does; the watchdog's verdict
names the lock wait (not a collective, not "busy"), says no build holds it, and tells how to clear it. The filelock
library's own debug log (tests/field/deepspeed-5205, DeepSpeed's Triton autotune cache on NFS) reads the same way."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ranktrace.analyzers import api
from tests.helpers import PY, REPO, TRACE, trace_env

_JOB = """import os
from torch.utils.file_baton import FileBaton
print("Loading JIT ops", flush=True)
baton = FileBaton(os.path.join(os.environ["EXT_DIR"], "lock"))
if baton.try_acquire():
    baton.release()
else:
    baton.wait()   # what cpp_extension does when another process holds the build lock
"""


def test_a_stale_jit_build_lock_is_named_live(tmp_path: Path) -> None:
    ext = tmp_path / "torch_extensions" / "py311_cpu" / "fused_op"
    ext.mkdir(parents=True)
    (ext / "lock").touch()                      # left behind by a start that was killed mid-build
    job = tmp_path / "job.py"
    job.write_text(_JOB)
    res = subprocess.run(TRACE + ["run", "-o", str(tmp_path / "run"), "--hang-after", "5", "--startup-hang-after", "5",
                                  "--on-hang", "kill", "--", PY, str(job)], capture_output=True, text=True,
                         timeout=150, env=trace_env(EXT_DIR=str(ext)), stdin=subprocess.DEVNULL, cwd=REPO)
    assert res.returncode == 3, res.stderr[-3000:]
    v = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["operation"]["name"]) == ("hang", "blocked_outside_collective", "file_lock")
    assert "FileBaton.wait" in v["summary"] and "stale lock" in v["summary"]
    assert "no compiler is running" in v["summary"]
    assert any("torch_extensions" in s for s in v["next_steps"])


def test_the_filelock_debug_log_of_processes_waiting_on_a_cache_lock() -> None:
    case = REPO / "tests" / "field" / "deepspeed-5205"
    v = api.analyze([case / "filelock_debug.log"], liveness=None).verdict
    assert (v.status, v.kind) == ("hang", "blocked_outside_collective")
    assert "Fp16Matmul_2d_kernel.pickle.lock" in v.summary and "3 processes" in v.summary
    assert "no compiler is running" not in v.summary   # a log alone does not say what ran
