"""ranktrace's injected sitecustomize: loads the in-rank tracer, then chains to any other sitecustomize.

Placed first on PYTHONPATH by ``trace run`` so that every Python process of the job (torchrun workers,
mp.spawn children, subprocesses) imports it. It must never break or slow the job: everything is guarded, the
tracer package is loaded from its own directory under a private module name (no sys.path change, so a user
module called ``tracer`` is never shadowed), and torch is not imported here.
"""


def _ranktrace_start() -> None:
    import os
    import sys

    if not os.environ.get("RANKTRACE_DIR"):
        return
    try:
        import importlib.util

        pkg_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tracer/
        spec = importlib.util.spec_from_file_location(
            "_ranktrace_tracer", os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir]
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["_ranktrace_tracer"] = pkg
        spec.loader.exec_module(pkg)
        from _ranktrace_tracer.rank import inject

        inject.install()
    except Exception as e:  # never the job's problem
        try:
            sys.stderr.write(f"[ranktrace] tracer not loaded in pid {os.getpid()}: {type(e).__name__}: {e}\n")
        except Exception:
            pass


def _chain_next_sitecustomize() -> object:
    """Run the sitecustomize that ours shadows (Debian's python ships one; so do some clusters); returns it, or None
    when there is none. The module is registered as ``sitecustomize`` before it runs, as an import would."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)
    return module


def _step_aside(user_module: object) -> None:
    """Leave the interpreter as it would be without us: ``import sitecustomize`` gives the user's module (or
    ModuleNotFoundError when there is none), and our folder is off sys.path (it stays on PYTHONPATH, for child
    processes). Our module cannot leave sys.modules while its own import runs (the import system reads it back):
    when there is no user module it is replaced by None, which a finder clears at the next import. The one
    difference left: when ``import sitecustomize`` is the program's very first new import, its ModuleNotFoundError
    says the import was halted (same exception, same ``name``)."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    if user_module is not None:
        sys.modules["sitecustomize"] = user_module
        return
    sys.modules["sitecustomize"] = None  # type: ignore[assignment]

    class _ClearAfterSite:
        # It stays in sys.meta_path, a no-op after its first call: removing itself while the import system walks
        # sys.meta_path would make that walk skip the finder after it (ranktrace's own post-import hooks).
        pending = [True]

        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if _ClearAfterSite.pending:
                _ClearAfterSite.pending.clear()
                if sys.modules.get("sitecustomize", 0) is None:
                    del sys.modules["sitecustomize"]
            return None

    sys.meta_path.insert(0, _ClearAfterSite)  # type: ignore[arg-type]


_ranktrace_start()
_user_sitecustomize = None
try:
    _user_sitecustomize = _chain_next_sitecustomize()
except Exception as _e:  # the other sitecustomize's own error: report as Python would, keep going
    import sys as _sys

    _sys.modules.pop("sitecustomize", None)
    _sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(_e).__name__}: {_e}\n")
try:
    _step_aside(_user_sitecustomize)
except Exception:
    pass
