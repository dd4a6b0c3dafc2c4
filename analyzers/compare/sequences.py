"""The fourth question of `trace compare`: where did B depart from A? Each rank's issued ops in order, as
(phase, group, op, seq, dtype, shape) keys, encoded to integers jointly for both runs so that a rank's first
difference is one numpy comparison (8 ranks x 1M ops stay interactive); and whether A and B are the same job at all.

Group names that are per-run hashes (an NCCL commId, a communicator pointer) are renamed by order of first use so
that two runs of one job line up. When the world sizes differ, shapes are left out of the key (a sharded tensor's
shape follows the world size), and said so."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.compare.whole import RunTables, codes, decoded, is_in
from ranktrace.analyzers.model.values import Divergence, OpRef

__all__ = ["OpSequences", "op_sequences", "op_sources", "choose_source", "first_divergence", "relatedness", "op_counts",
           "SOURCE_ORDER", "filter_rows"]

#: which evidence gives a rank's sequence when several do (the most direct first)
SOURCE_ORDER = ("events", "fr", "nccl", "nsys", "kineto", "watchdog")
_HASHLIKE = re.compile(r"^(?:0x[0-9a-f]+|comm:|split:)")
_COLS = ("rank", "phase", "group", "name", "seq", "dtype", "shape", "callsite")
_RELATEDNESS_SAMPLE = 200_000   # ops per run whose distinct (op, dtype, shape) decide whether two runs are one job


@dataclass
class OpSequences:
    """One run's issued ops in rank order, as a table with the columns of ``_COLS`` (plus `t`), and where each rank's
    rows start and end."""

    table: pa.Table
    source: str | None
    bounds: dict[int, tuple[int, int]]   # rank -> (first row, end row)

    @property
    def ranks(self) -> set[int]:
        return set(self.bounds)

    def op(self, row: int) -> OpRef:
        r = self.table.slice(row, 1).to_pylist()[0]
        return OpRef(op=r["name"], group=r["group"] or None, seq=None if r["seq"] == -1 else r["seq"],
                     phase=r["phase"] or None, dtype=r["dtype"] or None, shape=r["shape"] or None,
                     callsite=r["callsite"])


def filter_rows(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """``table.filter(mask)``, column by column (Table.filter with a mask chunked unlike the columns is several times
    slower at millions of rows), and nothing at all when every row is kept."""
    if pc.all(pc.fill_null(mask, False)).as_py():
        return table
    return pa.table({name: table[name].filter(mask) for name in table.column_names})


def op_sources(run: RunTables) -> dict[str, int]:
    """source -> issued ops it gave (the ops table has one row per op: a few million at most)."""
    ops = run.ops
    if not ops.num_rows:
        return {}
    values: dict[str, int] = {}
    counts = np.bincount(codes(ops["source"], values), minlength=len(values))
    return {v: int(counts[c]) for v, c in values.items() if v and counts[c]}


def choose_source(counts_a: dict[str, int], counts_b: dict[str, int]) -> tuple[str | None, str | None]:
    """The evidence each run's sequences come from: one both runs have if any (the most direct in SOURCE_ORDER),
    else each run's own best."""
    def best(counts: dict[str, int], among: set[str]) -> str | None:
        for s in SOURCE_ORDER:
            if s in among and counts.get(s):
                return s
        left = [s for s in among if counts.get(s)]
        return max(left, key=lambda k: counts[k]) if left else None

    common = set(counts_a) & set(counts_b)
    if common:
        s = best(counts_a, common)
        return s, s
    return best(counts_a, set(counts_a)), best(counts_b, set(counts_b))


def _group_labels(groups: pa.ChunkedArray, descs: pa.ChunkedArray) -> pa.Array:
    """group_desc where known, else the group; per-run hashes renamed comm#1, comm#2 ... by first use (our own
    group names are stable across runs and pass through). Dictionary-encoded: one code per op, a few labels."""
    values: dict[object, int] = {"": 0}
    base = codes(groups, values)
    if descs.null_count < len(descs):
        d = codes(descs, values)
        base = np.where(d != 0, d, base)
    labels = list(values)
    hashlike = [i for i, n in enumerate(labels) if _HASHLIKE.match(str(n))]
    if hashlike:
        first = {i: int(np.argmax(base == i)) for i in hashlike if np.any(base == i)}
        for k, i in enumerate(sorted(first, key=first.__getitem__)):
            labels[i] = f"comm#{k + 1}"
    return pa.DictionaryArray.from_arrays(pa.array(base, pa.int32()), pa.array(labels, pa.string()))


def _phases(run: RunTables, rank: np.ndarray, t: np.ndarray, t_ok: np.ndarray) -> pa.Array:
    """The phase each op was issued in: the innermost phase span (category ``phase``) open on its rank at its time;
    ops issued inside a CUDA graph capture are in ``graph capture``."""
    ev = run.events
    if not ev.num_rows or not rank.size:
        return pa.nulls(rank.size, pa.string())
    ev = ev.select(["category", "rank", "pid", "span_id", "kind", "name", "t_ns"])
    ph = filter_rows(ev, pa.array(is_in(ev["category"], ("phase",))))
    ph = decoded(ph.filter(pc.is_valid(ph["t_ns"])))
    if not ph.num_rows:
        return pa.nulls(rank.size, pa.string())
    spans: dict[tuple[Any, Any, Any], list[Any]] = {}
    for r in ph.select(["rank", "pid", "span_id", "kind", "name", "t_ns"]).to_pylist():
        key = (r["rank"], r["pid"], r["span_id"] if r["span_id"] is not None else r["name"])
        s = spans.setdefault(key, [r["rank"], r["name"], None, None])
        if r["kind"] == "enter" and s[2] is None:
            s[2] = r["t_ns"]
        elif r["kind"] in ("exit", "error"):
            s[3] = r["t_ns"]
    names: list[str] = []
    phase_of = np.full(rank.size, -1, dtype=np.int32)
    cuts = np.flatnonzero(np.diff(rank)) + 1
    slices: dict[int, list[tuple[int, int]]] = {}
    for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [rank.size])).tolist()):
        slices.setdefault(int(rank[a]), []).append((a, b))
    for prank, name, start, end in sorted((s for s in spans.values() if s[0] is not None and s[2] is not None),
                                          key=lambda s: s[2]):
        if name not in names:
            names.append(name)
        stop = end if end is not None else np.iinfo(np.int64).max
        for a, b in slices.get(int(prank), ()):   # a rank's ops only (one slice when ordered by rank)
            part = slice(a, b)
            phase_of[part][t_ok[part] & (t[part] >= start) & (t[part] < stop)] = names.index(name)
    return pa.DictionaryArray.from_arrays(pa.array(phase_of, mask=phase_of < 0), pa.array(names, pa.string()))


def op_sequences(run: RunTables, source: str | None = None) -> OpSequences:
    """Each rank's issued ops in issue order, from one source (see ``SOURCE_ORDER``). The ops table already comes
    ordered by (rank, time of issue) (timeline.build_ops, whole.RunTables), so this only filters. String columns
    stay dictionary-encoded; nulls compare as "" and a missing seq as -1."""
    ops = run.ops
    if source is None:
        source = choose_source(op_sources(run), {})[0]
    if source is None:
        return OpSequences(pa.table({c: pa.array([], pa.string()) for c in _COLS}), None, {})
    ops = ops.select(["rank", "t_enter", "issued", "source", "group", "group_desc", "name", "seq", "dtype",
                      "shape", "callsite", "capturing"])   # filtering few columns is many times faster
    ops = filter_rows(ops, pc.and_(pc.and_(pc.fill_null(ops["issued"], False),
                                           pc.fill_null(pc.equal(ops["source"], source), False)),
                                   pc.is_valid(ops["rank"])))
    rank = np.asarray(ops["rank"].to_numpy(), dtype=np.int64)
    t_np = np.asarray(pc.fill_null(ops["t_enter"], 0).to_numpy(), dtype=np.int64)
    t_ok = np.asarray(pc.is_valid(ops["t_enter"]).to_numpy(zero_copy_only=False), dtype=bool)
    phase = _phases(run, rank, t_np, t_ok)
    capturing = np.asarray(pc.fill_null(ops["capturing"], False).to_numpy(zero_copy_only=False), dtype=bool)
    if capturing.any():
        phase = pc.if_else(pa.array(capturing), pa.scalar("graph capture"), phase.cast(pa.string()))
    table = pa.table({
        "rank": ops["rank"], "phase": phase, "group": _group_labels(ops["group"], ops["group_desc"]),
        "name": ops["name"], "seq": pc.fill_null(ops["seq"], -1), "dtype": ops["dtype"], "shape": ops["shape"],
        "callsite": ops["callsite"],
    })
    bounds: dict[int, tuple[int, int]] = {}
    if rank.size:
        cuts = np.flatnonzero(np.diff(rank)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [rank.size]))
        for s0, e0 in zip(starts.tolist(), ends.tolist()):
            r = int(rank[s0])
            if r in bounds:   # not ordered by rank after all (a source without times): keep the first run
                continue
            bounds[r] = (s0, e0)
    return OpSequences(table, source, bounds)


def first_divergence(sa: OpSequences, sb: OpSequences, *, with_shapes: bool = True) -> list[Divergence]:
    """Per rank present in both runs, the first position where B's (phase, group, op, seq, dtype[, shape]) sequence
    departs from A's (an op one run issued and the other did not, or issued differently). Each column becomes one
    int code per op, jointly for both runs (a dictionary's few values are looked up, not its millions of rows);
    the two runs' aligned slices are then compared element-wise in numpy: no per-op Python, no hashing."""
    keys: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for col in ("phase", "group", "name", "dtype") + (("shape",) if with_shapes else ()):
        values: dict[object, int] = {"": 0}
        keys[col] = (codes(sa.table[col], values), codes(sb.table[col], values))
    # a phase only one run names (a --hook phase in one of them) is no difference of what was issued
    if not all(c.size and np.any(c != 0) for c in keys["phase"]):
        del keys["phase"]
    keys["seq"] = tuple(np.asarray(s.table["seq"].to_numpy(), dtype=np.int64) if s.table.num_rows  # type: ignore
                        else np.empty(0, np.int64) for s in (sa, sb))
    out: list[Divergence] = []
    for r in sorted(sa.ranks & sb.ranks):
        a0, a1 = sa.bounds[r]
        b0, b1 = sb.bounds[r]
        n = min(a1 - a0, b1 - b0)
        same = np.ones(n, dtype=bool)
        for ca, cb in keys.values():
            if not n:
                break
            same &= ca[a0:a0 + n] == cb[b0:b0 + n]
        diff = np.flatnonzero(~same)
        if diff.size:
            pos = int(diff[0])
        elif a1 - a0 != b1 - b0:
            pos = n
        else:
            continue
        oa = sa.op(a0 + pos) if pos < a1 - a0 else None
        ob = sb.op(b0 + pos) if pos < b1 - b0 else None
        out.append(Divergence(r, pos, oa.label() if oa else None, ob.label() if ob else None,
                              oa.callsite if oa else None, ob.callsite if ob else None, oa, ob))
    return out


def _script(command: str | None) -> str | None:
    """The script a command runs (its first ``*.py`` argument), else its program, without directories."""
    if not command or not command.split():
        return None
    toks = command.split()
    tok = next((t for t in toks if t.endswith(".py")), None)
    if tok is None:
        tok = next((t for t in toks[1:] if not t.startswith("-") and toks[0].rsplit("/", 1)[-1].startswith(
            ("python", "torchrun", "uv", "deepspeed"))), toks[0])
    return tok.rsplit("/", 1)[-1]


def relatedness(sa: OpSequences, sb: OpSequences, cmd_a: str | None, cmd_b: str | None, *,
                with_shapes: bool) -> tuple[bool, str]:
    """Are A and B runs of the same job? Yes when they ran the same script, or when most distinct (op, dtype[,
    shape]) of one are also issued by the other; no when both the script and the ops differ. Unknown -> yes (then
    only what the inputs hold is compared)."""
    same_script = _script(cmd_a) is not None and _script(cmd_a) == _script(cmd_b)
    if not sa.bounds or not sb.bounds:
        if same_script or cmd_a is None or cmd_b is None:
            return True, "same command" if same_script else "no op sequences to tell"
        return False, f"different commands ({_script(cmd_a)} vs {_script(cmd_b)}) and no op sequence to align"
    cols = ["name", "dtype"] + (["shape"] if with_shapes else [])

    def distinct(s: OpSequences) -> set[tuple[Any, ...]]:
        table = s.table.select(cols)
        if table.num_rows > _RELATEDNESS_SAMPLE:   # 16 windows spread over the run: a job's op kinds repeat
            step, width = table.num_rows // 16, _RELATEDNESS_SAMPLE // 16
            table = pa.concat_tables([table.slice(i * step, width) for i in range(16)])
        got = decoded(table).group_by(cols, use_threads=False).aggregate([]).to_pylist()
        return {tuple(row[c] for c in cols) for row in got}

    ua, ub = distinct(sa), distinct(sb)
    inter, union = len(ua & ub), len(ua | ub)
    jaccard = inter / max(1, union)
    share = f"{inter} of {union} distinct (op, dtype{', shape' if with_shapes else ''}) shared"
    if same_script:
        return True, f"same script ({_script(cmd_a)}); {share}"
    if jaccard >= 0.5:
        return True, share
    if cmd_a and cmd_b:
        return False, f"different scripts ({_script(cmd_a)} vs {_script(cmd_b)}); only {share}"
    return False, f"only {share}"


def op_counts(sa: OpSequences, sb: OpSequences) -> list[tuple[str, int, int]]:
    def counts(s: OpSequences) -> dict[str, int]:
        if not s.table.num_rows:
            return {}
        values: dict[str, int] = {}
        n = np.bincount(codes(s.table["name"], values), minlength=len(values))
        return {v: int(n[c]) for v, c in values.items() if n[c]}

    ca, cb = counts(sa), counts(sb)
    return [(n, ca.get(n, 0), cb.get(n, 0)) for n in sorted(set(ca) | set(cb), key=str)]
