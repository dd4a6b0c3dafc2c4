"""Statements that a job is being stopped from outside: a scheduler's cancel, a signal a serving framework or a launcher
says it received (the spellings are listed above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "SLURM", "SIGNAL", "SIGNAL_FIRST"]

# * Slurm (slurmstepd): ``slurmstepd: error: *** STEP 1234.0 ON node-3 CANCELLED AT 2024-05-01T10:00:00 ***``,
#   ``*** JOB 1234 ON node-3 CANCELLED AT 2024-05-01T10:00:00 DUE TO TIME LIMIT ***`` (scancel, or the time limit);
# * vLLM v1 (``vllm/v1/engine/core.py``, 0.11+): ``[shutdown] EngineCore: trigger received signal=SIGTERM``;
# * servers and trainers that say it in words: ``Received SIGTERM``, ``Caught signal SIGINT``, ``received signal 15``
#   (uvicorn, Ray, Lightning's SIGTERM handler, many launch scripts);
# * SGLang (``srt/managers/tokenizer_manager.py``, 0.4 ... 0.5.23): ``SIGTERM received. signum=None frame=None.
#   Draining requests and shutting down...``, ``Signal SIGTERM received while health check failed. Force exiting.``
#   (the signal's name first).
# torchelastic's own "Received 2 death signal, shutting down workers" is read by the torch_elastic family.
# Literal-led and bounded: linear in the line.

_SIG = r"SIG(?:TERM|INT|HUP|QUIT|KILL|USR1|USR2)"
CATALOGUE: tuple[str, ...] = (
    r".{0,200}?\*\*\* (?:STEP|JOB) [\w.+]{1,40} ON \S{1,200} CANCELLED AT",
    rf".{{0,300}}?\b(?:trigger )?(?:[Rr]eceived|[Cc]aught|[Gg]ot) (?:a |the )?(?:signal[= ]{{0,2}})?(?:{_SIG}|"
    r"\d{1,2}\b)",
    r".{0,300}?\bSIG(?:TERM|INT|HUP) received\b",
)

SLURM = re.compile(r"\*\*\* (?P<what>STEP|JOB) (?P<id>[\w.+]{1,40}) ON (?P<node>\S{1,200}) CANCELLED AT "
                   r"(?P<at>\S{1,40})(?P<limit> DUE TO TIME LIMIT)?")
SIGNAL = re.compile(rf"\b(?:trigger )?(?:[Rr]eceived|[Cc]aught|[Gg]ot) (?:a |the )?(?P<word>signal[= ]{{0,2}})?"
                    rf"(?P<sig>{_SIG}|\d{{1,2}}\b)")
#: the signal's name first, then "received" (SGLang's tokenizer manager). Not SIGQUIT: SGLang's "SIGQUIT received.
#: ... It usually means one child failed." is its own children failing (sgl-project/sglang#32893), no stop
SIGNAL_FIRST = re.compile(r"\b(?P<sig>SIG(?:TERM|INT|HUP)) received\b")
NUMBERS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGUSR1": 10, "SIGUSR2": 12, "SIGTERM": 15}
