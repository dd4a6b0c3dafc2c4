"""In-rank start-up: make the process's TraceState and patch torch only once the job imports it.

Imported by the injected sitecustomize in every Python process of a traced job; never imports torch itself
(+1 s and 200 MiB per process), so a process that never uses torch.distributed pays about a millisecond.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from typing import Any, Callable

from ..formats import redact
from .fastpath import FASTPATH_ERROR, fastpath_available
from .patch_c10d import install_c10d
from .patch_graphs import install_cuda
from .patch_pg import install_process_group
from .patch_user import ENV as HOOKS_ENV
from .patch_user import PROFILE_ENV, Target, UserHooks, load_plan, parse_env
from .recorder import Recorder, ring_slots
from .tracestate import TraceState

__all__ = ["install", "PostImportFinder", "state"]

C10D = "torch.distributed.distributed_c10d"
CUDA = "torch.cuda"
C10D_EXT = "torch._C._distributed_c10d"
MP_PROCESS = "multiprocessing.process"
_MAIN_MODULES = ("__main__", "__mp_main__")  # the main script runs through runpy, not a finder


class PostImportFinder:
    """A meta-path finder that runs callbacks right after a target module executes.

    A plain class (not importlib.abc) on purpose: importing importlib.abc costs ~18 ms per process. The spec comes
    from the finders after this one (so editable installs and other custom finders keep working), and only its
    loader's ``exec_module`` is wrapped. Several callbacks may wait for one module (c10d hooks and --hook targets).
    """

    def __init__(self, targets: dict[str, Callable[[Any], None]]) -> None:
        self.targets: dict[str, list[Callable[[Any], None]]] = {k: [v] for k, v in targets.items()}

    def add(self, fullname: str, callback: Callable[[Any], None]) -> None:
        self.targets.setdefault(fullname, []).append(callback)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callbacks = self.targets.get(fullname)
        if callbacks is None:
            return None
        spec = self._find_elsewhere(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            for callback in self.targets.pop(fullname, ()):
                try:
                    callback(module)
                except Exception as e:  # never break the user's import
                    _warn_once(f"could not hook {fullname}: {type(e).__name__}: {e}")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def _find_elsewhere(self, fullname: str, path: Any, target: Any) -> Any:
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(fullname, path, target)
            except Exception:  # let the normal import machinery meet (and report) it
                return None
            if spec is not None:
                return spec
        return importlib.machinery.PathFinder.find_spec(fullname, path)


_warned = False
state: Any = None  # this process's TraceState once install() ran (for debugging, tests and benchmarks)


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        sys.stderr.write(f"[ranktrace] {msg}; tracing off in pid {os.getpid()}\n")


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def install() -> None:
    """Set up tracing for this process if RANKTRACE_DIR is set: the state (its ring is made on first use), a fresh
    ring in every forked child, exit marks, and the patches, each when its module is imported."""
    trace_dir = os.environ.get("RANKTRACE_DIR")
    if not trace_dir:
        return
    global state
    setup = _Setup(trace_dir)
    state = setup.state
    os.register_at_fork(after_in_child=setup.after_fork_in_child)
    mark_exit = _record_process_exit(setup.state, setup.user)
    finder = PostImportFinder({})
    if MP_PROCESS in sys.modules:
        _mark_child_exit_codes(sys.modules[MP_PROCESS], mark_exit)
    else:
        finder.add(MP_PROCESS, lambda module: _mark_child_exit_codes(module, mark_exit))
    for name, callback in ((C10D, setup.on_c10d), (CUDA, setup.on_cuda)):
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            finder.add(name, callback)
    for name in setup.user.modules():
        module = sys.modules.get(name)
        if module is not None:
            setup.user.on_module(module)
        elif name not in _MAIN_MODULES:
            finder.add(name, setup.user.on_module)
    if finder.targets:
        sys.meta_path.insert(0, finder)


class _Setup:
    """What install() wires into the process: the ring factory and the callbacks run as torch is imported."""

    def __init__(self, trace_dir: str) -> None:
        self.trace_dir = trace_dir
        self.rings = os.path.join(trace_dir, "rings")
        self.slots = _env_int("RANKTRACE_RING_SLOTS") or ring_slots()
        self.state = TraceState(self.new_ring, _env_int("RANK"), _env_int("WORLD_SIZE"))
        specs, self.bad_hooks = parse_env(os.environ.get(HOOKS_ENV))
        profile_targets, proctitle, plan_problems = load_plan(os.environ.get(PROFILE_ENV))
        self.bad_hooks += plan_problems
        targets = profile_targets + [Target.of_spec(s) for s in specs]  # --hook adds to the profile
        self.user = UserHooks(self.state, targets, trace_dir, proctitle)
        self.state.on_init.append(self.user.retry_pending)

    def new_ring(self) -> Recorder:
        """The recorder factory (again in a forked child): a ring file of its own, then identity and versions."""
        pid = os.getpid()
        title = " ".join(redact.redact_argv(sys.argv))[:127]
        for attempt in range(100):  # pid reuse across a long job: never overwrite an earlier ring
            path = os.path.join(self.rings, f"{pid}.ring" if attempt == 0 else f"{pid}-{attempt}.ring")
            try:
                rec = Recorder(path, slots=self.slots, proctitle=title)
                break
            except FileExistsError:
                continue
        else:
            raise RuntimeError(f"no free ring file name for pid {pid} in {self.rings}")
        st = self.state
        st._rec = rec  # before the records below, which read st.rec
        st.identity("env")
        rec.meta({"type": "versions", **_versions()})
        if os.environ.get("RANKTRACE_AGENT", "1") != "0":  # a process that records gets a responder
            from . import agent

            agent.start(self.trace_dir, lambda: st.rank, st.no_capture_starts, lambda detail: st.note("agent", detail))
        return rec

    def after_fork_in_child(self) -> None:
        self.state.reset_after_fork(self.new_ring)

    def ring_or_off(self) -> Recorder | None:
        """The ring, made now if needed; None (tracing off, said once) when it cannot be: nothing gets patched."""
        try:
            return self.state.rec
        except Exception as e:
            self.state.enabled = False
            _warn_once(f"cannot write a ring under {self.rings} ({type(e).__name__}: {e})")
            return None

    def on_c10d(self, module: Any) -> None:
        """torch.distributed.distributed_c10d has executed: patch its functions, ProcessGroup and Work."""
        rec = self.ring_or_off()
        if rec is None:
            return
        how = install_c10d(self.state, module)
        try:  # ProcessGroup / Work are pybind classes of torch's extension, loaded by now (c10d imports them)
            ext: Any = importlib.import_module(C10D_EXT)
        except Exception:
            ext = None
        if ext is not None:
            how.update(install_process_group(self.state, ext))
        rec.meta({"type": "hooks", "c10d": how, "fastpath": fastpath_available(), "fastpath_error": FASTPATH_ERROR})
        for raw, problem in self.bad_hooks:  # malformed RANKTRACE_HOOKS entries (trace run checks --hook itself)
            self.user.problem(raw, problem)
        self.user.retry_pending()

    def on_cuda(self, module: Any) -> None:
        """torch.cuda has executed: patch graph capture/replay and host syncs."""
        if not self.state.enabled:
            return
        rec = self.ring_or_off()
        if rec is None:
            return
        _torch_prefix(self.state)
        self.state.load_nvtx()
        rec.meta({"type": "hooks", "cuda": install_cuda(self.state, module)})


def _torch_prefix(state: Any) -> None:
    """Call sites skip torch's own frames (install_c10d adds them too; torch.cuda may come first)."""
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    if path:
        prefix = os.path.dirname(os.path.abspath(path))
        if prefix not in state.skip_prefixes:
            state.skip_prefixes = state.skip_prefixes + (prefix,)


def _drop_idle_worker_ring(state: Any) -> bool:
    """A DataLoader worker that recorded no collective: its ring (made, and reserved in full, when the worker
    imported torch) says nothing, and goes as the worker exits; 10 epochs of 4 spawn workers used to keep 370 MB of
    rings for the job's life. True when it was removed (nothing more is written to it)."""
    try:
        worker = sys.modules.get("torch.utils.data._utils.worker")
        rec = state._rec
        if rec is None or worker is None or getattr(worker, "_worker_info", None) is None:
            return False
        if state.groups or state.seq:   # it did record communication: keep what it says
            return False
        state.enabled = False
        os.unlink(rec.path)
        return True
    except Exception:
        return False


def _record_process_exit(state: Any, user: Any) -> Callable[..., None]:
    """Mark a voluntary exit (interpreter exit, os._exit) in the ring, so the analyzer can tell the rank that left
    first from the ranks a launcher tore down afterwards (those die by signal and record nothing). Returns the
    mark function (``_mark_child_exit_codes`` uses it too).

    os._exit is wrapped, not replaced in behaviour: the mark is one ring write, then the real call.
    """
    import atexit
    import threading

    def mark(detail: str, code: Any = None) -> None:
        try:
            if state._rec is not None and state.enabled:
                rec = state._rec
                # never wait for the lock: a signal handler calling os._exit may have interrupted a meta write
                rec.meta({"type": "event", "kind": "mark", "name": "process_exit", "category": "phase",
                          "t_ns": rec.clock(), "tid": threading.get_native_id(), "detail": detail,
                          "exit_code": code if isinstance(code, int) else None}, blocking=False)
        except Exception:
            pass

    def at_exit() -> None:
        if _drop_idle_worker_ring(state):
            return
        try:
            user.report_unimported()
        except Exception:
            pass
        uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # printed by the top level
        if uncaught is not None and not isinstance(uncaught, SystemExit):
            mark(f"interpreter exit after an uncaught {type(uncaught).__name__}: exit code 1", 1)
        else:
            mark("interpreter exit")

    atexit.register(at_exit)
    real_exit = os._exit

    def _exit(*args: Any, **kwargs: Any) -> None:  # type: ignore[misc]  (same call forms as os._exit(status))
        code = args[0] if args else kwargs.get("status")
        if not _drop_idle_worker_ring(state):
            mark(f"os._exit({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})", code)
        real_exit(*args, **kwargs)

    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = _exit
    return mark


def _mark_child_exit_codes(module: Any, mark: Callable[..., None]) -> None:
    """multiprocessing's child processes (mp.spawn ranks: spawn, fork, forkserver) end with the exit code that
    ``BaseProcess._bootstrap`` returns (0, sys.exit's code, 1 after an exception it printed); a spawn child then
    calls sys.exit with it, which no exit hook can read. The wrapper records that code and returns it unchanged."""
    cls = getattr(module, "BaseProcess", None)
    real = getattr(cls, "_bootstrap", None)
    if real is None or getattr(real, "__wrapped__", None) is not None:
        return

    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        code = real(self, *args, **kwargs)
        mark(f"exit code {code} ({getattr(self, 'name', 'process')})", code)
        return code

    _bootstrap.__wrapped__ = real  # type: ignore[attr-defined]
    _bootstrap.__qualname__ = getattr(real, "__qualname__", "_bootstrap")
    cls._bootstrap = _bootstrap

def _versions() -> dict[str, Any]:
    """Versions of the job's own python/torch/NCCL/CUDA, read in-rank (the launcher may run another env)."""
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", None)
        ver = getattr(torch, "version", None)
        out["cuda"] = getattr(ver, "cuda", None)
        try:
            if out["cuda"]:
                nccl = torch.cuda.nccl.version()
                out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
    return out
