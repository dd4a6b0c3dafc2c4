"""In-rank start-up: lazy post-import hooks that patch torch only once the job imports it.

Imported by the injected ``sitecustomize`` in every Python process of a traced job (torchrun workers,
``mp.spawn`` children, subprocesses). Costs about a millisecond: it adds one finder to ``sys.meta_path`` whose
``find_spec`` is a dict lookup for every other import, and never imports torch itself (+1 s and 200 MiB per
process). When ``torch.distributed.distributed_c10d`` finishes executing, tracer.hooks patches it in place, before
``torch.distributed`` re-exports its functions.

The package is loaded under a private name (``_ranktrace_tracer``) by the sitecustomize, so a user module called
``tracer`` is never shadowed; all imports here are relative.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from typing import Any, Callable

__all__ = ["install", "PostImportFinder", "state"]

C10D = "torch.distributed.distributed_c10d"
CUDA = "torch.cuda"
C10D_EXT = "torch._C._distributed_c10d"


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
state: Any = None  # this process's tracer.hooks.TraceState once install() ran (for debugging and tests)


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
    """Set up tracing for this process if RANKTRACE_DIR is set. Never raises."""
    trace_dir = os.environ.get("RANKTRACE_DIR")
    if not trace_dir:
        return
    from . import patch_graphs as graphs
    from . import hooks
    from . import patch_pg as pg_hooks
    from . import recorder
    from .. import redact
    from . import patch_user as user_hooks

    rings = os.path.join(trace_dir, "rings")
    slots = _env_int("RANKTRACE_RING_SLOTS") or recorder.DEFAULT_SLOTS

    def factory() -> recorder.Recorder:
        pid = os.getpid()
        title = " ".join(redact.redact_argv(sys.argv))[:127]
        for attempt in range(100):  # pid reuse across a long job: never overwrite an earlier ring
            path = os.path.join(rings, f"{pid}.ring" if attempt == 0 else f"{pid}-{attempt}.ring")
            try:
                rec = recorder.Recorder(path, slots=slots, proctitle=title)
                break
            except FileExistsError:
                continue
        else:
            raise RuntimeError(f"no free ring file name for pid {pid} in {rings}")
        state.rec_created(rec)
        return rec

    global state
    state = hooks.TraceState(factory, _env_int("RANK"), _env_int("WORLD_SIZE"))

    def rec_created(rec: recorder.Recorder) -> None:
        state._rec = rec
        state.identity("env")
        rec.meta({"type": "versions", **_versions()})
        if os.environ.get("RANKTRACE_AGENT", "1") != "0":  # a process that records gets a responder (tracer.agent)
            from . import agent

            agent.start(trace_dir, lambda: state.rank, state.no_capture_starts,
                        lambda detail: state.note("agent", detail))

    state.rec_created = rec_created  # type: ignore[attr-defined]

    def on_c10d(module: Any) -> None:
        try:
            rec = state.rec  # create the ring first: if that fails, nothing gets patched at all
        except Exception as e:
            state.enabled = False
            _warn_once(f"cannot write a ring under {rings} ({type(e).__name__}: {e})")
            return
        how = hooks.install_c10d(state, module)
        try:  # ProcessGroup / Work are pybind classes of torch's extension, loaded by now (c10d imports them)
            ext: Any = importlib.import_module(C10D_EXT)
        except Exception:
            ext = None
        if ext is not None:
            how.update(pg_hooks.install_process_group(state, ext))
        rec.meta({"type": "hooks", "c10d": how, "fastpath": hooks.fastpath_available(),
                  "fastpath_error": hooks.FASTPATH_ERROR})
        for raw, problem in bad:  # malformed RANKTRACE_HOOKS entries (trace run checks --hook itself): said once
            user.problem(raw, problem)
        user.retry_pending()

    def on_cuda(module: Any) -> None:
        if not state.enabled:
            return
        try:
            rec = state.rec
        except Exception as e:
            state.enabled = False
            _warn_once(f"cannot write a ring under {rings} ({type(e).__name__}: {e})")
            return
        _torch_prefix(state)
        state.load_nvtx()
        rec.meta({"type": "hooks", "cuda": graphs.install_cuda(state, module)})

    specs, bad = user_hooks.parse_env(os.environ.get(user_hooks.ENV))
    user = user_hooks.UserHooks(state, specs, trace_dir)
    state.on_init.append(user.retry_pending)

    def after_fork_in_child() -> None:
        state.reset_after_fork(factory)

    os.register_at_fork(after_in_child=after_fork_in_child)
    _record_process_exit(state, user)
    finder = PostImportFinder({})
    for name, callback in ((C10D, on_c10d), (CUDA, on_cuda)):
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            finder.add(name, callback)
    for name in user.modules():
        module = sys.modules.get(name)
        if module is not None:
            user.on_module(module)
        elif name not in ("__main__", "__mp_main__"):  # the main script runs through runpy, not a finder
            finder.add(name, user.on_module)
    if finder.targets:
        sys.meta_path.insert(0, finder)


def _torch_prefix(state: Any) -> None:
    """Call sites skip torch's own frames (install_c10d adds them too; torch.cuda may come first)."""
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    if path:
        prefix = os.path.dirname(os.path.abspath(path))
        if prefix not in state.skip_prefixes:
            state.skip_prefixes = state.skip_prefixes + (prefix,)


def _record_process_exit(state: Any, user: Any) -> None:
    """Mark a voluntary exit (interpreter exit, os._exit) in the ring, so the analyzer can tell the rank that left
    first from the ranks a launcher tore down afterwards (those die by signal and record nothing).

    os._exit is wrapped, not replaced in behaviour: the mark is one ring write, then the real call.
    """
    import atexit
    import threading

    def mark(detail: str) -> None:
        try:
            if state._rec is not None and state.enabled:
                rec = state._rec
                # never wait for the lock: a signal handler calling os._exit may have interrupted a meta write
                rec.meta({"type": "event", "kind": "mark", "name": "process_exit", "category": "phase",
                          "t_ns": rec.clock(), "tid": threading.get_native_id(), "detail": detail}, blocking=False)
        except Exception:
            pass

    def at_exit() -> None:
        try:
            user.report_unimported()
        except Exception:
            pass
        mark("interpreter exit")

    atexit.register(at_exit)
    real_exit = os._exit

    def _exit(*args: Any, **kwargs: Any) -> None:  # type: ignore[misc]  (same call forms as os._exit(status))
        mark(f"os._exit({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})")
        real_exit(*args, **kwargs)

    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = _exit


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
