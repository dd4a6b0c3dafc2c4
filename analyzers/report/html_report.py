"""``<run>/report.html``: what a ticket needs about a hang, in one self-contained page (nothing fetched; one small
inline script for zoom and pan, the page reads the same without it) that opens wherever a hang gets pasted.
Everything that came from the trace is HTML-escaped; the script reads only numbers the page itself wrote.

* a run header: the command (redacted, as meta.json has it), host, start, duration, exit, versions, GPUs;
* the verdict, the ranks (identical ranks share a row), next steps, evidence in plain words;
* a timeline of the whole run, one lane per rank (past GROUP_ABOVE ranks, identical ranks share one lane: "ranks
  1-63 like rank 0"): every call up to a budget per lane, older calls beyond it drawn as bands of many; calls that
  never returned in red until the verdict's moment (spans.as_of); a culprit's lane shows where it sat since its
  last call (its stacks, its phase) and each stack sample taken of it. Wheel or buttons zoom, dragging pans.

Takes an ``Analysis``, returns the page as a string.
"""
from __future__ import annotations

import datetime
import html
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranktrace.analyzers.model.values import Analysis
from ranktrace.analyzers.report import bisect_html
from ranktrace.analyzers.report.evidence import evidence_lines
from ranktrace.analyzers.report.spans import Mark, Span, as_of, span_table
from ranktrace.analyzers.report.words import plain, shown_findings, state_text
from ranktrace.analyzers.verdict import RankState, Verdict, compact_ranks, operation_text

__all__ = ["render", "EXTENSION", "BINARY", "SPANS_PER_RANK", "GROUP_ABOVE", "BARS_PER_PAGE"]

EXTENSION = ".html"
BINARY = False

BARS_PER_PAGE = 20000  # calls drawn one by one on the whole page; a lane past its share draws its oldest as bands
SPANS_PER_RANK = 4000  # the most calls one lane draws one by one
GROUP_ABOVE = 8        # more ranks than this: identical ranks share one lane
_BANDS_PER_LANE = 200  # bands of many calls a lane's oldest part is drawn as
_MAX_DEPTH = 4         # rows drawn per lane (op ⊃ wait ⊃ ..., other threads); further spans share the last row
_MARKS_PER_RANK = 200  # latest marks drawn per rank (phase changes, a ring that wrapped, untraced ops)
_SAMPLES_PER_RANK = 200  # stack-sample ticks drawn on a culprit's lane
_W, _LABEL, _ROW, _TOP = 1100, 110, 13, 28  # picture width, label column, height of one nesting level, axis band
_NAMED_PX = 60  # a bar at least this wide carries its call's name (each nesting level says what it is)
_RIGHT = 10
_COLOURS = {"collective": "#4878d0", "p2p": "#956cb4", "sync": "#8c8c8c", "graph": "#ee854a", "init": "#6acc64",
            "phase": "#d5bb67", "user": "#82c6e2"}
_OPEN, _ERROR, _SAT, _MANY = "#d62728", "#7f2704", "#f2b134", "#b8c4dc"
_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d1d1f;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
.hang,.crashed{color:#b00020} .completed,.idle{color:#1b7f3b} .inconclusive{color:#8a6d00}
table{border-collapse:collapse} td,th{padding:2px 10px 2px 4px;text-align:left;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #ccc} tr.culprit td{color:#b00020;font-weight:600;background:#fde8ea}
#run{background:#eef1f6;padding:8px 12px;border-radius:6px;margin:0 0 14px} #run td{padding:1px 12px 1px 0}
#run th{border:0;color:#555;font-weight:500;padding:1px 12px 1px 0} code{font-size:12px}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px} .ev{color:#555;font-size:12px}
.legend span{display:inline-block;margin-right:12px} .sw{width:10px;height:10px;display:inline-block;margin-right:4px}
svg text{font:11px system-ui,sans-serif} #tl{width:100%;height:auto;cursor:grab;user-select:none}
.zoom button{font:12px system-ui,sans-serif;margin-right:4px} .zoom span{color:#555;font-size:12px;margin-left:8px}
"""
# Zoom and pan of the timeline: wheel zooms around the pointer, dragging pans, the buttons jump. Only numbers the
# page wrote are read (data-* attributes); the lanes group is stretched horizontally (bars keep their height, strokes
# do not scale), marks and ticks are moved, not stretched. "#zoom=hang" in the address opens zoomed on the hang.
_SCRIPT = r"""
(function(){
var svg=document.getElementById('tl');if(!svg)return;
var L=+svg.dataset.left,R=+svg.dataset.right,T0=+svg.dataset.t0,T1=+svg.dataset.t1,H0=+svg.dataset.h0,H1=+svg.dataset.h1;
var lanes=document.getElementById('tl-lanes'),axis=document.getElementById('tl-axis'),span=document.getElementById('tl-span');
var marks=svg.querySelectorAll('[data-x]'),k=1,tx=0,W=R-L,NS='http://www.w3.org/2000/svg';
function sec(x){return T0+(T1-T0)*(x-L)/W}
function draw(){
 if(k<1){k=1}if(k>1e6){k=1e6}
 tx=Math.min(0,Math.max(tx,-(k-1)*W));
 lanes.setAttribute('transform','matrix('+k+',0,0,1,'+(L-k*L+tx)+',0)');
 for(var i=0;i<marks.length;i++){var m=marks[i];m.setAttribute('transform','translate('+(L+(+m.dataset.x-L)*k+tx)+',0)')}
 while(axis.firstChild)axis.removeChild(axis.firstChild);
 var a=sec(L-tx/k),b=sec(L+(W-tx)/k),st=Math.pow(10,Math.floor(Math.log10(Math.max((b-a)/5,1e-9))));
 if((b-a)/st>10)st*=2;if((b-a)/st>10)st*=2.5;
 for(var t=Math.ceil(a/st)*st;t<=b+1e-12;t+=st){var x=L+((t-T0)/(T1-T0)*W)*k+tx;
  var ln=document.createElementNS(NS,'line');ln.setAttribute('x1',x);ln.setAttribute('x2',x);ln.setAttribute('y1',22);
  ln.setAttribute('y2',svg.viewBox.baseVal.height);ln.setAttribute('stroke','#f0f0f0');axis.appendChild(ln);
  var tt=document.createElementNS(NS,'text');tt.setAttribute('x',x);tt.setAttribute('y',18);tt.setAttribute('fill','#666');
  tt.setAttribute('text-anchor','middle');tt.textContent=(+t.toFixed(6))+' s';axis.appendChild(tt)}
 span.textContent='showing '+a.toFixed(3)+' s to '+b.toFixed(3)+' s';svg.dataset.zoom=k.toFixed(3);
}
function px(e){var r=svg.getBoundingClientRect();return (e.clientX-r.left)*svg.viewBox.baseVal.width/r.width}
function zoomAt(x,f){var u=(x-L-tx)/k;k*=f;if(k<1)k=1;tx=x-L-u*k;draw()}
function show(a,b){k=Math.max(1,(T1-T0)/Math.max(b-a,1e-9));tx=-((a-T0)/(T1-T0))*W*k;draw()}
svg.addEventListener('wheel',function(e){e.preventDefault();zoomAt(px(e),e.deltaY<0?1.25:0.8)},{passive:false});
var drag=null;svg.addEventListener('mousedown',function(e){drag={x:px(e),tx:tx};svg.style.cursor='grabbing'});
window.addEventListener('mousemove',function(e){if(drag){tx=drag.tx+px(e)-drag.x;draw()}});
window.addEventListener('mouseup',function(){drag=null;svg.style.cursor='grab'});
var b=document.querySelectorAll('.zoom button');
for(var i=0;i<b.length;i++)b[i].addEventListener('click',function(e){var w=e.target.dataset.zoom;
 if(w==='all'){k=1;tx=0;draw()}else if(w==='in'){zoomAt(L+W/2,2)}else if(w==='out'){zoomAt(L+W/2,0.5)}
 else if(w==='hang'){show(H0,H1)}else if(w==='end'){show(Math.max(T0,T1-10),T1)}});
var m=/zoom=(hang|end)/.exec(location.hash);if(m&&m[1]==='hang'&&H1>H0){show(H0,H1)}else if(m&&m[1]==='end'){show(Math.max(T0,T1-10),T1)}else{draw()}
})();
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


# --- the run header ------------------------------------------------------------------------------------------

def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return (f"{h} h " if h else "") + f"{m} min {sec} s"


def _exit_text(result: Analysis, meta: dict[str, Any]) -> str:
    ex = meta.get("exit") or {}
    if ex:
        if ex.get("killed_on_hang"):
            return "terminated by ranktrace on the hang (--on-hang kill); trace run exited 3"
        if ex.get("signal"):
            return f"ended by signal {ex['signal']} (exit code {ex.get('exit_code')})"
        return f"exited with status {ex.get('exit_code')}"
    state = result.job.state
    return {"running": "still running when this was written", "gone": "gone without an exit status",
            "unknown": "no exit status recorded (analyzed elsewhere, or trace run was killed)"}.get(state, state)


def _run_header(result: Analysis) -> str:
    meta = result.meta()
    rows: list[tuple[str, str]] = []
    if meta:
        cmd = meta.get("command") or []
        rows.append(("command", f"<code>{_e(shlex.join(cmd) if isinstance(cmd, list) else cmd)}</code>"))
        hosts = sorted({(h.meta or {}).get("hostname") or (h.meta or {}).get("host") or h.host_dir.name
                        for h in result.hosts})
        rows.append(("host", _e(", ".join(hosts))))
        # the ones a host's meta.json states (the filters drop the unset)
        starts = cast("list[int]", [(h.meta or {}).get("start_wall_ns") for h in result.hosts
                                    if (h.meta or {}).get("start_wall_ns")])
        ends = cast("list[int]", [(h.meta or {}).get("end_wall_ns") for h in result.hosts
                                  if (h.meta or {}).get("end_wall_ns")])
        if starts:
            rows.append(("start", _e(_when(min(starts)))))
            if ends and len(ends) == len(result.hosts):
                rows.append(("duration", _e(_duration((max(ends) - min(starts)) / 1e9))))
            elif result.liveness is not None:
                rows.append(("duration", _e(_duration(max(0.0, result.liveness.checked_at - min(starts) / 1e9))
                                            + " so far")))
        rows.append(("exit", _e(_exit_text(result, meta))))
        ver = dict(meta.get("versions") or {})
        drv = meta.get("driver") or {}
        if drv.get("version"):
            ver["driver"] = drv["version"]
        keys = [k for k in ("ranktrace", "torch", "nccl", "cuda", "driver", "python") if ver.get(k)]
        if keys:
            rows.append(("versions", _e(" · ".join(f"{k} {ver[k]}" for k in keys))))
        gpus = meta.get("gpus") or []
        if gpus:
            names = Counter(str(g.get("name") or "GPU") for g in gpus if isinstance(g, dict))
            rows.append(("GPUs", _e(", ".join(f"{n} × {name}" for name, n in names.items()))))
        else:
            rows.append(("GPUs", "none seen (no NVML on this machine, or a CPU job)"))
        if meta.get("run"):
            rows.append(("run", f"<code>{_e(meta['run'])}</code>"))
    else:
        rows.append(("inputs", _e(f"{len(result.files)} file(s) read, no ranktrace run directory among them")))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table id="run">{body}</table>'


# --- ranks: the table and which share a lane -----------------------------------------------------------------

def _rank_key(r: int, s: RankState, culprits: set[int]) -> tuple:
    return (r in culprits, s.state, s.innermost_open or "", s.last_op or "", s.where or (s.stack[0] if s.stack else ""))


def _rank_table(v: Verdict) -> str:
    if not v.ranks:
        return ""
    culprits = set(v.culprit_ranks)
    groups: dict[tuple, list[int]] = {}
    for r, s in sorted(v.ranks.items()):
        groups.setdefault(_rank_key(r, s, culprits), []).append(r)
    rows = []
    for rs in sorted(groups.values()):
        s = v.ranks[rs[0]]
        c = rs[0] in culprits
        rows.append(f'<tr class="{"culprit" if c else ""}"><td>{_e(compact_ranks(rs))}{" *" if c else ""}</td>'
                    f"<td>{_e(state_text(s.state))}</td><td>{_e(s.innermost_open)}</td><td>{_e(s.last_op)}</td>"
                    f"<td>{_e(s.where or (s.stack[0] if s.stack else ''))}</td></tr>")
    return ("<h2>Ranks</h2><table><tr><th>rank</th><th>state</th><th>inside</th><th>last op</th><th>where</th></tr>"
            f"{''.join(rows)}</table><p class=\"ev\">* culprit. Ranks that read the same share a row.</p>")


@dataclass
class _Lane:
    rank: int
    alike: tuple[int, ...] = ()   # other ranks this lane stands for


def _lanes(ranks: list[int], v: Verdict, calls: dict[int, tuple]) -> list[_Lane]:
    """One lane per rank; past GROUP_ABOVE ranks, ranks alike (same state, same calls, same open calls, not a
    culprit) share the lane of the lowest of them."""
    if len(ranks) <= GROUP_ABOVE:
        return [_Lane(r) for r in ranks]
    culprits = set(v.culprit_ranks)
    groups: dict[tuple, list[int]] = {}
    for r in ranks:
        s = v.ranks.get(r, RankState())
        key = (r in culprits, r if r in culprits else None, _rank_key(r, s, culprits)[1:], calls.get(r))
        groups.setdefault(key, []).append(r)
    return sorted((_Lane(rs[0], tuple(rs[1:])) for rs in groups.values()), key=lambda ln: ln.rank)


# --- the timeline --------------------------------------------------------------------------------------------

def _clock(result: Analysis) -> tuple[str, int]:
    """The clock of the picture and how many timed rows it leaves out: wall_ns (comparable across hosts) unless
    more rows carry only the monotonic t_ns (one host's clock; Kineto or nsys without a session start)."""
    ev = result.events
    if ev.num_rows == 0:
        return "wall_ns", 0
    ranked = pc.is_valid(ev["rank"])
    n_wall = pc.sum(pc.and_(ranked, pc.is_valid(ev["wall_ns"]))).as_py() or 0
    n_mono = pc.sum(pc.and_(ranked, pc.is_valid(ev["t_ns"]))).as_py() or 0
    n_any = pc.sum(pc.and_(ranked, pc.or_(pc.is_valid(ev["wall_ns"]), pc.is_valid(ev["t_ns"])))).as_py() or 0
    return ("wall_ns", n_any - n_wall) if n_wall >= n_mono else ("t_ns", n_any - n_mono)


@dataclass
class _Band:
    """Many old calls of one lane drawn as one bar."""

    start: int
    end: int
    n: int
    names: Counter


def _spans_of(t: pa.Table, start_col: str, end_col: str) -> list[Span]:
    out = []
    for r in t.to_pylist():
        out.append(Span(rank=r["rank"], pid=r["pid"], tid=r["tid"], name=r["name"] or "?", category=r["category"],
                        group=r["group"], seq=r["seq"], callsite=r["callsite"], peer=r["peer"],
                        capturing=bool(r["capturing"]), start=r[start_col],
                        end=None if r["outcome"] == "open" else (r[end_col] if r[end_col] is not None
                                                                 else r[start_col]),
                        error=r["error"], source=r["source"]))
    return out


def _lane_spans(spans: pa.Table, rank: int, budget: int, start_col: str, end_col: str
                ) -> tuple[list[Span], list[_Band]]:
    """A rank's calls: every one that never returned, its latest `budget` others one by one, and the rest as up to
    _BANDS_PER_LANE bands (each many calls, from the first's start to the last's end)."""
    mine = spans.filter(pc.equal(spans["rank"], rank))
    is_open = pc.equal(mine["outcome"], "open")
    opened = mine.filter(is_open)
    closed = mine.filter(pc.invert(is_open)).sort_by([(start_col, "ascending")])
    bands: list[_Band] = []
    if closed.num_rows > budget:
        old = closed.slice(0, closed.num_rows - budget)
        closed = closed.slice(closed.num_rows - budget)
        st = np.asarray(old[start_col].to_numpy(zero_copy_only=False), dtype=np.int64)
        en = np.asarray(pc.coalesce(old[end_col], old[start_col]).to_numpy(zero_copy_only=False), dtype=np.int64)
        names = old["name"].to_pylist()
        for chunk in np.array_split(np.arange(old.num_rows), min(_BANDS_PER_LANE, old.num_rows)):
            if chunk.size:
                bands.append(_Band(int(st[chunk].min()), int(en[chunk].max()), int(chunk.size),
                                   Counter(names[i] for i in chunk)))
    spans_ = _spans_of(closed, start_col, end_col) + _spans_of(opened, start_col, end_col)
    spans_.sort(key=lambda s: (s.start, -(s.end if s.end is not None else float("inf"))))
    return spans_, bands


def _levels(spans: list[Span]) -> list[int]:
    """Row of each span within its rank's lane (spans sorted by start, an enclosing span first): the first row whose
    last span has ended, below the row of the call it is inside (same thread), so a call and the wait inside it, or
    two threads' overlapping calls, never cover each other and a child is never drawn above its parent."""
    row_end: list[float] = []
    open_in: dict[tuple, list[tuple[float, int]]] = defaultdict(list)  # per thread: (end, row) of enclosing calls
    out = []
    for sp in spans:
        end = sp.end if sp.end is not None else float("inf")
        parents = open_in[(sp.pid, sp.tid)]
        while parents and parents[-1][0] <= sp.start:
            parents.pop()
        lowest = parents[-1][1] + 1 if parents else 0
        row = next((i for i in range(lowest, len(row_end)) if row_end[i] <= sp.start), max(lowest, len(row_end)))
        while len(row_end) <= row:
            row_end.append(float("-inf"))
        row_end[row] = end
        parents.append((end, row))
        out.append(min(row, _MAX_DEPTH - 1))
    return out


def _is_hung_op(sp: Span, v: Verdict) -> bool:
    """A span of the verdict's operation: same name, group and seq; for an operation without a seq (an init, a
    graph capture) the spans of that name that never returned."""
    op = v.operation
    if op is None or sp.name != op.name or (op.group is not None and sp.group != op.group):
        return False
    return sp.seq == op.seq if op.seq is not None else sp.open


def _marks(result: Analysis, clock: str) -> dict[int, list[Mark]]:
    ev = result.events
    if ev.num_rows == 0:
        return {}
    m = ev.filter(pc.and_(pc.equal(ev["kind"], "mark"), pc.and_(pc.is_valid(ev["rank"]), pc.is_valid(ev[clock]))))
    out: dict[int, list[Mark]] = defaultdict(list)
    for r in m.select(["rank", "tid", "name", clock]).to_pylist():
        out[r["rank"]].append(Mark(r["rank"], r["tid"], r["name"] or "?", r[clock]))
    return out


def _samples(result: Analysis, clock: str, ranks: set[int]) -> dict[int, list[tuple[int, str, list[str]]]]:
    """Per rank, its timed stack samples (time, thread, frames) of the most telling thread: MainThread if sampled."""
    st = result.stacks
    out: dict[int, list[tuple[int, str, list[str]]]] = defaultdict(list)
    if st.num_rows == 0 or clock not in st.schema.names or not ranks:
        return out
    st = st.filter(pc.and_(pc.is_valid(st[clock]), pc.is_in(st["rank"], value_set=pa.array(sorted(ranks),
                                                                                           pa.int32()))))
    seen: set[tuple] = set()
    for r in st.select(["rank", "thread_name", "frames", clock]).to_pylist():
        if r["thread_name"] not in ("MainThread", None):
            continue
        key = (r["rank"], r[clock])
        if key in seen:
            continue
        seen.add(key)
        out[r["rank"]].append((r[clock], r["thread_name"] or "", list(r["frames"] or [])))
    for k in out:
        out[k] = sorted(out[k])[-_SAMPLES_PER_RANK:]
    return out


def _timeline(result: Analysis, v: Verdict) -> str:
    clock, left_out = _clock(result)
    start_col, end_col = ("start_wall_ns", "end_wall_ns") if clock == "wall_ns" else ("start_t_ns", "end_t_ns")
    spans = span_table(result.events)
    spans = spans.filter(pc.and_(pc.is_valid(spans["rank"]), pc.is_valid(spans[start_col])))
    marks = _marks(result, clock)
    ev_ranks = set(pc.unique(result.events.filter(pc.and_(pc.is_valid(result.events["rank"]), pc.is_valid(
        result.events[clock])))["rank"]).to_pylist()) if result.events.num_rows else set()
    ranks = sorted(ev_ranks | set(spans["rank"].to_pylist()) | set(v.ranks))
    if spans.num_rows == 0 and not marks:
        return "<p>No timed op records (stacks and logs only).</p>"
    calls: dict[int, tuple] = {}
    if spans.num_rows:
        for r in spans.group_by(["rank"], use_threads=False).aggregate(
                [("name", "count"), ("outcome", "distinct")]).to_pylist():
            calls[r["rank"]] = (r["name_count"], tuple(sorted(r["outcome_distinct"])))
    lanes = _lanes(ranks, v, calls)
    budget = max(50, min(SPANS_PER_RANK, BARS_PER_PAGE // max(1, len(lanes))))
    drawn = {ln.rank: _lane_spans(spans, ln.rank, budget, start_col, end_col) for ln in lanes}
    culprits, waiting = set(v.culprit_ranks), set(v.waiting_ranks)
    samples = _samples(result, clock, culprits)
    t_verdict = as_of(result, clock)
    # the window: from the earliest call drawn (a phase open since the start is clipped at the left edge) to the
    # verdict's moment or the latest thing drawn
    all_sp = [s for ss, _b in drawn.values() for s in ss]
    closed = [s for s in all_sp if not s.open]
    firsts = [b[0].start for _s, b in drawn.values() if b] + [s.start for s in (closed or all_sp)]
    if not firsts:
        firsts = [m.t for ms in marks.values() for m in ms]
    start = min(firsts)
    lasts = [s.end for s in closed if s.end is not None] + [s.start for s in all_sp] + \
        [m.t for ms in marks.values() for m in ms] + [t for ss in samples.values() for t, _n, _f in ss] + \
        ([t_verdict] if t_verdict is not None else [])
    end = max(lasts)
    end = max(end, start + 1)
    span_ns = end - start
    right = _W - _RIGHT
    scale = (right - _LABEL) / span_ns

    def x(t: int) -> float:
        return _LABEL + (min(max(t, start), end) - start) * scale

    body: list[str] = []        # bars: stretched by the zoom
    top_marks: list[str] = []   # marks, the verdict line, labels in the picture: moved by the zoom, not stretched
    labels: list[str] = []      # the rank column: fixed
    y = _TOP
    hang_from = end
    open_from = [end, end]  # earliest open call: [a call, a phase / set-up step] (a start-up hang is inside both)
    for ln in lanes:
        rank = ln.rank
        spans_, bands = drawn[ln.rank]
        depths = _levels(spans_)
        height = _ROW * (max(depths, default=0) + 1) + 6 + (_ROW if rank in culprits else 0)
        cls = "#b00020" if rank in culprits else ("#8a6d00" if rank in waiting else "#1d1d1f")
        tag = " *" if rank in culprits else ""
        label = f"rank {rank}{tag}"
        labels.append(f'<text x="4" y="{y + 12}" fill="{cls}">{_e(label)}</text>')
        if ln.alike:
            labels.append(f'<text x="4" y="{y + 23}" fill="#777">+ {_e(compact_ranks(ln.alike))} alike</text>')
            height = max(height, 26)
        body.append(f'<line x1="{_LABEL}" x2="{right}" y1="{y + height}" y2="{y + height}" stroke="#eee"/>')
        for b in bands:
            x0, x1 = x(b.start), x(b.end)
            names = ", ".join(f"{n} ×{c}" for n, c in b.names.most_common(4))
            tip = (f"rank {rank}: {b.n} calls drawn as one ({names}), "
                   f"{(b.start - start) / 1e9:.2f} s to {(b.end - start) / 1e9:.2f} s; trace export has each")
            body.append(f'<rect x="{x0:.2f}" y="{y + 3}" width="{max(x1 - x0, 0.5):.2f}" height="{_ROW - 2}" '
                        f'fill="{_MANY}" class="many"><title>{_e(tip)}</title></rect>')
        named_to: dict[int, float] = {}  # per nesting level: where the last name drawn ends
        for sp, d in zip(spans_, depths):
            x0 = x(sp.start)
            x1 = x(sp.end if sp.end is not None else (t_verdict if t_verdict is not None else end))
            colour = _OPEN if sp.open else _ERROR if sp.error else _COLOURS.get(sp.category or "", "#999")
            hung = _is_hung_op(sp, v)
            stroke = ' stroke="#000" stroke-width="1.5" vector-effect="non-scaling-stroke"' if hung else ""
            if hung:  # "the hang" button: from the first call of the verdict's op ...
                hang_from = min(hang_from, sp.start)
            elif sp.open:  # ... else from the first call left open that is not a phase or set-up step around it
                key = 0 if sp.category in ("collective", "p2p", "sync", "user") else 1
                open_from[key] = min(open_from[key], sp.start)
            if sp.open:
                waited = ((t_verdict or end) - sp.start) / 1e9
                dur = f"never returned (open {waited:.1f} s when the verdict was made)"
            else:
                dur = f"{max(sp.end - sp.start, 0) / 1e6:.3f} ms"  # type: ignore[operator]
            if sp.start < start:
                dur += f", started {(start - sp.start) / 1e9:.1f} s before the picture"
            tip = f"rank {rank}: {sp.name}" + (f" group={sp.group}" if sp.group else "") + (
                f" seq={sp.seq}" if sp.seq is not None else "") + f" · {dur}" + (
                f" · {sp.callsite}" if sp.callsite else "") + (f" · error: {sp.error}" if sp.error else "")
            open_cls = ' class="open"' if sp.open else ""
            body.append(f'<rect x="{x0:.2f}" y="{y + 3 + d * _ROW}" width="{max(x1 - x0, 0.5):.2f}" '
                        f'height="{_ROW - 2}" fill="{colour}"{stroke}{open_cls}><title>{_e(tip)}</title></rect>')
            if x1 - x0 >= _NAMED_PX and x0 >= named_to.get(d, 0.0):  # its name on it, moved by the zoom
                name = sp.name + (f" seq {sp.seq}" if sp.seq is not None else "") + (" (never returned)" if sp.open
                                                                                      else "")
                name = name[:max(4, int((x1 - x0) / 5.5))]
                named_to[d] = x0 + 6 + 5.5 * len(name)  # the next name on this level starts past this one
                top_marks.append(f'<text x="3" y="{y + _ROW - 1 + d * _ROW}" fill="#fff" font-size="9" '
                                 f'class="bar-label" pointer-events="none" transform="translate({x0:.2f},0)" '
                                 f'data-x="{x0:.2f}">{_e(name)}</text>')
        if rank in culprits:
            bars, over = _culprit_band(rank, v, spans_, samples.get(rank, []), x,
                                       y + 3 + (max(depths, default=0) + 1) * _ROW,
                                       t_verdict if t_verdict is not None else end, start)
            body.extend(bars)
            top_marks.extend(over)
        ms = sorted(marks.get(rank, []), key=lambda m: m.t)
        shown = [m for m in ms if m.t < start][-1:] + [m for m in ms if start <= m.t <= end][-_MARKS_PER_RANK:]
        for m in shown:  # phases, ring wrapped, ...: over the bars, so their titles can be hovered
            when = " (before the picture)" if m.t < start else ""
            top_marks.append(f'<path d="M-4 {y}h8l-4 6z" fill="#333" transform="translate({x(m.t):.2f},0)" '
                             f'data-x="{x(m.t):.2f}"><title>{_e(f"rank {rank}: {m.name}{when}")}</title></path>')
        y += height
    if t_verdict is not None and start <= t_verdict <= end:
        xv = x(t_verdict)
        top_marks.append(f'<g transform="translate({xv:.2f},0)" data-x="{xv:.2f}"><line x1="0" x2="0" y1="{_TOP - 4}" '
                         f'y2="{y}" stroke="{_OPEN}" stroke-dasharray="3,2"/><text x="-3" y="{y + 11}" '
                         f'fill="{_OPEN}" text-anchor="end">verdict</text><title>the verdict: '
                         f'{_e(v.status.upper())} at {(t_verdict - start) / 1e9:.2f} s</title></g>')
    ticks = []
    for i in range(6):
        t = start + span_ns * i / 5
        ticks.append(f'<line x1="{x(int(t)):.1f}" x2="{x(int(t)):.1f}" y1="{_TOP - 6}" y2="{y}" stroke="#f0f0f0"/>'
                     f'<text x="{x(int(t)):.1f}" y="{_TOP - 10}" fill="#666" '
                     f'text-anchor="{"start" if i == 0 else "end" if i == 5 else "middle"}">{(t - start) / 1e9:.2f} s'
                     "</text>")
    total_s = span_ns / 1e9
    if hang_from >= end:
        hang_from = open_from[0] if open_from[0] < end else open_from[1]
    h0 = max(0.0, (hang_from - start) / 1e9 - 0.1 * max((end - hang_from) / 1e9, 0.5)) if hang_from < end else 0.0
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>{_e(k)}</span>' for k, c in _COLOURS.items())
    clock_txt = "wall clock" if clock == "wall_ns" else "monotonic clock of one host"
    if left_out:
        clock_txt += f"; {left_out} record(s) without that clock are not drawn"
    alike = [ln for ln in lanes if ln.alike]
    alike_txt = "".join(f"<li>ranks {_e(compact_ranks(ln.alike))} like rank {ln.rank}</li>" for ln in alike)
    height = y + 16
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" id="tl" viewBox="0 0 {_W} {height}" width="{_W}" '
           f'height="{height}" role="img" aria-label="calls per rank over the whole run" data-left="{_LABEL}" '
           f'data-right="{right}" data-t0="0" data-t1="{total_s:.9f}" data-h0="{h0:.6f}" data-h1="{total_s:.6f}">'
           f'<defs><clipPath id="tl-clip"><rect x="{_LABEL}" y="0" width="{right - _LABEL}" height="{height}"/>'
           f'</clipPath></defs><g id="tl-axis">{"".join(ticks)}</g>'
           f'<g clip-path="url(#tl-clip)"><g id="tl-lanes">{"".join(body)}</g>{"".join(top_marks)}</g>'
           f'{"".join(labels)}</svg>')
    zoom = ('<p class="zoom"><button data-zoom="all">whole run</button><button data-zoom="hang">the hang</button>'
            '<button data-zoom="end">last 10 s</button><button data-zoom="in">+</button>'
            '<button data-zoom="out">&minus;</button><span id="tl-span"></span>'
            '<span>wheel: zoom · drag: pan · hover a bar for the call</span></p>')
    return (zoom + svg +
            f'<p class="legend">{legend}<span><i class="sw" style="background:{_OPEN}"></i>never returned</span>'
            f'<span><i class="sw" style="background:{_ERROR}"></i>raised an error</span>'
            f'<span><i class="sw" style="background:{_SAT}"></i>where a culprit sat (its stacks)</span>'
            f'<span><i class="sw" style="background:{_MANY}"></i>many older calls drawn as one</span>'
            f'<span>outlined: the operation above</span><span>&#9660; a mark (phase, ring wrapped, ...)</span></p>'
            + (f'<ul class="ev">{alike_txt}</ul>' if alike_txt else "") +
            f'<p class="ev">Seconds since the first call drawn ({_e(clock_txt)}), {total_s:.1f} s in all; the dashed '
            f"line is the moment of the verdict. Each lane draws its latest {budget} calls one by one and older ones "
            "as bands. A returned NCCL call was only enqueued: a bar that ended is not an op that finished on the "
            "GPU.</p>")


def _culprit_band(rank: int, v: Verdict, spans_: list[Span], samples: list[tuple[int, str, list[str]]], x: Any,
                  y: int, t_end: int, start: int) -> tuple[list[str], list[str]]:
    """Under a culprit's calls: where it sat since its last call (until the verdict), and a tick per stack sample.
    Returns (bars, labels over them)."""
    out: list[str] = []
    over: list[str] = []
    st = v.ranks.get(rank)
    ends = [s.end for s in spans_ if s.end is not None and s.category in ("collective", "p2p", "sync")]
    since = max(ends) if ends else None
    if st is not None and since is not None and since < t_end:
        where = st.where or (st.stack[0] if st.stack else "outside any traced call")
        phase = f" · phase {st.phase}" if st.phase else ""
        tip = (f"rank {rank} sat in {where} · {state_text(st.state)}{phase} · for {(t_end - since) / 1e9:.1f} s "
               f"since its last call, until the verdict")
        out.append(f'<rect x="{x(since):.2f}" y="{y}" width="{max(x(t_end) - x(since), 0.5):.2f}" height="{_ROW - 2}" '
                   f'fill="{_SAT}" class="sat"><title>{_e(tip)}</title></rect>')
        over.append(f'<text x="3" y="{y + _ROW - 4}" fill="#5a3a00" class="sat-label" font-size="9" '
                    f'transform="translate({x(since):.2f},0)" data-x="{x(since):.2f}">sat in {_e(where)}</text>')
    for t, thread, frames in samples:
        tip = f"rank {rank}: stack sample at {(t - start) / 1e9:.2f} s ({thread})\n" + "\n".join(frames[:12])
        out.append(f'<rect x="{x(t):.2f}" y="{y}" width="0.8" height="{_ROW - 2}" fill="#5a3a00" class="sample">'
                   f"<title>{_e(tip)}</title></rect>")
    return out, over


def _phases(v: Verdict) -> str:
    """The start-up phase ledger (report/ledger.py): one row per phase and instance."""
    from ranktrace.analyzers.report.ledger import ledger_rows

    rows = ledger_rows(v)
    if not rows:
        return ""
    body = "".join(f"<tr><td>{_e(r.phase)}</td><td>{_e(r.ranks)}</td><td>{_e(r.took)}</td><td>{_e(r.open)}</td></tr>"
                   for r in rows)
    return ("<h2>Start-up phases</h2><table><tr><th>phase</th><th>ranks</th><th>took</th><th>still in it</th></tr>"
            f"{body}</table>")


def _findings(v: Verdict) -> str:
    findings = shown_findings(v)
    if not findings:
        return ""
    items = []
    for f in findings:
        ev = []
        shown, left = evidence_lines(f, v.culprit_ranks)  # the terminal's lines: the culprit's always, the cut said
        for ln in shown:
            who = ("rank " if len(ln.ranks) == 1 else "ranks ") + compact_ranks(ln.ranks) + ": " if ln.ranks else ""
            where = (ln.places[0] if ln.places else "") + (f" and {len(ln.places) - 1} more" if len(ln.places) > 1
                                                            else "")
            ev.append(f'<li class="ev">{_e(who + plain(ln.detail))} <code>[{_e(ln.source)} {_e(where)}]</code></li>')
        if left:
            ev.append(f'<li class="ev">... and {left} more evidence line{"s" if left != 1 else ""} (verdict.json has '
                      "every one)</li>")
        items.append(f"<li><b>[{_e(f.kind)}]</b> {_e(plain(f.summary))} (confidence {f.confidence:.1f})"
                     f"<ul>{''.join(ev)}</ul></li>")
    return f"<h2>Evidence</h2><ul>{''.join(items)}</ul>"


def render(result: Analysis, bisect: Mapping[str, Any] | None = None) -> str:
    """`bisect`: a trace bisect's document (bisect.json), drawn as a section above the verdict's details."""
    v = result.verdict
    facts = []
    if v.operation is not None:
        facts.append(f"<b>operation:</b> {_e(operation_text(v.operation))}")
    for label, ranks in (("culprit ranks", v.culprit_ranks), ("waiting ranks", v.waiting_ranks),
                         ("unobserved ranks (no evidence)", v.unobserved_ranks)):
        if ranks:
            facts.append(f"<b>{label}:</b> {_e(compact_ranks(ranks))}")
    steps = "".join(f"<li>{_e(plain(s))}</li>" for s in v.next_steps)
    waits = "".join(f"<li>rank {e.rank} waits on {_e(compact_ranks(e.waits_on))} in {_e(e.op)}"
                    + (f" (group {_e(e.group)}, seq {e.seq})" if e.group is not None else "") + "</li>"
                    for e in v.wait_for)
    inputs = "".join(f"<li><code>{_e(i)}</code></li>" for i in v.inputs)
    title = f"{v.status.upper()} · {v.kind}"
    if bisect:  # the page of a trace bisect: its answer is the headline, the hung run's verdict comes under it
        answer = str(bisect.get("answer") or bisect.get("status") or "trace bisect")
        head = (f'<title>ranktrace bisect: {_e(answer)}</title>', f'<h1>trace bisect: {_e(answer)}</h1>'
                f'<h2 class="{_e(v.status)}">The best hung run: {_e(title)}</h2><p>{_e(plain(v.summary))}</p>')
    else:
        head = (f"<title>ranktrace: {_e(title)}</title>",
                f'<h1 class="{_e(v.status)}">{_e(title)}</h1><p>{_e(plain(v.summary))}</p>')
    return "".join([
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{head[0]}',
        f"<style>{_STYLE}</style></head><body>",
        head[1],
        _run_header(result),
        "<p>" + "<br>".join(facts) + "</p>" if facts else "",
        bisect_html.section(bisect) if bisect else "",
        _rank_table(v),
        "<h2>Timeline</h2>", _timeline(result, v),
        f"<h2>Next steps</h2><ul>{steps}</ul>" if steps else "",
        _phases(v),
        _findings(v),
        f"<h2>Merged stacks (outermost first)</h2><pre>{_e(v.stack_tree)}</pre>" if v.stack_tree else "",
        f"<h2>Who waits on whom</h2><ul>{waits}</ul>" if waits else "",
        f"<h2>Inputs</h2><ul>{inputs}</ul>" if inputs else "",
        '<p class="ev">ranktrace · verdict schema ranktrace.verdict/1 · the JSON verdict is verdict.json</p>',
        f"<script>{_SCRIPT}</script>",
        "</body></html>\n",
    ])
