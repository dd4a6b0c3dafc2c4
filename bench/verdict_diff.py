"""Analyze the same inputs with two builds and say where their verdicts differ (issue #19: every verdict identical).

Each build runs in its own fresh process over every path (``api.analyze([path], liveness=None)``), with its own
environment (``--env-a`` / ``--env-b``, e.g. ``RANKTRACE_WINDOW_ROWS=16`` to force the window on small runs); the
verdicts are compared as JSON (``Verdict.to_dict``), key by key. A build is this tree (``.``) or another source
tree (``git archive <commit> | tar -x -C DIR``).

Usage: ``python bench/verdict_diff.py --a DIR --b . [--env-b K=V] PATH...`` — exit status 1 when any verdict
differs (or one build fails where the other does not), 0 when all are identical.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def _child(tree: str, paths: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent))
    if tree != ".":
        import bench_analyze

        bench_analyze._use_tree(Path(tree))
    from ranktrace.analyzers import api

    for p in paths:
        try:
            v = api.analyze([Path(p)], liveness=None).verdict.to_dict()
            out: dict[str, Any] = {"path": p, "verdict": v}
        except Exception as e:  # noqa: BLE001 - reported, compared like a verdict
            out = {"path": p, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)
    return 0


def run(tree: str, env_pairs: list[str], paths: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(kv.split("=", 1) for kv in env_pairs)
    proc = subprocess.run([sys.executable, str(HERE), "--child", tree, *paths], capture_output=True, text=True,
                          env=env)
    got = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            got[d["path"]] = d.get("verdict", {"error": d.get("error")})
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    return got


def diff(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'b' if k not in a else 'a'}")
            else:
                out.extend(diff(a[k], b[k], f"{where}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in diff(p, q, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {json.dumps(a, default=str)[:300]} != {json.dumps(b, default=str)[:300]}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default=".", help="build A: a source tree, or . for this one")
    ap.add_argument("--b", default=".")
    ap.add_argument("--env-a", action="append", default=[], metavar="K=V")
    ap.add_argument("--env-b", action="append", default=[], metavar="K=V")
    ap.add_argument("--ignore", action="append", default=[], help="top-level verdict keys not compared")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child, args.paths)
    a, b = run(args.a, args.env_a, args.paths), run(args.b, args.env_b, args.paths)
    bad = 0
    for p in args.paths:
        va, vb = a.get(p), b.get(p)
        if va is None or vb is None:
            print(f"{p}: no result from {'a' if va is None else 'b'}")
            bad += 1
            continue
        for k in args.ignore:
            va.pop(k, None)
            vb.pop(k, None)
        d = diff(va, vb)
        if d:
            bad += 1
            print(f"{p}: {len(d)} difference(s)")
            for line in d[:12]:
                print(f"  {line}")
        else:
            print(f"{p}: identical ({va.get('status')} {va.get('kind')} {va.get('culprit_ranks')})"
                  if "error" not in va else f"{p}: both fail alike")
    print(f"{len(args.paths) - bad} of {len(args.paths)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
