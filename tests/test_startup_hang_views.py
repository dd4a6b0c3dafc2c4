"""What a person sees of a start-up hang (issue #27), on a captured real run: tests/data/runs/sglang_replica_register_one
is `trace run --hang-after 5 --on-hang kill -- python -m sglang.launch_server --tp 4 --fault register-one
--fault-rank 3` of examples/replica (rank 3 never finishes registering its CUDA-graph buffers; ranks 0-2 wait in the
broadcast of that step), rings removed by finalize as every run's are now.

report.html: "the hang" starts at the hung call, not at the start of the run (every rank sat inside start-up phases
open since its first second); each nesting level names its call; the text verdict keeps rank 3's evidence."""
from __future__ import annotations

import re
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.report import html_report, text_report

RUN = Path(__file__).parent / "data" / "runs" / "sglang_replica_register_one"


def test_a_startup_hang_page_zooms_to_the_hang_and_names_its_bars():
    result = api.analyze([RUN], liveness=None)
    v = result.verdict
    assert (v.status, v.kind, v.culprit_ranks) == ("hang", "missing_ranks", (3,))
    assert not (next(RUN.iterdir()) / "rings").exists() or not list(RUN.glob("*/rings/*.ring"))
    page = html_report.render(result)
    h0, h1 = (float(x) for x in re.search(r'data-h0="([\d.]+)" data-h1="([\d.]+)"', page).groups())
    phase_starts = re.findall(r'<rect x="([\d.]+)"[^>]*fill="#d5bb67"', page)   # the phase bars (open or not)
    assert phase_starts and h0 > 0.5 and h1 - h0 < 0.95 * h1, (h0, h1)       # not the whole run
    names = re.findall(r'class="bar-label"[^>]*>([^<]+)</text>', page)
    assert names.count("register_graph_buffers (never returned)") == 4, names
    assert names.count("cuda_graph_init (never returned)") == 4
    text = text_report.render(v, width=100)
    ev = text[text.index("evidence:"):text.index("next steps:")]
    assert "rank 3: " in ev and "_get_graph_buffer_ipc_meta" in ev
    assert max(len(ln) for ln in text.splitlines()) <= 100


def test_compare_and_perfetto_say_host_states_in_words():
    """verdict.json keeps `blocked_other`; what a person reads (compare's text and page, Perfetto's metadata) says
    "blocked outside communication"."""
    import json

    from ranktrace.analyzers import compare
    from ranktrace.analyzers.report import compare_html, compare_text, perfetto_report

    assert "(blocked_other)" in json.loads((RUN / "verdict.json").read_text())["summary"]
    c = compare.compare_paths(RUN, RUN, liveness=None)
    for page in (compare_text.render(c), compare_html.render(c)):
        assert "blocked_other" not in page and "blocked outside communication" in page
    doc = json.loads(perfetto_report.render(api.analyze([RUN], liveness=None)))
    assert "blocked_other" not in doc["metadata"]["verdict"] and "blocked outside" in doc["metadata"]["verdict"]
