"""Score `trace analyze` on the field corpus (tests/field/<case>/: artifacts as posted + case.json truth).

Each case is analysed exactly as a user would (`trace analyze <its files> --json`, in a fresh process by default,
or in-process with --inproc for speed) and compared with the truth written from its public thread:

* right   — the verdict agrees on everything the truth establishes: hang-or-not (a run that finished or is serving
            must not get a hang/crash verdict), the kind (with the equivalences below), the operation where the
            truth names one, and the culprit ranks where the truth names them;
* files-alone — the same, counted over the cases whose truth a careful engineer gets from the files alone.

Prints right/total overall, by evidence family and by truth kind, and the cases that were wrong with what we said;
then the same per split (case.json "split": a set collected together, e.g. "holdout3", kept apart so that no reader
change is tuned on it; cases without one are "original"), each with its files-alone count and its families.
`--json` writes the per-case table; `--min N` exits 1 when fewer than N cases are right (the regression test);
`--split NAME` scores only that split.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO / "tests" / "field"

# kinds that answer the same question for a person: "who is stuck and who waits" with the op named
_HANG_STATUSES = {"hang", "crashed"}
_EQUIVALENT_KINDS = {
    # a watchdog-aborted job whose laggards are named is missing_ranks; one that names none is stuck; either reads
    # right when the truth does not name culprits
}


def load_cases(root: Path = FIELD) -> list[dict[str, Any]]:
    cases = []
    for case_json in sorted(root.glob("*/case.json")):
        case = json.loads(case_json.read_text())
        case["id"] = case_json.parent.name
        case["dir"] = case_json.parent
        cases.append(case)
    return cases


def split_of(case: dict[str, Any]) -> str:
    """The set a case was collected in; the first corpus has none."""
    return str(case.get("split") or "original")


class SplitScore:
    """Right / total, files-alone and per-family counts of one split."""

    def __init__(self) -> None:
        self.right = self.total = self.alone_right = self.alone_total = 0
        self.by_family: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def add(self, case: dict[str, Any], ok: bool) -> None:
        self.right += ok
        self.total += 1
        if case.get("files_alone"):
            self.alone_total += 1
            self.alone_right += ok
        for fam in case.get("families", []) or ["?"]:
            self.by_family[fam][0] += ok
            self.by_family[fam][1] += 1


def analyze_case(case: dict[str, Any], inproc: bool) -> dict[str, Any]:
    files = [str(case["dir"] / f) for f in case["files"]]
    if inproc:
        from ranktrace.analyzers import api

        try:
            return api.analyze([Path(f) for f in files], liveness=None).verdict.to_dict()
        except Exception as e:  # a crash is a wrong answer, never a crashed scorer
            return {"status": "error", "kind": f"{type(e).__name__}: {e}"}
    res = subprocess.run([sys.executable, "-m", "ranktrace.cli", "analyze", "--json", "--no-snapshot", *files],
                         capture_output=True, text=True, timeout=120)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        return {"status": "error", "kind": f"rc={res.returncode}: {res.stderr.strip()[-300:]}"}


def judge(truth: dict[str, Any], v: dict[str, Any]) -> tuple[bool | None, str]:
    """(right, why not) of verdict `v` against `truth`; right is None for a case the truth cannot score."""
    t_status, t_kind = truth.get("status"), truth.get("kind")
    v_status, v_kind = v.get("status"), v.get("kind")
    if t_kind is None and t_status is None:
        return None, "the thread establishes neither status nor kind: not scored"
    if t_kind == "no_hang" or t_status in ("completed", "idle"):
        ok = v_status not in _HANG_STATUSES
        return ok, "" if ok else f"said {v_status}/{v_kind} on a run that {t_status}"
    if v_status not in _HANG_STATUSES:
        return False, f"said {v_status}/{v_kind}"
    if t_kind is not None and v_kind != t_kind and not _kinds_agree(t_kind, v_kind, truth):
        return False, f"kind {v_kind} != {t_kind}"
    t_op = truth.get("op")
    v_op = (v.get("operation") or {}).get("name")
    if t_op and not _ops_agree(t_op, v_op):
        return False, f"op {v_op} != {t_op}"
    t_culprits = truth.get("culprit_ranks")
    if t_culprits:
        got = sorted(v.get("culprit_ranks") or [])
        if got != sorted(t_culprits):
            return False, f"culprits {got} != {sorted(t_culprits)}"
    return True, ""


def _kinds_agree(t_kind: str, v_kind: str, truth: dict[str, Any]) -> bool:
    # a rank that exited is the culprit of missing_ranks too: the two differ only in whether the exit is seen
    if {t_kind, v_kind} == {"missing_ranks", "rank_exited"}:
        return True
    return False


def _ops_agree(t_op: str, v_op: str | None) -> bool:
    if not v_op:
        return False
    from ranktrace.tracer.formats.opnames import canonical_op

    a, b = canonical_op(t_op), canonical_op(v_op)
    families = [{"all_gather", "all_gather_into_tensor", "all_gather_coalesced"},
                {"reduce_scatter", "reduce_scatter_tensor"}, {"all_to_all", "all_to_all_single"},
                {"barrier", "monitored_barrier"}, {"send", "isend"}, {"recv", "irecv"}]
    return a == b or any(a in f and b in f for f in families)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=FIELD)
    ap.add_argument("--inproc", action="store_true", help="analyse in this process (faster; same verdicts)")
    ap.add_argument("--json", type=Path, help="write the per-case table here")
    ap.add_argument("--min", type=int, default=0, help="exit 1 when fewer cases are right")
    ap.add_argument("-k", help="only cases whose id contains this")
    ap.add_argument("--split", help="only cases of this split (see the module docstring)")
    ap.add_argument("-v", action="store_true", help="print every case")
    args = ap.parse_args(argv)
    cases = [c for c in load_cases(args.root) if (not args.k or args.k in c["id"])
             and (not args.split or split_of(c) == args.split)]
    rows = []
    by_family: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    splits: dict[str, SplitScore] = defaultdict(SplitScore)
    right = alone_right = alone_total = unscored = 0
    for case in cases:
        v = analyze_case(case, args.inproc)
        ok, why = judge(case["truth"], v)
        if ok is None:
            unscored += 1
            continue
        right += ok
        splits[split_of(case)].add(case, ok)
        if case.get("files_alone"):
            alone_total += 1
            alone_right += ok
        for fam in case.get("families", []) or ["?"]:
            by_family[fam][0] += ok
            by_family[fam][1] += 1
        kind = case["truth"].get("kind") or f"({case['truth'].get('status')})"
        by_kind[kind][0] += ok
        by_kind[kind][1] += 1
        rows.append({"id": case["id"], "split": split_of(case), "right": ok, "why": why, "status": v.get("status"), "kind": v.get("kind"),
                     "op": (v.get("operation") or {}).get("name"), "culprits": v.get("culprit_ranks"),
                     "truth": case["truth"]})
        if args.v or not ok:
            t = case["truth"]
            print(f"{'ok ' if ok else 'BAD'} {case['id']:<26} truth {t.get('status')}/{t.get('kind')}/{t.get('op')}"
                  f"/{t.get('culprit_ranks')}  got {v.get('status')}/{v.get('kind')}/"
                  f"{(v.get('operation') or {}).get('name')}/{v.get('culprit_ranks')}  {why}")
    print()
    print("by family:")
    for fam, (r, n) in sorted(by_family.items(), key=lambda kv: -kv[1][1]):
        print(f"  {fam:<22} {r:>3}/{n}")
    print("by truth kind:")
    for kind, (r, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<26} {r:>3}/{n}")
    if len(splits) > 1 or args.split:
        print("by split (right; files alone; by family):")
        for name, sc in sorted(splits.items()):
            print(f"  {name:<12} {sc.right:>3}/{sc.total}; files alone {sc.alone_right}/{sc.alone_total}; "
                  + ", ".join(f"{fam} {r}/{n}" for fam, (r, n) in sorted(sc.by_family.items(), key=lambda kv: -kv[1][1])))
    scored = len(cases) - unscored
    print(f"\nright: {right}/{scored} ({100 * right / max(1, scored):.0f}%); files alone: {alone_right}/{alone_total}"
          + (f"; {unscored} case(s) not scored (truth unknown)" if unscored else ""))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0 if right >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
