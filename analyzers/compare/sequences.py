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

from ranktrace.analyzers.model import Analysis, Divergence, OpRef

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


def op_sources(an: Analysis) -> dict[str, int]:
    """source -> issued ops it gave (the ops table has one row per op: a few million at most)."""
    ops = an.ops
    if not ops.num_rows:
        return {}
    return {r["values"]: r["counts"] for r in pc.value_counts(ops["source"]).to_pylist() if r["values"]}


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


def _group_labels(groups: pa.ChunkedArray, descs: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """group_desc where known, else the group; per-run hashes renamed comm#1, comm#2 ... by first use (only then is
    the column re-encoded: our own group names are stable across runs and pass through)."""
    base = pc.coalesce(descs, groups) if len(groups) else pa.array([], pa.string())
    names = [n for n in pc.unique(base).to_pylist() if n is not None]
    hashlike = [n for n in names if _HASHLIKE.match(str(n))]
    if not hashlike:
        return base
    idx = pc.index_in(base, value_set=pa.array(hashlike, pa.string()))
    codes = np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    first = [int(np.argmax(codes == i)) for i in range(len(hashlike))]
    renamed = {hashlike[i]: f"comm#{k + 1}" for k, i in enumerate(np.argsort(first, kind="stable").tolist())}
    new = pc.take(pa.array([renamed[h] for h in hashlike], pa.string()), idx)
    return pc.if_else(pc.is_valid(idx), new, base)


def _phases(an: Analysis, rank: np.ndarray, t: np.ndarray, t_ok: np.ndarray) -> pa.Array:
    """The phase each op was issued in: the innermost phase span (category ``phase``) open on its rank at its time;
    ops issued inside a CUDA graph capture are in ``graph capture``."""
    ev = an.events
    if not ev.num_rows or not rank.size:
        return pa.nulls(rank.size, pa.string())
    ev = ev.select(["category", "rank", "pid", "span_id", "kind", "name", "t_ns"])
    ph = ev.filter(pc.equal(ev["category"], "phase"))
    ph = ph.filter(pc.is_valid(ph["t_ns"]))
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
    codes = np.full(rank.size, -1, dtype=np.int32)
    for prank, name, start, end in sorted((s for s in spans.values() if s[0] is not None and s[2] is not None),
                                          key=lambda s: s[2]):
        if name not in names:
            names.append(name)
        stop = end if end is not None else np.iinfo(np.int64).max
        codes[(rank == prank) & t_ok & (t >= start) & (t < stop)] = names.index(name)
    return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(names, pa.string())).cast(
        pa.string())


def op_sequences(an: Analysis, source: str | None = None) -> OpSequences:
    """Each rank's issued ops in issue order, from one source (see ``SOURCE_ORDER``). The ops table already comes
    ordered by (rank, time of issue) (timeline.build_ops), so this only filters; nulls become "" / -1 so that two
    runs' columns compare element by element."""
    ops = an.ops
    if source is None:
        source = choose_source(op_sources(an), {})[0]
    if source is None:
        return OpSequences(pa.table({c: pa.array([], pa.string()) for c in _COLS}), None, {})
    ops = ops.select(["rank", "t_enter", "line", "issued", "source", "group", "group_desc", "name", "seq", "dtype",
                      "shape", "callsite", "capturing"])   # filtering few columns is many times faster
    ops = filter_rows(ops, pc.and_(pc.and_(ops["issued"], pc.equal(ops["source"], source)), pc.is_valid(ops["rank"])))
    rank = np.asarray(ops["rank"].to_numpy(), dtype=np.int64)
    t_np = np.asarray(pc.fill_null(ops["t_enter"], 0).to_numpy(), dtype=np.int64)
    t_ok = np.asarray(pc.is_valid(ops["t_enter"]).to_numpy(zero_copy_only=False), dtype=bool)
    phase = _phases(an, rank, t_np, t_ok)
    capturing = np.asarray(pc.fill_null(ops["capturing"], False).to_numpy(zero_copy_only=False), dtype=bool)
    if capturing.any():
        phase = pc.if_else(pa.array(capturing), pa.scalar("graph capture"), phase)
    table = pa.table({
        "rank": ops["rank"], "phase": pc.fill_null(phase, ""),
        "group": pc.fill_null(_group_labels(ops["group"], ops["group_desc"]), ""),
        "name": pc.fill_null(ops["name"], ""), "seq": pc.fill_null(ops["seq"], -1),
        "dtype": pc.fill_null(ops["dtype"], ""), "shape": pc.fill_null(ops["shape"], ""),
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
    departs from A's (an op one run issued and the other did not, or issued differently). Column by column, the
    two runs' aligned slices are compared element-wise in C: no per-op Python, no hashing."""
    # a phase only one run names (a --hook phase in one of them) is no difference of what was issued
    phased = all(s.table.num_rows and pc.any(pc.not_equal(s.table["phase"], "")).as_py() for s in (sa, sb))
    cols = (("phase",) if phased else ()) + ("group", "name", "seq", "dtype") + (("shape",) if with_shapes else ())
    out: list[Divergence] = []
    for r in sorted(sa.ranks & sb.ranks):
        a0, a1 = sa.bounds[r]
        b0, b1 = sb.bounds[r]
        n = min(a1 - a0, b1 - b0)
        same = np.ones(n, dtype=bool)
        for col in cols:
            if not n:
                break
            eq = pc.equal(sa.table[col].slice(a0, n), sb.table[col].slice(b0, n))
            same &= np.asarray(pc.fill_null(eq, False).to_numpy(zero_copy_only=False), dtype=bool)
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
        got = table.group_by(cols, use_threads=False).aggregate([]).to_pylist()
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
        return {r["name"]: r["name_count"] for r in
                s.table.group_by(["name"], use_threads=False).aggregate([("name", "count")]).to_pylist()}

    ca, cb = counts(sa), counts(sb)
    return [(n, ca.get(n, 0), cb.get(n, 0)) for n in sorted(set(ca) | set(cb), key=str)]
