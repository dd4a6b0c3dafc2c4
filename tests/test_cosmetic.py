"""Small things a person sees (issue #16): ranktrace's wrapper frame in the job's tracebacks, `import sitecustomize`
giving ours, our last line glued to the job's unterminated stderr line, agent sockets left behind, and `-o FILE`
called "not empty"."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, run_trace, trace_env

ERRORS = r'''
import traceback, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
t = torch.ones(2)
for call in (lambda: dist.all_reduce(t, op="nonsense"), lambda: dist.broadcast(t, src=5),
             lambda: dist.distributed_c10d._get_default_group().allreduce([t], "x"), lambda: dist.all_reduce(t, async_op=True).wait(3)):
    try:
        call()
    except Exception:
        traceback.print_exc()
dist.destroy_process_group()
dist.all_reduce(t)   # not initialised: an uncaught error ends the job
'''


def _plain(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = env or {k: v for k, v in trace_env().items() if not k.startswith("RANKTRACE")}
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, cwd=cwd or REPO, timeout=120,
                          stdin=subprocess.DEVNULL)


def _job_text(s: str) -> str:
    s = re.sub(r" at 0x[0-9a-f]+", " at 0x?", s)
    return "\n".join(ln for ln in s.splitlines() if not ln.startswith("[ranktrace]") and ln.strip())


@pytest.mark.parametrize("fastpath", ["1", "0"])
def test_no_ranktrace_frame_in_the_jobs_tracebacks(tmp_path: Path, fastpath: str):
    plain = _plain(ERRORS)
    traced = run_trace(["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "r"), "--", PY, "-c", ERRORS],
                       env=trace_env(RANKTRACE_FASTPATH=fastpath))
    assert traced.returncode == plain.returncode == 1
    assert "tracer/rank" not in traced.stderr, traced.stderr[-3000:]
    assert _job_text(traced.stderr) == _job_text(plain.stderr)
