"""The watchdog inside `trace run`: notices silence, captures evidence, prints a verdict while the job is hung.

Progress, not utilisation (DESIGN §2). Each second it reads cheap signals — new recorder records in any rank's
ring, ``rchar``/``wchar``, major faults and RSS growth in /proc, the process set itself — and once those have been
quiet for a while it also samples stacks (non-blocking py-spy): a non-poller thread that is on the CPU outside a
known wait, or a stack that changed since the last sample, is progress too (a rank computing for minutes writes
no records). Our own sampling never counts: py-spy reads memory from outside, it does not touch the job's I/O
counters.

Silence = no progress for ``hang_after`` seconds (``startup_hang_after`` until the first collective was recorded:
loading weights can take minutes). On silence: a burst into ``dumps/<timestamp>/``, an early one-line picture from
the rings, then the full analysis, written to ``<run>/verdict.json``. ``on_hang`` decides what follows: ``report``
(keep watching, report again only when the picture changes), ``kill`` (terminate the job; `trace run` exits 3),
``wait`` (record only).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tracer import burst, ringformat

__all__ = ["MonitorOptions", "Monitor", "ring_progress", "proc_counters"]


@dataclass(frozen=True)
class MonitorOptions:
    hang_after: float = 60.0
    startup_hang_after: float = 600.0
    on_hang: str = "report"          # report | kill | wait
    interval: float = 1.0
    stack_interval: float = 3.0
    native_stacks: bool = False


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
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        majflt, rss = int(fields[9]), int(fields[21])
        io = 0
        try:
            with open(f"/proc/{pid}/io") as f:
                for line in f:
                    if line.startswith(("read_bytes", "write_bytes")):
                        io += int(line.split()[1])
        except OSError:
            pass
        if fields[0] == b"Z":
            return None
        return (io, majflt, rss)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _State:
    last_progress: float
    rings: dict[Path, tuple[int, int]] = field(default_factory=dict)
    procs: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    stacks: dict[int, tuple] = field(default_factory=dict)
    saw_collective: bool = False
    last_sample: float = 0.0
    last_stack_sample: float = 0.0
    reported: str | None = None     # the picture last reported (report again only when it changes)
    hang_reported_at: float | None = None


class Monitor:
    """Called from the launcher's wait loop (``tick``); owns no thread, so it can never outlive the job."""

    def __init__(self, run_dir: Path, host_dir: Path, opts: MonitorOptions, *,
                 log: Callable[[str], None], show: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.host_dir, self.opts = run_dir, host_dir, opts
        self.log, self.show, self.clock = log, show, clock
        self.state = _State(last_progress=clock())
        self.kill_requested = False
        self.hang_detected = False

    # --- sampling -----------------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        out = []
        for ring in (self.host_dir / "rings").glob("*.ring"):
            head = ring.stem.split("-")[0]
            if head.isdigit() and os.path.exists(f"/proc/{head}"):
                out.append(int(head))
        return sorted(set(out))

    def _cheap_progress(self) -> bool:
        moved = False
        st = self.state
        for ring in (self.host_dir / "rings").glob("*.ring"):
            try:
                prog = ring_progress(ring)
            except (OSError, ValueError):
                continue
            if st.rings.get(ring) != prog:
                moved = True
                if prog[0] > 0:
                    st.saw_collective = True
            st.rings[ring] = prog
        seen = {}
        for pid in self.pids():
            c = proc_counters(pid)
            if c is None:
                continue
            seen[pid] = c
            old = st.procs.get(pid)
            if old is None or c[0] != old[0] or c[1] != old[1] or c[2] > old[2] + 256:  # io, faults, RSS +1 MiB
                moved = True
        if set(seen) != set(st.procs):
            moved = True  # a process started or ended
        st.procs = seen
        return moved

    def _stack_progress(self) -> bool:
        """Sample stacks (non-blocking): running non-poller threads, or changed stacks, are progress."""
        from analyzers import hoststate

        pyspy = burst.find_pyspy()
        if pyspy is None:
            return False
        import subprocess

        moved = False
        for pid in self.pids():
            try:
                res = subprocess.run([pyspy, "dump", "--nonblocking", "--json", "--pid", str(pid)],
                                     capture_output=True, text=True, timeout=5)
                threads = json.loads(res.stdout) if res.returncode == 0 else []
            except (subprocess.TimeoutExpired, ValueError, OSError):
                continue
            sig = []
            for t in threads:
                name = t.get("thread_name") or ""
                frames = tuple(f"{f.get('name')} ({f.get('filename')}:{f.get('line')})" for f in t.get("frames", []))
                if hoststate.is_poller(name, frames):
                    continue
                state = hoststate.classify(frames, "active" if t.get("active") else "idle")
                # signature = (thread, state, the application's own frame): a poll loop inside a library (the
                # store barrier in init, an event loop) jitters in line numbers but keeps all three
                sig.append((name, state, hoststate.application_frame(frames)))
                if t.get("active") and state == "running":
                    moved = True
            key = tuple(sig)
            if self.state.stacks.get(pid) not in (None, key):
                moved = True
            self.state.stacks[pid] = key
        return moved

    # --- the loop ----------------------------------------------------------------------------------------
    def silent_for(self) -> float:
        return self.clock() - self.state.last_progress

    def threshold(self) -> float:
        return self.opts.hang_after if self.state.saw_collective else self.opts.startup_hang_after

    def tick(self) -> None:
        now = self.clock()
        st = self.state
        if now - st.last_sample < self.opts.interval:
            return
        st.last_sample = now
        progressed = self._cheap_progress()
        quiet = now - st.last_progress
        if not progressed and quiet >= min(5.0, self.threshold() / 3) and \
                now - st.last_stack_sample >= self.opts.stack_interval:
            st.last_stack_sample = now
            progressed = self._stack_progress()
        if progressed:
            if st.hang_reported_at is not None:
                self.log(f"progress again after {now - st.hang_reported_at:.0f} s: the job moved on")
            st.last_progress = now
            st.hang_reported_at = None
            return
        if quiet >= self.threshold() and st.hang_reported_at is None:
            st.hang_reported_at = now
            self.on_silence(quiet)

    def on_silence(self, quiet: float, reason: str = "silence") -> None:
        """Burst, early line, full verdict; then act per on_hang."""
        pids = self.pids()
        res = burst.capture_burst(self.host_dir, pids, native=self.opts.native_stacks,
                                  reason=f"{reason} after {quiet:.0f} s")
        for p in res.problems:
            self.log(p)
        early = self.early_line()
        self.log(f"{quiet:.0f} s silent: {early}" if early else f"{quiet:.0f} s silent")
        picture = self.analyze()
        if self.opts.on_hang == "kill":
            self.hang_detected = True
            self.kill_requested = True
        elif self.opts.on_hang == "report" and picture is not None:
            self.hang_detected = True

    def early_line(self) -> str:
        """'ranks 0-2 in all_reduce group 0 seq 5; rank 3 in nothing' from the live rings, before the analysis."""
        from analyzers import timeline
        from analyzers.readers import ranktrace_ring
        from analyzers.verdict import compact_ranks

        inside: dict[str, set[int]] = {}
        idle: set[int] = set()
        for ring in sorted((self.host_dir / "rings").glob("*.ring")):
            try:
                r = ranktrace_ring.read(ring)
            except Exception:
                continue
            ev = r.events
            ranks = [x for x in ev["rank"].to_pylist() if x is not None] if ev.num_rows else []
            if not ranks:
                continue
            spans = timeline.open_spans(ev)
            if spans:
                s = spans[-1]
                inside.setdefault(f"{s.name}" + (f" group {s.group} seq {s.seq}" if s.seq else ""), set()).add(
                    ranks[0])
            else:
                idle.add(ranks[0])
        def who(rs: set[int]) -> str:
            return ("rank " if len(rs) == 1 else "ranks ") + compact_ranks(rs)

        parts = [f"{who(rs)} in {what}" for what, rs in sorted(inside.items())]
        if idle:
            parts.append(f"{who(idle)} outside any traced op")
        return "; ".join(parts)

    def analyze(self) -> str | None:
        """Full analysis now; print it if the picture changed since the last report; write verdict.json."""
        try:
            from analyzers import facade
            from analyzers.report import json_report, text_report

            v = facade.analyze_paths([self.run_dir])
        except Exception as e:
            self.log(f"analysis failed: {type(e).__name__}: {e}")
            return None
        picture = f"{v.kind}|{v.culprit_ranks}|{v.operation}"
        (self.run_dir / "verdict.json").write_text(json_report.render(v))
        if picture != self.state.reported:
            self.state.reported = picture
            self.show(text_report.render(v))
        return picture
