"""The catalogue of evidence signatures: which lines of a text input belong to which family, wherever they occur.
A text input is not one format (a Slurm log holds NCCL lines, a watchdog timeout, a traceback, a pasted py-spy dump),
so each input is walked line by line against every family's signatures (anchored or literal-led: linear), and each
family whose signatures occur reads it with its package's ``read_doc(doc)``."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ranktrace.analyzers.readers.env_versions import signatures as env_versions_sig
from ranktrace.analyzers.readers.horovod import signatures as horovod_sig
from ranktrace.analyzers.readers.lock_wait import signatures as lock_wait_sig
from ranktrace.analyzers.readers.mpi_launcher import signatures as mpi_launcher_sig
from ranktrace.analyzers.readers.nccl_tests import signatures as nccl_tests_sig
from ranktrace.analyzers.readers.progress import signatures as progress_sig
from ranktrace.analyzers.readers.server_log import statements as server_statements
from ranktrace.analyzers.readers.ps_top import signatures as ps_top_sig
from ranktrace.analyzers.readers.stop_signal import signatures as stop_signal_sig
from ranktrace.analyzers.readers.text import TextDoc
from ranktrace.analyzers.readers.torch_c10d.signatures import SIGNATURE as TORCH_C10D_SIGNATURE
from ranktrace.analyzers.readers.torch_elastic.signatures import SIGNATURE as TORCH_ELASTIC_SIGNATURE
from ranktrace.analyzers.readers.traceback.signatures import SIGNATURE as TRACEBACK_SIGNATURE

__all__ = ["Family", "FAMILIES", "Scan", "scan"]


@dataclass(frozen=True)
class Family:
    """One kind of evidence: its reader module and the line signatures that mark its lines."""

    name: str
    module: str                     # importable module with read_doc(doc)
    signatures: re.Pattern[str]     # matched with .match() on each line's message (prefixes removed)
    needs: str = ""                 # a literal the whole text must hold before lines are tried (cheap filter)
    min_lines: int = 1              # lines needed before the family is asked to read the input


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


_FRAME_PY = r"\s*(?:\S.{0,300}?) \((?:[^()\s][^()]{0,300}):\d{1,7}\)\s*$"   # py-spy frame line: func (file.py:12)


FAMILIES: tuple[Family, ...] = (
    Family("pyspy", "ranktrace.analyzers.readers.pyspy", _rx(
        r"Process \d+: ", r"Python v\d", r"Thread (?:0x[0-9A-Fa-f]+|\d+) \((?:idle|active\+gil|active|gil)\)",
        r".{0,80}Pyspy (?:dump for PID|failed)", r"All pyspy dump attempts failed",
        r"Permission Denied: Try running again", r"Error: Failed to (?:get process executable|find python version)",
        r" {4}\S.{0,300}? \([^()\s][^()]{0,300}\.py:\d{1,7}\)\s*$",
        r"\S.{0,300}? \([^()\s][^()]{0,300}\.py:\d{1,7}\)\s*$", r"[A-Za-z_][\w.<>]{0,120} \([\w./-]{1,300}$",
        r"(?:\S{0,80}[$%#>] )?(?:sudo )?(?:\S{0,200}/)?py-spy dump\b"), min_lines=2),
    Family("faulthandler", "ranktrace.analyzers.readers.faulthandler", _rx(
        r"(?:Current thread|Thread) 0x[0-9A-Fa-f]+ (?:\[[^\]]{0,80}\] )?\(most recent call first\):",
        r"Stack \(most recent call first\):", r"Fatal Python error: ",
        r'\s+File "[^"]{1,400}", line \d+ in \S')),
    Family("gdb", "ranktrace.analyzers.readers.gdb", _rx(
        r"Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ )?\(?LWP \d+\)", r"#\d+\s+0x[0-9a-fA-F]+ in \S",
        r"#\d+\s+\S+ \(.{0,300}\) at \S+:\d+", r"Attaching to (?:program|process) ",
        r"\*?\s{0,4}\d{1,6}\s{1,8}Thread 0x[0-9a-fA-F]{1,16} \(LWP \d", r"GNU gdb \(", r"Reading symbols from \S",
        r"(?:\S{0,80}[$#%] )?(?:sudo )?(?:cuda-)?gdb\b.{0,200}?(?:-p|--pid|attach)\s{0,4}\d"), min_lines=2),
    Family("watchdog", "ranktrace.analyzers.readers.watchdog", _rx(
        r".{0,400}?WorkNCCL\(", r".{0,400}?[Ll]ast enqueued (?:\w+ )?work: -?\d"), needs="NCCL"),
    Family("nccl_log", "ranktrace.analyzers.readers.nccl_log", _rx(
        r".{0,200}? NCCL (?:INFO|WARN|TRACE|CALL) ", r"NCCL version \d+\.\d+", r"\s{0,8}NCCL WARN "), needs="NCCL"),
    Family("server_log", "ranktrace.analyzers.readers.server_log", _rx(
        r".{0,120}?(?:Init torch distributed (?:begin|ends)|Load weight (?:begin|end)|"
        r"Capture (?:[\w-]+ ){0,3}graph (?:begin|end)|fired up and ready to roll|server_args=ServerArgs\(|"
        r"Registering \d+ cuda graph addresses|Initializing a V\d LLM engine|Initializing an LLM engine|"
        r"vLLM API server|Graph capturing finished|KV Cache is allocated|Memory pool end|"
        r"Starting to load model|Loading model weights took|Uvicorn running on|Application startup complete|"
        r"No available shared memory broadcast block|"
        r"cudaErrorStreamCapture\w|operation not permitted when stream is capturing|"
        r"vLLM is using nccl==|Worker ready; awaiting tasks|world_size=\d+ rank=\d+ local_rank=\d+ distributed_init|"
        r"is assigned as DP rank|(?:Prefill|Decode) batch[.,]|Avg prompt throughput: |"
        r"Waiting for \d{1,6} (?:local, \d{1,6} remote )?core engine proc\(s\) to start)",
        r"(?:\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?: (?:DP|PP|TP|EP)\d{1,5}){1,4}\] )"
        r"Connecting to (?:tcp|ipc)://",
        # SGLang's scheduler watchdog is quoted in prose too ("... it crash with Scheduler watchdog timeout (self....")
        r".{0,400}?[Ww]atchdog timeout \(self\.watchdog_timeout=",
        r".{0,120}?\"(?:POST|GET) /v1/\S{0,200} HTTP/\d(?:\.\d)?\" 200\b", *server_statements.CATALOGUE)),
    Family("nvidia_smi", "ranktrace.analyzers.readers.nvidia_smi", _rx(
        r".{0,20}NVIDIA-SMI \S+\s+Driver Version", r"\s*GPU0\s+(?:GPU1|NIC0|mlx5_0|CPU Affinity)",
        r"\s*X\s+= Self", r"\s*NV#\s+= Connection",
        # a table pasted without its banner: the process rows, a GPU's temperature / memory / utilisation row
        r"\|\s{0,8}\d{1,3}\s+(?:(?:N/A|\d{1,4})\s+(?:N/A|\d{1,4})\s+)?\d{1,9}\s+(?:C\+G|G\+C|M\+C|C|G|M)\s+\S.{0,200}?"
        r"\s(?:\d{1,9}MiB|N/A)\s*\|\s*$",
        r"\|\s{0,8}(?:N/A|\d{1,3}%)\s+\d{1,3}C\s+P\d{1,2}\s.{0,80}\|\s*\d{1,9}MiB\s*/\s*\d{1,9}MiB\s*\|")),
    Family("fr_text", "ranktrace.analyzers.readers.fr_text", _rx(
        r".{0,200}?(?:Not all ranks joining collective|Collective sequence number: \d+ has errors|"
        r"Collective \d+ (?:at entry \d+ )?errors|Input/output mismatch in the collective)",
        r'\s*File "[^"]*(?:/torchfrtrace|flight_recorder/fr_trace\.py|flight_recorder/components/\w+\.py)", line')),
    Family("nccl_ras", "ranktrace.analyzers.readers.nccl_ras", _rx(
        r"Job summary\s*$", r"Communicators\.{0,3}", r"#\d+-\d+ \([0-9a-f]{8,16}\) (?:MISMATCH|INCOMPLETE|ERROR)",
        r".{0,80}RAS Monitor Mode", r".{0,80}PEER_DEAD: Process \d+ on node")),
    Family("horovod", "ranktrace.analyzers.readers.horovod", _rx(*horovod_sig.CATALOGUE)),
    Family("nccl_tests", "ranktrace.analyzers.readers.nccl_tests", _rx(*nccl_tests_sig.CATALOGUE), min_lines=2),
    Family("ps_top", "ranktrace.analyzers.readers.ps_top", _rx(*ps_top_sig.CATALOGUE)),
    Family("env_versions", "ranktrace.analyzers.readers.env_versions", _rx(*env_versions_sig.CATALOGUE)),
    Family("progress", "ranktrace.analyzers.readers.progress", _rx(*progress_sig.CATALOGUE)),
    Family("stop_signal", "ranktrace.analyzers.readers.stop_signal", _rx(*stop_signal_sig.CATALOGUE)),
    Family("mpi_launcher", "ranktrace.analyzers.readers.mpi_launcher", _rx(*mpi_launcher_sig.CATALOGUE)),
    Family("lock_wait", "ranktrace.analyzers.readers.lock_wait", _rx(*lock_wait_sig.CATALOGUE), needs="ock "),
    Family("torch_c10d", "ranktrace.analyzers.readers.torch_c10d", re.compile(TORCH_C10D_SIGNATURE)),
    Family("torch_elastic", "ranktrace.analyzers.readers.torch_elastic", re.compile(TORCH_ELASTIC_SIGNATURE)),
    Family("traceback", "ranktrace.analyzers.readers.traceback", re.compile(TRACEBACK_SIGNATURE)),
)


@dataclass
class Scan:
    """What the walk found in one input: the lines each family's signatures marked."""

    lines: dict[str, list[int]]     # family -> line numbers
    total: int                      # non-empty lines in the input

    @property
    def families(self) -> list[str]:
        return [f.name for f in FAMILIES if len(self.lines.get(f.name, ())) >= f.min_lines]

    @property
    def used(self) -> int:
        return len({n for ns in self.lines.values() for n in ns})


def scan(doc: TextDoc, families: tuple[Family, ...] = FAMILIES) -> Scan:
    """Walk `doc` once per family whose cheap filter passes; each line is tried with one anchored pattern."""
    whole = None
    found: dict[str, list[int]] = {}
    for fam in families:
        if fam.needs:
            if whole is None:
                whole = "\n".join(ln.text for ln in doc.lines)
            if fam.needs not in whole:
                continue
        match = fam.signatures.match
        hits = [ln.no for ln in doc.lines if match(ln.text)]
        if hits:
            found[fam.name] = hits
    return Scan(found, len(doc.lines))
