"""`trace compare A B`: two runs side by side (good vs hung, Hopper vs Blackwell, NCCL_P2P_DISABLE=1 vs not), on
anything `trace analyze` reads (run dirs, folders of NCCL logs, nsys exports, Kineto traces, Flight Recorder dumps).
Both go through the same API as `trace analyze`; the answers come in the order a person asks them:

1. hardware and software (:mod:`.facts`): GPU model and compute capability, driver, CUDA, NCCL, torch, framework
   versions, topology, P2P, IOMMU/ACS, environment that matters — differences first;
2. what NCCL decided (:mod:`.decisions`): per communicator and rank, across the runs and between the ranks of each;
3. outcome: both verdicts;
4. where B departed from A (:mod:`.sequences`): the first divergence of each rank's (phase, group, op, seq, shape)
   sequence — unless A and B are different jobs, which is said instead;
5. timings (:mod:`.timings`): phase durations and per-op latency distributions with ratios.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.compare import decisions, facts, sequences, timings
from ranktrace.analyzers.compare.whole import RunTables, run_tables
from ranktrace.analyzers.model.values import Analysis, Comparison, Divergence, Liveness

__all__ = ["Comparison", "Divergence", "compare_paths", "compare_analyses", "describe_inputs"]


_INPUT_NAMES = {"nccl_log": "NCCL log", "nsys": "nsys export", "kineto": "Kineto trace",
                "flight_recorder": "Flight Recorder dump", "pyspy": "py-spy dump", "watchdog": "watchdog log",
                "server_log": "server log", "nvidia_smi": "nvidia-smi output"}


def describe_inputs(an: Analysis) -> str:
    """What a run was made of, in a few words ("ranktrace run, 4 ranks; 2 NCCL logs")."""
    parts = []
    if an.hosts:
        n = facts.world_size(an)
        parts.append(f"ranktrace run{'' if len(an.hosts) == 1 else f' on {len(an.hosts)} hosts'}"
                     + (f", {n} ranks" if n else ""))
    kinds: dict[str, int] = {}
    for read in an.verdict.input_reads:
        for family in read.recognised:
            if family in _INPUT_NAMES:
                kinds[family] = kinds.get(family, 0) + 1
    exports = sum(1 for f in an.files if Path(f).parent.name == "nsys" and f.endswith(".sqlite"))  # trace run --nsys
    if exports:
        kinds["nsys"] = kinds.get("nsys", 0) + exports
    parts += [f"{n} {_INPUT_NAMES[k]}{'s' if n > 1 else ''}" for k, n in sorted(kinds.items())]
    return "; ".join(parts) or "no recognised input"


def _command(an: Analysis) -> str | None:
    cmd = an.meta().get("command")
    return " ".join(map(str, cmd)) if cmd else None


def compare_analyses(ra: Analysis, rb: Analysis, a: str, b: str, *, tables: tuple[RunTables, RunTables] | None = None
                     ) -> Comparison:
    """Compare two analyses (see the module docstring for the five answers). `tables`: each run's every record and
    op (whole.run_tables), where the analyses read a window of them; the sequences and timings come from these."""
    ta, tb = tables or (RunTables(ra.events, ra.ops, "analysis"), RunTables(rb.events, rb.ops, "analysis"))
    cmp = Comparison(a, b, a_inputs=describe_inputs(ra), b_inputs=describe_inputs(rb))
    fa, fb = facts.run_facts(ra), facts.run_facts(rb)
    cmp.context_diff = facts.context_diff(fa, fb, env_a=facts.env_known(ra), env_b=facts.env_known(rb))
    da, db = decisions.run_decisions(ra), decisions.run_decisions(rb)
    cmp.nccl_diff = (decisions.decisions_diff(da, db) + decisions.odd_ranks(da, "within_a")
                     + decisions.odd_ranks(db, "within_b"))
    if da.empty != db.empty:
        cmp.notes.append(f"only {'A' if db.empty else 'B'} has NCCL INFO lines: NCCL's decisions are shown for one "
                         "side only")
    cmp.verdict_a, cmp.verdict_b = ra.verdict, rb.verdict
    src_a, src_b = sequences.choose_source(sequences.op_sources(ta), sequences.op_sources(tb))
    with ThreadPoolExecutor(max_workers=2) as pool:   # each run's own work side by side (numpy and arrow let go
        seqs = pool.map(sequences.op_sequences, (ta, tb), (src_a, src_b))   # of the GIL)
        durations = pool.map(timings.phase_durations, (ta, tb))
        lat = pool.map(timings.latency, (ta, tb))
        (sa, sb), (pha, phb), (la, lb) = list(seqs), list(durations), list(lat)
    wa, wb = facts.world_size(ra), facts.world_size(rb)
    with_shapes = wa is None or wb is None or wa == wb
    cmp.related, cmp.relation = sequences.relatedness(sa, sb, _command(ra), _command(rb), with_shapes=with_shapes)
    notes = []
    if sa.source and sb.source:
        notes.append(f"sequences from {sa.source}" + ("" if sa.source == sb.source else f" (A) and {sb.source} (B)"))
    if not with_shapes:
        notes.append(f"world size {wa} vs {wb}: shapes left out of the comparison (a sharded shape follows the "
                     "world size)")
    only_a, only_b = sorted(sa.ranks - sb.ranks), sorted(sb.ranks - sa.ranks)
    if only_a or only_b:
        notes.append("ranks only in " + "; ".join(x for x in (f"A: {only_a}" if only_a else "",
                                                              f"B: {only_b}" if only_b else "") if x))
    if not sa.bounds and not sb.bounds:
        cmp.sequence_note = "no op sequence in either input: nothing to align"
    elif not sa.bounds or not sb.bounds:
        cmp.sequence_note = f"no op sequence in {'A' if not sa.bounds else 'B'}: nothing to align"
    else:
        cmp.sequence_note = "; ".join(notes)
    if cmp.related:
        cmp.first_divergence = sequences.first_divergence(sa, sb, with_shapes=with_shapes)
    cmp.op_counts = sequences.op_counts(sa, sb)
    cmp.phases = timings.phases_side_by_side(pha, phb)
    cmp.latency = timings.latency_side_by_side(la, lb)
    return cmp


def compare_paths(a: Path, b: Path, *, liveness: Liveness | None) -> Comparison:
    """Analyze both as `trace analyze` would (`liveness` as for ``api.analyze``: one value may cover both runs)
    and compare them, the sequences and timings over every op of each run (whole.run_tables). The two runs are
    read side by side. Raises api.InputError when either has nothing readable."""
    results: dict[str, tuple[Analysis, RunTables]] = {}
    errors: dict[str, BaseException] = {}

    def one(key: str, path: Path) -> None:
        try:
            an = api.analyze([path], liveness=liveness)
            results[key] = (an, run_tables(an, path, liveness=liveness))
        except BaseException as e:  # re-raised below, in the caller's thread (A's first)
            errors[key] = e

    t = threading.Thread(target=one, args=("b", b), daemon=True)
    t.start()
    one("a", a)
    t.join()
    for key in ("a", "b"):
        if key in errors:
            raise errors[key]
    (ra, ta), (rb, tb) = results["a"], results["b"]
    return compare_analyses(ra, rb, str(a), str(b), tables=(ta, tb))
