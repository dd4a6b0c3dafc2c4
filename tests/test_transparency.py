"""Transparency battery (issue #16): the same small jobs run plain and under `trace run`, compared for what a person
sees: exit status, stdout bytes, stderr bytes less ranktrace's own "[ranktrace]" lines (return values and exceptions
are printed by the jobs), and the files each job writes in its working directory.

Covered elsewhere, not repeated here: a job that raises (tracebacks, frames, exit 1:
test_cosmetic.test_no_ranktrace_frame_in_the_jobs_tracebacks), `import sitecustomize` finding the user's
(test_cosmetic.test_import_sitecustomize_is_what_it_is_without_ranktrace), signals sent to `trace run` from outside
and a daemon / start_new_session child / background writer outliving the run
(test_launch_safety.test_a_signal_reaches_the_job_exactly_once_as_without_ranktrace,
test_processes_the_job_leaves_behind_on_purpose_live_on), exit 7 and -15 mapped to 143
(test_run_spine.test_exit_status_and_signals_pass_through)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, events, trace_env

# 2 ranks over gloo (mp.spawn), each with a second thread issuing collectives on its own group while the main
# thread issues them on the default one; the results come back through a queue and the parent prints them.
GLOO_THREADS = r'''
import os, socket, sys, threading
import torch, torch.distributed as dist, torch.multiprocessing as mp
def rank_main(rank, world, q):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    side = dist.new_group([0, 1])
    got = {}
    def worker():
        t = torch.full((3,), float(rank + 10))
        for _ in range(5):
            dist.all_reduce(t, group=side)
        got["thread"] = t.tolist()
    th = threading.Thread(target=worker)
    th.start()
    t = torch.arange(4, dtype=torch.float32) * (rank + 1)
    for _ in range(5):
        dist.all_reduce(t)
    th.join()
    out = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(out, torch.tensor([rank, rank * 2.0]))
    q.put((rank, t.tolist(), got["thread"], [o.tolist() for o in out]))
    dist.destroy_process_group()
if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(2, q), nprocs=2)
    for r in sorted(q.get() for _ in range(2)):
        print(r)
    print("done", file=sys.stderr)
'''

# Pool.map, an exception raised in a worker, and a Queue from a Process, under one start method (argv[1]).
MP_START = r'''
import multiprocessing as mp, os, sys
class Boom(ValueError):
    pass
def square(x):
    return x * x
def fail(x):
    raise Boom(f"worker says no to {x}")
def put(q, n):
    q.put([("child", i, i ** 3) for i in range(n)])
    print("child stdout", n, flush=True)
    sys.stderr.write("child stderr\n")
if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    with ctx.Pool(2) as pool:
        print(pool.map(square, range(10)), flush=True)
        try:
            pool.apply(fail, (3,))
        except Boom as e:
            print("caught", type(e).__name__, e, flush=True)
    q = ctx.Queue()
    p = ctx.Process(target=put, args=(q, 4))
    p.start()
    got = q.get()
    p.join()  # the child's own lines first: the job's output has one order (PYTHONUNBUFFERED splits a print)
    print(got, flush=True)
    print("exitcode", p.exitcode)
    open("written.txt", "w").write(f"{sys.argv[1]} ok\n")
'''

THREADS = r'''
import concurrent.futures, threading, sys
lock = threading.Lock()
seen = []
def work(i):
    with lock:
        seen.append(i)
    if i == 5:
        raise KeyError(i)
    return sum(range(i * 1000))
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    futs = [ex.submit(work, i) for i in range(8)]
    for f in futs:
        e = f.exception()
        print(repr(e) if e else f.result())
print(sorted(seen), threading.active_count())
'''

# Its own handlers for SIGTERM and SIGUSR1, signalled by itself and by a child it started; TERM ends it with 5.
SELF_SIGNAL = r'''
import os, signal, subprocess, sys, time
got = []
def on_usr1(sig, frame):
    got.append("USR1")
    print("usr1", len(got), flush=True)
def on_term(sig, frame):
    print("term after", got, flush=True)
    sys.stderr.write("shutting down\n")
    sys.exit(5)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, on_term)
os.kill(os.getpid(), signal.SIGUSR1)
signal.raise_signal(signal.SIGUSR1)
subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getppid(), signal.SIGUSR1)"], check=True)
end = time.monotonic() + 10
while len(got) < 3 and time.monotonic() < end:
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
print("never")
'''

EXIT_7 = r'''
import atexit, sys
atexit.register(lambda: print("atexit ran", flush=True))
print("to stdout"); sys.stdout.write("no newline at the end")
sys.stderr.write("to stderr\nno newline either")
open("written.txt", "w").write("before exit\n")
sys.exit(7)
'''

# A cluster-style sitecustomize with side effects at start-up, in this process and in a spawned child.
USER_SITE = r'''
import builtins, os, sys
builtins.CLUSTER_MARK = "from the user's sitecustomize"
os.environ["CLUSTER_SET"] = "yes"
sys.stderr.write("user sitecustomize ran\n")
'''
SITE_JOB = r'''
import multiprocessing as mp, os, sys
def child(q):
    import sitecustomize
    q.put((CLUSTER_MARK, os.environ.get("CLUSTER_SET"), sitecustomize.__file__.endswith("site/sitecustomize.py")))
if __name__ == "__main__":
    import sitecustomize
    print(CLUSTER_MARK, os.environ["CLUSTER_SET"], sitecustomize.__file__.endswith("site/sitecustomize.py"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); got = q.get(); p.join(); print(got)
'''

JOBS = {
    "gloo_2_ranks_with_threads": (GLOO_THREADS, []),
    "mp_fork": (MP_START, ["fork"]),
    "mp_spawn": (MP_START, ["spawn"]),
    "mp_forkserver": (MP_START, ["forkserver"]),
    "threads": (THREADS, []),
    "own_signal_handlers": (SELF_SIGNAL, []),
    "exit_7_unterminated_output": (EXIT_7, []),
    "own_sitecustomize": (SITE_JOB, []),
}


def _run(name: str, tmp_path: Path, traced: bool) -> tuple[int, bytes, bytes, dict[str, bytes]]:
    code, args = JOBS[name]
    side = "traced" if traced else "plain"
    cwd = tmp_path / side
    cwd.mkdir()
    script = tmp_path / f"{name}.py"  # a file: spawn and forkserver children import the job's functions from it
    script.write_text(code)
    env = {k: v for k, v in trace_env().items() if not k.startswith("RANKTRACE")}
    if name == "own_sitecustomize":
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(USER_SITE)
        env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    argv = [PY, str(script), *args]
    if traced:
        argv = TRACE + ["run", "--no-analyze", "--no-monitor", "-o", str(tmp_path / "run"), "--"] + argv
    res = subprocess.run(argv, capture_output=True, env=env, cwd=cwd, timeout=120, stdin=subprocess.DEVNULL)
    files = {str(p.relative_to(cwd)): p.read_bytes() for p in sorted(cwd.rglob("*")) if p.is_file()}
    return res.returncode, res.stdout, res.stderr, files


def _same_stderr(plain: bytes, traced: bytes) -> bool:
    """`traced` is `plain` plus ranktrace's own lines, and before a run of them at most the one newline that
    launcher.fresh_line writes so they never glue onto the job's line (on a pipe it cannot see whether the job's
    last line was ended, so that newline may make an empty line)."""
    kept: list[bytes] = []
    optional: list[int] = []  # indexes in `kept` of a newline ranktrace may have written
    for ln in traced.splitlines(keepends=True):
        if ln.startswith(b"[ranktrace]"):
            if kept and kept[-1].endswith(b"\n") and (not optional or optional[-1] != len(kept) - 1):
                optional.append(len(kept) - 1)
            continue
        kept.append(ln)
    for mask in range(1 << len(optional)):  # a handful at most
        parts = list(kept)
        for bit, i in enumerate(optional):
            if mask >> bit & 1:
                parts[i] = parts[i][:-1]
        if b"".join(parts) == plain:
            return True
    return False


@pytest.mark.parametrize("name", list(JOBS))
def test_a_job_sees_and_shows_the_same_with_and_without_trace_run(tmp_path: Path, name: str):
    rc, out, err, files = _run(name, tmp_path, traced=False)
    t_rc, t_out, t_err, t_files = _run(name, tmp_path, traced=True)
    if name == "own_sitecustomize":
        # trace run is itself a Python program started with the job's environment: the user's sitecustomize also
        # runs once in it (as it does in torchrun), before anything of the job's
        assert t_err.startswith(b"user sitecustomize ran\n"), t_err[:2000]
        t_err = t_err[len(b"user sitecustomize ran\n"):]
    assert t_rc == rc, (name, rc, t_rc, t_err[-2000:])
    assert t_out == out, (name, out[-2000:], t_out[-2000:])
    assert _same_stderr(err, t_err), (name, err[-2000:], t_err[-2000:])
    assert t_files == files, (name, files, t_files)
    assert (tmp_path / "run").is_dir()  # it was traced
    if name == "gloo_2_ranks_with_threads":  # and its ranks were: the parent and both ranks wrote rings
        assert len(set(events(tmp_path / "run")["pid"].to_pylist())) >= 3
    expect = {"exit_7_unterminated_output": 7, "own_signal_handlers": 5}
    assert rc == expect.get(name, 0), (name, rc, err[-2000:])
    if name == "own_sitecustomize":
        assert err.count(b"user sitecustomize ran") >= 2 and b"from the user's sitecustomize yes True" in out, err


def test_the_stderr_comparison_sees_a_difference():
    assert _same_stderr(b"a\nb", b"a\nb\n[ranktrace] x\n")  # our newline ended the job's line
    assert _same_stderr(b"a\n", b"\n[ranktrace] y\na\n\n[ranktrace] x\n")  # empty lines of ours
    assert not _same_stderr(b"a\n", b"a\n\n")  # an empty line not before ours is the job's, and differs
    assert not _same_stderr(b"a\n", b"a\nb\n[ranktrace] x\n")
