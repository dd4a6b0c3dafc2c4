"""Build script: the package map (the folders tracer/ and analyzers/ install as ranktrace.tracer and
ranktrace.analyzers, every sub-package found here so none can be forgotten) and the one compiled piece,
ranktrace.tracer.rank._fastspan (tracer/rank/_fastspan.c) and the ring guard, ranktrace.tracer.rank._ringguard
(tracer/rank/_ringguard.c: a ring truncated by someone else faults with SIGBUS in the job's own call; the guard turns
that into a ring lost, not a rank killed).

The extensions are optional: where it cannot be compiled (no compiler, a Python older than 3.11), installation
still succeeds and the ranks run the pure-Python wrappers. Everything else is in pyproject.toml.
"""
import os

from setuptools import Extension, setup

ROOTS = {"ranktrace": "ranktrace", "ranktrace.tracer": "tracer", "ranktrace.analyzers": "analyzers"}


def packages() -> list:
    out = []
    for name, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")) and d != "__pycache__")
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, folder)
                out.append(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return sorted(set(out))


setup(
    packages=packages(),
    package_dir=ROOTS,
    ext_modules=[
        Extension("ranktrace.tracer.rank._fastspan", ["tracer/rank/_fastspan.c"], optional=True,
                  extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-braces"]),
        Extension("ranktrace.tracer.rank._ringguard", ["tracer/rank/_ringguard.c"], optional=True,
                  extra_compile_args=["-O2", "-std=gnu11", "-Wall"]),
    ],
)
