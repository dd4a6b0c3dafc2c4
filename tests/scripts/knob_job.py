#!/usr/bin/env python3
"""A job (no torch: it starts in a fraction of a second) whose fate depends on its environment and flags, for the
`trace bisect` tests of the search loop: it succeeds when every --needs NAME=VAL holds and every --needs-flag FLAG is
on its command line, and otherwise fails (--fail hang: silent until killed; crash: exit 1).

  --rate P --counter FILE   a failing configuration fails only in a fraction P of its runs: run n (counted in FILE)
                            fails when ceil((n+1)*P) > ceil(n*P) — exact, not random
  --reject-flag FLAG        exits 2 with argparse's "unrecognized arguments" when FLAG is given (another release)
  --ready                   on success print a server's ready line and keep serving (until stopped)
  --orphan FILE             first leave a detached grandchild behind (its pid in FILE), as a server's helper that
                            outlives its parent would
Unknown arguments (the flags a knob adds) are accepted.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--needs", action="append", default=[])
    p.add_argument("--needs-flag", action="append", default=[])
    p.add_argument("--fail", choices=["hang", "crash"], default="hang")
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--counter", default=None)
    p.add_argument("--reject-flag", action="append", default=[])
    p.add_argument("--ready", action="store_true")
    p.add_argument("--orphan", default=None)
    args, rest = p.parse_known_args()
    for flag in args.reject_flag:
        if flag in rest:
            sys.stderr.write(f"usage: knob_job.py [-h]\nknob_job.py: error: unrecognized arguments: {flag}\n")
            return 2
    if args.orphan:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(args.orphan, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(300)
            os._exit(0)
        time.sleep(0.3)
    ok = all(os.environ.get(k) == v for k, _, v in (n.partition("=") for n in args.needs))
    ok = ok and all(f in rest for f in args.needs_flag)
    if not ok and args.rate < 1 and args.counter:
        with open(args.counter, "a+") as f:
            f.seek(0)
            n = int(f.read().strip() or 0)
            f.seek(0)
            f.truncate()
            f.write(str(n + 1))
        ok = not math.ceil((n + 1) * args.rate) > math.ceil(n * args.rate)
    print(f"knob_job: {'ok' if ok else 'failing: ' + args.fail}", flush=True)
    if ok:
        if args.ready:
            print("knob_job: READY TO SERVE", flush=True)
            time.sleep(300)
        return 0
    if args.fail == "crash":
        return 1
    time.sleep(300)  # silent: only the watchdog ends this
    return 0


if __name__ == "__main__":
    sys.exit(main())
