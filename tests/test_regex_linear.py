"""Every regular expression that runs on user input is linear in the text it reads (issue #16).

An unanchored pattern that opens with an unbounded run (``[^\\s:]+:\\d+``, ``\\s*X``) retries that run from every
position of a line that never matches: quadratic. The NCCL-log sniffer took 47 s on one 64 KiB line and a 100 KB
vLLM log with one base64 line took 65 s. This test collects every pattern the analyzers (and redact, which reads
command lines) compile — module attributes, walked into dicts, tuples and dataclasses, plus every literal pattern
passed to ``re.*`` in the source — and times each on hostile lines built from its own literals and character
classes, at two lengths: 4x the text must cost about 4x the time, never ~16x.

The catalogue's family signatures are only ever used with ``.match()`` on a line (catalogue.Family says so), so
they are timed that way; every other pattern is timed with ``.search()``, the worst use.
"""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, trace_env

SCAN = r'''
import ast, importlib, json, pkgutil, re, sys, time
from pathlib import Path
try:
    from re import _parser as P, _constants as C
except ImportError:
    import sre_parse as P, sre_constants as C

ROOT = Path(sys.argv[1])
pats = {}            # (pattern, flags) -> [compiled, where, mode]


def add(p, where, mode, literal=False):
    if isinstance(p, re.Pattern):
        key = (p.pattern, p.flags)
        if key not in pats:
            pats[key] = [p, where, mode]
        elif mode == "search" and (literal or not pats[key][1].startswith("catalogue.")):
            pats[key][2] = "search"   # used both ways somewhere: the worse one counts


def walk(obj, where, mode="search", depth=0, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, re.Pattern):
        add(obj, where, mode)
    elif isinstance(obj, dict):
        for v in obj.values():
            walk(v, where, mode, depth + 1, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            walk(v, where, mode, depth + 1, seen)
    elif hasattr(obj, "__dataclass_fields__"):
        for f in obj.__dataclass_fields__:
            walk(getattr(obj, f, None), where, mode, depth + 1, seen)


import ranktrace.analyzers
from ranktrace.analyzers.readers import catalogue
for fam in catalogue.FAMILIES:      # matched with .match() on each line (catalogue.Family)
    add(fam.signatures, f"catalogue.{fam.name}", "match")
for m in pkgutil.walk_packages(ranktrace.analyzers.__path__, "ranktrace.analyzers."):
    mod = importlib.import_module(m.name)
    for k, v in vars(mod).items():
        walk(v, f"{m.name}.{k}")
import ranktrace.tracer.formats.redact as redact
for k, v in vars(redact).items():
    walk(v, f"ranktrace.tracer.formats.redact.{k}")
for f in sorted((ROOT / "analyzers").rglob("*.py")) + sorted((ROOT / "tracer" / "formats").rglob("*.py")):
    for node in ast.walk(ast.parse(f.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re" and node.args):
            try:
                src = eval(compile(ast.Expression(node.args[0]), "pattern", "eval"), {"__builtins__": {}}, {})
                p = re.compile(src)
            except Exception:
                continue
            add(p, f"{f.relative_to(ROOT)}:{node.lineno}",
                "match" if node.func.attr in ("match", "fullmatch") else "search", literal=True)


def literals(p):
    src = p.pattern.decode("latin1") if isinstance(p.pattern, bytes) else p.pattern
    try:
        tree = P.parse(src, p.flags & ~re.UNICODE if isinstance(p.pattern, bytes) else p.flags)
    except Exception:
        return []
    out = []

    def go(seq):
        run = []
        for op, av in seq:
            if op is C.LITERAL:
                run.append(chr(av))
                continue
            if run:
                out.append("".join(run))
                run = []
            if op is C.SUBPATTERN:
                go(av[-1])
            elif op is C.BRANCH:
                for b in av[1]:
                    go(b)
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                go(av[2])
            elif op in (C.ASSERT, C.ASSERT_NOT):
                go(av[1])
            elif op is C.IN:
                out.extend(chr(a) for o, a in av if o is C.LITERAL)
        if run:
            out.append("".join(run))
    go(tree)
    return [s for s in dict.fromkeys(out) if 0 < len(s) <= 40][:30]


BASE = list("aA0 \t\n/.:-_[]()\"'=,\\#<>{}|@;+*%") + ["\u00e9"]
WORDS = ("ab", "a ", "0:", "a:", "a.", "a/", "[a", "a=", " x", "a:1:", "0 ")


def hostile(p, n):
    src = p.pattern.decode("latin1") if isinstance(p.pattern, bytes) else p.pattern
    chars = set(BASE) | {c for c in src if c.isprintable()}
    out = [c * n for c in sorted(chars)] + [w * (n // len(w)) for w in WORDS]
    for lit in literals(p):
        for w in (lit, lit + "a", lit + " ", "a" + lit, lit + "0"):
            out.append(w * max(1, n // len(w)))
    return out


def cost(p, mode, s):
    run = p.match if mode == "match" else p.search
    t = time.perf_counter()
    try:
        run(s)
    except Exception:
        pass
    return time.perf_counter() - t


N = 2000
bad = []
spent = []
for (src, _flags), (p, where, mode) in pats.items():
    t0 = time.perf_counter()
    enc = (lambda s: s.encode("utf-8", "replace")) if isinstance(src, bytes) else (lambda s: s)
    worst, worst_s = 0.0, ""
    for s in hostile(p, N):
        d = cost(p, mode, enc(s))
        if d > worst:
            worst, worst_s = d, s
    if worst > 0.002:   # slow enough to matter: does it grow faster than the text?
        small = min(cost(p, mode, enc(worst_s)) for _ in range(2))
        big = cost(p, mode, enc(worst_s * 4))
        if big > 0.05 and big / max(small, 1e-9) > 8:
            bad.append({"where": where, "mode": mode, "pattern": (src if isinstance(src, str) else src.decode("latin1"))[:160],
                        "input": worst_s[:12], "seconds_at_8k": round(big, 3), "growth_x4": round(big / max(small, 1e-9), 1)})
    spent.append((time.perf_counter() - t0, where))
print(json.dumps({"patterns": len(pats), "quadratic": bad, "slowest": sorted(spent, reverse=True)[:15]}))
'''


def test_every_pattern_on_user_input_is_linear(tmp_path: Path):
    res = subprocess.run([sys.executable, "-c", SCAN, str(REPO)], capture_output=True, text=True, env=trace_env(),
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["patterns"] > 300  # the collection found the analyzers' patterns at all
    assert out["quadratic"] == [], json.dumps(out["quadratic"], indent=1)


def test_the_nccl_sniffer_on_a_long_base64_line_is_fast():
    """The reported case: the NCCL-log sniffer took 47 s on one 64 KiB line."""
    import base64
    import os
    import time

    from ranktrace.analyzers.readers.nccl_log import grammar

    line = base64.b64encode(os.urandom(3 * (64 << 10) // 4))
    t = time.perf_counter()
    grammar.SNIFF_RE.search(line)
    list(grammar.MARKER_RE.finditer(line.decode()))
    assert time.perf_counter() - t < 0.5
