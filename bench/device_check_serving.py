"""Device check for issue #14 (serving profiles, start-up ledger): a small real SGLang TP2 server with CUDA graphs,
dummy weights, under `trace run` with NO --hook; prints the ledger and PASS/FAIL checks. On a machine with 2+ NVIDIA
GPUs and SGLang installed, from the repo root:

    python bench/device_check_serving.py                    # ~2-5 min: start-up, one request, shut down
    python bench/device_check_serving.py --model-path DIR   # your own model dir (config.json; weights not read)

No network is needed: unless --model-path is given, a tiny Llama config.json is written to a temp dir, and the
server runs with --load-format dummy --skip-tokenizer-init (the request sends token ids). What is checked: the sglang
profile was picked from the command; every rank's ledger has torch distributed init, weight loading, KV cache and one
cuda-graph capture per batch size (bs=...); pynccl / custom all-reduce set-up was recorded; each scheduler's roles came
from its process title (sglang::scheduler_TP<n>); the server answered; the verdict is not a hang.

    python bench/device_check_serving.py --replica          # the same flow on CPU against examples/replica

--replica runs the whole script on any machine (tests/test_device_check_serving.py does): the CPU stand-in instead of
SGLang, no HTTP request. It cannot stand in for the GPU run: it checks the script, not SGLang.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterable

REPO = Path(__file__).resolve().parents[1]
READY = "The server is fired up and ready to roll!"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False, "rope_theta": 10000.0,
}
PHASES_EXPECTED = ("torch_distributed_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture")


def tiny_model_dir(root: Path) -> Path:
    """A model directory SGLang can start with dummy weights: config.json only."""
    d = root / "tiny-llama"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_LLAMA, indent=1))
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_command(run_dir: Path, *, model: Path | None, tp: int, port: int, replica: bool,
                  hang_after: int = 120) -> list[str]:
    """`trace run` around the server: the profile must come from the command alone (no --hook, no --profile)."""
    trace = [sys.executable, "-m", "ranktrace.cli", "run", "-o", str(run_dir), "--hang-after", str(hang_after),
             "--on-hang", "report", "--"]
    if replica:
        return trace + [sys.executable, "-m", "sglang.launch_server", "--tp", str(tp), "--serve"]
    return trace + [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--tp", str(tp),
                    "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port),
                    "--mem-fraction-static", "0.5", "--log-level", "info"]


def wait_ready(lines: Iterable[str], deadline: float, clock: Any = time.monotonic) -> tuple[bool, list[str]]:
    """Read the server's output until it says it serves (True), it ends or the deadline passes (False)."""
    seen: list[str] = []
    for line in lines:
        seen.append(line.rstrip("\n"))
        if READY in line:
            return True, seen
        if clock() > deadline:
            break
    return False, seen


def one_request(port: int, timeout: float = 60) -> str:
    body = json.dumps({"input_ids": [1, 15, 27, 42], "sampling_params": {"max_new_tokens": 8,
                                                                          "temperature": 0}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()[:300]


def ledger_report(verdict: dict[str, Any]) -> str:
    """The start-up ledger per rank: phase, detail, start, seconds, open."""
    lines = [f"verdict: {verdict['status']} · {verdict['kind']}: {verdict['summary']}", "start-up ledger:"]
    for p in verdict.get("phases", []):
        who = "main" if p["rank"] is None else f"rank {p['rank']}"
        secs = "" if p["seconds"] is None else f"{p['seconds']:8.2f} s"
        lines.append(f"  {who:<7} {p['name']:<28} {p.get('detail') or '':<14} {secs}{'  (open)' if p['open'] else ''}"
                     f"  [{p['source']}]")
    for r, s in sorted(verdict.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"  rank {r}: roles {s.get('roles')}, phase {s.get('phase')} {s.get('phase_detail') or ''}")
    return "\n".join(lines)


def checks(verdict: dict[str, Any], meta: dict[str, Any], tp: int, answered: bool | None) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) for everything the device run must show."""
    out: list[tuple[str, bool, str]] = []
    prof = meta.get("profile") or {}
    out.append(("profile sglang picked from the command", prof.get("names") == ["sglang"] and
                prof.get("chosen_by") == "the command", str(prof)))
    phases = verdict.get("phases", [])
    for r in range(tp):
        mine = [p for p in phases if p["rank"] == r]
        names = {p["name"] for p in mine}
        missing = [n for n in PHASES_EXPECTED if n not in names]
        out.append((f"rank {r}: ledger has {', '.join(PHASES_EXPECTED)}", not missing, f"missing {missing}"))
        bs = sorted({p["detail"] for p in mine if p["name"] == "cuda_graph_capture" and p["detail"]})
        out.append((f"rank {r}: one capture per batch size", len(bs) >= 2, ", ".join(bs)))
        roles = verdict.get("ranks", {}).get(str(r), {}).get("roles")
        out.append((f"rank {r}: roles from the process title", roles == f"TP{r}", str(roles)))
    out.append(("not a hang", verdict.get("status") != "hang", f"{verdict.get('status')} {verdict.get('kind')}"))
    if answered is not None:
        out.append(("the server answered a request", answered, ""))
    return out


def _meta(run: Path) -> dict[str, Any]:
    hosts = [d for d in run.iterdir() if d.is_dir()]
    return json.loads((hosts[0] / "meta.json").read_text()) if hosts else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", type=Path, default=None)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for the server to be ready")
    ap.add_argument("--replica", action="store_true", help="run against examples/replica on CPU (no GPU, no SGLang)")
    ap.add_argument("--out", type=Path, default=None, help="run dir (default: a temp dir)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rt-serving-"))
    run = args.out or tmp / "run"
    port = free_port()
    model = None if args.replica else (args.model_path or tiny_model_dir(tmp))
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(REPO / "examples" / "replica")] if args.replica else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = build_command(run, model=model, tp=args.tp, port=port, replica=args.replica)
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    answered: bool | None = None
    try:
        ready, seen = wait_ready(proc.stdout, time.monotonic() + args.timeout)  # type: ignore[arg-type]
        print("\n".join(seen[-40:]), flush=True)
        if ready and not args.replica:
            try:
                print("response:", one_request(port), flush=True)
                answered = True
            except Exception as e:
                print(f"request failed: {type(e).__name__}: {e}", flush=True)
                answered = False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # trace run forwards it to the server, then writes the verdict
        try:
            rest, _ = proc.communicate(timeout=120)
            print(rest[-3000:], flush=True)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    verdict = json.loads((run / "verdict.json").read_text())
    print(ledger_report(verdict))
    results = checks(verdict, _meta(run), args.tp, answered)
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail and not ok else ""))
    print(f"trace: {run}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
