"""`trace bisect`: the loop that ties the parts together — check everything before the first run, hold the GPUs, run
what the search asks for (K times each, one job at a time, each fully reaped) within the budget, and at the end (also
after Ctrl-C) write what is known: bisect.json, bisect.txt, `trace compare` of the best hung vs the best good run,
and report.html."""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ranktrace.tracer.launch import launcher
from ranktrace.tracer.launch.bisect import knobs as knobs_mod
from ranktrace.tracer.launch.bisect import report, runner
from ranktrace.tracer.launch.bisect.search import FAILED, Config, Search, Tally

__all__ = ["BisectOptions", "BisectError", "BisectResult", "run_bisect", "parse_duration", "EXIT"]

# trace bisect's exit codes: a fix found; failure reproduced but no fix found (budget, or none in the catalogue);
# the command as given never failed; usage or setup error; Ctrl-C.
EXIT = {"fixed": 0, "no_fix": 3, "incomplete": 3, "not_reproduced": 4, "error": 2, "interrupted": 130}


class BisectError(Exception):
    """Found before anything runs (usage, knobs file, output folder, GPUs busy): exit 2."""


@dataclass(frozen=True)
class BisectOptions:
    command: tuple[str, ...]
    out: Path | None = None
    base_dir: Path = Path("traces")
    repeat: int = 2
    budget_runs: int | None = 20
    budget_seconds: float | None = None
    knobs_file: Path | None = None
    framework: str | None = None          # NAME or NAME==VERSION; detected from the command otherwise
    hang_after: float = 60.0
    startup_hang_after: float = 600.0
    ready: str | None = None              # regex; the framework's ready line otherwise
    run_timeout: float = 3600.0
    hooks: tuple[str, ...] = ()


@dataclass
class BisectResult:
    root: Path
    doc: dict[str, Any]
    text: str
    exit_code: int
    problems: list[str] = field(default_factory=list)


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '1h30m' -> seconds."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise ValueError(f"{text!r}: expected seconds or a duration like 90s, 15m, 2h, 1h30m")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def _safe(name: str, limit: int = 60) -> str:
    s = re.sub(r"-{3,}", "--", re.sub(r"[^A-Za-z0-9_.=-]+", "-", name)).strip("-.") or "run"
    return s[:limit].rstrip("-.")


def _root(opts: BisectOptions) -> Path:
    if opts.out is not None:
        if opts.out.exists() and (not opts.out.is_dir() or any(opts.out.iterdir())):
            raise BisectError(f"output directory {opts.out} exists and is not empty; ranktrace never overwrites a trace")
        return opts.out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    script = next((Path(a).stem for a in opts.command if a.endswith(".py")), Path(opts.command[0]).name)
    base = opts.base_dir / f"{stamp}-bisect-{_safe(script, 40)}"
    root, n = base, 1
    while root.exists():
        n += 1
        root = base.with_name(f"{base.name}-{n}")
    return root


class _Session:
    def __init__(self, opts: BisectOptions, env: Mapping[str, str], say: Callable[[str], None]) -> None:
        self.opts, self.env, self.say = opts, dict(env), say
        self.t0 = time.monotonic()
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.attempts: list[report.Attempt] = []
        self.runs_used = 0
        self.stopped: str | None = None
        self.problems: list[str] = []
        self.hints: list[knobs_mod.Hint] = []
        self.stop = runner.Stopper()
        self.unrun: Config | None = None   # what the search asked for when it was stopped
        self._check()

    # -- before anything runs -------------------------------------------------------------------------------------

    def _check(self) -> None:
        o = self.opts
        if o.repeat < 1:
            raise BisectError("--repeat must be at least 1")
        if o.budget_runs is not None and o.budget_runs < o.repeat:
            raise BisectError(f"--budget {o.budget_runs} cannot pay for one configuration of --repeat {o.repeat}")
        try:
            launcher.check_command(o.command)
        except launcher.LaunchError as e:
            raise BisectError(str(e)) from None
        try:
            catalogue = knobs_mod.load_catalogue()
            kf = knobs_mod.load_knobs_file(o.knobs_file) if o.knobs_file is not None else None
            self.knobs, self.first = knobs_mod.merge(catalogue, kf)
            fw = knobs_mod.parse_framework(o.framework) if o.framework else knobs_mod.detect_framework(o.command)
        except knobs_mod.KnobError as e:
            raise BisectError(str(e)) from None
        if fw.version is None and fw.name in ("sglang", "vllm"):
            version = runner.probe_version(o.command, self.env, fw.name)
            if version:
                fw = knobs_mod.Framework(fw.name, version, f"{fw.why}; {fw.name} {version} installed")
        self.fw = fw
        self.ready = o.ready or runner.READY.get(fw.name)
        if self.ready:
            try:
                re.compile(self.ready)
            except re.error as e:
                raise BisectError(f"--ready {self.ready!r}: {e}") from None
        self.singles, self.skipped = knobs_mod.candidates(self.knobs, o.command, self.env, fw)
        self.root = _root(o)

    def make_root(self) -> None:
        try:
            (self.root / "runs").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BisectError(f"output directory {self.root}: {e.strerror or e}") from None

    # -- the search's three questions -------------------------------------------------------------------------------

    def order_after_baseline(self, base: Tally) -> list[knobs_mod.Candidate]:
        failed = [v for o, v in zip(base.outcomes, base.verdicts) if v and o in FAILED]
        self.hints = knobs_mod.hints(failed)
        return knobs_mod.order(self.singles, self.hints, self.first)

    def narrower_of(self, c: knobs_mod.Candidate) -> list[knobs_mod.Candidate]:
        return knobs_mod.narrower(self.knobs, c, self.opts.command, self.env, self.fw)

    def alternative_of(self, c: knobs_mod.Candidate) -> knobs_mod.Candidate | None:
        return knobs_mod.alternative(c, self.opts.command, self.env, self.fw)

    # -- running ----------------------------------------------------------------------------------------------------

    def _interrupted(self) -> str:
        sig = self.stop.signal
        return "interrupted (Ctrl-C)" if sig in (None, signal.SIGINT) else f"interrupted ({signal.Signals(sig).name})"

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _affordable(self) -> str | None:
        """Why the next configuration (K runs) cannot be run, or None."""
        o = self.opts
        if self.stop.requests:
            return self._interrupted()
        if o.budget_runs is not None and self.runs_used + o.repeat > o.budget_runs:
            return f"budget: {self.runs_used} of {o.budget_runs} runs used, the next configuration needs {o.repeat}"
        if o.budget_seconds is not None:
            left = o.budget_seconds - self._elapsed()
            walls = [r.wall_seconds for a in self.attempts for _, r in a.runs if r.outcome != "interrupted"]
            need = statistics.median(walls) * o.repeat if walls else 0.0
            if left <= 0 or left < need:
                return (f"time: {self._elapsed():.0f} s of --time {o.budget_seconds:.0f} s used"
                        + (f", the next configuration needs about {need:.0f} s" if left > 0 else ""))
        return None

    def run_config(self, config: Config) -> Tally | None:
        """K runs of `config`; None when the search must stop (Ctrl-C, time) before they were all made."""
        o = self.opts
        applied = knobs_mod.apply(o.command, self.env, config.candidates)
        tally = Tally(config, o.repeat)
        attempt = report.Attempt(config, tally, applied.changes, applied.env)
        self.attempts.append(attempt)
        env = dict(self.env)
        env.update(applied.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # the ready line arrives when printed, not at a buffer's flush
        edits = any(c.knob.variants[c.variant].edits() for c in config.candidates)
        for rep in range(1, o.repeat + 1):
            if self.stop.requests:
                self.stopped = self._interrupted()
                return None
            self.runs_used += 1
            index = self.runs_used
            name = f"{index:02d}-{_safe(config.name)}-r{rep}"
            deadline, outcome_at_deadline = time.monotonic() + o.run_timeout, "timeout"
            if o.budget_seconds is not None and self.t0 + o.budget_seconds < deadline:
                deadline, outcome_at_deadline = self.t0 + o.budget_seconds, "cut"
            spec = runner.RunSpec(argv=applied.argv, env=env, run_dir=self.root / "runs" / name,
                                  log=self.root / "runs" / f"{name}.log", hang_after=o.hang_after,
                                  startup_hang_after=o.startup_hang_after, hooks=o.hooks, ready=self.ready,
                                  deadline=deadline, deadline_outcome=outcome_at_deadline, edits_flags=edits)
            budget = f"/{o.budget_runs}" if o.budget_runs is not None else ""
            self.say(f"bisect run {index}{budget}: {config.name} ({rep}/{o.repeat}) ...")
            rec = runner.run_once(spec, self.stop, self.say)
            attempt.runs.append((index, rec))
            tally.outcomes.append(rec.outcome)
            tally.verdicts.append(rec.full_verdict)
            detail = f" · {report.verdict_line(rec.verdict)}" if rec.outcome in ("hang", "crash") else ""
            self.say(f"bisect run {index}: {rec.outcome} after {rec.seconds:.1f} s ({rec.how}){detail}")
            for p in rec.problems:
                self.say(f"bisect run {index}: {p}")
            if rec.outcome == "error":
                self.stopped = f"error: {rec.how}"
                return None
            if rec.outcome in ("interrupted", "cut"):
                self.stopped = self._interrupted() if rec.outcome == "interrupted" else "time: --time ran out"
                return None
            if rec.outcome == "rejected":
                break  # an argument error repeats itself: no need to see it K times
        return tally

    def search(self) -> Search:
        s = Search(self.opts.repeat, self.order_after_baseline, self.narrower_of, self.alternative_of)
        plan = s.plan()
        try:
            config = next(plan)
            while True:
                why = self._affordable()
                if why is not None:
                    self.stopped, self.unrun = why, config
                    break
                tally = self.run_config(config)
                if tally is None:
                    break
                config = plan.send(tally)
        except StopIteration:
            pass
        return s

    # -- the end --------------------------------------------------------------------------------------------------

    def _pick(self, s: Search) -> tuple[runner.RunRecord | None, runner.RunRecord | None]:
        """The best hung run (the baseline's first hang, else its first failure) and the best good run (the fix's
        first success, else the first success of the configuration closest to the baseline)."""
        def first(attempts: list[report.Attempt], outcomes: tuple[str, ...]) -> runner.RunRecord | None:
            for o in outcomes:
                for a in attempts:
                    for _, r in a.runs:
                        if r.outcome == o and (r.run_dir / "verdict.json").exists():
                            return r
            return None

        base = [a for a in self.attempts if a.config.role == "baseline"]
        hung = first(base, ("hang",)) or first(self.attempts, ("hang",)) or first(base, ("crash", "timeout"))
        fix_key = frozenset(c.key for c in s.fix) if s.fix else None
        fixed = [a for a in self.attempts if a.config.key == fix_key]
        rest = sorted(self.attempts, key=lambda a: len(a.config.candidates))
        good = first(fixed, ("success",)) or first(rest, ("success",))
        return hung, good

    def _compare(self, hung: runner.RunRecord | None, good: runner.RunRecord | None) -> dict[str, Any] | None:
        if hung is None or good is None:
            return None
        from ranktrace.analyzers import compare as compare_mod
        from ranktrace.analyzers.report import compare_text
        from ranktrace.tracer.watch import live

        doc: dict[str, Any] = {"hung": str(hung.run_dir.relative_to(self.root)),
                               "good": str(good.run_dir.relative_to(self.root))}
        try:
            c = compare_mod.compare_paths(hung.run_dir, good.run_dir,
                                          liveness=live.liveness([hung.run_dir, good.run_dir]))
            (self.root / "compare.txt").write_text(compare_text.render(c), encoding="utf-8")
            (self.root / "compare.json").write_text(json.dumps(c.to_dict(), indent=2, default=str), encoding="utf-8")
        except Exception as e:  # the bisect's own answer must come whatever happens here
            doc["problem"] = f"trace compare failed: {type(e).__name__}: {e}"
            return doc
        doc.update(summary=c.summary(), file="compare.txt",
                   context=[[d.key, d.a, d.b] for d in c.context_diff if d.status != "same"],
                   outcome=[v.status if v is not None else None for v in (c.verdict_a, c.verdict_b)])
        return doc

    def _html(self, doc: dict[str, Any], hung: runner.RunRecord | None) -> None:
        from ranktrace.analyzers import api
        from ranktrace.analyzers.report import bisect_html, html_report
        from ranktrace.tracer.watch import live

        page = None
        if hung is not None:  # the best hung run's own page, with the bisect on top
            try:
                page = html_report.render(api.analyze([hung.run_dir], liveness=live.liveness([hung.run_dir])),
                                          bisect=doc)
            except Exception as e:  # its trace may be damaged: the bisect alone then
                self.problems.append(f"report.html without the hung run's timeline: {type(e).__name__}: {e}")
        try:
            page = page if page is not None else bisect_html.page(doc)
            (self.root / "report.html").write_text(page, encoding="utf-8", errors="backslashreplace")
        except Exception as e:  # the page is extra; bisect.json is what must land
            self.problems.append(f"report.html not written: {type(e).__name__}: {e}")

    def finish(self, s: Search) -> BisectResult:
        hung, good = self._pick(s)
        compare = self._compare(hung, good)
        o = self.opts
        options = {"repeat": o.repeat, "budget_runs": o.budget_runs, "budget_seconds": o.budget_seconds,
                   "hang_after": o.hang_after, "startup_hang_after": o.startup_hang_after, "ready": self.ready,
                   "run_timeout": o.run_timeout, "knobs_file": str(o.knobs_file) if o.knobs_file else None,
                   "hooks": list(o.hooks)}
        doc = report.build(root=self.root, command=o.command, framework=self.fw, options=options,
                           attempts=self.attempts, search=s, hints=self.hints, skipped=self.skipped,
                           stopped=self.stopped, seconds=self._elapsed(), runs_used=self.runs_used,
                           compare=compare, started=self.started, next_config=self.unrun)
        if self.stopped and self.stopped.startswith("error"):
            doc["status"] = "error"
        text = report.render_text(doc, self.root)
        (self.root / "bisect.json").write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        (self.root / "bisect.txt").write_text(text, encoding="utf-8")
        self._html(doc, hung)
        code = 128 + (self.stop.signal or 2) if self.stop.requests else EXIT.get(doc["status"], 3)
        return BisectResult(self.root, doc, text, code, self.problems)


def run_bisect(opts: BisectOptions, *, env: Mapping[str, str] | None = None,
               say: Callable[[str], None] = lambda s: sys.stderr.write(f"[ranktrace] {s}\n")) -> BisectResult:
    """Search for the smallest change of `opts.command` that turns its hang into success. BisectError before any
    run for usage problems. Makes this process a child subreaper and takes SIGINT/SIGTERM/SIGHUP while it runs."""
    env = dict(os.environ if env is None else env)
    session = _Session(opts, env, say)
    try:
        with runner.gpu_lock(env) as gpus:
            session.make_root()
            runner.become_subreaper()
            say(f"bisect of {session.fw.name}{' ' + session.fw.version if session.fw.version else ''} job on GPUs "
                f"{gpus}: {len(session.singles)} knob(s) to try, {opts.repeat} run(s) each; folder {session.root}")
            with session.stop.installed():
                s = session.search()
                return session.finish(s)
    except runner.GpuBusy as e:
        raise BisectError(str(e)) from None
