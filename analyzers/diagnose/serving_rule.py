"""What serving start-up hangs look like, when no rank is missing from a collective.

enqueued_then_sync: every rank waits for the GPU in a host sync, and the last device communication each made was a
  collective ranktrace could only see *enqueued* (a profile's pynccl / custom all-reduce call, an NCCL op: returning
  from it is not finishing it, DESIGN §2). The collective is what hangs on the GPU; the sync is where the host waits
  for it. Named with the phase (``cuda-graph capture bs=64``) and the steps that isolate it fastest.
setup_step: every rank is inside the same set-up step of a communicator (ncclCommInitRank, custom all-reduce IPC
  set-up, graph-buffer registration) and in nothing below it: the step itself hangs — not "the application".

GPU utilisation (NVML samples) is evidence where present: a kernel spinning at 100% (NCCL waiting for a peer) versus
an idle GPU (the host waits for work that never started). Neither rule blames a rank: every rank shows the same.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow.compute as pc

from ranktrace.analyzers.diagnose.candidate import Candidate, ranks_text, stack_evidence
from ranktrace.analyzers.model.build import Model
from ranktrace.analyzers.model.phases import phase_text
from ranktrace.analyzers.verdict import Evidence, Finding, Operation

__all__ = ["enqueued_then_sync", "setup_step", "STEP_TEXT", "SYNC_NAMES"]

SYNC_NAMES = {"cuda_synchronize": "torch.cuda.synchronize", "accelerator_synchronize": "torch.accelerator.synchronize",
              "stream_synchronize": "torch.cuda.Stream.synchronize", "event_synchronize": "torch.cuda.Event.synchronize",
              "empty_cache": "torch.cuda.empty_cache", "accelerator_empty_cache": "torch.accelerator.empty_cache",
              "wait": "Work.wait"}
# set-up steps a profile records (category init / graph) and what a person calls them
STEP_TEXT = {
    "ncclCommInitRank": "NCCL communicator init (ncclCommInitRank)",
    "ncclCommInitRankConfig": "NCCL communicator init (ncclCommInitRankConfig)",
    "ncclGetUniqueId": "NCCL unique-id creation", "pynccl_init": "pynccl communicator set-up",
    "pynccl_comm_init": "pynccl communicator init", "device_communicator_init": "device communicator set-up",
    "custom_all_reduce_init": "custom all-reduce set-up (CUDA IPC buffer exchange)",
    "quick_all_reduce_init": "quick all-reduce set-up", "symm_mem_init": "symmetric-memory set-up",
    "mscclpp_init": "MSCCL++ set-up", "pcie_ipc_init": "PCIe IPC all-reduce set-up",
    "flashinfer_all_reduce_init": "FlashInfer all-reduce set-up", "nccl_window_register": "NCCL window registration",
    "shm_broadcast_init": "shared-memory broadcast queue set-up", "group_coordinator_init": "process-group set-up",
    "initialize_model_parallel": "model-parallel group set-up",
    "init_distributed_environment": "torch distributed init",
    "register_graph_buffers": "custom all-reduce graph-buffer registration",
    "register_peer_mapped_inputs": "custom all-reduce peer-mapped input registration",
    "graph_capture": "the TP group's graph-capture context", "custom_all_reduce_capture": "custom all-reduce capture",
}
_NOT_STEPS = {"init_process_group", "new_group", "destroy_process_group", "cuda_graph_capture",
              "make_graphed_callables", "replay"}
_ENQUEUE_BACKENDS = ("hook", "nccl")


def _ranks(ctx: Model) -> list[int]:
    return sorted(set(range(ctx.world)) if ctx.world else ctx.observed_ranks)


def _in_sync(ctx: Model, r: int) -> str | None:
    """The host sync rank r waits in (its innermost open span, else its stack), or None."""
    o = ctx.open_by_rank().get(r)
    if o is not None and o.category == "sync":
        return SYNC_NAMES.get(o.name, o.name)
    if ctx.host_states.get(r) == "host_sync_wait":
        st = ctx.stacks.get(r)
        top = st.frames[0] if st and st.frames else "a host sync"
        return top.split(" (")[0]
    return None


def _last_enqueued(ctx: Model, r: int) -> dict[str, Any] | None:
    """The last collective rank r issued that returned without any completion seen (hooked or NCCL)."""
    ops = ctx.ops
    if ops.num_rows == 0:
        return None
    mine = ops.filter(pc.and_(pc.equal(ops["rank"], r), pc.equal(ops["category"], "collective")))
    if mine.num_rows == 0:
        return None
    last = mine.sort_by([("t_enter", "descending")]).slice(0, 1).to_pylist()[0]
    if last["backend"] not in _ENQUEUE_BACKENDS or not last["returned"] or last["completed"] or last["errored"]:
        return None
    return last


def _gpu_evidence(ctx: Model, ranks: list[int]) -> list[Evidence]:
    """NVML: the GPU each rank uses and its utilisation in the last sample."""
    util = {o["name"]: o for o in ctx.observations("gpu_util") if o["name"]}
    if not util:
        return []
    gpu_of = {o["rank"]: o["name"] for o in ctx.observations("gpu_memory")
              if o["rank"] in ranks and o["detail"] == "process" and o["name"]}
    out = []
    for r in ranks:
        g = gpu_of.get(r)
        o = util.get(g) if g else None
        if o is None or o["value"] is None:
            continue
        v = o["value"]
        what = ("a kernel spins on it (an NCCL or custom all-reduce kernel waiting for a peer)" if v >= 90 else
                "it is idle: the host waits for work that is not running on the GPU" if v <= 5 else "partly busy")
        out.append(Evidence(o["source"] or "gpu", o["file"], o["line"], f"{g} at {v:.0f}% utilisation: {what}", r))
    return out


def _duration(secs: float | None) -> str:
    if secs is None:
        return ""
    if secs >= 120:
        return f" for {secs / 60:.0f} min"
    return f" for {secs:.0f} s"


def _phase(ctx: Model, ranks: list[int]) -> tuple[str | None, str | None, float | None]:
    cur = [ctx.current[r] for r in ranks if r in ctx.current and ctx.current[r].open]
    if not cur:
        return None, None, None
    (name, detail), _n = Counter((p.name, p.detail) for p in cur).most_common(1)[0]
    secs = [p.seconds for p in cur if (p.name, p.detail) == (name, detail) and p.seconds is not None]
    return name, detail, (min(secs) if secs else None)


def enqueued_then_sync(ctx: Model) -> list[Candidate]:
    ranks = _ranks(ctx)
    if len(ranks) < 2:
        return []
    syncs = {r: _in_sync(ctx, r) for r in ranks}
    if not all(syncs.values()):
        return []
    lasts = {r: _last_enqueued(ctx, r) for r in ranks}
    if not all(lasts.values()):
        return []
    keys = Counter((o["name"], o["group_desc"], o["seq"]) for o in lasts.values())  # type: ignore[union-attr]
    (name, comm, seq), n = keys.most_common(1)[0]
    if n != len(ranks) and len(keys) > 1 and any(k[0] == name and k[1] == comm for k in keys if k[2] != seq):
        return []  # ranks at different positions of the same communicator: the wait-for graph tells who is behind
    ref = next(o for o in lasts.values() if (o["name"], o["group_desc"], o["seq"]) == (name, comm, seq))  # type: ignore[union-attr]
    phase, detail, secs = _phase(ctx, ranks)
    where = phase_text(phase, detail) if phase else None
    sync_names = sorted(set(syncs.values()))  # type: ignore[arg-type]
    who = "all" if len(ranks) > 1 else "it"
    op_text = f"{comm + ' ' if comm else ''}{name} #{seq}"
    summary = (f"{ranks_text(ranks)}{' in ' + where if where else ''}{_duration(secs)}; the last call each made was "
               f"{op_text}, returned (enqueued, never seen complete); {who} now wait for the GPU in "
               f"{' / '.join(sync_names)}")
    ev = [Evidence(o["source"] or "events", o["file"], o["line"],  # type: ignore[index]
                   f"{o['group_desc'] or ''} {o['name']} seq {o['seq']} at {o['callsite']}: returned, "  # type: ignore[index]
                   f"not completed", r) for r, o in sorted(lasts.items())]
    for r in ranks:
        o = ctx.open_by_rank().get(r)
        if o is not None and o.category == "sync":
            ev.append(Evidence("events", o.file, o.line, f"waits in {SYNC_NAMES.get(o.name, o.name)} at "
                                                         f"{o.callsite}, never returned", r))
        elif r in ctx.stacks:
            ev.append(stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")))
    gpu = _gpu_evidence(ctx, ranks)
    ev += gpu
    if gpu:
        busy = [e for e in gpu if "spins" in e.detail]
        summary += ("; their GPUs are busy: a kernel spins waiting for a peer" if len(busy) == len(gpu) else
                    "; their GPUs are idle: the host waits for work that never started" if not busy else "")
    steps = [
        "Relaunch once with NCCL_P2P_DISABLE=1: if start-up then passes, the GPU peer-to-peer path is what hangs "
        "(PCIe ACS / IOMMU on a PCIe box, a bad NVLink: see `nvidia-smi topo -m`, `nvidia-smi nvlink -s`).",
        "If it still hangs, relaunch with --disable-custom-all-reduce (SGLang and vLLM): the custom all-reduce "
        "kernels over CUDA IPC are next to rule out.",
        "If it still hangs, relaunch with --disable-cuda-graph (SGLang) / --enforce-eager (vLLM): the hang is then "
        "in graph capture or its warm-up, not in serving.",
        f"The op: {op_text} at {ref.get('callsite')}; every rank returned from it and waits in "
        f"{' / '.join(sync_names)}: no rank is behind another.",
    ]
    members = ctx.graph.members.get(ref["chan"]) or tuple(ranks)
    return [Candidate("stuck_in_collective", summary, culprits=(), waiting=tuple(ranks),
                      operation=Operation(name=name, group=ref["group"], group_desc=comm, group_ranks=tuple(members),
                                          seq=seq, dtype=ref.get("dtype"), shape=ref.get("shape"), phase=phase,
                                          callsite=ref.get("callsite"), phase_detail=detail),
                      findings=[Finding("stuck_in_collective", summary, tuple(ranks), 0.7, tuple(ev))],
                      next_steps=steps)]


def innermost_step(ctx: Model, r: int) -> Any:
    """Rank r's innermost open span when it is a communicator set-up / registration step, else None."""
    o = ctx.open_by_rank().get(r)
    if o is None or o.category not in ("init", "graph") or o.name in _NOT_STEPS:
        return None
    return o


def open_step(ctx: Model, r: int) -> Any:
    """The innermost set-up / registration step rank r is inside, even below a collective it waits in."""
    best = None
    for s in ctx.open_spans:  # time order: the last one wins
        if s.rank == r and s.category in ("init", "graph") and s.name not in _NOT_STEPS:
            best = s
    return best


def setup_step(ctx: Model) -> list[Candidate]:
    ranks = _ranks(ctx)
    if len(ranks) < 2 or ctx.graph.edges:
        return []
    steps = {r: innermost_step(ctx, r) for r in ranks}
    if not all(steps.values()):
        return []
    names = {s.name for s in steps.values()}
    if len(names) != 1:
        return []
    name = names.pop()
    first = next(iter(steps.values()))
    text = STEP_TEXT.get(name, name.replace("_", " "))
    phase, detail, secs = _phase(ctx, ranks)
    where = f" during {phase_text(phase, detail)}" if phase and phase not in ("torch_distributed_init",) else ""
    summary = (f"{ranks_text(ranks)} are all inside {text}{where} and none has returned: that step hangs "
               f"(every rank is in it, none is waiting for another), not the application")
    ev = [Evidence("events", s.file, s.line, f"entered {s.name} at {s.callsite}, never returned", r)
          for r, s in sorted(steps.items())]
    ev += [stack_evidence(ctx.stacks[r], ctx.host_states.get(r, "unknown")) for r in ranks if r in ctx.stacks]
    ev += _gpu_evidence(ctx, ranks)
    registration = first.category == "graph"
    if registration:
        next_steps = [
            "Relaunch with --disable-custom-all-reduce: if start-up then passes, the custom all-reduce's CUDA IPC "
            "mapping of peer buffers is what hangs (check peer access: `nvidia-smi topo -m`, "
            "NCCL_P2P_DISABLE=1 does not affect it).",
            "Or relaunch with --disable-cuda-graph (SGLang) / --enforce-eager (vLLM): no capture, no registration.",
            f"The stacks of the ranks show where inside {name} they wait (a cudaIpcOpenMemHandle, a peer exchange).",
        ]
    else:
        next_steps = [
            "Relaunch with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET: the last INIT/BOOTSTRAP line of each "
            "rank names the step (bootstrap connect, topology, transport set-up) it never finished.",
            "Check that every rank reaches the others on the interface NCCL picks (NCCL_SOCKET_IFNAME) and that no "
            "firewall drops the bootstrap port; try NCCL_P2P_DISABLE=1 if it stops at P2P set-up.",
        ]
        if "custom" in name or "ipc" in name:
            next_steps.insert(0, "Relaunch with --disable-custom-all-reduce: its CUDA IPC set-up is what hangs.")
    op = Operation(name=name, group=getattr(first, "group", None), phase=phase or ("init" if not registration else None),
                   callsite=first.callsite, phase_detail=detail)
    kind = "graph_capture" if registration else "init_hang"
    return [Candidate(kind, summary, culprits=(), waiting=tuple(ranks), operation=op,
                      findings=[Finding(kind, summary, tuple(ranks), 0.7, tuple(ev))], next_steps=next_steps)]
