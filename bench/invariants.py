"""Count violations of the verdict invariants (issue #25) over every input we have: the field corpus (tests/field),
the false-alarm corpus (tests/data/false_alarm), the captured runs and scenarios in tests/data.

The invariants, each checked on every case:

1. witness     — a culprit is a rank some input says something about (never one of the verdict's unobserved ranks);
2. completion  — a false-alarm case (finished, serving, or stopped healthy) gets no hang / crash and no culprit;
3. stop        — a run stopped from outside with no hang before it (false-alarm truth "stopped") is interrupted /
                 stopped with no culprit;
4. agreement   — the headline, the per-rank table, the JSON and the HTML say the same thing: text headline ==
                 "STATUS · kind" of the JSON, the ranks marked `*` in the table are the culprits, the page carries the
                 same headline, and no rank the verdict calls waiting in a collective is "outside communication" in
                 the table, nor a serving/idle verdict shown over a rank "blocked outside communication";
5. one finding — no hang-kind finding is told twice, and none blames (rank_exited, missing_ranks, mismatch)
                 ranks disjoint from the verdict's culprits;
6. metamorphic — the verdict (status, kind, op, culprits) does not change when the input files are renamed,
                 given in reverse order, or joined by an unrelated file; text files concatenated into one keep it
                 too when each names its rank (checked on cases whose files are all text).

Prints the count per invariant and per corpus and the cases that break each; ``--json FILE`` writes them;
``--strict`` exits 1 on any violation (tests/test_invariants.py runs the same checks).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RANKTRACE_SHARED", REPO.parent / "shared"))
HANG_STATUSES = {"hang", "crashed"}
HANG_KINDS = {"missing_ranks", "collective_mismatch", "stuck_in_collective", "graph_capture", "init_hang",
              "rank_exited", "blocked_outside_collective", "wait_cycle"}
UNRELATED = "Build notes\n===========\nThis file lists the packages installed on the image.\nnumpy 2.1\npyarrow 17\n"


def _case_files(case_dir: Path, files: list[str]) -> list[Path]:
    out = []
    for f in files:
        if f.startswith("../shared/"):
            out.append(SHARED / f[len("../shared/"):])
        else:
            out.append(case_dir / f)
    return out


def cases(which: set[str] | None = None) -> Iterator[tuple[str, str, list[Path], dict[str, Any]]]:
    """(corpus, case id, input paths, truth) for every case of every corpus."""
    if which is None or "field" in which:
        for cj in sorted((REPO / "tests" / "field").glob("*/case.json")):
            c = json.loads(cj.read_text())
            yield "field", cj.parent.name, [cj.parent / f for f in c["files"]], c.get("truth") or {}
    if which is None or "false_alarm" in which:
        for cj in sorted((REPO / "tests" / "data" / "false_alarm").glob("*/case.json")):
            c = json.loads(cj.read_text())
            yield "false_alarm", cj.parent.name, _case_files(cj.parent, c["files"]), {"fa": c.get("truth")}
    if which is None or "runs" in which:
        for d in sorted((REPO / "tests" / "data" / "runs").iterdir()):
            if d.is_dir():
                yield "runs", d.name, [d], {}
        for d in sorted((REPO / "tests" / "data" / "scenarios").iterdir()):
            if d.is_dir():
                yield "scenarios", d.name, [d], {}


def analyze(paths: list[Path]) -> Any:
    from ranktrace.analyzers import api

    return api.analyze(paths, liveness=None)


def brief(v: dict[str, Any]) -> tuple:
    return v["status"], v["kind"], (v.get("operation") or {}).get("name"), tuple(v.get("culprit_ranks") or ())


def check_witness(analysis: Any) -> str | None:
    """Culprits are ranks some input speaks about: a rank of our records, a stack, an observation, or a rank the
    evidence of the verdict's own finding names (a stall inspector's list)."""
    v = analysis.verdict.to_dict()
    culprits = set(v.get("culprit_ranks") or ())
    if not culprits:
        return None
    seen: set[int] = set()
    for t in (analysis.events, analysis.stacks, analysis.observations):
        if t.num_rows and "rank" in t.column_names:
            seen |= {r for r in t["rank"].to_pylist() if r is not None}
    for f in v["findings"]:
        if f["kind"] != v["kind"]:
            continue
        if v.get("world_size") and any(e.get("source") == "events" for e in f["evidence"]):
            seen |= set(range(v["world_size"]))  # our own init records state the world: its ranks are named by it
        if any((e.get("detail") or "").startswith("stated") for e in f["evidence"]):
            seen |= set(f["ranks"])  # an input's own list of the ranks (stall inspector, FR analyzer)
        for e in f["evidence"]:
            if e.get("rank") is not None:
                seen.add(e["rank"])
            seen |= {int(x) for x in re.findall(r"\b\d+\b", e.get("detail") or "") if int(x) < 1 << 20}
    bad = culprits - seen
    return f"culprits {sorted(bad)} are ranks no input mentions" if bad else None


def check_false_alarm(v: dict[str, Any], truth: str) -> str | None:
    if v["status"] in HANG_STATUSES:
        return f"{v['status']}/{v['kind']} on a {truth} case"
    if v.get("culprit_ranks"):
        return f"culprits {v['culprit_ranks']} on a {truth} case"
    if truth == "stopped" and v["status"] not in ("interrupted", "stopped", "completed", "idle", "inconclusive"):
        return f"{v['status']} on a run stopped from outside"
    return None


def check_agreement(analysis: Any) -> str | None:
    from ranktrace.analyzers.report import html_report, text_report

    v = analysis.verdict
    d = v.to_dict()
    text = text_report.render(v) if hasattr(text_report, "render") else ""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    want = f"{d['status'].upper()} · {d['kind']}"
    if text and first.strip() != want:
        return f"text headline {first.strip()!r} != JSON {want!r}"
    starred = set()
    for ln in text.splitlines():
        m = re.match(r"^([0-9][0-9,\-]*)\s+\*\s+│", ln)
        if m:
            starred |= _expand(m.group(1))
    if text and "┃" in text and starred != set(d.get("culprit_ranks") or ()):
        return f"table marks {sorted(starred)} but culprits are {d.get('culprit_ranks')}"
    page = html_report.render(analysis)
    if d["status"].upper() not in page or d["kind"] not in page:
        return "report.html lacks the headline"
    states = {int(r): s.get("state") for r, s in (d.get("ranks") or {}).items()}
    if d["kind"] in ("stuck_in_collective", "missing_ranks") and d["status"] in HANG_STATUSES | {"hang"}:
        outside = [r for r in d.get("waiting_ranks") or () if states.get(r) in ("blocked_other", "idle_loop")]
        if outside:
            return f"waiting in {d['kind']} but the table says ranks {outside} are outside communication"
    if d["status"] in ("idle", "completed") and any(s == "blocked_other" for s in states.values()):
        return f"{d['status']} over ranks blocked outside communication"
    return None


def _expand(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out |= set(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def check_one_finding(v: dict[str, Any]) -> str | None:
    """One hang, one story: no hang-kind finding repeats another (same kind, same ranks), and none blames ranks the
    verdict does not when the verdict blames someone."""
    if v["kind"] not in HANG_KINDS:
        return None
    culprits = set(v.get("culprit_ranks") or ())
    told: set[tuple] = set()
    for f in v["findings"]:
        if f["kind"] not in HANG_KINDS:
            continue
        key = (f["kind"], tuple(f["ranks"]))
        if key in told:
            return f"finding {f['kind']} {f['ranks']} is told twice"
        told.add(key)
        if f["kind"] != v["kind"] and f["ranks"] and culprits and not set(f["ranks"]) & culprits \
                and f["kind"] in ("rank_exited", "missing_ranks", "collective_mismatch"):
            return f"second finding {f['kind']} blames {f['ranks']}, the verdict {sorted(culprits)}"
    return None


def metamorphic(paths: list[Path], base: tuple) -> str | None:
    """Renamed, reversed, joined by an unrelated file: the same verdict. Only for cases made of plain files."""
    files = [p for p in paths if p.is_file()]
    if len(files) != len(paths) or not files:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        renamed = []
        for i, f in enumerate(files):
            d = t / f"in{i}"
            d.mkdir()
            suffix = "".join(f.suffixes[-2:]) if f.suffix in (".gz", ".json", ".arrow", ".sqlite", ".pickle",
                                                                ".pkl", ".tar") else ""
            # a rank in a file's name is information the file carries: renaming keeps any digits-with-rank
            keep = re.search(r"rank[_-]?\d+", f.name, re.IGNORECASE)
            name = f"posted_{i}{'_' + keep.group(0) if keep else ''}{suffix or '.txt'}"
            shutil.copyfile(f, d / name)
            renamed.append(d / name)
        checks: list[tuple[str, Callable[[], list[Path]]]] = [
            ("renamed", lambda: renamed),
            ("reversed", lambda: list(reversed(files))),
            ("with an unrelated file", lambda: [*files, _unrelated(t)]),
        ]
        for what, make in checks:
            try:
                got = brief(analyze(make()).verdict.to_dict())
            except Exception as e:  # noqa: BLE001 - a crash is a violation, reported as such
                got = ("error", f"{type(e).__name__}: {e}", None, ())
            if got != base:
                return f"{what}: {got} != {base}"
    return None


def _unrelated(t: Path) -> Path:
    p = t / "notes.txt"
    p.write_text(UNRELATED)
    return p


def run(which: set[str] | None = None, metamorphic_checks: bool = True) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {k: [] for k in
                                             ("witness", "completion", "stop", "agreement", "one_finding",
                                              "metamorphic")}
    for corpus, cid, paths, truth in cases(which):
        key = f"{corpus}/{cid}"
        try:
            an = analyze(paths)
        except Exception as e:  # noqa: BLE001
            if "nothing readable" not in str(e):
                out["agreement"].append((key, f"analysis raised {type(e).__name__}: {e}"))
            continue
        v = an.verdict.to_dict()
        why = check_witness(an)
        if why:
            out["witness"].append((key, why))
        why = check_one_finding(v)
        if why:
            out["one_finding"].append((key, why))
        why = check_agreement(an)
        if why:
            out["agreement"].append((key, why))
        fa = truth.get("fa")
        if fa:
            why = check_false_alarm(v, fa)
            if why:
                out["stop" if fa == "stopped" else "completion"].append((key, why))
        if metamorphic_checks and corpus == "field":
            why = metamorphic(paths, brief(v))
            if why:
                out["metamorphic"].append((key, why))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=["field", "false_alarm", "runs"])
    ap.add_argument("--no-metamorphic", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args(argv)
    res = run(set(args.only) if args.only else None, not args.no_metamorphic)
    total = 0
    for name, bad in res.items():
        total += len(bad)
        print(f"{name:<12} {len(bad):>4} violation(s)")
        for key, why in bad[:40]:
            print(f"    {key}: {why}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 1 if args.strict and total else 0


if __name__ == "__main__":
    sys.exit(main())
