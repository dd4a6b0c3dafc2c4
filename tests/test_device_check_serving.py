"""bench/device_check_serving.py cannot run here (no GPU, no SGLang): its CPU-side logic is checked, and the whole
script runs end to end against the CPU replica (--replica)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import device_check_serving as dcs  # noqa: E402


def test_the_command_leaves_the_profile_to_detection_and_needs_no_network(tmp_path: Path):
    model = dcs.tiny_model_dir(tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2
    cmd = dcs.build_command(tmp_path / "run", model=model, tp=2, port=30123, replica=False)
    joined = " ".join(cmd)
    assert "--hook" not in cmd and "--profile" not in cmd
    assert "-m sglang.launch_server" in joined and "--load-format dummy" in joined and "--tp 2" in joined
    assert "--skip-tokenizer-init" in joined and "--port 30123" in joined


def test_wait_ready_stops_at_the_ready_line_or_the_deadline():
    ok, seen = dcs.wait_ready(iter(["a\n", dcs.READY + "\n", "never read\n"]), deadline=1e18)
    assert ok and seen[-1] == dcs.READY
    clock = iter([0.0, 10.0, 20.0]).__next__
    ok, seen = dcs.wait_ready(iter(["a\n", "b\n", "c\n"]), deadline=5.0, clock=clock)
    assert not ok and seen == ["a", "b"]


def test_checks_and_ledger_on_a_verdict():
    phases = [{"rank": r, "name": n, "detail": d, "start": None, "seconds": 1.0, "open": False, "source": "events"}
              for r in (0, 1) for n, d in (("torch_distributed_init", None), ("weight_loading", None),
                                           ("kv_cache_alloc", None), ("cuda_graph_capture", "bs=8"),
                                           ("cuda_graph_capture", "bs=4"))]
    v = {"status": "completed", "kind": "no_hang", "summary": "ok", "phases": phases,
         "ranks": {"0": {"roles": "TP0", "phase": "serving"}, "1": {"roles": "TP1", "phase": "serving"}}}
    meta = {"profile": {"names": ["sglang"], "chosen_by": "the command"}}
    assert all(ok for _, ok, _ in dcs.checks(v, meta, 2, True))
    v["ranks"]["1"]["roles"] = None
    failed = [n for n, ok, _ in dcs.checks(v, meta, 2, False) if not ok]
    assert failed == ["rank 1: roles from the process title", "the server answered a request"]
    text = dcs.ledger_report(v)
    assert "rank 1  cuda_graph_capture" in text and "bs=4" in text


def test_the_script_end_to_end_on_the_cpu_replica(tmp_path: Path, capsys):
    rc = dcs.main(["--replica", "--tp", "2", "--timeout", "300", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert "PASS  profile sglang picked from the command" in out and "FAIL" not in out
    assert "rank 0  cuda_graph_capture" in out
