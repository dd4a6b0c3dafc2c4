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


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize that ours shadows (Debian's python ships one; so do some clusters)."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_ranktrace_start()
try:
    _chain_next_sitecustomize()
except Exception as _e:  # the other sitecustomize's own error: report as Python would, keep going
    import sys as _sys

    _sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(_e).__name__}: {_e}\n")
