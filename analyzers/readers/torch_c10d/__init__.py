"""torch_c10d: the error and status messages of torch's c10d layer (DETAIL mismatch reports, monitoredBarrier,
store / socket / NCCL set-up failures, Gloo timeouts, the heartbeat monitor, the desync report) as the rows of
docs/EVIDENCE.md: torch often says itself who is missing or broken. Stages: :mod:`.signatures` -> :mod:`.scan`
(lines -> records) -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.torch_c10d.rows import build
from ranktrace.analyzers.readers.torch_c10d.scan import scan
from ranktrace.analyzers.readers.torch_c10d.signatures import SIGNATURE

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "SIGNATURE", "read_doc"]

FORMAT = "torch_c10d"

#: How the messages' fields become columns (raw wording, column, type, default, first torch that prints it).
FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("Rank R is running collective: CollectiveFingerPrint(SequenceNumber=S, OpType=O, TensorShape=..)",
              "OBSERVATIONS.kind=fingerprint rank=R name=canonical(O) value=S detail shape/dtype/device/by",
              "int, str, int", "value null before 1.13", "1.10"),
    ColumnMap("[Rank 0]: Ranks A, B failed to pass monitoredBarrier in T ms",
              "OBSERVATIONS.kind=missing_rank rank=A,B name=monitored_barrier (or the wrapped op) detail by=0",
              "int per rank", "-", "1.9"),
    ColumnMap("Rank R successfully reached monitoredBarrier, but received errors ... from rank 0",
              "OBSERVATIONS.kind=joined_rank rank=R detail by=R", "int", "-", "1.9"),
    ColumnMap("Monitored Barrier encountered error running collective: CollectiveFingerPrint(..)",
              "EVENTS.kind=enter name seq shape dtype error", "str, int", "-", "1.11"),
    ColumnMap("[Rank R] Running collective: CollectiveFingerPrint(..) (INFO; last per rank)",
              "EVENTS.kind=enter name seq shape dtype", "str, int", "-", "1.13"),
    ColumnMap("Timed out after S seconds waiting for clients. k/n clients joined",
              "OBSERVATIONS.kind=init_failure name=store value=S", "int seconds", "-", "2.2"),
    ColumnMap("Waiting in / Timed out initializing process group in store based barrier ... rank: R",
              "OBSERVATIONS.kind=init_failure name=store_barrier rank=R value=timeout", "int seconds", "-", "1.8"),
    ColumnMap("The client socket has timed out after Ns / failed to connect to ... ; connect() timed out",
              "OBSERVATIONS.kind=init_failure name=connect value=N", "int seconds", "null", "1.8"),
    ColumnMap("Socket Timeout | wait timeout after Nms | server socket failed to bind/listen",
              "OBSERVATIONS.kind=init_failure name=store", "int seconds", "null", "1.8"),
    ColumnMap("[R] is setting up NCCL communicator and retrieving ncclUniqueId from [0] ... got error: E",
              "OBSERVATIONS.kind=init_failure name=nccl_unique_id rank=R", "int", "-", "1.13"),
    ColumnMap("Timed out waiting Nms for send|recv operation to complete | Application timeout caused pair closure",
              "OBSERVATIONS.kind=transport_error name=gloo_timeout value=N", "int ms", "null", "1.8"),
    ColumnMap("Connection closed by peer [ip]:port | Read error [ip]:port: ... | Failed to recv, got 0 bytes",
              "OBSERVATIONS.kind=transport_error name=connection_closed", "str", "-", "1.8"),
    ColumnMap("NCCL error in: F:L, E, NCCL version V (+ ncclXError:, Last error:) | NCCL communicator was aborted",
              "OBSERVATIONS.kind=transport_error name=nccl_error", "str", "-", "1.8"),
    ColumnMap("Cuda failure '..' | CUDA error: ..", "OBSERVATIONS.kind=transport_error name=cuda_error", "str", "-",
              "1.8"),
    ColumnMap("ProcessGroupNCCL's watchdog got stuck for S seconds | Heartbeat monitor timed out!",
              "OBSERVATIONS.kind=watchdog_stuck name=watchdog_hang|heartbeat value=S group=PG", "int seconds",
              "null", "2.2"),
    ColumnMap("desync: [R] joined but didn't finish / finished ... didn't join collective #N / never joined",
              "OBSERVATIONS.kind=missing_rank rank=R value=N detail by=reporter", "int", "-", "1.13"),
    ColumnMap("desync: [R] Timeout at collective: O, #N | #N started ranks: [..] started O",
              "OBSERVATIONS.kind=joined_rank rank name value=N", "int", "-", "1.13"),
    ColumnMap("terminate called after throwing an instance of 'T' / what(): W | Terminating the process ...",
              "OBSERVATIONS.kind=rank_exit name=signal value=6; OBSERVATIONS.kind=exception name=T", "int", "-",
              "1.8"),
    ColumnMap("Watchdog caught collective operation timeout (no WorkNCCL body)",
              "OBSERVATIONS.kind=exception name=type or watchdog_timeout", "str", "-", "1.8"),
    ColumnMap("NCCL version V (in an NCCL error)", "OBSERVATIONS.kind=version name=nccl detail=V", "str", "-", "1.8"),
    ColumnMap("world_size=N of store_based_barrier_key:1 (init_process_group's barrier)", "ReadResult.world_size",
              "int", "null", "1.8"),
    ColumnMap("[rankN]: prefix | [PG .. Rank N] of the default group | file name | [Rank N]",
              "EVENTS.rank OBSERVATIONS.rank OBSERVATIONS.group", "int", "null", "-"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "fingerprint": "one rank's collective in a DETAIL mismatch report (name op, value SequenceNumber)",
    "missing_rank": "monitoredBarrier failures, desync lagging ranks (detail by=<reporter>)",
    "joined_rank": "ranks that reached monitoredBarrier, desync ranks that joined/finished",
    "init_failure": "store, connect, store_barrier, nccl_unique_id set-up failures",
    "transport_error": "gloo_timeout, connection_closed, nccl_error, cuda_error",
    "watchdog_stuck": "the NCCL watchdog's heartbeat monitor: heartbeat | watchdog_hang",
    "rank_exit": "abort on an uncaught C++ exception or by the heartbeat monitor (signal 6)",
    "exception": "the C++ exception type of a terminate, or a watchdog timeout cut before its WorkNCCL body",
    "version": "nccl: the NCCL version an NCCL error names",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The c10d statements of a text input. ReaderError when it holds none (its signature was a coincidence).

    Known limits:

    * Ranks a message names (monitoredBarrier, fingerprints, desync, ``[1] is setting up NCCL communicator``) are ranks
      in the process group that printed them; for the default group they are global. A launcher prefix, when present,
      gives the speaker's global rank.
    * The desync report's ``#N`` counts the group's collectives from 1; it is not the watchdog's SeqNum, so desync
      statements are OBSERVATIONS only.
    * socket.cpp warnings that only report a retry are kept as ``init_failure`` rows whose detail starts with
      "retrying": a successful run prints them too.
    * ``Waiting in store based barrier`` lines followed by ``Completed store-based barrier`` for the same key and rank
      leave no row; the last wait of a barrier that never completed does.
    """
    found = scan(doc)
    events, obs = build(found.records, doc.path, FORMAT)
    if not events and not obs:
        raise ReaderError(doc.path, "no torch c10d error or status message found")
    for version, line in found.nccl_versions.items():   # context: the NCCL an error came from
        obs.append(dict(kind="version", name="nccl", detail=version, source=FORMAT, file=doc.path, line=line))
    world = found.world_sizes.pop() if len(found.world_sizes) == 1 else None
    return ReadResult(file=doc.path, format=FORMAT, events=schema.table_from_rows(schema.EVENTS, events),
                      observations=schema.table_from_rows(schema.OBSERVATIONS, obs), skipped=tuple(found.skipped),
                      world_size=world)
