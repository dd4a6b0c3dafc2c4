"""Lines -> typed records: what a launcher says about its workers (who ended, how; rendezvous; a finished run).

ChildFailedError's table spans lines: a section header ("Failures:" / "Root Cause (first observed failure):"), then
one ``[i]:`` entry per worker with ``key : value`` lines; an entry ends at the next entry, section or separator.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.text import Line, TextDoc
from ranktrace.analyzers.readers.common.torch_text import Speaker, speaker
from ranktrace.analyzers.readers.torch_elastic.signatures import KEY, P

SIGNAL_NUMBERS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGTERM": 15, "SIGUSR1": 10, "SIGUSR2": 12}

__all__ = ["Exit", "Finished", "Stopped", "RendezvousFailure", "RankMap", "Scan", "scan"]


@dataclass(frozen=True)
class Exit:
    """A worker process ended (or was ended by its launcher)."""

    line: int
    who: Speaker
    how: str                       # failed | table | closing | spawn | spawn_error | spawn_term | lightning | deepspeed |
    #                                absl | rocr | event | event_term
    rank: int | None = None        # global rank when the launcher states it
    local_rank: int | None = None
    pid: int | None = None
    exitcode: int | None = None    # as printed (negative = signal)
    signal: str | None = None      # SIGKILL ...
    host: str | None = None
    root_cause: bool = False
    text: str = ""


@dataclass(frozen=True)
class Stopped:
    """The job was stopped from outside: the launcher got a terminating signal, or the scheduler cancelled it."""

    line: int
    who: Speaker
    signal: int | None             # 2 SIGINT, 15 SIGTERM, 1 SIGHUP
    text: str


@dataclass(frozen=True)
class Finished:
    line: int
    who: Speaker
    text: str


@dataclass(frozen=True)
class RendezvousFailure:
    line: int
    who: Speaker
    error: str                     # RendezvousTimeoutError ...
    text: str
    keep_alive: bool = False       # a running agent lost the rendezvous store (not a set-up failure)


@dataclass(frozen=True)
class RankMap:
    """One agent's "Rendezvous complete for workers" result: its local ranks' global ranks."""

    line: int
    local_ranks: tuple[int, ...]
    global_ranks: tuple[int, ...]
    world_size: int | None


@dataclass
class Scan:
    records: list[object] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    rdzv_timeout_s: int | None = None


def scan(doc: TextDoc) -> Scan:
    return _Scanner(doc).run()


def _ints(listed: str) -> tuple[int, ...]:
    return tuple(int(x) for x in listed.strip("[]() ").replace(" ", "").split(",") if x.lstrip("-").isdigit())


class _Scanner:
    def __init__(self, doc: TextDoc) -> None:
        self.doc = doc
        self.out = Scan()
        self.section: str | None = None           # failures | root_cause inside a ChildFailedError table
        self.entry: tuple[int, Speaker, dict[str, str]] | None = None
        self.rdzv: tuple[int, dict[str, str]] | None = None
        self.rocr_fault = False                    # a ROCr device fault already recorded (one per input)

    def run(self) -> Scan:
        for ln in self.doc.lines:
            try:
                self.line(ln)
            except (ValueError, IndexError) as e:
                self.out.skipped.append(Skipped(self.doc.path, ln.no, f"launcher message not understood "
                                                                     f"({type(e).__name__}): {ln.text[:160]!r}"))
        self.flush_entry()
        self.flush_rdzv()
        return self.out

    def add(self, rec: object) -> None:
        self.out.records.append(rec)

    def line(self, ln: Line) -> None:
        text = ln.text
        if self.table(ln, text) or self.rdzv_block(text):
            return
        if not KEY.search(text) and "rdzv_configs" not in text:
            return
        who, body = speaker(ln, text, self.doc.name_rank)
        no = ln.no
        m = P["rdzv_config"].search(body)
        if m:
            self.out.rdzv_timeout_s = int(m.group("t"))
            return
        m = P["event"].search(body)
        if m:
            self.event(no, who, body, m.group("state"))
            return
        m = P["rdzv_result"].search(body)
        if m:
            self.flush_rdzv()
            self.rdzv = (no, {})
            return
        for m in P["closing"].finditer(body):
            self.add(Exit(no, who, "closing", pid=int(m.group("pid")), signal=m.group("sig"), text=m.group(0)))
        for m in P["failed"].finditer(body):
            self.add(Exit(no, who, "failed", local_rank=int(m.group("local")), pid=int(m.group("pid")),
                          exitcode=int(m.group("code")), text=m.group(0)))
        m = P["finished_ok"].search(body)
        if m:
            self.add(Finished(no, who, body[m.start():]))
        m = P["stop_signal"].search(body)
        if m:
            sig = m.group("sig")
            num = int(sig) if sig.isdigit() else SIGNAL_NUMBERS.get(sig.rsplit(".", 1)[-1])
            self.add(Stopped(no, who, num, body[m.start():].strip()))
        m = P["keep_alive"].search(body)
        if m:
            self.add(RendezvousFailure(no, who, m.group("type"), m.group(0) + ".", keep_alive=True))
        else:
            m = P["rdzv_error"].search(body)
            if m and not body.lstrip().startswith(("raise ", "from ", "import ", "except ")):
                self.add(RendezvousFailure(no, who, m.group("type"), body[m.start():].rstrip('",')))
        m = P["spawn_error"].search(body)
        if m:
            self.add(Exit(no, who, "spawn_error", rank=int(m.group("i")), text=m.group(0)))
        else:
            for m in P["spawn_exit"].finditer(body):
                code = m.group("code")
                self.add(Exit(no, who, "spawn", rank=int(m.group("i")), signal=m.group("sig"),
                              exitcode=int(code) if code else None, text=body[m.start():]))
        for m in P["spawn_term"].finditer(body):
            self.add(Exit(no, who, "spawn_term", pid=int(m.group("pid")), signal=m.group("sig"), text=m.group(0)))
        m = P["lightning"].search(body)
        if m:
            self.add(Exit(no, who, "lightning", rank=int(m.group("rank")), pid=int(m.group("pid")),
                          exitcode=int(m.group("code")), text=body[m.start():]))
        m = P["absl"].search(body)
        if m and not (self.rocr_fault and m.group("sig") == "SIGABRT"):  # ROCr's abort after the fault it printed
            self.add(Exit(no, who, "absl", rank=who.global_rank, pid=who.pid, signal=m.group("sig"), text=m.group(0)))
        m = P["rocr"].search(body)
        if m and not self.rocr_fault:   # one per input: ROCr prints it for every queue of the faulting device
            self.rocr_fault = True
            self.add(Exit(no, who, "rocr", rank=who.global_rank, pid=who.pid, signal="SIGABRT", text=m.group(0)))
        m = P["deepspeed"].search(body)
        if m:
            loc = P["ds_local"].search(m.group("cmd"))
            self.add(Exit(no, who, "deepspeed", local_rank=int(loc.group("local")) if loc else None,
                          exitcode=int(m.group("code")), text=body[m.start():]))

    # --- torchelastic's event records ---------------------------------------------------------------------------------
    def event(self, no: int, who: Speaker, body: str, state: str) -> None:
        """One worker's end as the agent recorded it (``_record_worker_events``: the run's state per worker; FAILED
        with its exit code and pid, TERMINATED when the agent stopped it after another failed). The agent's own
        records (source AGENT: START, durations, its own FAILED traceback) say nothing about a worker and are left."""
        src = P["event_source"].search(body)
        if src is None or src.group("source") != "WORKER":
            return
        rank_m, host_m = P["event_rank"].search(body), P["event_host"].search(body)
        rank = int(rank_m.group("rank")) if rank_m else None
        host = host_m.group("host") if host_m else None
        if state == "SUCCEEDED":
            self.add(Finished(no, Speaker(host=host), f"torchelastic.worker.status.SUCCEEDED (global_rank {rank})"))
        elif state in ("FAILED", "TERMINATED"):
            code_m, pid_m = P["event_code"].search(body), P["event_pid"].search(body)
            self.add(Exit(no, who, "event_term" if state == "TERMINATED" else "event",
                          rank=rank if rank is not None and rank >= 0 else None,
                          pid=int(pid_m.group("pid")) if pid_m else None,
                          exitcode=int(code_m.group("code")) if code_m else None, host=host,
                          text=f"torchelastic.worker.status.{state}"))

    # --- ChildFailedError's table ---------------------------------------------------------------------------------
    def table(self, ln: Line, text: str) -> bool:
        m = P["section"].match(text)
        if m:
            self.flush_entry()
            self.section = "root_cause" if m.group("s").startswith("Root") else "failures"
            return True
        if self.entry is None:      # a field of an entry cut above, with the next entry's header glued to it
            f = P["field"].match(text)
            g = P["glued"].search(f.group("v")) if f else None
            if g and g.group("i"):
                self.section = self.section or "unknown"
                self.entry = (ln.no, self.entry_who(ln, text), {})
                return True
        m = P["entry"].match(text)
        if m is None and self.section is None:
            return False
        if m and self.section is None:
            self.section = "unknown"      # a table cut above its section header: an entry needs its fields
        if m:
            self.flush_entry()
            self.entry = (ln.no, self.entry_who(ln, text), {})
            return True
        if self.entry is not None:
            m = P["field"].match(text)
            if m:
                value = m.group("v")
                # the shared opener may take this table's equal-width lines for one wrapped line and glue the next
                # entry header or separator to the value: "...errors.html[2]:", "...errors.html======"
                glued = P["glued"].search(value)
                if glued:
                    value = value[:glued.start()]
                self.entry[2].setdefault(m.group("k"), value.strip())
                if glued and glued.group("i"):
                    self.flush_entry()
                    self.entry = (ln.no, self.entry_who(ln, text), {})
                elif glued:
                    self.flush_entry()
                    if glued.group(0).startswith("="):
                        self.section = None
                return True
        self.flush_entry()
        if P["table_end"].match(text):
            if text.strip().startswith("="):
                self.section = None
            return True
        self.section = None
        return False

    def entry_who(self, ln: Line, text: str) -> Speaker:
        return speaker(ln, text, self.doc.name_rank)[0]

    def flush_entry(self) -> None:
        if self.entry is None:
            return
        no, who, f = self.entry
        self.entry = None
        if "rank" not in f and "exitcode" not in f:
            return
        rank = local = pid = code = None
        sig = None
        m = P["rank_field"].match(f.get("rank", ""))
        if m:
            rank = int(m.group("rank"))
            local = int(m.group("local")) if m.group("local") else None
        m = P["exit_field"].match(f.get("exitcode", ""))
        if m:
            code = int(m.group("code"))
            pid = int(m.group("pid")) if m.group("pid") else None
        tb = f.get("traceback", "")
        m = P["signal_tb"].search(tb)
        if m:
            sig = m.group("sig")
            pid = pid or int(m.group("pid"))
        text = " ".join(f"{k}={v}" for k, v in f.items() if k in ("time", "exitcode", "traceback"))
        self.add(Exit(no, who, "table", rank=rank if rank is not None and rank >= 0 else None, local_rank=local,
                      pid=pid, exitcode=code, signal=sig, host=f.get("host"),
                      root_cause=self.section == "root_cause", text=text))

    # --- "Rendezvous complete for workers. Result:" -----------------------------------------------------------------
    def rdzv_block(self, text: str) -> bool:
        if self.rdzv is None:
            return False
        m = P["rdzv_field"].search(text)
        if m:
            self.rdzv[1][m.group("k")] = m.group("v")
            return True
        if P["rdzv_other"].search(text):
            return True   # restart_count=, master_addr=, ... the fields this reader does not need
        self.flush_rdzv()
        return False

    def flush_rdzv(self) -> None:
        if self.rdzv is None:
            return
        no, f = self.rdzv
        self.rdzv = None
        local, glob = _ints(f.get("local_ranks", "")), _ints(f.get("global_ranks", ""))
        sizes = _ints(f.get("global_world_sizes", ""))
        if local and len(local) == len(glob):
            self.add(RankMap(no, local, glob, sizes[0] if sizes else None))
