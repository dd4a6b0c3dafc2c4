"""The search: which configuration to run next, given what the runs so far showed. Pure — a generator that yields
configurations and is sent each one's Tally; the session runs them, and stops asking on budget, time or Ctrl-C,
when `Search` still holds everything known so far.

The order: the command as given (the baseline), K times. If it never fails there is nothing to find. Otherwise each
knob alone, in the order the verdict points at (`order`, supplied by the session), until one turns every one of
its K runs into success; then the knobs that narrow it (a smaller change that may fix it too). If no knob alone
fixes it: every knob at once, and if that fixes it, delta debugging (Zeller's ddmin) down to a set from which no
knob can be dropped. A knob spelled in a way the command rejects (a flag of another release) is retried in its
next spelling."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence

from ranktrace.tracer.launch.bisect.knobs import Candidate

__all__ = ["COUNTED", "FAILED", "Config", "Tally", "Search"]

FAILED = ("hang", "crash", "timeout")            # outcomes that are not success
COUNTED = FAILED + ("success",)                  # outcomes in the rates (rejected / interrupted / cut are not)


@dataclass(frozen=True)
class Config:
    candidates: tuple[Candidate, ...] = ()
    role: str = "baseline"   # baseline | single | narrower | alternative | combination

    @property
    def name(self) -> str:
        return "baseline" if not self.candidates else " + ".join(c.label for c in self.candidates)

    @property
    def key(self) -> frozenset[str]:
        return frozenset(c.key for c in self.candidates)

    @property
    def knob_names(self) -> list[str]:
        return [c.name for c in self.candidates]


@dataclass
class Tally:
    """The runs of one configuration: each run's outcome and (for failures) its verdict."""

    config: Config
    repeat: int
    outcomes: list[str] = field(default_factory=list)
    verdicts: list[dict[str, Any] | None] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return self.outcomes.count(outcome)

    @property
    def n(self) -> int:
        return sum(1 for o in self.outcomes if o in COUNTED)

    @property
    def failures(self) -> int:
        return sum(1 for o in self.outcomes if o in FAILED)

    @property
    def complete(self) -> bool:
        return self.n >= self.repeat

    @property
    def fixes(self) -> bool:
        """Every one of its K runs succeeded: never a single lucky run."""
        return self.complete and self.failures == 0

    @property
    def rejected(self) -> bool:
        return self.n == 0 and self.count("rejected") > 0

    @property
    def fail_rate(self) -> float | None:
        return self.failures / self.n if self.n else None

    def rates(self) -> str:
        """'hang 2/3, success 1/3'."""
        n = self.n or len(self.outcomes)
        parts = [f"{o} {self.count(o)}/{n}" for o in COUNTED + ("rejected",) if self.count(o)]
        others = sorted({o for o in self.outcomes if o not in COUNTED + ("rejected",)})
        parts += [f"{o} {self.count(o)}" for o in others]  # interrupted / cut: not in the rates
        return ", ".join(parts) or "no runs"


class Search:
    """`plan()` is the search; the attributes are what it knows at any point (read them after stopping early).

    order_after_baseline(tally) -> the single-knob candidates, ordered by what the baseline's verdicts point at;
    narrower_of(candidate) -> knobs that narrow it; alternative_of(candidate) -> its next spelling, or None."""

    def __init__(self, repeat: int, order_after_baseline: Callable[[Tally], list[Candidate]],
                 narrower_of: Callable[[Candidate], list[Candidate]],
                 alternative_of: Callable[[Candidate], Candidate | None]) -> None:
        self.repeat = repeat
        self._order, self._narrower, self._alternative = order_after_baseline, narrower_of, alternative_of
        self.tallies: dict[frozenset[str], Tally] = {}
        self.baseline: Tally | None = None
        self.singles: list[Candidate] = []        # in the order they are (to be) tried
        self.pending: list[Candidate] = []        # singles / narrower knobs not run yet
        self.status = "running"                   # running | fixed | no_fix | not_reproduced
        self.fix: tuple[Candidate, ...] | None = None
        self.fix_minimal = False                  # no knob of `fix` can be dropped (ddmin finished, or a single)
        self.note = ""

    # -- the search ---------------------------------------------------------------------------------------------

    def plan(self) -> Generator[Config, Tally, None]:
        base = yield Config()
        self.baseline = base
        self.tallies[frozenset()] = base
        if base.failures == 0:
            self.status = "not_reproduced"
            self.note = f"the command as given did not fail in {base.n} run(s): nothing to bisect"
            return
        self.singles = list(self._order(base))
        self.pending = list(self.singles)
        tried: list[Candidate] = []
        while self.pending:
            c = self.pending.pop(0)
            t = yield from self._test([c], "single" if c in self.singles else "alternative")
            if t.rejected:
                alt = self._alternative(c)
                if alt is not None:
                    self.pending.insert(0, alt)
                continue
            tried.append(c)
            if t.fixes:
                self.fix, self.fix_minimal, self.status = (c,), True, "fixed"
                yield from self._refine(c)
                return
        union = self._union(tried)
        if not self.singles:
            self.status, self.note = "no_fix", "no knob changes this command (see skipped; a knobs file can add some)"
            return
        if len(union) < 2:
            self.status = "no_fix"
            self.note = "no knob alone turns the failure into success" + (
                "" if union else ", and none can be combined")
            return
        t = yield from self._test(union, "combination")
        if not t.fixes:
            self.status = "no_fix"
            self.note = f"no knob alone, and not all {len(union)} together, turn the failure into success"
            return
        self.fix, self.status = tuple(union), "fixed"
        yield from self._ddmin(union)
        self.fix_minimal = True

    def _test(self, cs: Sequence[Candidate], role: str) -> Generator[Config, Tally, Tally]:
        key = frozenset(c.key for c in cs)
        if key in self.tallies:
            return self.tallies[key]
        t = yield Config(tuple(cs), role)
        self.tallies[key] = t
        return t

    def _refine(self, broad: Candidate) -> Generator[Config, Tally, None]:
        """A smaller change that fixes it too is the better answer ('P2P over PCIe' rather than 'P2P')."""
        self.pending = list(self._narrower(broad))
        while self.pending:
            c = self.pending.pop(0)
            t = yield from self._test([c], "narrower")
            if t.rejected:
                alt = self._alternative(c)
                if alt is not None:
                    self.pending.insert(0, alt)
                continue
            if t.fixes:
                self.fix = (c,)
                yield from self._refine(c)
                return

    def _union(self, tried: Sequence[Candidate]) -> list[Candidate]:
        """Every knob that ran (not rejected, not turning the job into a crash every time), one per variable or
        option."""
        out: list[Candidate] = []
        slots: set[str] = set()
        for c in tried:
            t = self.tallies[frozenset([c.key])]
            if t.n and t.count("crash") == t.n and (self.baseline is None or self.baseline.count("crash") == 0):
                continue  # it breaks the job another way; in a combination it would hide any fix
            if c.slot in slots:
                continue
            slots.add(c.slot)
            out.append(c)
        return out

    def _ddmin(self, cs: list[Candidate]) -> Generator[Config, Tally, None]:
        """Reduce a fixing set until no knob can be dropped (each subset costs K runs; singles are known)."""
        n = 2
        while len(cs) >= 2:
            chunks = [cs[i * len(cs) // n:(i + 1) * len(cs) // n] for i in range(n)]
            chunks = [ch for ch in chunks if ch]
            reduced = False
            for ch in chunks:
                if (yield from self._test(ch, "combination")).fixes:
                    cs, n, reduced = ch, 2, True
                    break
            if not reduced and n > 2:
                for i in range(len(chunks)):
                    comp = [c for j, ch in enumerate(chunks) if j != i for c in ch]
                    if (yield from self._test(comp, "combination")).fixes:
                        cs, n, reduced = comp, max(n - 1, 2), True
                        break
            if reduced:
                self.fix = tuple(cs)
                continue
            if n >= len(cs):
                break
            n = min(2 * n, len(cs))

    # -- what it found --------------------------------------------------------------------------------------------

    def tried(self) -> list[Tally]:
        return list(self.tallies.values())

    def chance_by_luck(self) -> float | None:
        """How likely the fix's K successes are if it changed nothing: the baseline's success rate to the K."""
        if self.fix is None or self.baseline is None or not self.baseline.n:
            return None
        t = self.tallies.get(frozenset(c.key for c in self.fix))
        k = t.n if t else self.repeat
        return (1 - (self.baseline.fail_rate or 0.0)) ** k
