"""The torch.distributed functions ranktrace records, and where each one's tensor and peer arguments are.

Read by patch_c10d (what to patch) and wrap_ops (how to read a call's arguments).
"""
from __future__ import annotations

__all__ = ["OP_SPECS", "INIT_OPS", "COALESCING_MANAGER", "SENDS", "ALWAYS_ASYNC"]

# name -> (category, input tensor argument, input is a list, peer argument names)
OP_SPECS: dict[str, tuple[str, str | None, bool, tuple[str, ...]]] = {
    "all_reduce": ("collective", "tensor", False, ()),
    "broadcast": ("collective", "tensor", False, ()),
    "reduce": ("collective", "tensor", False, ()),
    "all_gather": ("collective", "tensor", False, ()),
    "all_gather_into_tensor": ("collective", "input_tensor", False, ()),
    "reduce_scatter": ("collective", "input_list", True, ()),
    "reduce_scatter_tensor": ("collective", "input", False, ()),
    "all_to_all": ("collective", "input_tensor_list", True, ()),
    "all_to_all_single": ("collective", "input", False, ()),
    "gather": ("collective", "tensor", False, ()),
    "scatter": ("collective", "tensor", False, ()),
    "barrier": ("collective", None, False, ()),
    "monitored_barrier": ("collective", None, False, ()),
    "all_reduce_coalesced": ("collective", "tensors", True, ()),
    "all_gather_coalesced": ("collective", "input_tensor_list", True, ()),
    "all_gather_object": ("collective", None, False, ()),
    "broadcast_object_list": ("collective", None, False, ()),
    "gather_object": ("collective", None, False, ()),
    "scatter_object_list": ("collective", None, False, ()),
    "send": ("p2p", "tensor", False, ("dst", "group_dst")),
    "isend": ("p2p", "tensor", False, ("dst", "group_dst")),
    "recv": ("p2p", "tensor", False, ("src", "group_src")),
    "irecv": ("p2p", "tensor", False, ("src", "group_src")),
    "send_object_list": ("p2p", None, False, ("dst", "group_dst")),
    "recv_object_list": ("p2p", None, False, ("src", "group_src")),
    "batch_isend_irecv": ("p2p", None, False, ()),
}
INIT_OPS = ("init_process_group", "new_group", "destroy_process_group")
COALESCING_MANAGER = "_coalescing_manager"
SENDS = frozenset({"send", "isend", "send_object_list"})
ALWAYS_ASYNC = frozenset({"isend", "irecv"})
