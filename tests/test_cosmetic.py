"""Small things a person sees (issue #16): ranktrace's wrapper frame in the job's tracebacks, `import sitecustomize`
giving ours, our last line glued to the job's unterminated stderr line, agent sockets left behind, and `-o FILE`
called "not empty"."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, events, run_trace, trace_env

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


def test_import_sitecustomize_is_what_it_is_without_ranktrace(tmp_path: Path):
    """`import sitecustomize` gave ranktrace's own module: the user's one (a cluster's, say) was shadowed, and a job
    that has none imported ours."""
    code = ("import argparse\ntry:\n    import sitecustomize\n    print('found', getattr(sitecustomize, 'MARK', None))\n"
            "except ImportError as e:\n    print(type(e).__name__, e.name, e)\n")
    none = run_trace(["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "a"), "--", PY, "-c", code])
    assert none.stdout == _plain(code).stdout == \
        "ModuleNotFoundError sitecustomize No module named 'sitecustomize'\n", none.stdout
    # the one difference left (see _step_aside in tracer/rank/_inject/sitecustomize.py): when `import sitecustomize` is the very first new import of the
    # program, the message says the import was halted; the exception and its name are the same
    first = code.replace("import argparse\n", "")
    got = run_trace(["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "c"), "--", PY, "-c", first])
    assert got.stdout.startswith("ModuleNotFoundError sitecustomize "), got.stdout
    user = tmp_path / "site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("MARK = 'users'\n")
    env = trace_env(PYTHONPATH=f"{user}{os.pathsep}{trace_env()['PYTHONPATH']}")
    mine = subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "b"), "--", PY, "-c",
                                   code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert mine.stdout == "found users\n", mine.stdout + mine.stderr[-2000:]


PARTIAL = "import sys; sys.stderr.write('a progress bar without its newline 100%'); sys.stderr.flush()"


def test_our_last_line_is_never_glued_to_the_jobs_unterminated_line(tmp_path: Path):
    res = run_trace(["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "r"), "--", PY, "-c", PARTIAL])
    assert "100%\n[ranktrace]" in res.stderr, res.stderr  # a pipe
    log = tmp_path / "err.log"
    with open(log, "w") as err:
        subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "f"), "--", PY, "-c",
                                PARTIAL], stdout=subprocess.DEVNULL, stderr=err, env=trace_env(), cwd=REPO,
                       timeout=120, stdin=subprocess.DEVNULL)
    text = log.read_text()
    assert "100%\n[ranktrace]" in text, text
    with open(log, "w") as err:  # a file that already ends its line gets no empty line
        subprocess.run(TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "g"), "--", PY, "-c",
                                "import sys; sys.stderr.write('done\\n')"], stdout=subprocess.DEVNULL, stderr=err,
                       env=trace_env(), cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)
    assert "done\n[ranktrace]" in log.read_text()


FORKED = r'''
import multiprocessing as mp, torch.distributed
def child():
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
    dist.destroy_process_group()
if __name__ == "__main__":
    ps = [mp.get_context("fork").Process(target=child) for _ in range(2)]
    [p.start() for p in ps]
    [p.join() for p in ps]
'''


def test_no_agent_socket_is_left_behind(tmp_path: Path):
    """Forked children end with os._exit (no atexit): their sockets stayed in <host>/agents/ after the run."""
    job = tmp_path / "forked.py"
    job.write_text(FORKED)
    run_dir = tmp_path / "r"
    res = run_trace(["run", "--no-analyze", "--no-monitor", "-o", str(run_dir), "--", PY, str(job)])
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(set(events(run_dir)["pid"].to_pylist())) >= 3  # the parent and both children recorded
    assert list(run_dir.glob("*/agents/*.sock")) == []


def test_output_that_is_a_file_is_called_a_file(tmp_path: Path):
    f = tmp_path / "somefile"
    f.write_text("x")
    res = run_trace(["run", "-o", str(f), "--", PY, "-c", "pass"])
    assert res.returncode == 2
    assert "is a file" in res.stderr and "not empty" not in res.stderr, res.stderr
