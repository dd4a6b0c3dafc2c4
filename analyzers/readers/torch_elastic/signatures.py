"""What torch's launchers print about their workers: torchelastic (torchrun / torch.distributed.run / launch),
torch.multiprocessing.spawn, and the launchers that wrap them (Lightning, DeepSpeed), as compiled patterns, and the
catalogue signature that marks a line holding one of them."""
from __future__ import annotations

import re

__all__ = ["SIGNATURE", "KEY", "P"]

# Sources: ``torch/distributed/elastic/multiprocessing/api.py`` ("Sending process %s closing signal %s", "failed
# (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"), ``elastic/multiprocessing/errors/__init__.py``
# (ChildFailedError's "Root Cause (first observed failure):" table), ``elastic/agent/server/api.py`` ("[default]
# worker group successfully finished", "Local worker group finished (SUCCEEDED)", "Rendezvous complete for workers.
# Result:"), ``elastic/rendezvous/*`` (RendezvousTimeoutError, RendezvousClosedError, RendezvousConnectionError, the
# keep-alive warning), ``torch/multiprocessing/spawn.py`` ("process %d terminated with signal %s", "-- Process %d
# terminated with the following error:"), torch 1.8 – 2.13. Every pattern is linear: literal-led, bounded repetitions,
# no nested quantifiers.

# A message starts the line or follows up to four ':'-ended leaders ("WARNING:torch.distributed.elastic....api:",
# "E1112 23:34:29.122000 2366719 site-packages/torch/distributed/elastic/multiprocessing/api.py:897]" ends in ']').
_HOP = r"[^:\]\n]{0,300}[:\]]"
_LEAD = rf"(?:{_HOP}(?:{_HOP}(?:{_HOP}(?:{_HOP})?)?)?)?"
_KEYS = (
    r"Sending process \d{1,9} closing signal", r"failed \(exitcode: -?\d{1,4}\) local_rank: ",
    r"Root Cause \(first observed failure\)", r"Failures:\s*$", r"exitcode\s{0,4}: -?\d{1,4} \(pid: ",
    r"traceback\s{0,4}: Signal \d{1,3} \(", r"[\w.]{0,80}ChildFailedError",
    r"\[\w{0,40}\] worker group successfully finished",
    r"Local worker group finished \(", r"[\w.]{0,80}Rendezvous\w{0,30}Error\b", r"The node '",
    r"[\w.]{0,80}(?:ProcessExitedException|Exception): process \d{1,6} terminated with",
    r"process \d{1,6} terminated with (?:signal|exit code)", r"-- Process \d{1,6} terminated with the following error",
    r"Child process with PID \d{1,9} terminated with code", r"Terminating process \d{1,9} via signal",
    r"\[\w{0,40}\] Rendezvous complete for workers", r"[\w:.]{0,80}sigkill_handler\]",
    r"\*\*\* SIG[A-Z]{2,8} received at time=",
    r"Received (?:\d{1,2}|Signals\.SIG[A-Z]{2,8}|SIG[A-Z]{2,8}) death signal",
    r"(?:HW Exception|Memory access fault) by GPU node-\d{1,6} \(Agent handle",
    r"torchelastic\.worker\.status\.[A-Z]{3,12}\"",
)
# ... and a python logger's name ("torch.distributed.elastic.multiprocessing.api:") may sit right before it
SIGNATURE = rf"{_LEAD}\s{{0,40}}\"?(?:[\w.]{{1,120}}:)?(?:{'|'.join(_KEYS)})"

KEY = re.compile("|".join(_KEYS))


def _c(rx: str) -> re.Pattern[str]:
    return re.compile(rx)


P: dict[str, re.Pattern[str]] = {
    "closing": _c(r"Sending process (?P<pid>\d{1,9}) closing signal (?P<sig>SIG\w{1,10})"),
    "failed": _c(r"failed \(exitcode: (?P<code>-?\d{1,4})\) local_rank: (?P<local>\d{1,6}) \(pid: (?P<pid>\d{1,9})\)"
                 r"(?: of binary: (?P<bin>\S{1,300}))?"),
    # ChildFailedError.format_msg: "Failures:" / "Root Cause (first observed failure):" then entries
    #   [0]:
    #     time      : 2023-08-01_01:06:47
    #     host      : r1n2a6000bittensor
    #     rank      : 4 (local_rank: 4)
    #     exitcode  : -9 (pid: 208585)              (2.11: "-11 (pid: 5277) (SIGSEGV)")
    #     error_file: <N/A>
    #     traceback : Signal 9 (SIGKILL) received by PID 208585
    "section": _c(r"^\s{0,8}(?P<s>Failures:|Root Cause \(first observed failure\):)\s*$"),
    "entry": _c(r"^\s{0,8}\[(?P<i>\d{1,6})\]:\s*$"),
    "field": _c(r"^\s{1,12}(?P<k>time|host|rank|exitcode|error_file|traceback)\s{0,12}: ?(?P<v>.{0,400})$"),
    "rank_field": _c(r"^(?P<rank>-?\d{1,9})(?: \(local_rank: (?P<local>-?\d{1,9})\))?"),
    "exit_field": _c(r"^(?P<code>-?\d{1,4})(?: \(pid: (?P<pid>\d{1,9})\))?"),
    "signal_tb": _c(r"Signal (?P<n>\d{1,3}) \((?P<sig>SIG\w{1,10})\) received by PID (?P<pid>\d{1,9})"),
    "glued": _c(r"(?:={8,}|-{8,}|\[(?P<i>\d{1,6})\]:)\s*$"),
    "table_end": _c(r"^\s{0,8}(?:={8,}|-{8,}|<NO_OTHER_FAILURES>)\s*$"),
    # the agent's end of a run
    # a stop from outside: torchelastic's agent got SIGINT/SIGTERM/SIGHUP ("Received 2 death signal, shutting down
    # workers", elastic/agent/server/api.py; 2.x prints the number, 1.x "Signals.SIGTERM")
    "stop_signal": _c(r"Received (?P<sig>\d{1,2}|Signals\.SIG[A-Z]{2,8}|SIG[A-Z]{2,8}) death signal"),
    "finished_ok": _c(r"(?:\[(?P<role>\w{0,40})\] worker group successfully finished|Local worker group finished "
                      r"\((?:WorkerState\.)?SUCCEEDED\))"),
    # "[default] Rendezvous complete for workers. Result:" then "  local_ranks=[0, 1]" "  global_ranks=[2, 3]"
    "rdzv_result": _c(r"\[(?P<role>\w{0,40})\] Rendezvous complete for workers"),
    "rdzv_field": _c(r"(?:^|\s)(?P<k>group_rank|group_world_size|local_ranks|global_ranks|global_world_sizes)="
                     r"(?P<v>\S{1,40000})\s*$"),
    "rdzv_other": _c(r"(?:^|\s)\w{1,40}=\S{0,400}\s*$"),
    "rdzv_config": _c(r"rdzv_configs\s{0,8}: \{[^}]{0,400}?'(?:join_)?timeout': (?P<t>\d{1,9})"),
    # rendezvous failures: "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "RendezvousClosedError",
    # "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.",
    # the error file's JSON: "message": "RendezvousTimeoutError: "
    "rdzv_error": _c(r"(?P<type>Rendezvous(?:Timeout|Closed|Connection|State|GracefulExit)?Error)(?![\w(])"
                     r"(?::\s?(?P<msg>[^\"\n]{0,300}))?"),
    # "The node 'host_187281_0' has failed to send a keep-alive heartbeat to the rendezvous 'none' due to an error of
    # type RendezvousConnectionError."
    "keep_alive": _c(r"The node '(?P<node>[^']{1,200})' has failed to send a keep-alive heartbeat to the rendezvous "
                     r"'(?P<rdzv>[^']{0,200})' due to an error of type (?P<type>\w{1,80})"),
    # torch.multiprocessing.spawn: "ProcessExitedException: process 1 terminated with signal SIGKILL",
    # "process 0 terminated with exit code 1" (1.x: "Exception: process 3 terminated with signal SIGKILL"),
    # "-- Process 3 terminated with the following error:" (a traceback follows), and its cleanup (2.x):
    # "Terminating process 96 via signal SIGTERM"
    "spawn_exit": _c(r"process (?P<i>\d{1,6}) terminated with (?:signal (?P<sig>SIG\w{1,10})|exit code "
                     r"(?P<code>-?\d{1,4}))"),
    "spawn_error": _c(r"-- Process (?P<i>\d{1,6}) terminated with the following error"),
    "spawn_term": _c(r"Terminating process (?P<pid>\d{1,9}) via signal (?P<sig>SIG\w{1,10})"),
    # Lightning's launcher: "[rank: 2] Child process with PID 13117 terminated with code -6. Forcefully terminating
    # all other processes to avoid zombies"
    "lightning": _c(r"\[rank: (?P<rank>\d{1,6})\] Child process with PID (?P<pid>\d{1,9}) terminated with code "
                    r"(?P<code>-?\d{1,4})"),
    # DeepSpeed's launcher: "[launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py',
    # '--local_rank=3'] exits with return code = -9"
    "deepspeed": _c(r"sigkill_handler\] (?P<cmd>\[.{0,4000}?\]) exits with return code = (?P<code>-?\d{1,4})"),
    "ds_local": _c(r"--local_rank=(?P<local>\d{1,6})"),
    # absl's failure signal handler (Ray, vLLM, JAX-linked processes): "*** SIGABRT received at time=1708511498 on
    # cpu 37 ***" then "PC: @ ..." lines — the process is dying of that signal
    # ROCm's runtime (ROCr) on a fatal device fault, before it aborts the process: "HW Exception by GPU node-9
    # (Agent handle: 0x64ff272d8ab0) reason :GPU Hang", "Memory access fault by GPU node-2 (Agent handle: 0x9f73a80)
    # on address 0x7ef9eb704000. Reason: Unknown." — node-N is an HSA agent, not a rank
    "rocr": _c(r"(?:HW Exception|Memory access fault) by GPU node-(?P<node>\d{1,6}) \(Agent handle: 0x[0-9a-fA-F]{1,16}\)"
               r"(?P<rest>.{0,200})"),
    # torchelastic's event records (elastic/events/api.py Event.serialize, one JSON object per line, written by the
    # agent's event log handler when a run ends: elastic/agent/server/api.py _record_worker_events): {"name":
    # "torchelastic.worker.status.SUCCEEDED", "source": "WORKER", "timestamp": 0, "metadata": {"global_rank": 23,
    # "hostname": "h", "state": "SUCCEEDED", "raw_error": null, "metadata": "{\"exit_code\": [1], \"worker_pid\":
    # [34627], ...}"}} — a cut record still names its state, source and often its rank
    "event": _c(r'"name": ?"torchelastic\.worker\.status\.(?P<state>[A-Z]{3,12})"'),
    "event_source": _c(r'"source": ?"(?P<source>WORKER|AGENT)"'),
    "event_rank": _c(r'"global_rank": ?(?P<rank>-?\d{1,9})\b'),
    "event_host": _c(r'"hostname": ?"(?P<host>[^"\\]{1,200})"'),
    "event_code": _c(r'\\?"exit_code\\?": ?\[?(?P<code>-?\d{1,4})'),
    "event_pid": _c(r'\\?"worker_pid\\?": ?\[?(?P<pid>\d{1,9})'),
    "absl": _c(r"\*\*\* (?P<sig>SIG[A-Z]{2,8}) received at time=(?P<t>\d{1,12})(?: on cpu \d{1,5})? \*\*\*"),
}
