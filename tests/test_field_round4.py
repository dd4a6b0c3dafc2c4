"""Round 4 of the field readers (#26): what launchers and pastes put around the text, each on an artifact as posted
in a public thread (tests/field/<case>/, the URL in its case.json).

* pdsh's ``104.171.201.171: `` host prefix (DeepSpeed's multi-node launcher) —
  https://github.com/huggingface/accelerate/issues/1317, https://github.com/NVIDIA/nccl/issues/969
* rich's box-drawn traceback (``│ /x/other.py:81 │`` / ``│ in wait_for_everyone │`` / ``│ ❱ 81 │ code │``) —
  https://github.com/huggingface/accelerate/issues/1317, https://github.com/MLI-lab/DeepDeWedge/issues/20
* NCCL's network-transport failure WARNs (``NET/IB : ... collective mismatch error``, ``Got completion from peer ...
  with error 4``) — https://github.com/NVIDIA/nccl/issues/969, https://github.com/NVIDIA/nccl/issues/928
* SGLang's scheduler watchdog quoted in a report's prose — https://github.com/sgl-project/sglang/issues/33393
"""
from __future__ import annotations

import json
from pathlib import Path

from ranktrace.analyzers import api
from ranktrace.analyzers.readers import nccl_log
from ranktrace.analyzers.readers.text import open_text
from ranktrace.analyzers.readers.text.prefixes import split_prefixes
from ranktrace.analyzers.readers.traceback.scan import Traceback, scan as scan_tracebacks
from tests.helpers import REPO

FIELD = REPO / "tests" / "field"


def _files(case: str) -> list[Path]:
    meta = json.loads((FIELD / case / "case.json").read_text())
    return [FIELD / case / f for f in meta["files"]]


def _verdict(paths: list[Path]) -> dict:
    return api.analyze(paths, liveness=None).verdict.to_dict()


def test_pdsh_host_prefix_is_peeled_and_names_the_host() -> None:
    line = (FIELD / "accelerate-1317" / "pdsh_log.txt").read_text().splitlines()[8]
    prefix, message = split_prefixes(line)
    assert prefix.host == "104.171.201.171"
    assert message.startswith("│ ❱  81 │")
    # a version number or a ratio in a message is no host
    assert split_prefixes("1.5: not a host")[0].host is None


def test_rich_box_traceback_is_read_as_its_frames() -> None:
    # accelerate-1317: the location wraps onto the next box line ("│ in wait_for_everyone │"), the ❱ line is the code
    (path,) = _files("accelerate-1317")
    records = [r for r in scan_tracebacks(open_text(path)).records if isinstance(r, Traceback)]
    assert len(records) == 1
    frame = records[0].frames[0]
    assert (frame.file.rsplit("/", 1)[-1], frame.lineno, frame.func) == ("other.py", 81, "wait_for_everyone")
    assert frame.code == "torch.distributed.barrier()"
    assert records[0].exc_type is None   # the paste cut the exception line: unknown, not invented


def test_a_rich_traceback_is_no_longer_nothing_readable() -> None:
    # both were exit 2 before: a person reads the barrier call (accelerate-1317) and the store timeout (deepdewedge-20)
    v = _verdict(_files("accelerate-1317"))
    assert v["status"] in ("hang", "crashed") and (v["operation"] or {}).get("name") == "barrier"
    v = _verdict(_files("deepdewedge-20"))
    assert (v["status"], v["kind"]) == ("crashed", "init_hang")


def test_net_ib_failure_warn_is_a_transport_failure_not_a_mismatched_call() -> None:
    # nccl-969: the maintainer's answer was "environment configure error"; the WARN's "collective mismatch error" is
    # the IB receive's size check, so no collective_mismatch verdict, but the run did fail
    v = _verdict(_files("nccl-969"))
    assert v["status"] == "crashed" and v["kind"] != "collective_mismatch"
    assert "net_ib.cc" in v["summary"] or "NET/IB" in v["summary"]
    # nccl-928: "NET/IB : Got completion from peer ... with error 4 ... vendor err 81" on several hosts
    (path,) = _files("nccl-928")
    obs = nccl_log.read(path).observations.to_pylist()
    assert any(o["kind"] == "transport_error" and o["name"] == "net_error" and "vendor err 81" in o["detail"]
               for o in obs)
    assert _verdict([path])["status"] == "crashed"


def test_sglang_watchdog_quoted_in_prose_is_read_but_names_no_collective() -> None:
    # sglang-33393: the only text is the report's sentence; it was "nothing readable" (exit 2)
    (path,) = _files("sglang-33393")
    res = api.analyze([path], liveness=None)
    v = res.verdict.to_dict()
    (read,) = v["input_reads"]
    assert "server_log" in read["recognised"] and read["lines_used"] == 1
    assert v["operation"] is None or not (v["operation"] or {}).get("name")


def test_half_prose_half_log_keeps_the_readable_half(tmp_path: Path) -> None:
    # a ticket that quotes one NCCL WARN line between sentences: the line is used, the prose counted as not read
    warn = (FIELD / "nccl-969" / "error_log.txt").read_text().splitlines()[0]
    p = tmp_path / "ticket.txt"
    p.write_text("We see this on two nodes since Monday.\n" + warn + "\nAny idea? It worked last week.\n")
    v = _verdict([p])
    (read,) = v["input_reads"]
    assert read["lines_used"] == 1 and read["lines_total"] == 3
    assert v["status"] == "crashed"


def test_sglangs_subprocess_watchdog_crash_line_is_a_crash_that_blames_no_rank(tmp_path: Path) -> None:
    """SGLang 0.5.23's SubprocessWatchdog (srt/utils/watchdog.py, the release's source: no posted sample found yet)
    logs `Subprocess scheduler_1 (pid=4242) crashed with exit code -9. Triggering SIGQUIT for cleanup...`; the
    scheduler's index counts this node's processes, not a global rank, so the crash names no culprit."""
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-01-10 10:00:00] server_args=ServerArgs(model_path='m', tp_size=2)\n"
        "[2026-01-10 10:00:20 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB\n"
        "[2026-01-10 10:00:20 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB\n"
        "[2026-01-10 10:00:40] Subprocess scheduler_1 (pid=4242) crashed with exit code -9. Triggering SIGQUIT for "
        "cleanup...\n")
    v = _verdict([log])
    assert v["status"] == "crashed", (v["status"], v["summary"])
    assert "signal 9" in v["summary"], v["summary"]
    assert v["culprit_ranks"] == [], v["culprit_ranks"]


def test_sglangs_configured_log_prefix_gives_the_lines_rank_pid_and_time() -> None:
    """SGLang under a logging config of its own writes `2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10
    scheduler.py:2655] ...` (the line as issue #26 quotes it from a public thread): the rank is the line's TP tag."""
    from ranktrace.analyzers.readers import server_log

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "server.log"
        log.write_text(
            "[2025-08-28 21:10:00 DP10 TP10 EP10] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
            "avail mem=20.00 GB, mem usage=50.00 GB.\n"
            "2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655] Scheduler hit an exception: "
            "Traceback (most recent call last):\n")
        rows = server_log.read(log).observations.to_pylist()
    exits = [r for r in rows if r["kind"] == "rank_exit"]
    assert [(r["rank"], r["pid"], r["line"]) for r in exits] == [(10, 125765, 2)], rows
    assert exits[0]["wall_ns"] is not None
