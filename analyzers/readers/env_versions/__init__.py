"""env_versions: versions and environment settings (collect_env, check_env, pip, ``NCCL version``,
``export NCCL_*``) read into ``version`` / ``env`` OBSERVATIONS: half of the hangs people post are explained by a
version or a setting. Stages: :mod:`.signatures` (the wordings) -> :mod:`.scan` -> :mod:`.rows`."""
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
    """The versions and settings stated in `doc`. ReaderError when it states none.

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
    facts = scan.scan(doc)
    if not facts:
        raise ReaderError(doc.path, "no version or environment setting")
    return rows.result(doc.path, FORMAT, SOURCE, facts)
