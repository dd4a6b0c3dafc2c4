"""Build script for the one compiled piece: ranktrace.tracer.rank._fastspan (the traced-call fast path, tracer/rank/_fastspan.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be compiled (no compiler, a
Python older than 3.11), installation still succeeds and tracer.hooks runs its pure-Python wrappers.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("ranktrace.tracer.rank._fastspan", ["tracer/rank/_fastspan.c"], optional=True,
                  extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-braces"]),
    ],
)
