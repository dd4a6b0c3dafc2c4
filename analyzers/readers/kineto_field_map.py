"""Declared mapping of the Kineto reader: which raw trace field feeds which common column, and the dtype table.

Why separate: these are data, not code: the tests check ``FIELD_MAP`` against ``analyzers.schema`` and readers of the
docs look them up, without wading through the parser. Both are re-exported by ``analyzers.readers.kineto``.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class FieldMap(NamedTuple):
    """One raw trace field and where it goes (the reader's declared mapping, style.md point 3)."""

    raw: str        # where in the trace
    column: str     # TABLE.column in analyzers.schema ('' = used only inside the reader)
    type: str
    default: Any
    since: str      # first PyTorch/Kineto generation known to write it


FIELD_MAP: tuple[FieldMap, ...] = (
    FieldMap("distributedInfo.rank", "EVENTS.rank", "int", None, "all with distributed"),
    FieldMap("distributedInfo.world_size", "EVENTS.world", "int", None, "~2023"),
    FieldMap("distributedInfo.backend", "EVENTS.backend", "str", None, "~2023"),
    FieldMap("distributedInfo.pg_config[].pg_name", "EVENTS.group (kind=group)", "str", None, "~2024"),
    FieldMap("distributedInfo.pg_config[].pg_desc | uid", "EVENTS.group_desc", "str", None, "uid: older"),
    FieldMap("distributedInfo.pg_config[].ranks", "EVENTS.group_ranks", "list[int] | str", None, "~2024"),
    FieldMap("distributedInfo.pg_config[].backend_config", "EVENTS.backend", "str 'cuda:nccl'", None, "~2024"),
    FieldMap("traceEvents[].ts", "EVENTS.wall_ns | t_ns", "µs float", None, "all"),
    FieldMap("traceEvents[].dur", "EVENTS.wall_ns (exit row)", "µs float", 0, "all"),
    FieldMap("baseTimeNanoseconds", "EVENTS.wall_ns offset", "int ns", None, "~2024"),
    FieldMap("nccl:<op> | gloo:<op> annotation name", "EVENTS.name (canonical_op), EVENTS.backend", "str", None,
             "all"),
    FieldMap("args['Collective name']", "EVENTS.name (fallback)", "str", None, "~2023"),
    FieldMap("args['Process Group Name']", "EVENTS.group", "str", None, "~2024"),
    FieldMap("args['Process Group Description']", "EVENTS.group_desc", "str", None, "~2024"),
    FieldMap("args['Process Group Ranks']", "EVENTS.group_ranks", "str '[0, 1]'", None, "~2024"),
    FieldMap("args['Process Group ID']", "EVENTS.group", "int", None, "older (2023-2024)"),
    FieldMap("args['Global rank start'/'Global rank stride'] + args['Group size']", "EVENTS.group_ranks", "int",
             None, "older"),
    FieldMap("args['dtype']", "EVENTS.dtype", "str 'Float'", None, "~2023"),
    FieldMap("args['In msg nelems'] × itemsize(dtype)", "EVENTS.nbytes", "int", None, "~2023"),
    FieldMap("annotation args['Input Dims'], args['Input type']", "EVENTS.shape, dtype, nbytes", "list", None,
             "record_shapes=True"),
    FieldMap("args['Seq']", "EVENTS.backend_seq", "int", None, "newer"),
    FieldMap("args['Src Rank'] | args['Dst Rank']", "EVENTS.peer", "int", None, "p2p, newer"),
    FieldMap("kernel args['correlation'] ↔ cuda_runtime args['correlation']", "EVENTS kind=complete", "int", None,
             "all"),
)

# element type name (Kineto dtype arg = c10 ScalarType name; annotation 'Input type' = C++ type name) → (torch
# dtype name, itemsize bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "float": ("float32", 4), "Double": ("float64", 8), "double": ("float64", 8),
    "Half": ("float16", 2), "c10::Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "c10::BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "long int": ("int64", 8), "long": ("int64", 8),
    "int64_t": ("int64", 8), "Int": ("int32", 4), "int": ("int32", 4), "Short": ("int16", 2),
    "short int": ("int16", 2), "Char": ("int8", 1), "signed char": ("int8", 1), "Byte": ("uint8", 1),
    "unsigned char": ("uint8", 1), "Bool": ("bool", 1), "bool": ("bool", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1), "c10::Float8_e5m2": ("float8_e5m2", 1),
    "ComplexFloat": ("complex64", 8), "c10::complex<float>": ("complex64", 8),
}
