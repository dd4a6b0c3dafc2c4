"""Regenerate the Flight Recorder JSON fixtures of two scenarios (run by hand; tests only read the output).

The shape copies a real torch 2.13 ``_dump_fr_trace_json()`` dump (shared/data/local/torch-2.13-gloo-hang/
fr_gloo_rank0.json: compact JSON, keys sorted, 0 for unknown times, string pg_status values) with NCCL-style
values from formats.md §3 (``nccl:`` profiling names, a named ``pg_config`` entry, ``completed`` states).

    python tests/data/scenarios/_make_fr_scenarios.py
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
T0 = 1_795_937_452_000_000_000
THREAD = {0: "140368805194624", 1: "140512339437376", 2: "139925470345024", 3: "140636598524800"}


def entry(rank: int, seq: int, state: str, *, name: str = "nccl:all_reduce", size: int = 4096,
          dtype: str = "Float", t_off_ms: float = 0.0) -> dict[str, Any]:
    created = T0 + int(seq * 50e6 + t_off_ms * 1e6) + rank * 137_000
    completed = created + 4_000_000 if state == "completed" else 0
    return {
        "collective_seq_id": seq, "input_dtypes": [dtype], "input_sizes": [[size]], "is_p2p": False,
        "op_id": seq, "output_dtypes": [dtype], "output_sizes": [[size]], "p2p_seq_id": 0, "pg_id": 0,
        "process_group": ["0", "default_pg"], "profiling_name": name, "record_id": seq - 1,
        "retired": state == "completed", "state": state, "thread_id": THREAD[rank], "thread_name": "pt_main_thread",
        "time_created_ns": created, "time_discovered_completed_ns": completed, "time_discovered_started_ns": 0,
        "timeout_ms": 600000,
    }


def dump(entries: list[dict[str, Any]]) -> str:
    last = entries[-1]["collective_seq_id"] if entries else -1
    done = max([e["collective_seq_id"] for e in entries if e["state"] == "completed"], default=-1)
    doc = {
        "comm_lib_version": "2.27.7", "entries": entries, "nccl_comm_state": {},
        "pg_config": {"0": {"desc": "default_pg", "name": "0", "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {"0": {"last_completed_collective": str(done), "last_enqueued_collective": str(last),
                            "last_started_collective": "-1"}},
        "version": "2.10",
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def missing_rank() -> None:
    """Rank 1 never issued all_reduce #7; ranks 0, 2, 3 enqueued it and wait (scheduled)."""
    out = HERE / "fr_missing_rank"
    for r in range(4):
        n = 6 if r == 1 else 7
        es = [entry(r, s, "completed", name="nccl:broadcast" if s == 1 else "nccl:all_reduce") for s in range(1, n)]
        es.append(entry(r, n, "completed" if (r == 1) else "scheduled"))
        (out / f"nccl_trace_rank_{r}.json").write_text(dump(es) + "\n")


def nccl_not_completed() -> None:
    """All ranks issued all_reduce #42; ranks 0-2 saw it complete, rank 3's stays scheduled (NCCL async case)."""
    out = HERE / "fr_nccl_not_completed"
    for r in range(4):
        es = [entry(r, s, "completed", size=1 << 20, dtype="BFloat16") for s in range(33, 42)]
        es.append(entry(r, 42, "scheduled" if r == 3 else "completed", size=1 << 20, dtype="BFloat16"))
        for i, e in enumerate(es):  # a wrapped ring: record ids continue from earlier entries
            e["record_id"] = 100 + i
        (out / f"nccl_trace_rank_{r}.json").write_text(dump(es) + "\n")


if __name__ == "__main__":
    missing_rank()
    nccl_not_completed()
