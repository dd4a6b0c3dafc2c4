"""The lines that state a version or an environment setting, as the tools print them (the wordings are listed
above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "PACKAGES", "ENV_PREFIXES", "COLLECT_ENV", "CHECK_ENV", "PIP_FREEZE", "PIP_LIST", "PIP_TAG",
           "INSTALLED", "NCCL_VERSION", "VLLM_NCCL", "SET_BY_ENV", "DRIVER", "ASSIGNMENTS", "ASSIGNMENT", "package_name"]

# * ``python -m torch.utils.collect_env`` (and vLLM's copy of it): ``PyTorch version: 2.1.0+cu121``, ``CUDA runtime
#   version: 12.1.105``, ``Nvidia driver version: 535.104.05``, ``Python version: 3.10.12 (main, ...)``,
#   ``vLLM Version: 0.5.2``, then ``[pip3] torch==2.1.0`` / ``[conda] pytorch  2.1.0  py3.10_cuda12.1_0  pytorch``;
#   ``python -m sglang.check_env``: ``sglang: 0.4.1``, ``PyTorch: 2.5.1+cu124``, ``CUDA Driver Version: 550.54.15``;
# * ``pip freeze`` (``torch==2.1.0``), ``pip list`` (``torch   2.1.0``), ``Successfully installed torch-2.1.0 ...``;
# * ``NCCL version 2.18.1+cuda12.1`` anywhere (torch's error messages end with ``NCCL version 2.20.5``), vLLM's
#   ``vLLM is using nccl==2.28.9``, nvidia-smi's ``Driver Version: 535.183.01``;
# * settings: ``NCCL_P2P_DISABLE=1``, ``export NCCL_DEBUG=INFO``, ``declare -x NCCL_IB_HCA="mlx5"``, and
#   ``NCCL_DEBUG=INFO torchrun ...`` (assignments in front of a command). An assignment written *after* a command
#   (``./all_reduce_perf -g 2 NCCL_P2P_DISABLE=1``) is an argument, not the environment, and is not read.
#
# Anchored or literal-led, bounded patterns.

#: distribution name (lower case, '-' and '_' alike) → the ``version`` row's name
PACKAGES: dict[str, str] = {
    "torch": "torch", "pytorch": "torch", "vllm": "vllm", "sglang": "sglang", "deepspeed": "deepspeed",
    "horovod": "horovod", "transformers": "transformers", "accelerate": "accelerate", "flashinfer": "flashinfer",
    "flashinfer-python": "flashinfer", "triton": "triton", "pytorch-triton": "triton", "tensorrt-llm": "tensorrt_llm",
    "megatron-core": "megatron_core", "xformers": "xformers", "nccl": "nccl", "nvidia-nccl-cu11": "nccl",
    "nvidia-nccl-cu12": "nccl", "nvidia-nccl-cu13": "nccl", "lightning": "lightning",
    "pytorch-lightning": "lightning", "ray": "ray", "mpi4py": "mpi4py", "sgl-kernel": "sgl_kernel",
    "jax": "jax", "jaxlib": "jaxlib", "tensorflow": "tensorflow", "cupy": "cupy",
}
_NAMES = "|".join(sorted((re.escape(k).replace("\\-", "[-_]") for k in PACKAGES), key=len, reverse=True))
#: variable families whose settings are context for a hang (by prefix) and single names
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVIDIA_", "GLOO_", "VLLM_", "SGLANG_", "HOROVOD_", "UCX_", "FI_",
                "OMPI_", "PYTORCH_", "NVSHMEM_", "TP_", "MASTER_", "CUBLAS_", "TORCHELASTIC_", "DEEPSPEED_")
_ENV = r"(?:NCCL|TORCH|CUDA|NVIDIA|GLOO|VLLM|SGLANG|HOROVOD|UCX|FI|OMPI|PYTORCH|NVSHMEM|TP|MASTER|CUBLAS|" \
       r"TORCHELASTIC|DEEPSPEED)_[A-Z0-9_]{1,60}|WORLD_SIZE|LOCAL_RANK|RANK|OMP_NUM_THREADS|LOCAL_WORLD_SIZE"

CATALOGUE: tuple[str, ...] = (
    r"\s{0,8}Collecting environment information",
    r"\s{0,8}(?:PyTorch version|CUDA runtime version|Nvidia driver version|CUDA used to build PyTorch|"
    r"vLLM Version|Python version)\s{0,4}:\s{0,4}\S",
    r"\s{0,8}(?:PyTorch|sglang|vllm|flashinfer|CUDA Driver Version|NCCL)\s{0,4}:\s{0,4}\d",
    r"\s{0,8}\[(?:pip3?|conda)\]\s{1,8}\S",
    r"\s{0,8}(?:" + _NAMES + r")(?:\[[\w,]{1,60}\])?\s{0,2}==\s{0,2}\d",
    r"\s{0,8}(?:" + _NAMES + r")\s{2,60}\d{1,4}\.\d",
    r".{0,200}?(?:NCCL version \d{1,3}\.\d{1,3}\.\d|vLLM is using nccl==\d|Successfully installed \S|"
    r"NCCL INFO [A-Z][A-Z0-9_]{1,60} set by environment to )",
    r"\s{0,8}(?:\S{0,80}[$#%>]\s{1,4})?(?:export\s{1,4}|declare -x\s{1,4}|set\s{1,4})?(?:" + _ENV
    + r")=",
)

COLLECT_ENV = re.compile(r"\s{0,8}(?P<key>PyTorch version|CUDA runtime version|Nvidia driver version|"
                         r"CUDA used to build PyTorch|vLLM Version|Python version)\s{0,4}:\s{0,4}(?P<v>\S{1,80})")
CHECK_ENV = re.compile(r"\s{0,8}(?P<key>PyTorch|sglang|vllm|flashinfer|CUDA Driver Version|NCCL)\s{0,4}:\s{0,4}"
                       r"(?P<v>\d\S{0,80})")
PIP_TAG = re.compile(r"\s{0,8}\[(?:pip3?|conda)\]\s{1,8}(?P<rest>\S.{0,200})")
PIP_FREEZE = re.compile(r"\s{0,8}(?P<name>[A-Za-z][\w.-]{0,60})(?:\[[\w,]{1,60}\])?\s{0,2}==\s{0,2}(?P<v>\d[\w.+!-]{0,60})")
PIP_LIST = re.compile(r"\s{0,8}(?P<name>[A-Za-z][\w.-]{0,60})\s{1,60}(?P<v>\d{1,4}\.[\w.+!-]{0,60})(?:\s|$)")
INSTALLED = re.compile(r"Successfully installed (?P<rest>.{1,4000})")
NCCL_VERSION = re.compile(r"NCCL version (?P<v>\d{1,3}\.\d{1,3}\.\d{1,4}(?:[+.]\S{0,30})?)")
VLLM_NCCL = re.compile(r"vLLM is using nccl==(?P<v>\d[\w.+]{0,40})")
#: NCCL's own report of a setting it read: ``NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0``
SET_BY_ENV = re.compile(r"NCCL INFO (?P<name>[A-Z][A-Z0-9_]{1,60}) set by environment to (?P<v>\S{0,400})")
DRIVER = re.compile(r"Driver Version:\s{0,4}(?P<v>\d{2,4}\.\d{1,4}(?:\.\d{1,4})?)")
#: a run of assignments at the start of a line (after a shell prompt, ``export`` / ``declare -x`` / ``set``)
ASSIGNMENTS = re.compile(r"\s{0,8}(?:\S{0,80}[$#%>]\s{1,4})?(?:export\s{1,4}|declare -x\s{1,4}|set\s{1,4})?(?=[A-Z])")
ASSIGNMENT = re.compile(r"(?P<name>[A-Z][A-Z0-9_]{0,80})=(?P<q>[\"']?)(?P<v>[^\s\"']{0,400})(?P=q)(?:\s{1,8}|$)")


def package_name(dist: str) -> str | None:
    """The ``version`` row name of a distribution (``nvidia-nccl-cu12`` → ``nccl``), or None when not tracked.

    >>> package_name("nvidia_nccl_cu12"), package_name("Torch"), package_name("numpy") is None
    ('nccl', 'torch', True)
    """
    return PACKAGES.get(dist.lower().replace("_", "-"))
