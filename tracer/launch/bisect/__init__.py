"""`trace bisect`: find the knob that makes a hang go away, by running the job under `trace run --hang-after S
--on-hang kill` once per configuration and searching the knob space (NCCL and torch variables, SGLang / vLLM
flags) for the smallest change that turns the hang into success.

knobs.toml  the catalogue: every knob, its area, what a fix by it suggests, the releases its flags were read from
knobs.py    the catalogue and a user's knobs file, framework detection, which knobs change a command, the order
            the verdict points at, what a configuration does to the command line and environment (pure)
search.py   which configuration next: baseline, single knobs, narrower knobs, all together + ddmin (pure)
runner.py   one run: trace run as a child, ready line, stop, reap everything it left; the GPU lock
report.py   the ranktrace.bisect/1 document and its text
session.py  the loop: budget, time, Ctrl-C, and the files at the end (bisect.json/.txt, compare, report.html)
"""
from ranktrace.tracer.launch.bisect.session import EXIT, BisectError, BisectOptions, BisectResult, parse_duration, \
    run_bisect

__all__ = ["EXIT", "BisectError", "BisectOptions", "BisectResult", "parse_duration", "run_bisect"]
