"""What the torch text families (torch_c10d, torch_elastic, traceback) share: who wrote a line (launcher prefix, glog
and PG leaders, timestamps the opener leaves), read one way for all of them; redaction of messages; signal names."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ranktrace.analyzers.readers.text import Line
from ranktrace.tracer.formats.redact import redact_value

__all__ = ["Speaker", "speaker", "strip_leaders", "clip", "SIGNALS", "signal_number", "exit_kind", "DETAIL_MAX"]

DETAIL_MAX = 300     # characters of a message kept in a row's detail

# Timestamps / stray prefixes the shared opener leaves in front of the message (it peels launcher prefixes only).
_LEADERS = re.compile(
    r"(?:[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d |"                  # Jul 13 21:22:34 (CI, syslog)
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z |"                  # 2024-01-01T00:00:00.0000000Z (GitHub Actions)
    r"\d\d:\d\d:\d\d[.,]\d{1,6} (?=\[rank\d)|"                          # 18:11:06.680 [rank4]: (an app's clock)
    r"\[rank\d{1,6}\]:[ \t]?|"                                          # a rank prefix the opener could not reach
    r"\s{0,4}E {2,}(?=\S)|\s{0,4}E$)"                                   # pytest's E column left behind a space
)
_LEADER_RANK = re.compile(r"\[rank(\d{1,6})\]:")
_GLOG = re.compile(
    r"\[?(?P<lvl>[EWIF])(?P<date>\d{4})? ?(?P<time>\d\d:\d\d:\d\d(?:\.\d{1,9})?)?(?: \d{1,9})? "
    r"(?P<src>[^\]\s]{1,300}):(?P<srcline>\d{1,6})\] ?")
_PG_NEW = re.compile(r"\[PG ID (\d{1,9}) PG GUID ([^\s(\]]{1,200})(?:\(([^)\]]{0,200})\))? Rank (\d{1,9})\]")
_PG_OLD = re.compile(r"\[PG (\d{1,9})(?: \(([^)\]]{0,200})\))? Rank (\d{1,9})\]")
_PG_BARE = re.compile(r"^\[Rank (\d{1,9})\]")

SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGBUS": 7,
           "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13, "SIGALRM": 14,
           "SIGTERM": 15, "SIGXCPU": 24}


@dataclass(frozen=True)
class Speaker:
    """Who wrote a line, as far as its prefixes and leaders say."""

    prefix_rank: int | None = None    # launcher prefix: global
    pg_rank: int | None = None        # [PG .. Rank N] / [Rank N]: rank inside that group
    pg: str | None = None             # PG GUID (≥ 2.5) or PG number (2.1 – 2.4)
    pg_desc: str | None = None        # default_pg, a user group_desc
    name_rank: int | None = None      # the file name's rank
    pid: int | None = None
    host: str | None = None
    level: str | None = None          # glog level letter E/W/I/F
    log_time: str | None = None       # glog time (no year)

    @property
    def default_pg(self) -> bool:
        return self.pg_desc == "default_pg" or (self.pg == "0" and self.pg_desc in (None, "default_pg"))

    @property
    def global_rank(self) -> int | None:
        if self.prefix_rank is not None:
            return self.prefix_rank
        if self.pg_rank is not None and self.pg is not None and self.default_pg:
            return self.pg_rank
        if self.name_rank is not None:
            return self.name_rank
        if self.pg_rank is not None and self.pg is None:
            return self.pg_rank        # a bare [Rank N] (torch <= 2.0): the group is not named, usually the default
        return None

    def facts(self) -> str:
        """``pg=.. pg_rank=..`` for a row's detail when the rank lives in a group."""
        parts = []
        if self.pg is not None:
            parts.append(f"pg={self.pg}" + (f"({self.pg_desc})" if self.pg_desc else ""))
        if self.pg_rank is not None and (self.prefix_rank is None or self.pg_rank != self.prefix_rank):
            parts.append(f"pg_rank={self.pg_rank}")
        if self.log_time:
            parts.append(f"log_time={self.log_time}")
        return " ".join(parts)


def strip_leaders(text: str) -> tuple[str, int | None]:
    """The message without timestamps / stray prefixes in front of it, and a rank one of them named."""
    rank = None
    for _ in range(4):
        m = _LEADERS.match(text)
        if not m or not m.end():
            break
        r = _LEADER_RANK.match(m.group(0))
        if r:
            rank = int(r.group(1))
        text = text[m.end():]
    return text, rank


def speaker(ln: Line, text: str, name_rank: int | None = None) -> tuple[Speaker, str]:
    """Who wrote `ln` and its message with the glog and PG leaders removed (`text` = ln.text after strip_leaders).

    A rank says the same thing in several spellings: ``[rank3]:`` (torchrun, peeled by the opener), a glog leader
    ``[E1218 20:27:21.426 ProcessGroupNCCL.cpp:629]``, a PG leader ``[PG ID 0 PG GUID 0(default_pg) Rank 3]``
    (torch ≥ 2.5), ``[PG 1 (tp) Rank 3]`` (2.1 – 2.4), ``[Rank 3]`` (≤ 2.0) and timestamps the opener does not
    peel (``Jul 13 21:22:34``, GitHub Actions ``2024-01-01T00:00:00.0000000Z``, an application's ``18:11:06.680``).

    Rank rule (``Speaker.global_rank``): the launcher prefix (global) wins; else a PG leader of the default group
    (its ranks are global); else the file name's rank; else a bare ``[Rank N]`` (torch ≤ 2.0 prints the rank in the
    group, which for the usual default group is the global rank: ``detail`` keeps ``pg_rank=N`` so a reader can
    tell); a rank in a named subgroup stays out of ``rank`` (``pg_rank=`` in ``detail`` only).

    All patterns are anchored or bounded: linear in the line.
    """
    p = ln.prefix
    body, leader_rank = strip_leaders(text)
    level = log_time = None
    m = _GLOG.match(body)
    if m:
        level = m.group("lvl")
        if m.group("date") or m.group("time"):
            log_time = f"{m.group('lvl')}{m.group('date') or ''} {m.group('time') or ''}".strip()
        body = body[m.end():]
    pg = pg_desc = None
    pg_rank = None
    m = _PG_NEW.search(body[:400])
    if m:
        pg, pg_desc, pg_rank = m.group(2), m.group(3), int(m.group(4))
    else:
        m = _PG_OLD.search(body[:400])
        if m:
            pg, pg_desc, pg_rank = m.group(1), m.group(2), int(m.group(3))
        else:
            m = _PG_BARE.match(body)
            if m:
                pg_rank = int(m.group(1))
    prefix_rank = p.rank if p.rank is not None else leader_rank
    return Speaker(prefix_rank, pg_rank, pg, pg_desc, name_rank, p.pid, p.host, level, log_time), body


def clip(text: str, limit: int = DETAIL_MAX) -> str:
    """A message for a row: secrets redacted, whitespace folded, at most `limit` characters."""
    s = " ".join(text.split())
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    return redact_value(s)


def signal_number(name: str) -> int | None:
    return SIGNALS.get(name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper())


def exit_kind(exitcode: int) -> tuple[str, int]:
    """(rank_exit name, value) of a process exit code as launchers print it (negative = killed by that signal)."""
    if exitcode < 0:
        sig = -exitcode
        return ("segfault" if sig == 11 else "signal"), sig
    if exitcode > 128 and exitcode - 128 in SIGNALS.values():   # a shell's 128+N
        sig = exitcode - 128
        return ("segfault" if sig == 11 else "signal"), sig
    return "exit", exitcode
