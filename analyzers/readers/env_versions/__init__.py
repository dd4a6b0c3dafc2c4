"""Read versions and environment settings (collect_env, check_env, pip, ``NCCL version``, ``export NCCL_*``) into
``version`` and ``env`` OBSERVATIONS rows.

Why: half of the hangs people post are explained by a version (an NCCL release with a known bug, a driver too old
for P2P on a GPU) or a setting (``NCCL_P2P_DISABLE=1`` that fixes it, ``NCCL_SOCKET_IFNAME`` pointing at the wrong
interface). The report shows them as context next to the verdict; the wordings read are in ``signatures``.

Rows (``source="env_versions"``, ``file``, ``line``, ``rank`` = the line's launcher prefix rank or null):

* ``version`` — ``name`` = ``torch`` | ``nccl`` | ``cuda`` (runtime) | ``torch_cuda`` (CUDA torch was built with) |
  ``driver`` | ``python`` | a framework (``vllm``, ``sglang``, ``deepspeed``, ``horovod``, ``transformers``,
  ``flashinfer``, ``triton`` ...), ``detail`` = the version string (``2.1.0+cu121``); ``value`` null.
* ``env`` — ``name`` = the variable (``NCCL_*``, ``TORCH_*``, ``CUDA_*``, ``GLOO_*``, ``VLLM_*``, ``MASTER_*``,
  ``WORLD_SIZE``, ...), ``detail`` = its value through ``tracer.redact.redact_env`` (a secret-named variable's
  value is never written). From ``export``/``declare -x`` lines, ``env | grep`` output, assignments in front of a
  command, and NCCL's ``NCCL_X set by environment to Y``.

One row per (kind, name, value): the first line that states it. ``ReadResult.version`` = the torch version.
Known limits: an assignment after a command (an argument, no effect) is not read on purpose; settings made in
Python (``os.environ[...] = ...``) or in a YAML launcher config are not read.
"""
from __future__ import annotations

from ranktrace.analyzers.readers.base import ColumnMap, ReaderError, ReadResult
from ranktrace.analyzers.readers.env_versions import rows, scan
from ranktrace.analyzers.readers.env_versions.signatures import CATALOGUE
from ranktrace.analyzers.readers.text import TextDoc

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "CATALOGUE", "read_doc"]

FORMAT = "env_versions"
SOURCE = "env_versions"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("collect_env 'PyTorch version: X' etc.", "OBSERVATIONS.name/detail (version)", "str", "-", "torch 1.0"),
    ColumnMap("'[pip3] name==X' / 'name==X' / 'name   X' / 'Successfully installed name-X'",
              "OBSERVATIONS.name/detail (version)", "str", "-", "-"),
    ColumnMap("'NCCL version X' / 'vLLM is using nccl==X'", "OBSERVATIONS.detail (version nccl)", "str", "-", "-"),
    ColumnMap("nvidia-smi 'Driver Version: X'", "OBSERVATIONS.detail (version driver)", "str", "-", "-"),
    ColumnMap("'[export ]NAME=value' / 'NCCL INFO NAME set by environment to value'",
              "OBSERVATIONS.name/detail (env, redacted)", "str", "-", "-"),
    ColumnMap("launcher prefix", "OBSERVATIONS.rank", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "version": "name = torch | nccl | cuda | torch_cuda | driver | python | framework, detail = version",
    "env": "name = variable, detail = value (redacted)",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The versions and settings stated in `doc`. ReaderError when it states none."""
    facts = scan.scan(doc)
    if not facts:
        raise ReaderError(doc.path, "no version or environment setting")
    return rows.result(doc.path, FORMAT, SOURCE, facts)
