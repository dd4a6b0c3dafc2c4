"""A serving engine's start-up that stops: the last start-up step its log reached names where it is stuck.

SGLang / vLLM print one line per start-up step (distributed init, NCCL communicator init, message-queue connect,
weight loading, KV cache, CUDA-graph capture, serving). A log that reached a step and printed nothing after it —
no later step, no "server is ready" — stopped in that step. This is weaker evidence than a stack or a timeout (the
paste may just be cut there), so it is used only when nothing stronger speaks, and said with low confidence.
"""
from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.verdict import Evidence, Finding, Operation

__all__ = ["startup_stall", "INIT_STEPS"]

#: start-up steps that are communication set-up: a log ending in one of them is an init hang
INIT_STEPS = {"dist_init_begin": "torch distributed init", "nccl_comm_init_begin": "NCCL communicator init",
              "dist_init_mq_connect": "the TP group's message-queue connect (end of distributed init)"}
_ENDS = {"dist_init_begin": {"dist_init_end", "load_weights_begin", "load_weights_end", "kv_cache_alloc"},
         "nccl_comm_init_begin": {"dist_init_end", "load_weights_begin", "load_weights_end", "kv_cache_alloc",
                                  "worker_ready"},
         "dist_init_mq_connect": {"dist_init_end", "load_weights_begin", "load_weights_end", "kv_cache_alloc"}}


def _marks(ctx: Model) -> list[dict[str, Any]]:
    ev = ctx.events
    if ev.num_rows == 0:
        return []
    m = ev.filter(pc.and_(pc.equal(ev["kind"], "mark"), pc.equal(ev["source"], "server_log")))
    return sorted(m.select(["rank", "name", "file", "line", "detail"]).to_pylist(),
                  key=lambda r: (r["file"] or "", r["line"] or 0))


def startup_stall(ctx: Model) -> list[Candidate]:
    marks = _marks(ctx)
    if not marks or any(o["name"] == "server_ready" for o in ctx.observations("completion")):
        return []
    names = [m["name"] for m in marks]
    if "serving" in names:
        return []
    last = marks[-1]
    step = last["name"]
    if step in INIT_STEPS:
        later = _ENDS[step]
        if any(n in later for n in names[names.index(step):]):
            return []
        at = [m for m in marks if m["name"] == step]
        ranks = tuple(sorted({m["rank"] for m in at if m["rank"] is not None}))
        done = {o["rank"] for o in ctx.observations("nccl_init_complete") if o["rank"] is not None}
        summary = (f"start-up stopped in {INIT_STEPS[step]}: "
                   + (f"{ranks_text(ranks)} reached it" if ranks else "the log reached it")
                   + " and printed no later step" + (f" (NCCL init completed on {ranks_text(sorted(done))})"
                                                     if done else ""))
        ev = tuple(Evidence("server_log", m["file"], m["line"], (m["detail"] or step)[:200], m["rank"])
                   for m in at[-6:])
        return [Candidate("init_hang", summary, waiting=ranks,
                          operation=Operation(name="init_process_group" if step == "dist_init_begin"
                                              else "nccl_comm_init", phase="init"),
                          findings=[Finding("init_hang", summary, ranks, 0.4, ev)],
                          next_steps=["Dump every rank's stack now (py-spy dump --pid <scheduler/worker pid>): a rank "
                                      "in ncclCommInitRank / a store get / a socket connect is the init step that "
                                      "waits; a rank elsewhere is the one it waits for.",
                                      "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET to see which "
                                      "rank stops in communicator init; try NCCL_P2P_DISABLE=1 if it stops at P2P "
                                      "set-up."])]
    if step == "load_weights_begin":
        began = {m["rank"] for m in marks if m["name"] == "load_weights_begin" and m["rank"] is not None}
        ended = {m["rank"] for m in marks if m["name"] == "load_weights_end" and m["rank"] is not None}
        late = tuple(sorted(began - ended))
        if ended and late:
            summary = (f"{ranks_text(late)} never finished loading weights while {ranks_text(sorted(ended))} did: "
                       "those wait in the first collective after loading")
            return [Candidate("missing_ranks", summary, culprits=late, waiting=tuple(sorted(ended)),
                              operation=Operation(name="load_weights", phase="weight_loading"),
                              findings=[Finding("missing_ranks", summary, late, 0.4, ())],
                              next_steps=["See why those ranks load slowly (storage, a lock on the model cache)."])]
    return []
