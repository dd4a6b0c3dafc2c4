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

__all__ = ["OpSequences", "op_sequences", "first_divergence", "relatedness", "op_counts", "SOURCE_ORDER"]

#: which evidence gives a rank's sequence when several do (the most direct first)
SOURCE_ORDER = ("events", "fr", "nccl", "nsys", "kineto", "watchdog")
_HASHLIKE = re.compile(r"^(?:0x[0-9a-f]+|comm:|split:)")
_COLS = ("rank", "phase", "group", "name", "seq", "dtype", "shape", "callsite")


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
        return OpRef(op=r["name"], group=r["group"], seq=r["seq"], phase=r["phase"], dtype=r["dtype"],
                     shape=r["shape"], callsite=r["callsite"])


def _choose_source(ops: pa.Table) -> str | None:
    if not ops.num_rows:
        return None
    counts = {r["source"]: r["source_count"] for r in
              ops.group_by(["source"], use_threads=False).aggregate([("source", "count")]).to_pylist()}
    for s in SOURCE_ORDER:
        if counts.get(s):
            return s
    return max(counts, key=lambda k: counts[k]) if counts else None


def _group_labels(groups: pa.ChunkedArray, descs: pa.ChunkedArray) -> pa.Array:
    """group_desc where known, else the group; per-run hashes renamed comm#1, comm#2 ... by first use."""
    base = pc.coalesce(descs, groups).combine_chunks() if len(groups) else pa.array([], pa.string())
    enc = base.dictionary_encode()
    dictionary = enc.dictionary.to_pylist()
    codes = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    first = np.full(len(dictionary), np.iinfo(np.int64).max, dtype=np.int64)
    valid = codes >= 0
    np.minimum.at(first, codes[valid], np.flatnonzero(valid))
    renamed: list[str | None] = list(dictionary)
    k = 0
    for idx in np.argsort(first, kind="stable").tolist():
        if dictionary[idx] is not None and _HASHLIKE.match(str(dictionary[idx])):
            k += 1
            renamed[idx] = f"comm#{k}"
    return pa.DictionaryArray.from_arrays(enc.indices, pa.array(renamed, pa.string())).cast(pa.string())


def _phases(an: Analysis, rank: np.ndarray, t: np.ndarray, t_ok: np.ndarray) -> pa.Array:
    """The phase each op was issued in: the innermost phase span (category ``phase``) open on its rank at its time;
    ops issued inside a CUDA graph capture are in ``graph capture``."""
    ev = an.events
    labels = np.full(rank.size, None, dtype=object)
    if ev.num_rows and rank.size:
        ph = ev.filter(pc.and_(pc.equal(ev["category"], "phase"), pc.is_valid(ev["t_ns"])))
        if ph.num_rows:
            ph = ph.select(["rank", "pid", "span_id", "kind", "name", "t_ns"]).to_pylist()
            spans: dict[tuple[Any, Any, Any], list[Any]] = {}
            for r in ph:
                key = (r["rank"], r["pid"], r["span_id"] if r["span_id"] is not None else r["name"])
                s = spans.setdefault(key, [r["rank"], r["name"], None, None])
                if r["kind"] == "enter" and s[2] is None:
                    s[2] = r["t_ns"]
                elif r["kind"] in ("exit", "error"):
                    s[3] = r["t_ns"]
            for prank, name, start, end in sorted((s for s in spans.values() if s[0] is not None and s[2] is not None),
                                                  key=lambda s: s[2]):
                stop = end if end is not None else np.iinfo(np.int64).max
                mask = (rank == prank) & t_ok & (t >= start) & (t < stop)
                labels[mask] = name
    return pa.array(labels.tolist(), pa.string())


def op_sequences(an: Analysis) -> OpSequences:
    """Each rank's issued ops in issue order, from one source (see ``SOURCE_ORDER``)."""
    ops = an.ops
    source = _choose_source(ops)
    if source is None:
        return OpSequences(pa.table({c: pa.array([], pa.string()) for c in _COLS}), None, {})
    ops = ops.filter(pc.and_(pc.and_(ops["issued"], pc.equal(ops["source"], source)), pc.is_valid(ops["rank"])))
    t = pc.coalesce(ops["t_enter"], ops["wall_enter"])
    ops = ops.append_column("t", t).sort_by([("rank", "ascending"), ("t", "ascending"), ("line", "ascending")])
    rank = np.asarray(ops["rank"].to_numpy(), dtype=np.int64)
    t_np = np.asarray(pc.fill_null(ops["t"], 0).to_numpy(), dtype=np.int64)
    t_ok = np.asarray(pc.is_valid(ops["t"]).to_numpy(zero_copy_only=False), dtype=bool)
    phase = _phases(an, rank, t_np, t_ok)
    capturing = np.asarray(pc.fill_null(ops["capturing"], False).to_numpy(zero_copy_only=False), dtype=bool)
    if capturing.any():
        phase = pc.if_else(pa.array(capturing), pa.scalar("graph capture"), phase)
    table = pa.table({
        "rank": ops["rank"], "phase": phase, "group": _group_labels(ops["group"], ops["group_desc"]),
        "name": ops["name"], "seq": ops["seq"], "dtype": ops["dtype"], "shape": ops["shape"],
        "callsite": ops["callsite"],
    })
    bounds: dict[int, tuple[int, int]] = {}
    if rank.size:
        cuts = np.flatnonzero(np.diff(rank)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [rank.size]))
        for s, e in zip(starts.tolist(), ends.tolist()):
            bounds[int(rank[s])] = (s, e)
    return OpSequences(table, source, bounds)


def _codes(col_a: pa.ChunkedArray | pa.Array, col_b: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray,
                                                                                          int]:
    """Joint integer codes of one column over both runs (null -> 0)."""
    both = pa.chunked_array([c for c in (col_a, col_b) for c in (c.chunks if isinstance(c, pa.ChunkedArray) else [c])],
                            type=col_a.type)
    if pa.types.is_integer(both.type):
        vals = np.asarray(pc.fill_null(both, -1).to_numpy(), dtype=np.int64)
        uniq, inv = np.unique(vals, return_inverse=True)
        codes, n = inv.astype(np.int64), int(uniq.size)
    else:
        enc = pc.dictionary_encode(both).combine_chunks()
        codes = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64) + 1
        n = len(enc.dictionary) + 1
    na = len(col_a)
    return codes[:na], codes[na:], n


def _keys(sa: OpSequences, sb: OpSequences, columns: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One int64 per op for both runs: equal keys = the same (columns) values."""
    ka = np.zeros(sa.table.num_rows, dtype=np.int64)
    kb = np.zeros(sb.table.num_rows, dtype=np.int64)
    for col in columns:
        ca, cb, n = _codes(sa.table[col], sb.table[col])
        if n > 1 and int(max(ka.max(initial=0), kb.max(initial=0))) > (np.iinfo(np.int64).max // n) - n:
            # re-encode the combined keys so far before they overflow
            _, inv = np.unique(np.concatenate((ka, kb)), return_inverse=True)
            ka, kb = inv[:ka.size].astype(np.int64), inv[ka.size:].astype(np.int64)
        ka = ka * n + ca
        kb = kb * n + cb
    return ka, kb


def first_divergence(sa: OpSequences, sb: OpSequences, *, with_shapes: bool = True) -> list[Divergence]:
    """Per rank present in both runs, the first position where B's (phase, group, op, seq, dtype[, shape]) sequence
    departs from A's (an op one run issued and the other did not, or issued differently)."""
    cols = ("phase", "group", "name", "seq", "dtype") + (("shape",) if with_shapes else ())
    if not sa.bounds or not sb.bounds:
        return []
    ka, kb = _keys(sa, sb, cols)
    out: list[Divergence] = []
    for r in sorted(sa.ranks & sb.ranks):
        a0, a1 = sa.bounds[r]
        b0, b1 = sb.bounds[r]
        xa, xb = ka[a0:a1], kb[b0:b1]
        n = min(xa.size, xb.size)
        diff = np.flatnonzero(xa[:n] != xb[:n])
        if diff.size:
            pos = int(diff[0])
        elif xa.size != xb.size:
            pos = n
        else:
            continue
        oa = sa.op(a0 + pos) if pos < xa.size else None
        ob = sb.op(b0 + pos) if pos < xb.size else None
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
    cols = ("name", "dtype") + (("shape",) if with_shapes else ())
    ka, kb = _keys(sa, sb, cols)
    ua, ub = np.unique(ka), np.unique(kb)
    inter = np.intersect1d(ua, ub, assume_unique=True).size
    jaccard = inter / max(1, np.union1d(ua, ub).size)
    share = f"{inter} of {np.union1d(ua, ub).size} distinct (op, dtype{', shape' if with_shapes else ''}) shared"
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
