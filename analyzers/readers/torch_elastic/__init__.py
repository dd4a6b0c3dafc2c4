"""torch_elastic: what torch's launchers (torchrun's agent, torch.multiprocessing.spawn, Lightning, DeepSpeed) say
about their workers: which ended first and how, which they stopped, whether rendezvous completed, whether the
group finished. Stages: :mod:`.signatures` -> :mod:`.scan` (lines -> records) -> :mod:`.rows`."""
from __future__ import annotations

from ranktrace.tracer.formats import schema
from ranktrace.analyzers.readers.base import ColumnMap, ReadResult, ReaderError
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.torch_elastic.rows import build
from ranktrace.analyzers.readers.torch_elastic.scan import RankMap, scan
from ranktrace.analyzers.readers.torch_elastic.signatures import SIGNATURE

__all__ = ["FORMAT", "FIELD_MAP", "OBSERVATION_KINDS", "SIGNATURE", "read_doc"]

FORMAT = "torch_elastic"

FIELD_MAP: tuple[ColumnMap, ...] = (
    ColumnMap("failed (exitcode: C) local_rank: L (pid: P) of binary: B",
              "OBSERVATIONS.kind=rank_exit name=exit|signal|segfault value=C or -C detail pid/local_rank",
              "int", "rank null unless mapped", "1.9"),
    ColumnMap("Root Cause (first observed failure): / Failures: [i]: rank : R (local_rank: L) exitcode : C (pid: P)",
              "OBSERVATIONS.kind=rank_exit rank=R value detail root_cause=yes host pid", "int", "-", "1.9"),
    ColumnMap("traceback : Signal N (SIGX) received by PID P", "OBSERVATIONS.kind=rank_exit name=signal value=N",
              "int", "-", "1.9"),
    ColumnMap("Sending process P closing signal SIGTERM", "OBSERVATIONS.kind=rank_exit name=signal value=15 "
              "detail terminated_by=agent", "int", "rank null", "1.9"),
    ColumnMap("process I terminated with signal SIGX | exit code C | -- Process I terminated with the following error",
              "OBSERVATIONS.kind=rank_exit rank=I name=signal|exit|exception", "int", "-", "1.5"),
    ColumnMap("[rank: R] Child process with PID P terminated with code C (Lightning)",
              "OBSERVATIONS.kind=rank_exit rank=R", "int", "-", "lightning 2.0"),
    ColumnMap("[launch.py:N:sigkill_handler] [cmd --local_rank=L] exits with return code = C (DeepSpeed)",
              "OBSERVATIONS.kind=rank_exit detail local_rank", "int", "rank null", "deepspeed 0.5"),
    ColumnMap("*** SIGABRT received at time=T on cpu C *** (absl's failure signal handler: Ray, vLLM)",
              "OBSERVATIONS.kind=rank_exit name=signal|segfault value=N", "int", "rank from the prefix", "-"),
    ColumnMap("[default] worker group successfully finished | Local worker group finished (SUCCEEDED)",
              "OBSERVATIONS.kind=completion name=exit_ok", "-", "-", "1.9"),
    ColumnMap("RendezvousTimeoutError | RendezvousClosedError | RendezvousConnectionError: ...",
              "OBSERVATIONS.kind=init_failure name=rendezvous value=rdzv_configs timeout", "int seconds", "null",
              "1.9"),
    ColumnMap("The node 'N' has failed to send a keep-alive heartbeat to the rendezvous ...",
              "OBSERVATIONS.kind=transport_error name=connection_closed", "-", "-", "1.10"),
    ColumnMap('{"name": "torchelastic.worker.status.FAILED|TERMINATED|SUCCEEDED", "source": "WORKER", ...} '
              "(the agent's event records: --event-log-handler console)",
              "OBSERVATIONS.kind=rank_exit rank=global_rank value=exit_code pid=worker_pid | kind=completion",
              "int", "-", "1.9"),
    ColumnMap("Rendezvous complete for workers. Result: local_ranks=[..] global_ranks=[..] global_world_sizes=[..]",
              "OBSERVATIONS.rank (local -> global), ReadResult.world_size", "int", "-", "1.9"),
)

OBSERVATION_KINDS: dict[str, str] = {
    "rank_exit": "a worker ended: exit code / signal / exception; detail pid, local_rank, root_cause, terminated_by",
    "completion": "exit_ok: the agent says its worker group finished",
    "stopped": "signal (value = the signal the agent got: 'Received 2 death signal'): the job was stopped from "
               "outside",
    "init_failure": "rendezvous: the rendezvous did not complete",
    "transport_error": "connection_closed: a running agent lost the rendezvous store",
}


def read_doc(doc: TextDoc) -> ReadResult:
    """The launcher statements of a text input. ReaderError when it holds none.

    Known limits:

    * The agent names local ranks; a global rank comes from ChildFailedError's table ("rank : 3 (local_rank: 3)"), a
      spawn process index, Lightning's "[rank: 2]", or the agent's "Rendezvous complete for workers" result in the same
      input. Otherwise ``rank`` is null and ``detail`` has ``local_rank=``.
    * Workers the launcher stopped after another failed are ``rank_exit`` rows too, marked ``terminated_by=agent`` /
      ``terminated_by=spawn`` in ``detail``: they ended, but as a consequence.
    * The error file's JSON (``error_handler``) is read only for its ``"message"`` line; its ``py_callstack`` string is
      not unescaped into a traceback.
    """
    found = scan(doc)
    obs = build(found.records, doc.path, FORMAT, found.rdzv_timeout_s)
    if not obs:
        raise ReaderError(doc.path, "no torch launcher (elastic / spawn) message found")
    sizes = {r.world_size for r in found.records if isinstance(r, RankMap) and r.world_size}
    return ReadResult(file=doc.path, format=FORMAT, observations=schema.table_from_rows(schema.OBSERVATIONS, obs),
                      skipped=tuple(found.skipped), world_size=sizes.pop() if len(sizes) == 1 else None)
