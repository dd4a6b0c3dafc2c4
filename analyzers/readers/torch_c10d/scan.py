"""Lines -> typed records: each c10d message a line holds, with who said it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ranktrace.analyzers.readers.base import Skipped
from ranktrace.analyzers.readers.text import Line, TextDoc
from ranktrace.analyzers.readers.torch_c10d.signatures import EXC_PREFIX, KEY, P, ranks_of
from ranktrace.analyzers.readers.common.torch_text import Speaker, speaker

__all__ = ["Fingerprint", "Collective", "BarrierVerdict", "InitFailure", "StoreBarrier", "TransportError",
           "WatchdogStuck", "Desync", "Terminated", "BareTimeout", "Scan", "scan"]


@dataclass(frozen=True)
class Fingerprint:
    """One rank's collective in a TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch report."""

    line: int
    who: Speaker
    rank: int                  # the rank whose collective this is (as the report numbers it)
    by: int                    # the rank that reported it
    optype: str | None         # OpType as printed (ALLREDUCE, _ALLGATHER_BASE)
    seq: int | None            # SequenceNumber (None before torch 1.13)
    shape: str | None
    dtype: str | None
    device: str | None
    differ: str | None         # "Collectives differ in the following aspects: ..."
    cut: bool                  # the fingerprint text ends before its closing parenthesis


@dataclass(frozen=True)
class Collective:
    """A rank states the collective it runs: ProcessGroupWrapper's "Running collective" (INFO) or the collective
    whose pre-check failed ("Monitored Barrier encountered error running collective")."""

    line: int
    who: Speaker
    optype: str | None
    seq: int | None
    shape: str | None
    dtype: str | None
    failed: bool               # the wrapper's monitoredBarrier failed for it


@dataclass(frozen=True)
class BarrierVerdict:
    """monitoredBarrier's statement about ranks: failed to pass (missing) or reached it (joined)."""

    line: int
    who: Speaker
    ranks: tuple[int, ...]
    joined: bool
    by: int | None             # rank 0 states the failures; a rank that reached it speaks for itself
    timeout_ms: int | None
    text: str
    wrapped: Collective | None = None   # the collective ProcessGroupWrapper was about to run


@dataclass(frozen=True)
class InitFailure:
    line: int
    who: Speaker
    rank: int | None           # a rank the message names ([1] is setting up ...), else the speaker's
    stage: str                 # store | rendezvous | nccl_unique_id | store_barrier | nccl_init | connect
    timeout_s: int | None
    text: str
    retry: bool = False        # a warning the client retries after (the connection attempt, not the set-up, failed)


@dataclass(frozen=True)
class StoreBarrier:
    """distributed_c10d's store-based barrier of init_process_group / new_group: waiting, timed out or done."""

    line: int
    who: Speaker
    rank: int
    key: str
    world_size: int | None
    joined: int | None
    timeout_s: int | None
    state: str                 # waiting | timed_out | done
    text: str


@dataclass(frozen=True)
class TransportError:
    line: int
    who: Speaker
    name: str                  # gloo_timeout | connection_closed | nccl_error | cuda_error
    timeout_ms: int | None
    text: str
    rank: int | None = None    # a rank the message names (NCCL communicator was aborted on rank N)


@dataclass(frozen=True)
class WatchdogStuck:
    line: int
    who: Speaker
    name: str                  # heartbeat | watchdog_hang
    seconds: int | None
    text: str


@dataclass(frozen=True)
class Desync:
    """One statement of a TORCH_NCCL_DESYNC_DEBUG report (count from 1)."""

    line: int
    who: Speaker
    by: int | None             # the rank whose watchdog wrote the report
    ranks: tuple[int, ...]
    state: str                 # timed_out | joined_not_finished | finished_not_joined | never_joined | started |
    #                            finished
    seq: int | None
    optype: str | None


@dataclass(frozen=True)
class Terminated:
    """The process ends: std::terminate on an uncaught C++ exception, or the NCCL monitor's fatal exit."""

    line: int
    who: Speaker
    exc_type: str | None       # c10::DistBackendError
    cause: str                 # what() / "ProcessGroupNCCL watchdog hang"


@dataclass(frozen=True)
class BareTimeout:
    """'Watchdog caught collective operation timeout' whose WorkNCCL(...) body the paste cut off."""

    line: int
    who: Speaker
    exc_type: str | None
    text: str


@dataclass
class Scan:
    records: list[object] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    world_sizes: set[int] = field(default_factory=set)    # stated by the default group's store-based barrier
    nccl_versions: dict[str, int] = field(default_factory=dict)   # "NCCL version 2.20.5" -> first line


def scan(doc: TextDoc) -> Scan:
    """
    One pass over the document. A line is looked at only when the one KEY search finds a message in it, or when it
    continues a statement the previous lines opened (a desync snapshot, ``Last error:`` after an NCCL error, ``what():``
    after ``terminate called``, the monitoredBarrier error after ProcessGroupWrapper's collective). Torn or unknown
    lines become ``Skipped`` notes, never errors.
    """
    return _Scanner(doc).run()


class _Scanner:
    def __init__(self, doc: TextDoc) -> None:
        self.doc = doc
        self.out = Scan()
        self.wrap: tuple[int, Collective] | None = None          # (line, collective) awaiting its barrier error
        self.nccl: tuple[int, int, int | None] | None = None     # (line, record, prefix rank) of an NCCL error
        self.last_error_at: tuple[int, int, int | None] | None = None   # (record, line, prefix rank) of "Last error:"
        self.terminate: tuple[int, Speaker, str] | None = None    # (line, speaker, type) awaiting what()
        self.desync_by: int | None = None
        self.snapshot: tuple[int, int, str] | None = None        # (line, seq, state) of a desync snapshot header

    def note(self, no: int, why: str, text: str) -> None:
        self.out.skipped.append(Skipped(self.doc.path, no, f"{why}: {text[:160]!r}"))

    def add(self, rec: object) -> None:
        self.out.records.append(rec)

    def run(self) -> Scan:
        for ln in self.doc.lines:
            try:
                self.line(ln)
            except (ValueError, IndexError) as e:   # a torn number or group: the line is noted, never fatal
                self.note(ln.no, f"torch message not understood ({type(e).__name__})", ln.text)
        self.finish()
        return self.out

    def finish(self) -> None:
        """Statements the input ended in the middle of."""
        if self.terminate is not None:
            t_no, who, typ = self.terminate
            self.add(Terminated(t_no, who, typ, ""))
        if self.wrap is not None:
            w_no, col = self.wrap
            self.add(BarrierVerdict(w_no, col.who, (), False, None, None, "monitoredBarrier error not shown", col))

    # --- one line -------------------------------------------------------------------------------------------------
    def line(self, ln: Line) -> None:
        text = ln.text
        no = ln.no
        if self.continuation(ln, text):
            return
        if not KEY.search(text):
            return
        if " NCCL WARN " in text or " NCCL INFO " in text:
            return  # NCCL's own log lines belong to the nccl_log family
        who, body = speaker(ln, text, self.doc.name_rank)
        if self.fingerprints(no, who, body):
            return
        self.wrapper(no, who, body)
        self.barrier(no, who, body)
        if self.init(no, who, body):
            return
        self.transport(no, who, body)
        self.watchdog(no, who, body)
        self.desync(no, who, body)
        self.terminated(no, who, body)

    def continuation(self, ln: Line, text: str) -> bool:
        no = ln.no
        # "what():" after "terminate called after throwing an instance of '...'"
        if self.terminate is not None:
            t_no, who, typ = self.terminate
            m = P["what"].match(text)
            if m and no - t_no <= 2:
                self.terminate = None
                what = m.group("what").strip()
                said, _ = speaker(ln, what, self.doc.name_rank)   # "[PG 1 Rank 6] ..." names the rank in its group
                if who.pg_rank is None and said.pg_rank is not None:
                    who = replace(who, pg_rank=said.pg_rank, pg=said.pg, pg_desc=said.pg_desc)
                self.add(Terminated(t_no, who, typ, what))
                return True
            if no - t_no > 2:
                self.terminate = None
                self.add(Terminated(t_no, who, typ, ""))
        # the line after "Last error:" is NCCL's own reason (same writer, next line)
        if self.last_error_at is not None:
            idx, at, rank = self.last_error_at
            self.last_error_at = None
            rec = self.out.records[idx]
            if (isinstance(rec, TransportError) and no == at + 1 and ln.prefix.rank == rank
                    and (not KEY.search(text) or P["cuda_failure"].search(text))
                    and not text.lstrip().startswith(("Traceback", "File "))):
                self.out.records[idx] = replace(rec, text=f"{rec.text} | {text.strip()}")
                return True
        if self.nccl is not None:
            n_no, idx, n_rank = self.nccl
            if no - n_no > 4 or ln.prefix.rank != n_rank:
                self.nccl = None
            else:
                m = P["last_error"].match(text)
                if m:
                    rec = self.out.records[idx]
                    if isinstance(rec, TransportError):
                        if m.group("what"):
                            self.out.records[idx] = replace(rec, text=f"{rec.text} | Last error: {m.group('what')}")
                        else:
                            self.last_error_at = (idx, no, ln.prefix.rank)
                    return True
                m = P["nccl_kind"].search(text)
                if m and not P["nccl_in"].search(text):
                    rec = self.out.records[idx]
                    if isinstance(rec, TransportError):
                        self.out.records[idx] = replace(rec, text=f"{rec.text} | {m.group(0).strip()}")
                        self.nccl = (no, idx, n_rank)
                    return True
        # a desync snapshot's "[0, 1, 2] started ALLREDUCE" lines
        if self.snapshot is not None:
            s_no, seq, _ = self.snapshot
            m = P["ds_snap_ranks"].match(text)
            if no - s_no > 64:
                self.snapshot = None      # a report is a few lines: a later "[..] started X" is something else
            elif m:
                who, _body = speaker(ln, text, self.doc.name_rank)
                self.add(Desync(no, who, self.desync_by, ranks_of(m.group("ranks")), m.group("state"), seq,
                                m.group("op")))
                return True
        return False

    # --- ProcessGroupWrapper mismatch ------------------------------------------------------------------------------
    def fingerprints(self, no: int, who: Speaker, body: str) -> bool:
        own = P["fp_own"].search(body)
        if own is None:
            if "CollectiveFingerPrint(" in body or "Detected mismatch between collectives" not in body:
                return False
            self.note(no, "mismatch report cut before its first fingerprint", body)
            return True
        by = int(own.group("rank"))
        other = P["fp_other"].search(body, own.end())
        own_body = body[own.end():other.start() if other else len(body)]
        differ = P["fp_differ"].search(body)
        differ_text = differ.group("what").strip() if differ else None
        first = self.fingerprint(no, who, by, by, own_body, differ_text)
        self.add(first)
        if other is not None:
            other_body = body[other.end():differ.start() if differ else len(body)]
            self.add(self.fingerprint(no, who, int(other.group("rank")), by, other_body, differ_text))
        elif not own.group("old"):
            self.note(no, "mismatch report cut before the other rank's fingerprint", body[own.start():])
        return True

    @staticmethod
    def fingerprint(no: int, who: Speaker, rank: int, by: int, fp: str, differ: str | None) -> Fingerprint:
        seq = P["fp_seq"].search(fp)
        op = P["fp_op"].search(fp)
        shape = P["fp_shape"].search(fp)
        dtype = P["fp_dtype"].search(fp)
        device = P["fp_device"].search(fp)
        cut = ")" not in fp
        return Fingerprint(no, who, rank, by, op.group(1) if op else None, int(seq.group(1)) if seq else None,
                           shape.group(1) if shape else None, dtype.group(1).strip() if dtype else None,
                           (device.group(1) or device.group(2)) if device else None, differ, cut)

    # --- monitoredBarrier ----------------------------------------------------------------------------------------
    def wrapper(self, no: int, who: Speaker, body: str) -> None:
        for key, failed in (("wrapper", True), ("running", False)):
            m = P[key].search(body)
            if m is None:
                continue
            fp = body[m.end():]
            end = fp.find(")")
            fp = fp[:end] if end >= 0 else fp
            seq = P["fp_seq"].search(fp)
            op = P["fp_op"].search(fp)
            shape = P["fp_shape"].search(fp)
            dtype = P["fp_dtype"].search(fp)
            col = Collective(no, who, op.group(1) if op else None, int(seq.group(1)) if seq else None,
                             shape.group(1) if shape else None, dtype.group(1).strip() if dtype else None, failed)
            if failed:
                self.wrap = (no, col)
            else:
                self.add(col)
            return

    def barrier(self, no: int, who: Speaker, body: str) -> None:
        found: list[BarrierVerdict] = []
        for m in P["mb_failed"].finditer(body):
            ms = m.group("ms")
            by = who.prefix_rank if who.prefix_rank is not None else 0   # only rank 0 checks the others
            found.append(BarrierVerdict(no, who, ranks_of(m.group("ranks")), False, by, int(ms) if ms else None,
                                        body[m.start():m.end()]))
        for m in P["mb_reached"].finditer(body):
            r = int(m.group("rank"))
            found.append(BarrierVerdict(no, who, (r,), True, r, None, body[m.start():m.end()]))
        m = P["mb_timed_out"].search(body)
        if m:
            found.append(BarrierVerdict(no, who, (), False, int(m.group("rank")), int(m.group("ms")),
                                        body[m.start():m.end()]))
        m = P["mb_processed"].search(body)
        if m:
            found.append(BarrierVerdict(no, who, ranks_of(m.group("ranks")), True, 0, None, body[m.start():]))
        for v in found:
            if self.wrap is not None and no - self.wrap[0] <= 3:
                v = replace(v, wrapped=self.wrap[1])
            self.add(v)
        if found:
            self.wrap = None
        elif self.wrap is not None and no - self.wrap[0] > 3:
            self.add(BarrierVerdict(self.wrap[0], self.wrap[1].who, (), False, None, None,
                                    "monitoredBarrier error not shown", self.wrap[1]))
            self.wrap = None

    # --- store / socket / rendezvous / communicator set-up ----------------------------------------------------------
    def init(self, no: int, who: Speaker, body: str) -> bool:
        m = P["unique_id"].search(body)
        if m:
            err = m.group("err") or ""
            t = P["store_timeout"].search(err)
            secs = int(t.group("ms")) // 1000 if t and t.group("ms") else None
            self.add(InitFailure(no, who, int(m.group("rank")), "nccl_unique_id", secs, body[m.start():]))
            return True
        found = False
        for key, state in (("sbb_timeout", "timed_out"), ("sbb_wait", "waiting")):
            for m in P[key].finditer(body):   # several, when equal-width lines were joined as a wrapped one
                found = True
                if m.group("key").rstrip(",") == "store_based_barrier_key:1":   # init_process_group's own group
                    self.out.world_sizes.add(int(m.group("ws")))
                self.add(StoreBarrier(no, who, int(m.group("rank")), m.group("key").rstrip(","), int(m.group("ws")),
                                      int(m.group("got")), _seconds(m.group("t")), state, m.group(0)))
        if found:
            return True
        m = P["sbb_done"].search(body)
        if m:
            self.add(StoreBarrier(no, who, int(m.group("rank")), m.group("key").rstrip(",."), None, None, None,
                                  "done", body[m.start():]))
            return True
        m = P["store_clients"].search(body)   # its n clients are agents under torchrun, not ranks: no world size
        if m:
            self.add(InitFailure(no, who, None, "store", int(m.group("s")), body[m.start():]))
            return True
        m = P["sock_timeout"].search(body)
        if m:
            n = int(m.group("n"))
            self.add(InitFailure(no, who, None, "connect", n // 1000 if m.group("unit") == "ms" else n,
                                 body[m.start():]))
            return True
        for key in ("sock_any", "sock_init"):
            m = P[key].search(body)
            if m:
                self.add(InitFailure(no, who, None, "connect", None, body[m.start():]))
                return True
        m = P["sock_retry"].search(body)
        if m:
            self.add(InitFailure(no, who, None, "connect", None, body[m.start():], retry=who.level == "W"))
            return True
        m = P["sock_server"].search(body)
        if m:
            self.add(InitFailure(no, who, None, "store", None, body[m.start():]))
            return True
        m = P["connect_old"].search(body)
        if m:
            ms = m.group("ms")
            self.add(InitFailure(no, who, None, "connect", int(ms) // 1000 if ms else None, body[m.start():]))
            return True
        m = P["gloo_mesh"].search(body)
        if m:
            self.add(InitFailure(no, who, None, "connect", None, body[m.start():]))
            return True
        m = P["store_timeout"].search(body)
        if m:
            ms = m.group("ms")
            self.add(InitFailure(no, who, None, "store", int(ms) // 1000 if ms else None, body[m.start():]))
            return True
        m = P["store_closed"].search(body)
        if m:
            self.add(TransportError(no, who, "connection_closed", None, "c10d store: " + body[m.start():]))
            return True
        if "The client socket " in body or "The server socket " in body:
            return True   # socket.cpp warnings without a failure (gai lookups, hostnames): nothing to say
        return False

    # --- gloo / NCCL / CUDA ----------------------------------------------------------------------------------------
    def transport(self, no: int, who: Speaker, body: str) -> None:
        src = P["gloo_src"].search(body)
        where = f" [{src.group('src')}]" if src else ""
        for m in P["gloo_timeout"].finditer(body):
            self.add(TransportError(no, who, "gloo_timeout", int(m.group("ms")), m.group(0) + where))
        for m in P["gloo_closed"].finditer(body):
            self.add(TransportError(no, who, "connection_closed", None, m.group(0) + where))
        for m in P["gloo_reset"].finditer(body):
            self.add(TransportError(no, who, "connection_closed", None, m.group(0) + where))
        if P["gloo_app_timeout"].search(body):
            self.add(TransportError(no, who, "gloo_timeout", None, "Application timeout caused pair closure" + where))
        m = P["nccl_aborted"].search(body)
        if m:
            self.add(TransportError(no, who, "nccl_error", None, body[m.start():], rank=int(m.group("rank"))))
            return
        m = P["nccl_in"].search(body)
        if m and m.group("ver"):
            self.out.nccl_versions.setdefault(m.group("ver").rstrip(".,"), no)
        m = m or P["nccl_err"].search(body)
        if m:
            self.add(TransportError(no, who, "nccl_error", None, body[m.start():]))
            self.nccl = (no, len(self.out.records) - 1, who.prefix_rank)
            return
        m = P["nccl_kind"].search(body)
        if m:
            self.add(TransportError(no, who, "nccl_error", None, m.group(0)))
            self.nccl = (no, len(self.out.records) - 1, who.prefix_rank)
            return
        m = P["cuda_failure"].search(body) or P["cuda_error"].search(body)
        if m:
            self.add(TransportError(no, who, "cuda_error", None, m.group(0)))

    # --- the NCCL watchdog's own health ----------------------------------------------------------------------------
    def watchdog(self, no: int, who: Speaker, body: str) -> None:
        m = P["wd_stuck"].search(body)
        if m:
            self.add(WatchdogStuck(no, who, "watchdog_hang", int(m.group("s")), body[m.start():]))
            return
        m = P["hb_timeout"].search(body)
        if m:
            self.add(WatchdogStuck(no, who, "heartbeat", None, body[m.start():]))
            return
        for key in ("hb_first", "hb_monitor"):
            m = P[key].search(body)
            if m:
                self.add(WatchdogStuck(no, who, "heartbeat", None, body[m.start():]))
                return
        m = P["hb_terminate"].search(body)
        if m:
            why = m.group("why").strip()
            self.add(Terminated(no, who, None, why))
            if "watchdog hang" in why:
                self.add(WatchdogStuck(no, who, "watchdog_hang", None, body[m.start():]))
            return
        if P["wd_bare"].search(body) and "WorkNCCL(" not in body:
            exc = EXC_PREFIX.match(body)
            self.add(BareTimeout(no, who, exc.group("type") if exc else None, body))
        elif P["wd_some_failed"].search(body):
            self.add(BareTimeout(no, who, "nccl_work_failed", body))

    # --- TORCH_NCCL_DESYNC_DEBUG ------------------------------------------------------------------------------------
    def desync(self, no: int, who: Speaker, body: str) -> None:
        m = P["ds_timeout"].search(body)
        if m:
            self.desync_by = int(m.group("rank"))
            self.add(Desync(no, who, self.desync_by, (self.desync_by,), "timed_out", int(m.group("seq")),
                            m.group("op")))
            return
        m = P["ds_joined"].search(body)
        if m:
            self.add(Desync(no, who, self.desync_by, ranks_of(m.group("ranks")), "joined_not_finished",
                            int(m.group("seq")), None))
        m = P["ds_finished"].search(body)
        if m:
            self.add(Desync(no, who, self.desync_by, ranks_of(m.group("ranks")), "finished_not_joined",
                            int(m.group("next")), None))
            return
        m = P["ds_never"].search(body)
        if m:
            self.add(Desync(no, who, self.desync_by, ranks_of(m.group("ranks")), "never_joined", None, None))
            return
        m = P["ds_snap_seq"].match(body)
        if m:
            self.snapshot = (no, int(m.group("seq")), m.group("state"))

    # --- the process ends ----------------------------------------------------------------------------------------
    def terminated(self, no: int, who: Speaker, body: str) -> None:
        m = P["terminate"].search(body)
        if m:
            if self.terminate is not None:
                t_no, t_who, typ = self.terminate
                self.add(Terminated(t_no, t_who, typ, ""))
            self.terminate = (no, who, m.group("type"))


def _seconds(t: str) -> int | None:
    """'0:30:00' / '1 day, 0:00:00' / '1800' -> seconds."""
    t = t.strip().rstrip(",")
    days = 0
    if "day" in t:
        d, _, t = t.partition(",")
        days = int(d.split()[0])
        t = t.strip()
    parts = t.split(":")
    try:
        if len(parts) == 3:
            return days * 86400 + int(parts[0]) * 3600 + int(parts[1]) * 60 + int(float(parts[2]))
        return days * 86400 + int(float(t))
    except ValueError:
        return None
