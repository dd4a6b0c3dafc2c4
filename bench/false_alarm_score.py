"""Score `trace analyze` on the false-alarm corpus (tests/data/false_alarm/<case>/: healthy or finished artifacts).

Every case is a run that finished, a server that is up (idle or serving), or a healthy job stopped from outside;
its case.json says which ("truth": completed | no_hang | idle | stopped) and what in the files establishes it.
None of them may get a hang or crash verdict, and none may name a culprit rank.

Each case is analysed as a user would (`trace analyze <its files>`): in this process through
`ranktrace.analyzers.api.analyze(paths, liveness=None)` by default, or with --subprocess in a fresh
`python -m ranktrace.cli analyze --json --no-snapshot` per case. Prints per case status/kind/culprits, then per split
(tune / holdout / holdout2 / all; holdout2 is round 2's fresh held-out split, collected after round 1's
holdout had been looked at):

* alarms   — hang or crashed verdicts (must be 0);
* culprits — cases whose verdict names any culprit rank (must be 0);
* right    — the status agrees with the truth: completed for a finished run (completed or idle for no_hang: the
             run made progress and nothing shows a stall), idle for a server (or interrupted/stopped when the case
             says the server was then stopped from outside), interrupted/stopped for a job stopped from outside;
* inconclusive — not a false alarm, not right either; errors — the analysis raised or printed no JSON.

A file name in case.json that starts with ``../shared/`` is relative to the repository root (CI lays ``shared/``
beside the clone; RANKTRACE_SHARED overrides where it is); every other one is relative to the case folder.
`--json FILE` writes the table and totals; `--strict` exits 1 on any alarm or culprit.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "false_alarm"
SHARED = Path(os.environ.get("RANKTRACE_SHARED", REPO.parent / "shared"))

ALARM = {"hang", "crashed"}
#: the splits, in print order; nobody tunes the analyzer on a holdout split
SPLITS = ("tune", "holdout", "holdout2")
# what a verdict's status may be for each truth to count as right
RIGHT = {
    "completed": {"completed"},
    "no_hang": {"completed", "idle"},
    "idle": {"idle"},
    "stopped": {"interrupted", "stopped"},
}


def load_cases(root: Path = CORPUS) -> list[dict[str, Any]]:
    cases = []
    for case_json in sorted(root.glob("*/case.json")):
        case = json.loads(case_json.read_text())
        case["id"] = case_json.parent.name
        case["dir"] = case_json.parent
        cases.append(case)
    return cases


def case_paths(case: dict[str, Any]) -> list[Path]:
    out = []
    for f in case["files"]:
        if f.startswith("../shared/"):
            out.append(SHARED / f[len("../shared/"):])
        else:
            out.append(case["dir"] / f)
    return out


def analyze_case(case: dict[str, Any], subprocess_mode: bool = False) -> dict[str, Any]:
    paths = case_paths(case)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        return {"status": "error", "kind": f"missing input: {missing}"}
    if not subprocess_mode:
        from ranktrace.analyzers import api

        try:
            return api.analyze(paths, liveness=None).verdict.to_dict()
        except Exception as e:  # an InputError or a crash is a wrong answer, never a crashed scorer
            return {"status": "error", "kind": f"{type(e).__name__}: {str(e)[:200]}"}
    res = subprocess.run([sys.executable, "-m", "ranktrace.cli", "analyze", "--json", "--no-snapshot",
                          *map(str, paths)], capture_output=True, text=True, timeout=300, cwd=REPO)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "kind": f"rc={res.returncode}: {res.stderr.strip()[-300:]}"}


def judge(case: dict[str, Any], v: dict[str, Any]) -> dict[str, Any]:
    status = v.get("status")
    truth = case["truth"]
    ok_statuses = set(RIGHT.get(truth, set()))
    if truth == "idle" and case.get("stopped_after"):
        ok_statuses |= RIGHT["stopped"]
    culprits = v.get("culprit_ranks") or []
    return {
        "id": case["id"], "split": case.get("split", "tune"), "truth": truth,
        "status": status, "kind": v.get("kind"), "op": (v.get("operation") or {}).get("name"),
        "culprits": culprits,
        "alarm": status in ALARM, "has_culprit": bool(culprits),
        "right": status in ok_statuses, "inconclusive": status == "inconclusive", "error": status == "error",
    }


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "cases": len(rows),
        "alarms": sum(r["alarm"] for r in rows),
        "culprits": sum(r["has_culprit"] for r in rows),
        "right": sum(r["right"] for r in rows),
        "inconclusive": sum(r["inconclusive"] for r in rows),
        "errors": sum(r["error"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGPIPE"):  # `... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=CORPUS)
    ap.add_argument("--subprocess", action="store_true", help="a fresh `trace analyze` process per case")
    ap.add_argument("--json", nargs="?", const="-", help="write the table and totals as JSON (to FILE, or - for stdout)")
    ap.add_argument("--split", choices=list(SPLITS), help="only this split")
    ap.add_argument("-k", help="only cases whose id contains this")
    ap.add_argument("--strict", action="store_true", help="exit 1 on any alarm or culprit")
    args = ap.parse_args(argv)
    cases = [c for c in load_cases(args.root)
             if (not args.k or args.k in c["id"]) and (not args.split or c.get("split", "tune") == args.split)]
    rows = []
    quiet = args.json == "-"
    for case in cases:
        r = judge(case, analyze_case(case, args.subprocess))
        rows.append(r)
        if not quiet:
            mark = "ALARM" if r["alarm"] else ("BLAME" if r["has_culprit"] else ("ok   " if r["right"] else "-    "))
            print(f"{mark} {r['id']:<40} {r['split']:<8} truth {r['truth']:<9} got {r['status']}/{r['kind']}"
                  f"{'/' + str(r['op']) if r['op'] else ''}{' culprits ' + str(r['culprits']) if r['culprits'] else ''}",
                  flush=True)
    by_split = {s: totals([r for r in rows if r["split"] == s]) for s in SPLITS}
    by_split["all"] = totals(rows)
    if not quiet:
        print()
        print(f"{'split':<8} {'cases':>5} {'alarms':>6} {'culprits':>8} {'right':>5} {'inconcl':>7} {'errors':>6}")
        for s, t in by_split.items():
            print(f"{s:<8} {t['cases']:>5} {t['alarms']:>6} {t['culprits']:>8} {t['right']:>5} {t['inconclusive']:>7}"
                  f" {t['errors']:>6}")
    if args.json:
        out = json.dumps({"cases": rows, "totals": by_split}, indent=2)
        if args.json == "-":
            print(out)
        else:
            Path(args.json).write_text(out + "\n")
    bad = by_split["all"]["alarms"] + by_split["all"]["culprits"]
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
