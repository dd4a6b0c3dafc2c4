"""Who wrote a log line: the launcher / logger prefixes in front of it peeled off into one ``LinePrefix``, so every
family reads the same message text and the rank comes from the innermost prefix that names one."""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LinePrefix", "split_prefixes", "strip_ansi", "strip_collector", "SRUN_PREFIX"]

# ESC-less leftovers of colour codes are common in pastes ("[36m(RayWorkerWrapper pid=1)"): only when followed by
# text, and only the SGR form (digits and ';' ending in m), so "[12m]" in a message is not eaten.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]{0,200}\x07|(?<![\w\]])\[[0-9;]{1,8}m(?=[\S ])")

_QUOTE = re.compile(r"(?:>[ \t]?)+")
_LINE_NO = re.compile(r"\[\d{1,9}\] ")
_PYTEST = re.compile(r"E {2,}(?=\S)")
_TORCHRUN = re.compile(r"\[rank(\d{1,6})\]:[ \t]?")
_TORCHRUN_LOCAL = re.compile(r"\[([A-Za-z_]{1,32}?)(\d{1,6})\]:[ \t]?")
#: mpirun --tag-output ``[1,3]<stdout>:`` (job, rank) and horovodrun's own ``[3]<stderr>:`` (rank)
_OPENMPI = re.compile(r"\[(?:\d{1,9},)?(\d{1,6})\]<std(?:out|err)>:[ \t]?")
#: srun -l / pdsh-like ``3: `` — taken as a prefix only when most lines of a file carry it (TextDoc decides)
SRUN_PREFIX = re.compile(r"[ \t]{0,4}(\d{1,6}): ")
_WORKER = re.compile(  # (VllmWorker rank=2 pid=51) (RayWorkerWrapper pid=4009, ip=10.0.0.1) (VllmWorker TP1 pid=9)
    r"\((?P<tag>[A-Za-z_][\w.-]{0,60}?)(?: (?:rank=(?P<rank>\d{1,6})|TP(?P<tp>\d{1,4})|[A-Za-z_]+=?\d{1,6}))*"
    r" pid=(?P<pid>\d{1,9})(?:, ip=(?P<ip>[0-9A-Fa-f.:]{3,45}))?\)[ \t]?")
#: journald / syslog: ``May 01 12:00:00 gpu-node-3 python[4242]: `` (host, program, pid); moreutils' ``ts``:
#: ``May 01 12:00:00 ``
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
_SYSLOG = re.compile(_MONTH + r"(?P<host>[\w.-]{1,64}) [\w./@-]{1,64}?(?:\[(?P<pid>\d{1,9})\])?: ")
_TS = re.compile(_MONTH)
#: kubectl logs --prefix: ``[pod/trainer-worker-3/pytorch] `` (pod, container); the pod is the host it ran on
_KUBECTL = re.compile(r"\[pod/(?P<host>[\w.-]{1,253})/[\w.-]{1,63}\] ")
_HOST_STREAM = re.compile(r"(?P<host>[\w.-]{1,128}) \[std(?:out|err)\]:? ")
#: pdsh / DeepSpeed's multi-node launcher: ``104.171.201.171: `` (an IPv4 host, then the line that host printed)
_PDSH_IP = re.compile(r"(?P<host>(?:25[0-5]|2[0-4]\d|1?\d{1,2})(?:\.(?:25[0-5]|2[0-4]\d|1?\d{1,2})){3}): ")
_COMPOSE = re.compile(r"(?P<svc>[\w.-]{1,64}?)(?:[-_]\d{1,4})? {1,16}\| ")
#: vLLM's logger: ``ERROR 05-08 19:06:38 [multiproc_executor.py:962] `` (older: ``INFO 09-03 02:15:41 utils.py:965] ``);
#: it logs a worker's traceback one line at a time behind this prefix
_PYLOG = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
                    r"\[?[\w./-]{1,120}:\d{1,6}\] ?")
#: a log collector's or Python logging's own stamp in front of the line: ``2024-05-01 12:00:00,123 INFO ``,
#: ``2024-05-01T12:00:00.123456789Z `` (kubectl logs --timestamps, docker logs -t), ``2024-05-01 12:00:00,123 - root -
#: WARNING - ``; a level followed by ``MM-DD hh:mm:ss`` is vLLM's own prefix behind a container's stamp
#: (``2025-05-16T13:12:16.6Z DEBUG 05-16 13:12:16 [core_client.py:425] ``) and stays for _PYLOG. Bare only: a
#: bracketed ``[2024-05-01 12:00:00]`` is NCCL's or SGLang's own and theirs to read. One
#: space after it is the separator; the indentation behind it belongs to the message (a py-spy frame, a traceback).
_LOGSTAMP = re.compile(
    # not SGLang's configured logger (``2025-08-28 21:19:34 ERROR 125765 [ DP10 TP10 EP10 scheduler.py:2655] ``): its
    # stamp, pid and rank tags are one prefix, server_log's to read whole
    r"(?!\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,9})? (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{1,10} "
    r"\[ ?(?:DP|PP|TP|EP|ATTN_CP|MOE_DP|CP)\d)"
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?:(?: -)? (?:\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE)\]?(?! \d\d-\d\d \d\d:\d\d:\d\d)"
    r"|[\w.]{1,60} - (?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL))(?: -|:)?)? ")
_VLLM_PROC = re.compile(r"\((?P<tag>[A-Za-z_][\w.-]{0,60}?) pid=(?P<pid>\d{1,9})\)[ \t]?")


@dataclass(frozen=True)
class LinePrefix:
    """What the prefixes of one line said about its writer (None: not stated)."""

    rank: int | None = None          # global rank ([rank3]:, mpirun rank, vLLM rank=, srun -l task when trusted)
    local_rank: int | None = None    # [default3]: (torchrun's older role+local rank)
    pid: int | None = None
    host: str | None = None
    tag: str | None = None           # the worker / launcher name (VllmWorker, RayWorkerWrapper, service name)
    tp_rank: int | None = None       # (VllmWorker TP1 pid=..): a rank inside the TP group


def _collector(line: str) -> "re.Match[str] | None":
    """What a log collector put in front of `line` (a time stamp, journald's or kubectl's prefix; group ``host``,
    and ``pid`` for journald, where it names them), when it is followed by a message."""
    if line[:1].isdigit():
        m = _LOGSTAMP.match(line)
    elif line[:5] == "[pod/":
        m = _KUBECTL.match(line)
    elif line[:1].isupper() and line[3:4] == " ":
        m = _SYSLOG.match(line) or _TS.match(line)
    else:
        return None
    return m if m and m.end() < len(line) else None


def strip_collector(line: str) -> str:
    """`line` without what a log collector put in front of it, in either order (a stamp and a pod prefix): what the
    job itself printed starts after it (an srun task prefix, say)."""
    for _ in range(2):
        m = _collector(line)
        if m is None:
            break
        line = line[m.end():]
    return line


def strip_ansi(line: str) -> str:
    return _ANSI.sub("", line) if ("\x1b" in line or "m" in line) else line


def split_prefixes(line: str, srun: bool = False, srun_ranks: bool = True) -> tuple[LinePrefix, str]:
    """Peel every known prefix off `line` (ANSI codes already removed). Returns (prefix facts, message).

    ``srun`` says the file's lines carry ``N: `` task prefixes (decided once per file, since ``1: `` may also
    start a message); ``srun_ranks`` whether those name ranks (not when one task wrote the whole file: a launcher
    on a node, its ranks' lines all behind the same ``0: ``). The innermost rank prefix wins: ``0: [rank3]:`` is
    rank 3 (task 0 runs torchrun).

    >>> split_prefixes("> [rank3]:[E ProcessGroupNCCL.cpp:1] x")[0].rank
    3
    >>> p, rest = split_prefixes("(VllmWorker rank=2 pid=51) INFO hi"); (p.rank, p.pid, rest)
    (2, 51, 'INFO hi')
    >>> split_prefixes("0: [rank5]:[W305 socket.cpp:462] x", srun=True)[0].rank
    5

    Real files are pasted from terminals, Slurm outputs, Ray dashboards and tickets; every layer adds its own prefix
    (``> `` quote, ``[80746]`` line numbers, a collector's ``2024-05-01 12:00:00,123 INFO `` stamp, journald's
    ``May 01 12:00:00 node3 python[42]: ``, ``3: `` srun -l,
    ``[rank3]:`` torchrun, ``[1,3]<stdout>:`` mpirun,
    ``(VllmWorker rank=2 pid=51)`` vLLM, ``(RayWorkerWrapper pid=4009, ip=10.0.0.1)`` Ray, ``host [stderr] ``,
    ``10.0.0.3: `` pdsh, ``[pod/trainer-0/main] `` kubectl logs --prefix,
    ``service_1  | `` docker compose, ``E   `` pytest). Each family's parser then reads the same message text, and the
    rank comes from the innermost prefix that names one. All patterns are anchored and bounded: linear in the line.
    """
    rank = local = pid = tp = srun_rank = None
    host = tag = None
    rest = line
    for _ in range(8):  # a handful of stacked layers at most; each pass must consume something
        before = rest
        m = _QUOTE.match(rest)
        if m and m.end():
            rest = rest[m.end():]
        m = _LINE_NO.match(rest)
        if m:
            rest = rest[m.end():]
        m = _PYTEST.match(rest)
        if m:
            rest = rest[m.end():]
        if srun and srun_rank is None:  # the outermost one only: `6: [...]` behind it is the message's own
            m = SRUN_PREFIX.match(rest)
            if m:
                srun_rank = int(m.group(1))
                rest = rest[m.end():]
        m = _TORCHRUN.match(rest)
        if m:
            rank = int(m.group(1))
            rest = rest[m.end():]
            continue
        m = _OPENMPI.match(rest)
        if m:
            rank = int(m.group(1))
            rest = rest[m.end():]
            continue
        m = _TORCHRUN_LOCAL.match(rest)
        if m and m.group(1).lower() not in ("rank", "e", "w", "i", "f", "tp", "dp", "pp", "ep"):
            local = int(m.group(2))
            rest = rest[m.end():]
            continue
        if rest[:1] == "(":
            m = _WORKER.match(rest)
            if m:
                tag = m.group("tag")
                pid = int(m.group("pid"))
                host = m.group("ip") or host
                if m.group("rank"):
                    rank = int(m.group("rank"))
                if m.group("tp"):
                    tp = int(m.group("tp"))
                rest = rest[m.end():]
                continue
        m = _PDSH_IP.match(rest) if rest[:1].isdigit() else None
        if m:
            host = host or m.group("host")
            rest = rest[m.end():]
            continue
        m = _HOST_STREAM.match(rest)
        if m:
            host = m.group("host")
            rest = rest[m.end():]
            continue
        m = _PYLOG.match(rest)
        if m:
            rest = rest[m.end():]
            continue
        m = _collector(rest)
        if m:
            found = m.groupdict()
            host = found.get("host") or host
            pid = int(found["pid"]) if found.get("pid") else pid
            rest = rest[m.end():]
            continue
        m = _COMPOSE.match(rest)
        if m and not rest[:m.end()].strip().isdigit():
            tag = tag or m.group("svc")
            rest = rest[m.end():]
            continue
        if rest == before:
            break
    if rank is None and local is None and srun_ranks:
        rank = srun_rank  # `0: [default3]:`: the task runs a launcher (a node), its index is no rank
    return LinePrefix(rank, local, pid, host, tag, tp), rest
