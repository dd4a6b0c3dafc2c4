"""The watchdog inside `trace run`: notices silence, captures evidence, prints a verdict while the job is hung.

Progress, not utilisation: new ring records, storage I/O, major faults, RSS and GPU memory growth, the process set,
the job's other processes at work (a compiler child, in the process tree, whatever its session: watch/activity.py),
file offsets that move (a load from the page cache), new lines of output, and (once those are quiet) stacks that
move. How long a silence must last is watch/threshold.py's: adaptive by default (a short path when every rank is
parked in a known wait), --hang-after / --startup-hang-after as fixed overrides. Silence is measured on the
monotonic clock, and a stretch the watchdog itself did not run (the machine paused, suspended or starved it) is
not silence. The same reads are kept as samples/*.arrow; nothing is read twice.
"""
from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ranktrace.analyzers.verdict import compact_ranks
from ranktrace.tracer.watch import burst
from ranktrace.tracer.watch.activity import BusyChild, JobActivity, child_text
from ranktrace.tracer.watch.threshold import Cadence, RankView, Threshold, decide
from ranktrace.tracer.formats import ringformat

if TYPE_CHECKING:
    from ranktrace.analyzers.model.values import Analysis

__all__ = ["MonitorOptions", "Monitor", "ring_progress", "proc_counters", "inside_line"]


def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, ""))
        return v if v > 0 else default
    except ValueError:
        return default


def _env_ras() -> str | None:
    from ranktrace.tracer.watch import ras

    return ras.default_addr()


@dataclass(frozen=True)
class MonitorOptions:
    #: fixed silence thresholds (after / before the ranks joined their process group); None: adaptive (threshold.py)
    hang_after: float | None = None
    startup_hang_after: float | None = None
    on_hang: str = "report"          # report | kill | wait
    interval: float = 1.0            # cheap signals and the /proc sample
    stack_interval: float = 3.0      # fastest stack sampling, while quiet
    native_stacks: bool = False
    # sampling (environment overrides: RANKTRACE_STACK_EVERY, RANKTRACE_GPU_EVERY, RANKTRACE_FLUSH_EVERY,
    # RANKTRACE_SAMPLES=0 turns the sample files off; NCCL_RAS_ADDR / NCCL_RAS_ENABLE=0 as NCCL reads them)
    stack_every: float = field(default_factory=lambda: _env_float("RANKTRACE_STACK_EVERY", 10.0))
    gpu_every: float = field(default_factory=lambda: _env_float("RANKTRACE_GPU_EVERY", 2.0))
    flush_every: float = field(default_factory=lambda: _env_float("RANKTRACE_FLUSH_EVERY", 5.0))
    samples: bool = field(default_factory=lambda: os.environ.get("RANKTRACE_SAMPLES", "1") != "0")
    gpu: bool = field(default_factory=lambda: os.environ.get("RANKTRACE_GPU", "1") != "0")
    ras_addr: str | None = field(default_factory=_env_ras)


def ring_progress(path: Path) -> tuple[int, int]:
    """(newest op record index + 1, meta-region bytes used) of a live ring: cheap, no full decode."""
    import numpy as np

    with open(path, "rb") as f:
        head = f.read(ringformat.HEADER.size)
        if len(head) < ringformat.HEADER.size:
            return (0, 0)
        fields = ringformat.HEADER.unpack(head)
        meta_size, slot_size, slots = fields[5], fields[6], fields[7]
        f.seek(ringformat.META_OFFSET)
        meta = f.read(meta_size)
        used, off = 0, 0
        while off + 8 <= len(meta):
            length = int.from_bytes(meta[off:off + 4], "little")
            if length == 0:
                break
            off += 8 + length
            used = off
        f.seek(ringformat.META_OFFSET + meta_size)
        ops = f.read(slots * slot_size)
    commits = np.frombuffer(ops, dtype="<u8", count=len(ops) // slot_size * (slot_size // 8))[:: slot_size // 8]
    return (int(commits.max()) if len(commits) else 0, used)


def proc_counters(pid: int) -> tuple[int, int, int] | None:
    """(storage read_bytes + write_bytes, major faults, RSS pages) or None when the process is gone.

    Not rchar/wchar: those count socket traffic, and a rank polling the rendezvous store inside
    init_process_group (or an NCCL proxy) moves them forever while making no progress at all.
    """
    from ranktrace.tracer.watch.proc_sampler import ProcSampler

    c = ProcSampler(None).sample([pid]).get(pid)
    return None if c is None else (c.io, c.majflt, c.rss_pages)


@dataclass
class _State:
    last_progress: float
    procs: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    stacks: dict[int, tuple[tuple, float]] = field(default_factory=dict)   # pid -> (signature, when)
    gpu_mem: dict[tuple[Any, Any], int] = field(default_factory=dict)
    saw_collective: bool = False
    last_sample: float = 0.0
    last_stack_sample: float = float("-inf")
    last_gpu_request: float = float("-inf")
    last_flush: float = 0.0
    reported: str | None = None     # the picture last reported (report again only when it changes)
    hang_reported_at: float | None = None
    last_tick: float | None = None  # when the previous tick ended (a longer gap: the watchdog itself was paused)
    cadence: Cadence = field(default_factory=Cadence)
    #: pid -> (main thread's host state, in a timed sleep, when sampled): the stack half of "parked"
    main_wait: dict[int, tuple[str, bool, float]] = field(default_factory=dict)
    rank_cpu: dict[int, list[float]] = field(default_factory=dict)   # ring pid -> its CPU share, last looks
    busy_child: BusyChild | None = None


class Monitor:
    """Called from the launcher's wait loop (``tick``); owns no thread, so it can never outlive the job."""

    def __init__(self, run_dir: Path, host_dir: Path, opts: MonitorOptions, *,
                 log: Callable[[str], None], show: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, note: Callable[[str], None] | None = None,
                 show_verdict: Callable[[Any], None] | None = None) -> None:
        from ranktrace.tracer.watch.proc_sampler import ProcSampler
        from ranktrace.tracer.watch.ring_tail import RingTail
        from ranktrace.tracer.watch.sample_log import GPU_SCHEMA, PROC_SCHEMA, STACKS_SCHEMA, ArrowStreamLog
        from ranktrace.tracer.watch.stack_sampler import StackSampler

        self.run_dir, self.host_dir, self.opts = run_dir, host_dir, opts
        self.log, self.show, self.clock = log, show, clock
        # printing (tracer.watch.presenter): what this machine lacks goes to `note` (one line under the verdict);
        # the verdict to `show_verdict` (the terminal's width and colour), else rendered plain to `show`
        self.note = note or log
        self.show_verdict = show_verdict
        self.state = _State(last_progress=clock())
        self.state.last_sample = clock() - opts.interval
        self.kill_requested = False
        self.hang_detected = False
        # captures that must happen while the job is still hung, before the verdict and before --on-hang kill
        # (trace run --nsys: stop the nsys session and export its report); each once per silence
        self.hang_captures: list[Callable[[str], object]] = []
        self.tails: dict[Path, RingTail] = {}
        self.off: set[str] = set()           # samplers switched off after a failure (said once each)
        self.pyspy = burst.find_pyspy()
        self._said_no_pyspy = False
        self._rounds: dict[str, int] = {}     # where each periodic sampler resumes its turn (_next_round)
        self._ras_off = opts.ras_addr is None
        self.proc_log = self.stack_log = self.gpu_log = None
        if opts.samples:
            try:
                d = host_dir / "samples"
                # Arrow IPC *streams* (flushed as they go): named .arrows, as Arrow names streams, so that a reader
                # does not take them for IPC files (pyarrow.ipc.open_stream / DuckDB's read_arrow, not open_file)
                self.proc_log = ArrowStreamLog(d / "proc.arrows", PROC_SCHEMA)
                self.stack_log = ArrowStreamLog(d / "stacks.arrows", STACKS_SCHEMA)
                self.gpu_log = ArrowStreamLog(d / "gpu.arrows", GPU_SCHEMA)
            except OSError as e:
                self._fail("samples", e)
        self.procs = ProcSampler(self.proc_log)
        self.activity = JobActivity(None, log_path=host_dir / "output.log")
        self.stack_sampler = StackSampler(self.stack_log)
        self.gpu: Any = None
        if opts.gpu:
            from ranktrace.tracer.watch.gpu_sampler import GpuSampler

            self.gpu = GpuSampler(log=self.note)
            try:
                self.gpu.start()
            except Exception as e:
                self._fail("gpu", e)

    def _fail(self, what: str, err: BaseException) -> None:
        """One line, that sampler off, the watchdog goes on."""
        if what not in self.off:
            self.off.add(what)
            self.log(f"{what} sampling off: {type(err).__name__}: {err}")

    # --- sampling -----------------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        out = []
        for ring in (self.host_dir / "rings").glob("*.ring"):
            head = ring.stem.split("-")[0]
            if head.isdigit() and os.path.exists(f"/proc/{head}"):
                out.append(int(head))
        return sorted(set(out))

    def ranks(self) -> dict[int, int | None]:
        """pid -> rank from the rings' identity records (None until the rank is known)."""
        return {t.pid: t.rank for t in self.tails.values() if t.pid}

    def _cheap_progress(self) -> list[tuple[str, str]]:
        """What moved since the last tick, as (class, words): ``ring`` (new op or phase records of a live rank),
        ``exit`` (a rank's exit mark), ``procs`` (the process set), ``io`` (storage I/O, faults, RSS), ``busy`` (the
        job's other processes, files, output: watch/activity.py)."""
        from ranktrace.tracer.watch.proc_sampler import ProcSampler
        from ranktrace.tracer.watch.ring_tail import RingTail

        moved: list[tuple[str, str]] = []
        st = self.state
        now = self.clock()
        # once every rank joined, the ranks' records speak: a process with no rank (vLLM's EngineCore polling its
        # workers' queue, a tokenizer) recording new calls says nothing about a rank stuck in its collective
        joined = self._all_joined()
        for ring in (self.host_dir / "rings").glob("*.ring"):
            tail = self.tails.get(ring)
            if tail is None:
                tail = self.tails[ring] = RingTail(ring)
            was_exited, seqs, phase = tail.exited, dict(tail.group_seq), tail.phase
            if tail.update():
                if tail.exited and not was_exited:
                    moved.append(("exit", f"{self._who(tail)} exited"))
                elif tail.rank is not None or not joined:
                    grew = [f"{g} seq {q}" for g, q in tail.group_seq.items() if seqs.get(g) != q]
                    moved.append(("ring", f"{self._who(tail)} " + (
                        "issued " + ", ".join(f"group {x}" for x in grew[:2]) if grew else
                        f"entered {tail.phase}" if tail.phase != phase else "recorded new calls")))
                    if tail.rank is not None:
                        st.cadence.moved(tail.rank, tail.phase or "", now)
            if tail.newest > 0:
                st.saw_collective = True
        pids = self.pids()
        try:
            counters = self.procs.sample(pids, self.ranks(), threads="proc" not in self.off and set(
                self._next_round("threads", pids)))
        except Exception as e:  # a /proc surprise or a full disk: keep the progress reads, drop the rows
            self._fail("proc", e)
            self.procs.log = None
            counters = ProcSampler(None).sample(pids)
        seen = {}
        for pid, c in counters.items():
            seen[pid] = (c.io, c.majflt, c.rss_pages)
            old = st.procs.get(pid)
            if old is None:
                continue
            if c.io != old[0] or c.majflt != old[1] or c.rss_pages > old[2] + 256:  # RSS +1 MiB
                moved.append(("io", f"storage I/O, page faults or memory growth of pid {pid}"))
        if set(seen) != set(st.procs):
            moved.append(("procs", "a process started or ended"))
        st.procs = seen
        try:
            act = self.activity.look(now, set(pids), quiet_s=now - st.last_progress,
                                     skip_dirs=(str(self.host_dir.resolve()),), output_is_news=not self._all_joined())
        except Exception as e:  # never a reason to stop watching
            self._fail("activity", e)
        else:
            st.busy_child = act.busy_child
            moved.extend(("busy", m) for m in act.moved)
            for pid, share in act.rank_share.items():
                st.rank_cpu[pid] = (st.rank_cpu.get(pid, []) + [share])[-3:]
            for pid in [p for p in st.rank_cpu if p not in act.rank_share]:
                del st.rank_cpu[pid]
        return moved

    @staticmethod
    def _who(tail: Any) -> str:
        return f"rank {tail.rank}" if tail.rank is not None else f"pid {tail.pid}"

    def _gpu_tick(self, now: float) -> list[tuple[str, str]]:
        """Collect GPU answers (never waits), ask for the next one when due. Moved: a process's GPU memory grew, or a
        GPU is at work while no rank is inside a collective (a kernel that spins in a hung collective reads 100% too,
        so utilisation counts only outside one)."""
        if self.gpu is None or "gpu" in self.off:
            return []
        moved: list[tuple[str, str]] = []
        try:
            rows = self.gpu.poll()
            ranks = self.ranks()
            in_op = any(t.open_ops for t in self.tails.values() if not t.exited)
            for r in rows:
                if r.get("pid") is not None:
                    r["rank"] = ranks.get(r["pid"])
                if r.get("kind") == "process" and r.get("mem_used") is not None:
                    key = (r.get("gpu"), r["pid"])
                    old = self.state.gpu_mem.get(key)
                    if old is not None and r["mem_used"] > old + (64 << 20):
                        moved.append(("gpu", f"GPU memory of pid {r['pid']} grew"))
                    self.state.gpu_mem[key] = r["mem_used"]
                elif r.get("kind") == "device" and not in_op and (r.get("util_gpu") or 0) >= 20 and self.tails:
                    moved.append(("gpu", f"GPU {r.get('gpu')} at {r.get('util_gpu')}%"))
                if self.gpu_log is not None:
                    self.gpu_log.add(r)
            if now - self.state.last_gpu_request >= self.opts.gpu_every and self.gpu.active:
                self.gpu.request()
                self.state.last_gpu_request = now
        except Exception as e:
            self._fail("gpu", e)
            self.gpu.close()
        return moved

    def _quiet_stack_interval(self) -> float:
        return max(self.opts.stack_interval, min(self.opts.stack_every, self.threshold().seconds / 8))

    def sample_stacks(self, trigger: str) -> dict[int, Any]:
        """One non-blocking py-spy round over every rank, recorded in stacks.arrow; {} without py-spy."""
        from ranktrace.tracer.watch.stack_sampler import agent_dumps, dump_all

        pids = self._next_round("stacks", self.pids())
        if self.pyspy is None and not self._said_no_pyspy:
            self._said_no_pyspy = True
            self.note("py-spy not found or turned off: stack samples come from the in-rank agents only")
        dumps = dump_all(self.pyspy, pids) if self.pyspy is not None else {}
        unread = [p for p in pids if dumps.get(p) is None or dumps[p].text is None]
        if unread:  # py-spy missing or refused (ptrace): the ranks' own agents answer instead
            dumps.update({p: d for p, d in agent_dumps(self.host_dir, unread).items()
                          if d.text is not None or p not in dumps})
        if "stacks" not in self.off:
            try:
                self.stack_sampler.record(dumps, self.ranks(), trigger)
            except Exception as e:
                self._fail("stacks", e)
        return dumps

    #: per-host budget of the periodic samplers (issue #19): past this many processes, each round reads this many
    #: of them in turn, so a host of 64 small ranks costs what one of 8 does (a burst still reads every one)
    ROUND = 8

    def _next_round(self, what: str, pids: list[int]) -> list[int]:
        """The pids this round of `what` reads: all of them, or ROUND of them in turn."""
        if len(pids) <= self.ROUND:
            return pids
        start = self._rounds.get(what, 0) % len(pids)
        self._rounds[what] = start + self.ROUND
        return (pids[start:] + pids[:start])[:self.ROUND]

    def waiting_in_op(self, pid: int) -> dict[int, str]:
        """Native thread id -> the collective / p2p call (torch.distributed or a profile's framework collective) that
        thread of `pid` has been inside for --hang-after or longer. Such a thread waits for its peers whatever its
        CPU does: vLLM's CPU all-reduce (torch.ops._C.shm_allreduce) and custom all-reduce on GPUs busy-wait inside
        the call."""
        before = time.monotonic() - self.threshold().seconds
        out: dict[int, str] = {}
        for t in self.tails.values():
            if t.pid == pid:
                out.update(t.open_ops_since(before))
        return out

    def _stack_progress(self, dumps: dict[int, Any]) -> bool:
        """Running non-poller threads, or changed stacks, are progress — except a thread that runs inside a call
        open for --hang-after with the same stack as before: a spin-wait (only a changed stack moves it)."""
        from ranktrace.analyzers.model import hoststate

        moved = False
        for pid, d in dumps.items():
            if d.error is not None:
                continue
            spinning_in = self.waiting_in_op(pid)
            sig = []
            main: tuple[str, bool] | None = None
            for t in d.threads:
                name = t.get("thread_name") or ""
                frames = tuple(f"{f.get('name')} ({f.get('filename')}:{f.get('line')})" for f in t.get("frames", []))
                if hoststate.is_poller(name, frames):
                    continue
                state = hoststate.classify(frames, "active" if t.get("active") else "idle")
                if main is None or name == "MainThread":  # the main thread's wait is the rank's (else the first)
                    main = (state, _timed_sleep(pid, frames))
                # signature = (thread, state, the application's own frame): a poll loop inside a library (the
                # store barrier in init, an event loop) jitters in line numbers but keeps all three
                sig.append((name, state, hoststate.application_frame(frames)))
                # a thread inside a long-open collective with the same stack spins in a wait: not progress
                # (a dump without native thread ids: any such call of the process counts for all its threads)
                tid = t.get("os_thread_id")
                spins = bool(spinning_in) and (tid is None or tid in spinning_in)
                if t.get("active") and state == "running" and not spins:
                    moved = True
            key = tuple(sig)
            if main is not None:
                self.state.main_wait[pid] = (main[0], main[1], self.clock())
            prev = self.state.stacks.get(pid)
            # a change counts only against a sample taken within this quiet spell: a change since a sample from
            # before the last progress is that same, already counted, progress (periodic samples predate it)
            if prev is not None and prev[0] != key and prev[1] >= self.state.last_progress:
                moved = True
            self.state.stacks[pid] = (key, self.clock())
        return moved

    def flush(self) -> None:
        for lg in (self.proc_log, self.stack_log, self.gpu_log):
            if lg is not None:
                try:
                    lg.flush()
                except Exception as e:
                    self._fail("samples", e)
                    self.proc_log = self.stack_log = self.gpu_log = self.procs.log = self.stack_sampler.log = None
                    return

    def close(self) -> None:
        """At the end of the run: last batches out, files closed, the GPU child ended."""
        if self.gpu is not None:
            try:
                rows = self.gpu.poll()
                if self.gpu_log is not None:
                    for r in rows:
                        self.gpu_log.add(r)
            except Exception:
                pass
            self.gpu.close()
        for lg in (self.proc_log, self.stack_log, self.gpu_log):
            if lg is not None:
                try:
                    lg.close()
                except Exception as e:
                    self._fail("samples", e)

    def gpu_hello(self, wait_s: float = 5.0) -> dict[str, Any] | None:
        """The GPU child's hello (driver, GPUs) for meta.json; None when NVML is absent or did not answer."""
        if self.gpu is None:
            return None
        h = self.gpu.hello if self.gpu.hello is not None else self.gpu.wait_hello(wait_s)
        return h if h and h.get("ok") else None

    # --- the live status line -----------------------------------------------------------------------------
    def status_text(self, width: int = 100) -> str:
        from ranktrace.tracer.watch import statusline

        ranked = [t for t in self.tails.values() if t.rank is not None]
        alive = sum(1 for t in ranked if not t.exited and os.path.exists(f"/proc/{t.pid}"))
        world = max((t.world for t in ranked if t.world), default=None)
        groups: dict[str, dict[int, int]] = {}
        phases: Counter[str] = Counter()
        for t in ranked:
            for g, seq in t.group_seq.items():
                groups.setdefault(g, {})[t.rank] = seq  # type: ignore[index]
            if t.exited or not os.path.exists(f"/proc/{t.pid}"):
                phases["exited"] += 1
            else:
                phases[t.phase or ("init" if t.in_init else ("running" if t.newest else "setup"))] += 1
        phase = phases.most_common(1)[0][0] if phases else "starting"
        if len(phases) > 1:
            phase += " (" + ", ".join(f"{n} {p}" for p, n in phases.most_common()[1:3]) + ")"
        if self.state.busy_child is not None and self.state.hang_reported_at is None:
            phase += ", " + child_text(self.state.busy_child)   # "JIT build in a child (ptxas, 40 s)", not silence
        if self.state.hang_reported_at is not None:
            phase += ", hang reported"
            if self.decided is not None:  # what decided it, and after how long
                phase += f" ({self.decided[0].path} path, after {self.decided[1]:.0f} s)"
        return statusline.format_status(alive, len(ranked), world, groups, self.silent_for(), phase, width)

    # --- the loop ----------------------------------------------------------------------------------------
    #: why hang detection is paused (the job took the terminal: a debugger prompt waits for a person), or None
    interactive: str | None = None
    #: the status of the last verdict the watchdog computed (None: none yet, or the analysis failed)
    last_status: str | None = None

    def silent_for(self) -> float:
        return self.clock() - self.state.last_progress

    @property
    def job_pgid(self) -> int | None:
        """The job's process group (set by the launcher): the job's other processes (a JIT build's compiler) at work
        are its progress; their tree is followed from the job and from every rank, whatever their session."""
        return self.activity.job_pid

    @job_pgid.setter
    def job_pgid(self, pgid: int | None) -> None:
        self.activity.job_pid = pgid

    #: the main thread's host states (hoststate.classify) that are a wait nobody inside the job ends by itself
    _PARKED_STATES = {"in_init": "a set-up step", "in_collective": "a collective", "blocked_other": "a lock or queue "
                      "wait", "stopped": "stopped"}

    def rank_views(self) -> tuple[list[RankView], int | None]:
        """Each known rank now (parked in what, asleep, CPU, joined) and the world size the rings say.

        A rank that has not joined yet writes a ring with no group (its rank from RANK, or none yet under
        mp.spawn): where no process that joined claims that rank, it stands for it; processes of the job that say no
        rank stand for the ranks no ring names when they are exactly as many (siblings of the ranks that joined, not
        yet in init_process_group). This only decides how long to wait: blame is the analysis's."""
        joined: dict[int, RankView] = {}
        waiting: dict[int, RankView] = {}
        unranked: list[tuple[int | None, RankView]] = []   # (parent pid, view)
        parents: set[int | None] = set()
        world = None
        for t in self.tails.values():
            world = max(world or 0, t.world or 0) or None
            v = self._view_of(t)
            if t.rank is None:
                if v.parked != "exited":
                    unranked.append((_parent(t.pid), v))
            elif t.group_desc or t.in_init or t.newest or t.open_steps:
                old = joined.get(t.rank)
                if old is None or (old.parked == "exited" and v.parked != "exited"):
                    joined[t.rank] = v
                    parents.add(_parent(t.pid))
            elif v.parked != "exited":
                waiting.setdefault(t.rank, v)
        by_rank = {**{r: v for r, v in waiting.items() if r not in joined}, **joined}
        siblings = [v for ppid, v in unranked if ppid is not None and ppid in parents]
        if world and siblings:
            missing = [r for r in range(world) if r not in by_rank]
            if len(missing) == len(siblings):
                for r, v in zip(missing, siblings):
                    by_rank[r] = RankView(r, v.parked, v.asleep, v.cpu_share, False, v.phase)
        return sorted(by_rank.values(), key=lambda v: v.rank), world

    def _view_of(self, t: Any) -> RankView:
        st = self.state
        alive = not t.exited and os.path.exists(f"/proc/{t.pid}")
        parked: str | None = None
        asleep = False
        if not alive:
            parked = "exited"
        elif t.open_ops:
            parked = sorted({v[0] for v in t.open_ops.values()})[0]
        elif t.in_init or t.open_steps:
            parked = "init_process_group" if t.in_init else sorted(set(t.open_steps.values()))[0]
        else:
            w = st.main_wait.get(t.pid)
            if w is not None and w[2] >= st.last_progress:  # sampled in this quiet spell
                asleep = w[1]
                parked = None if asleep else self._PARKED_STATES.get(w[0])
        cpu = max(st.rank_cpu.get(t.pid, [0.0])) if alive else 0.0
        return RankView(t.rank if t.rank is not None else -1, parked, asleep, cpu,
                        bool(t.group_desc) and not t.in_init, t.phase or "")

    def _all_joined(self) -> bool:
        """Every rank of the world past its rendezvous. From then on the ranks' own records are the job's progress and
        a line it prints is not: a server's periodic stats line ("Engine 000: Avg prompt throughput: 0.0 tokens/s,
        Running: 1 reqs", vLLM, every 10 s) kept a rank stopped mid-request from being reported for a minute."""
        views, world = self.rank_views()
        return bool(world) and {v.rank for v in views if v.joined or v.parked == "exited"} >= set(range(world or 0))

    def threshold(self) -> Threshold:
        """How long this silence may last before it is a hang, and why (watch/threshold.py): fixed when
        --hang-after / --startup-hang-after were given, else adaptive."""
        views, world = self.rank_views()
        return decide(views, world, self.state.cadence, hang_after=self.opts.hang_after,
                      startup_hang_after=self.opts.startup_hang_after)

    #: a gap between two ticks longer than this: the watchdog itself did not run (suspend, SIGSTOP, a starved
    #: machine); that stretch is taken out of the silence, since nothing was watched during it
    PAUSE_S = 5.0

    def tick(self) -> None:
        now = self.clock()
        st = self.state
        if now - st.last_sample < self.opts.interval:
            return
        if st.last_tick is not None and now - st.last_tick > self.PAUSE_S:
            gap = now - st.last_tick - self.opts.interval
            st.last_progress += gap       # a pause the watchdog shows is no silence of the job's
            if gap >= 30:
                self.log(f"the watchdog did not run for {gap:.0f} s (the machine paused or starved it): "
                         "not counted as silence")
        st.last_sample = now
        try:
            self._tick(now)
        finally:
            st.last_tick = self.clock()

    def _tick(self, now: float) -> None:
        st = self.state
        moved = self._cheap_progress() + self._gpu_tick(now)
        quiet = now - st.last_progress
        thr = self.threshold()
        quiet_due = (not moved and quiet >= min(5.0, thr.seconds / 3)
                     and now - st.last_stack_sample >= self._quiet_stack_interval())
        dumps: dict[int, Any] | None = None
        if quiet_due or now - st.last_stack_sample >= self.opts.stack_every:
            st.last_stack_sample = now
            dumps = self.sample_stacks("quiet" if quiet_due else "periodic")
            if self._stack_progress(dumps):
                moved.append(("stack", "a rank's stack moved"))
            thr = self.threshold()  # the stacks may say every rank is parked now
        if now - st.last_flush >= self.opts.flush_every:
            st.last_flush = now
            self.flush()
        if st.hang_reported_at is not None:
            self._after_report(now, moved)
            return
        if moved:
            st.last_progress = now
            return
        if quiet >= thr.seconds and self.interactive is None:
            st.hang_reported_at = now
            self.decided = (thr, quiet)
            self.on_silence(quiet, dumps=dumps)

    def _after_report(self, now: float, moved: list[tuple[str, str]]) -> None:
        """After a hang was reported: only a live rank's new records say the job moved on (a process ending, a kill's
        teardown, an error record, I/O or a core dump being written are not progress); never once --on-hang kill
        was asked for — the job is being ended."""
        st = self.state
        if self.kill_requested:
            return
        ring = [w for c, w in moved if c == "ring"]
        if ring:
            assert st.hang_reported_at is not None
            self.log(f"progress again after {now - st.hang_reported_at:.0f} s: " + "; ".join(ring[:3]))
            st.last_progress = now
            st.hang_reported_at = None

    #: (the threshold that decided, the silence it waited) of the last hang the watchdog reported
    decided: tuple[Threshold, float] | None = None

    def on_silence(self, quiet: float, reason: str = "silence", dumps: dict[int, Any] | None = None) -> None:
        """Burst (reusing this tick's stack dumps), NCCL RAS, early line, full verdict; then act per on_hang."""
        pids = self.pids()
        ras_addr = None if self._ras_off else self.opts.ras_addr
        res = burst.capture_burst(self.host_dir, pids, native=self.opts.native_stacks,
                                  reason=f"{reason} after {quiet:.0f} s",
                                  dumps=None if self.opts.native_stacks else dumps, ras_addr=ras_addr)
        if res.dumps and "stacks" not in self.off:
            try:
                self.stack_sampler.record(res.dumps, self.ranks(), "burst")
                self._stack_progress(res.dumps)   # keep the signatures current for the next comparison
            except Exception as e:
                self._fail("stacks", e)
        for p in res.problems:
            self.log(p)
        if self._ras_said(res.ras) and reason == "silence":
            now = self.clock()
            self.state.last_progress = now
            self.state.hang_reported_at = None
            return
        for capture in self.hang_captures:
            try:
                capture(f"{reason} after {quiet:.0f} s")
            except Exception as e:  # an extra capture must never stop the verdict or --on-hang
                self.log(f"capture failed: {type(e).__name__}: {e}")
        self.flush()  # the samples of the last seconds (the host-wait probe's lock / wait rows) reach this analysis
        picture = self.analyze(quiet)
        if self.last_status == "idle":
            # a server waiting for requests (the verdict says IDLE: nothing pending, ranks in their serving loop) is
            # quiet by design: said once, never killed; progress (a request) re-arms the watchdog
            self.log("idle: the job serves and waits for requests; not a hang (--on-hang is not acted on)")
            return
        if self.opts.on_hang == "kill":
            self.hang_detected = True
            self.kill_requested = True
        elif self.opts.on_hang == "report" and picture is not None:
            self.hang_detected = True

    def _ras_said(self, res: Any) -> bool:
        """Log what RAS said (once if absent). True when its op counts moved: NCCL still issues work."""
        if res is None:
            return False
        if res.absent:
            self._ras_off = True
            self.note(res.absent)
            return False
        s = res.summary or {}
        missing = sorted({(m.get("group"), m.get("rank")) for m in s.get("missing", [])}, key=str)
        dead = s.get("dead", [])
        if missing or dead:
            what = []
            if missing:
                what.append("missing " + ", ".join(f"rank {r} of {g}" for g, r in missing[:6]))
            if dead:
                what.append("dead " + ", ".join(f"pid {d.get('pid')}" if d.get("rank") is None else
                                                 f"rank {d.get('rank')} of {d.get('group')}" for d in dead[:6]))
            self.log("NCCL RAS: " + "; ".join(what))
        if s.get("moved"):
            changes = [c for comm in s.get("comms", {}).values() for c in comm.get("changes", [])]
            self.log("NCCL RAS: launched-op counts moved between two answers (" + ", ".join(changes[:4]) +
                     "): NCCL is still issuing work, not reporting a hang")
            return True
        return False

    _hang_recorded = False

    def _record_hang(self, v: Any) -> None:
        """meta.json says a hang was reported live, and what it was: if trace run is then SIGKILLed (its guardian
        ends the job), the analysis of the cut trace still knows the hang came first, not only the cut."""
        from ranktrace.tracer.launch import meta

        try:
            meta.update_meta(self.host_dir, hang_reported={
                "wall_ns": time.time_ns(), "status": v.status, "kind": v.kind,
                "culprit_ranks": list(v.culprit_ranks), "operation": (v.operation.name if v.operation else None)})
            self._hang_recorded = True
        except (OSError, ValueError) as e:
            self.log(f"could not record the live hang in meta.json: {e}")

    def analyze(self, quiet: float) -> str | None:
        """Full analysis now, verdict.json and report.html rewritten; one line of who is inside what, and the
        verdict printed if the picture changed since the last report. Returns the picture (None: analysis failed)."""
        # imported here, not at the top: `trace run` starts without loading the analysis (pyarrow and all)
        from ranktrace.analyzers import api
        from ranktrace.analyzers.report import text_report
        from ranktrace.tracer.watch import live

        try:
            refreshed = api.refresh_run(self.run_dir, live.liveness([self.run_dir]))
        except Exception as e:
            self.last_status = None
            self.log(f"{quiet:.0f} s silent")
            self.log(f"analysis failed: {type(e).__name__}: {e}")
            return None
        line = inside_line(refreshed.analysis)
        if self.decided is not None and self.decided[1] == quiet:
            thr = self.decided[0]
            self.log(f"hang suspected after {quiet:.0f} s with no progress ({thr.path} threshold {thr.seconds:.0f} s: "
                     f"{thr.why})")
        self.log(f"{quiet:.0f} s silent: {line}" if line else f"{quiet:.0f} s silent")
        if refreshed.problem:  # disk full, run dir removed: said; the verdict is still printed and acted on
            self.log(refreshed.problem)
        v = refreshed.analysis.verdict
        self.last_status = v.status
        if v.status in ("hang", "crashed") and not self._hang_recorded:
            self._record_hang(v)
        picture = f"{v.kind}|{v.culprit_ranks}|{v.operation}"
        if picture != self.state.reported:
            self.state.reported = picture
            try:
                if self.show_verdict is not None:
                    self.show_verdict(v)
                else:
                    self.show(text_report.render(v))
            except Exception as e:  # the verdict is on disk; a report bug must not stop --on-hang
                self.log(f"report failed: {type(e).__name__}: {e}")
        return picture


#: a function that sleeps in order to wait for something (a lock's poll: FileBaton.wait, filelock's acquire)
_WAITS_BY_SLEEPING = re.compile(r"^(?:\w+\.)*(?:wait\w*|acquire\w*|\w*lock\w*|barrier|join|get|poll\w*|recv\w*)$")


def _timed_sleep(pid: int, frames: tuple[str, ...]) -> bool:
    """The process's main thread sleeps for a time (nanosleep: time.sleep) in code of its own, not in a poll loop of a
    wait (FileBaton.wait sleeps between its looks at the lock): a sleep ends by itself."""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as f:
            wchan = f.read().decode("ascii", "replace")
    except OSError:
        return False
    if "nanosleep" not in wchan:
        return False
    for fr in frames[:2]:
        name = fr.split(" (", 1)[0]
        if name != "sleep" and _WAITS_BY_SLEEPING.match(name):
            return False
    return True


def _parent(pid: int) -> int | None:
    """The parent pid of a live process (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def inside_line(analysis: Analysis) -> str:
    """'ranks 0-2 in all_reduce group 0 seq 5; rank 3 outside any traced op': each observed rank's innermost open
    call, as the analysis found it."""
    inside: dict[str, set[int]] = {}
    for rank, s in analysis.inside().items():
        inside.setdefault(f"{s.name}" + (f" group {s.group} seq {s.seq}" if s.seq else ""), set()).add(rank)
    v = analysis.verdict
    outside = set(v.ranks) - set(analysis.inside()) - set(v.unobserved_ranks)

    def who(rs: set[int]) -> str:
        return ("rank " if len(rs) == 1 else "ranks ") + compact_ranks(rs)

    parts = [f"{who(rs)} in {what}" for what, rs in sorted(inside.items())]
    if outside:
        parts.append(f"{who(outside)} outside any traced op")
    phases = {(s.phase, s.phase_detail) for s in v.ranks.values() if s.phase and s.state != "exited"}
    if len(phases) == 1 and parts:  # every rank in the same start-up phase: say which
        from ranktrace.analyzers.verdict import phase_text

        name, detail = phases.pop()
        parts[-1] += f" (during {phase_text(name, detail)})"
    return "; ".join(parts)
