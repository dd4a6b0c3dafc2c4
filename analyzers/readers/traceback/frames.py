"""What a traceback's frames say: short file names, application vs library frames, the torch.distributed op the
traceback was raised in (directly, or through a framework's wrapper), and the set-up stage of an init failure."""
from __future__ import annotations

import re

__all__ = ["short_file", "is_app", "Op", "find_op", "init_stage", "cpp_init_stage", "launcher_kind"]

_STDLIB = re.compile(r"/lib/python\d(?:\.\d{1,3})?t?/")
_TORCH_SRC = re.compile(r"(?:^|/)torch/(?:distributed|nn|multiprocessing|utils|autograd|cuda|_[a-z_]{1,30}|"
                        r"[a-z_]{1,30}\.py$)")

# distributed_c10d function -> (canonical op, category)
_C10D: dict[str, tuple[str, str]] = {
    **{n: (n, "collective") for n in (
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
        "all_gather_object", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
        "reduce", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter", "scatter_object_list",
        "barrier", "monitored_barrier")},
    "_all_gather_base": ("all_gather_into_tensor", "collective"),
    "_reduce_scatter_base": ("reduce_scatter_tensor", "collective"),
    "all_reduce_multigpu": ("all_reduce", "collective"), "broadcast_multigpu": ("broadcast", "collective"),
    **{n: (n, "p2p") for n in ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                               "recv_object_list")},
    **{n: (n, "init") for n in ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
                                "destroy_process_group", "split_group")},
    "_new_group_with_tag": ("new_group", "init"),
}

# (path suffix, function) -> op, for frameworks that wrap torch.distributed
_WRAPPERS: dict[str, dict[str, str]] = {
    "deepspeed/comm/comm.py": {
        "all_reduce": "all_reduce", "inference_all_reduce": "all_reduce", "all_reduce_coalesced":
        "all_reduce_coalesced", "broadcast": "broadcast", "all_gather": "all_gather", "allgather_fn":
        "all_gather_into_tensor", "all_gather_into_tensor": "all_gather_into_tensor", "all_gather_base":
        "all_gather_into_tensor", "reduce_scatter_fn": "reduce_scatter_tensor", "reduce_scatter_tensor":
        "reduce_scatter_tensor", "reduce_scatter": "reduce_scatter", "all_to_all_single": "all_to_all_single",
        "all_to_all": "all_to_all", "barrier": "barrier", "monitored_barrier": "monitored_barrier", "send": "send",
        "recv": "recv", "isend": "isend", "irecv": "irecv", "gather": "gather", "scatter": "scatter",
        "reduce": "reduce", "broadcast_object_list": "broadcast_object_list"},
    "deepspeed/comm/torch.py": {
        "all_reduce": "all_reduce", "inference_all_reduce": "all_reduce", "all_reduce_coalesced":
        "all_reduce_coalesced", "broadcast": "broadcast", "all_gather": "all_gather", "all_gather_into_tensor":
        "all_gather_into_tensor", "all_gather_base": "all_gather_into_tensor", "all_gather_coalesced":
        "all_gather_coalesced", "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter":
        "reduce_scatter", "all_to_all_single": "all_to_all_single", "all_to_all": "all_to_all", "barrier":
        "barrier", "monitored_barrier": "monitored_barrier", "send": "send", "recv": "recv", "isend": "isend",
        "irecv": "irecv", "gather": "gather", "scatter": "scatter", "reduce": "reduce"},
    "accelerate/utils/operations.py": {
        "_gpu_gather_one": "all_gather", "_gpu_gather": "all_gather", "gather": "all_gather",
        "gather_object": "all_gather_object", "_gpu_gather_object": "all_gather_object", "broadcast": "broadcast",
        "_gpu_broadcast": "broadcast", "broadcast_object_list": "broadcast_object_list", "reduce": "all_reduce",
        "_reduce_across_processes": "all_reduce"},
    "accelerate/state.py": {"wait_for_everyone": "barrier"},
    "accelerate/accelerator.py": {"wait_for_everyone": "barrier"},
    "lightning_fabric/utilities/distributed.py": {"_sync_ddp": "all_reduce", "_gather_all_tensors": "all_gather",
                                                  "_simple_gather_all_tensors": "all_gather"},
    "lightning/fabric/utilities/distributed.py": {"_sync_ddp": "all_reduce", "_gather_all_tensors": "all_gather",
                                                  "_simple_gather_all_tensors": "all_gather"},
    "megatron/core/tensor_parallel/mappings.py": {
        "_reduce": "all_reduce", "_gather_along_first_dim": "all_gather_into_tensor",
        "_gather_along_last_dim": "all_gather", "_reduce_scatter_along_first_dim": "reduce_scatter_tensor"},
    "torch/nn/parallel/distributed.py": {
        "_distributed_broadcast_coalesced": "broadcast", "_sync_module_states": "broadcast",
        "_verify_param_shape_across_processes": "all_gather"},
    "torch/distributed/_functional_collectives.py": {
        "all_reduce": "all_reduce", "all_gather_tensor": "all_gather_into_tensor", "reduce_scatter_tensor":
        "reduce_scatter_tensor", "all_to_all_single": "all_to_all_single", "broadcast": "broadcast"},
}
_P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"})
_CODE_CALL = re.compile(r"\b(?:dist|distributed|torch\.distributed|c10d)\.(?P<op>[a-z_]{3,40})\(")

# set-up stage markers, innermost first wins: (function, stage)
_INIT_MARKS: dict[str, str] = {
    "_store_based_barrier": "store_barrier", "_create_c10d_store": "store", "_tcp_rendezvous_handler": "store",
    "_env_rendezvous_handler": "store", "_file_rendezvous_handler": "store", "_create_store": "store",
    "next_rendezvous": "rendezvous", "_rendezvous": "rendezvous", "rendezvous": "rendezvous",
    "_new_process_group_helper": "nccl_init",
}
_CPP_INIT_MARKS = (("broadcastUniqueNCCLID", "nccl_unique_id"), ("ncclCommInitRank", "nccl_init"),
                   ("NCCLComm::create", "nccl_init"), ("getNCCLComm", "nccl_init"), ("initNCCLComm", "nccl_init"),
                   ("TCPStore::TCPStore", "store"), ("waitForWorkers", "store"), ("SocketConnectOp", "connect"),
                   ("Socket::connect", "connect"), ("connectFullMesh", "connect"))


def short_file(path: str) -> str:
    """py-spy's short spelling: the path after site-packages/ or dist-packages/ (or the stdlib's lib/pythonX.Y/)."""
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        i = p.rfind(marker)
        if i >= 0:
            return p[i + len(marker):]
    m = _STDLIB.search(p)
    if m:
        return p[m.end():]
    return p


def is_app(path: str) -> bool:
    """A frame of the user's code: not an installed package, not the stdlib, not torch's own source tree."""
    p = path.replace("\\", "/")
    if "site-packages/" in p or "dist-packages/" in p or _STDLIB.search(p):
        return False
    if p.startswith("<") or "/<frozen" in p:
        return False
    return _TORCH_SRC.search(p) is None


class Op:
    """The torch.distributed op a traceback was raised in."""

    __slots__ = ("name", "category", "index", "via")

    def __init__(self, name: str, category: str, index: int, via: str) -> None:
        self.name = name
        self.category = category
        self.index = index      # the frame (innermost-first position) that names it
        self.via = via          # distributed_c10d | <wrapper path> | code

    def __repr__(self) -> str:
        return f"Op({self.name!r}, {self.category!r}, {self.index}, {self.via!r})"


def find_op(frames: list[tuple[str, int, str, str | None]], cut_bottom: bool) -> Op | None:
    """`frames` innermost first as (file, line, function, code line).

    Which frame names the op, in order (innermost first):

    1. a ``torch/distributed/distributed_c10d.py`` frame whose function is a public op (``all_reduce``, ``barrier``,
       ``init_process_group`` ...; ``c10d_logger.wrapper`` and private helpers are skipped);
    2. a framework's wrapper of one (DeepSpeed ``deepspeed/comm/comm.py`` / ``torch.py``, accelerate, Lightning,
       Megatron, torch's functional collectives);
    3. only for a traceback cut before its end: the innermost shown frame's code line calling ``dist.<op>(`` (the call
       into the frames that were cut off).
    """
    for i, (file, _line, func, _code) in enumerate(frames):
        if file.replace("\\", "/").endswith("distributed/distributed_c10d.py") and func in _C10D:
            name, cat = _C10D[func]
            return Op(name, cat, i, "distributed_c10d")
    for i, (file, _line, func, _code) in enumerate(frames):
        f = file.replace("\\", "/")
        for suffix, funcs in _WRAPPERS.items():
            if f.endswith(suffix) and func in funcs:
                name = funcs[func]
                return Op(name, "p2p" if name in _P2P else "collective", i, suffix)
    if cut_bottom and frames and frames[0][3]:
        m = _CODE_CALL.search(frames[0][3] or "")
        if m and m.group("op") in _C10D:
            name, cat = _C10D[m.group("op")]
            return Op(name, cat, 0, "code")
    return None


def init_stage(frames: list[tuple[str, int, str, str | None]]) -> tuple[str, str] | None:
    """(stage, marker function) of the innermost set-up step the frames show, for a traceback raised in init."""
    for file, _line, func, _code in frames:
        if "torch/distributed" in file.replace("\\", "/") and func in _INIT_MARKS:
            return _INIT_MARKS[func], func
    return None


def cpp_init_stage(symbols: list[str]) -> tuple[str, str] | None:
    for sym in symbols:
        for mark, stage in _CPP_INIT_MARKS:
            if mark in sym:
                return stage, mark
    return None


def launcher_kind(frames: list[tuple[str, int, str, str | None]]) -> str | None:
    """'launcher (torchrun)' / 'launcher (spawn)' when the traceback is the launcher's own, not a rank's."""
    files = [f.replace("\\", "/") for f, _l, _fn, _c in frames]
    if any(f.endswith(("torch/distributed/run.py", "elastic/agent/server/api.py", "distributed/launcher/api.py",
                       "torch/distributed/launch.py", "/bin/torchrun")) for f in files):
        return "launcher (torchrun)"
    if frames and any(f.endswith("torch/multiprocessing/spawn.py") and fn in ("join", "start_processes", "spawn")
                      for f, _l, fn, _c in frames) and not any(fn == "_wrap" for _f, _l, fn, _c in frames):
        return "launcher (spawn)"
    return None
