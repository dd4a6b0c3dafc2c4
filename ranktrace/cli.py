"""The `trace` / `ranktrace` command (run, bisect, analyze, attach, snapshot, compare, --version): the only place that
writes to the terminal and maps outcomes to exit codes. Commands import what they use when they run."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ranktrace.progress import working

if TYPE_CHECKING:
    from ranktrace.analyzers.model.values import Analysis
    from ranktrace.analyzers.verdict import Verdict

__all__ = ["main"]

EXIT_USAGE = 2


def _err(msg: str) -> None:
    click.echo(f"[ranktrace] {msg}", err=True)


def _one_line_errors(fn):  # type: ignore[no-untyped-def]
    """A command never ends in a traceback: an unexpected error is one line and exit 4 ("inconclusive")."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except (SystemExit, click.exceptions.Exit, click.ClickException, KeyboardInterrupt):
            raise
        except Exception as e:
            _err(f"{fn.__name__} failed (a ranktrace bug, please report): {type(e).__name__}: {e}")
            sys.exit(4)

    return wrapper


def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ranktrace.versions import versions_text

    click.echo(versions_text())
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_versions,
              help="Print the versions of ranktrace, torch and its NCCL, and python, and exit.")
def main() -> None:
    """ranktrace: which collective, graph capture or init step never returned, on which ranks, and why."""


def _check_hooks(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--hook values, normalised to MODULE:QUALNAME=category; a malformed one is a usage error before the job."""
    from ranktrace.tracer.rank.patch_user import SpecError, parse_spec

    out: list[str] = []
    for v in values:
        try:
            text = parse_spec(v).text
        except SpecError as e:
            raise click.BadParameter(str(e), param_hint="--hook") from None
        if text not in out:
            out.append(text)
    return tuple(out)


class _RunCommand(click.Command):
    """`trace run`'s options end at `--` or at the first word that is not an option (the command): everything from
    there on is the job's, verbatim. A mistyped option before that is an unknown option (exit 2), never a command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            hint = f" (did you mean {e.possibilities[0]}?)" if e.possibilities else ""
            raise click.UsageError(
                f"unknown option {e.option_name} for trace run{hint}; the command to run goes after `--`: "
                f"trace run [OPTIONS] -- CMD ARGS...", ctx) from None


@main.command(cls=_RunCommand, context_settings={"allow_interspersed_args": False})
@click.option("-o", "--output", "output", type=click.Path(path_type=Path), default=None,
              help="Run directory to create (default traces/<timestamp>-<name>/). Never overwritten.")
@click.option("--name", default=None, help="Name used in the default run directory.")
@click.option("--nccl-debug", default=None, help="NCCL_DEBUG level for the ranks (default INFO; yours wins).")
@click.option("--nccl-coll", is_flag=True, help="Add COLL to NCCL_DEBUG_SUBSYS (one line per collective).")
@click.option("--analyze/--no-analyze", default=True, show_default=True,
              help="Analyze the trace when the job ends and write <run>/verdict.json and <run>/report.html.")
@click.option("--hang-after", type=click.FloatRange(min=1), default=None, show_default="adaptive",
              help="Seconds without progress (once the ranks joined their process group) that count as a hang. "
                   "Default adaptive: 8 s when every rank is parked in a collective or a known wait with no CPU or "
                   "I/O, else from each rank's own cadence (at least 60 s).")
@click.option("--startup-hang-after", type=click.FloatRange(min=1), default=None, show_default="adaptive",
              help="The same before the ranks joined their process group (adaptive: the short path, else 180 s).")
@click.option("--on-hang", type=click.Choice(["report", "kill", "wait"]), default="report", show_default=True,
              help="report: print the verdict and keep watching; kill: terminate the job and exit 3; wait: record.")
@click.option("--native-stacks", is_flag=True, help="Hang-time py-spy dumps with --native (slower, C++ frames).")
@click.option("--monitor/--no-monitor", default=True, show_default=True, help="Watch for silence while it runs.")
@click.option("--hook", "hook_targets", multiple=True, metavar="MODULE:QUALNAME[=CATEGORY]", callback=_check_hooks,
              help="Also record calls of this function or method (repeatable). CATEGORY: phase, collective, graph, "
                   "sync or user (default). collective: aligned across ranks by object and call count.")
@click.option("--perfetto", type=click.Path(path_type=Path), default=None,
              help="Also write the run's timeline as Chrome-trace JSON (open in ui.perfetto.dev) when it ends; an "
                   "existing file is refused before the job starts.")
@click.option("--nsys", "use_nsys", is_flag=True,
              help="Run the job under Nsight Systems (CUDA, NVTX, OS runtime; CUDA graphs and NCCL where nsys has "
                   "them). On a hang the report is written and exported before the verdict and before --on-hang "
                   "kill; it lands in <run>/<host>/nsys/ and joins the verdict. Without nsys: one line, no nsys.")
@click.option("--nsys-args", default="", metavar='"ARGS"', help="More `nsys profile` switches (one quoted string).")
@click.option("--profile", "profile", default=None, metavar="NAME|FILE",
              help="What a serving framework's ranks also record (communicators, set-up steps, phases): sglang, vllm, "
                   "torch, a profile .toml, or none. Default: picked from the command (-m sglang.launch_server, "
                   "sglang serve, vllm serve, -m vllm.entrypoints...). --hook adds to it.")
@click.option("--run-id", default=None,
              help="One run across hosts: every node's trace run with this id writes into one run folder "
                   "(traces/<id>/<host>/, or -o). Default: RANKTRACE_RUN_ID, else the launcher's job id (Slurm, "
                   "torchrun --rdzv-id, a Kubernetes JobSet / PyTorchJob).")
@click.option("--host-label", default=None,
              help="Name this host's directory (default hostname + boot id; env RANKTRACE_HOST): for several "
                   "trace run of one run on one machine.")
@click.option("--keep-rings", is_flag=True,
              help="Keep <host>/rings/ after the run (the raw per-process record files, ~9 MiB each). By default they "
                   "are removed once events.arrow holds their records; a ring that could not be read, or whose "
                   "process still runs, always stays.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(output: Path | None, name: str | None, nccl_debug: str | None, nccl_coll: bool, analyze: bool,
        hang_after: float, startup_hang_after: float, on_hang: str, native_stacks: bool, monitor: bool,
        hook_targets: tuple[str, ...], perfetto: Path | None, use_nsys: bool, nsys_args: str, profile: str | None,
        run_id: str | None, host_label: str | None, keep_rings: bool,
        command: tuple[str, ...]) -> None:
    """Run COMMAND with every rank traced: trace run [OPTIONS] -- CMD ARGS...

    Options end at `--` or at the first word that is not an option; from there on everything is the command's."""
    from ranktrace.tracer.launch import finalize
    from ranktrace.tracer.launch import launcher
    from ranktrace.tracer.launch import meta
    from ranktrace.tracer.launch import profiles
    from ranktrace.tracer.watch.monitor import MonitorOptions

    if perfetto is not None and perfetto.exists():  # nothing a user has is ever overwritten: said before the job
        _err(f"{perfetto} exists: not overwritten (choose another path)")
        sys.exit(EXIT_USAGE)
    from ranktrace.tracer.launch import runid

    try:
        label = runid.host_label(host_label, os.environ)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--host-label") from None
    try:
        chosen, chosen_by = profiles.choose(command, profile)
    except profiles.ProfileError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    if chosen and chosen_by == "the command":
        _err(f"profile {chosen[0].name} ({len(chosen[0].targets)} targets), picked from the command "
             f"(--profile none to turn it off)")
    opts = launcher.RunOptions(command=tuple(command), out=output, name=name, nccl_debug=nccl_debug,
                               nccl_coll=nccl_coll, hooks=hook_targets, nsys=use_nsys or bool(nsys_args),
                               nsys_args=nsys_args, profiles=chosen, profile_source=chosen_by,
                               run_id=run_id, host_label=label)
    if startup_hang_after is not None and hang_after is not None:
        startup_hang_after = max(startup_hang_after, hang_after)
    mon = MonitorOptions(hang_after=hang_after, startup_hang_after=startup_hang_after,
                         on_hang=on_hang, native_stacks=native_stacks) if monitor else None
    try:
        outcome = launcher.launch(opts, monitor_opts=mon)
    except launcher.LaunchError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    try:
        fin = finalize.finalize_host_dir(outcome.host_dir, keep_rings=keep_rings)
        m = meta.read_meta(outcome.host_dir)
        versions = {**m.get("versions", {}), **fin["versions"]}
        meta.update_meta(outcome.host_dir, pids=fin["pids"], versions=versions, finalize_problems=fin["problems"],
                         hook_problems=fin.get("hook_problems", []), rings=fin["rings"])
        folded = _profile_problems_line(fin.get("hook_problems", []))
        if folded:
            _err(folded)
    except Exception as e:  # the job's status must come through whatever happens to us
        _err(f"could not finalize the trace in {outcome.host_dir}: {type(e).__name__}: {e}")
    presenter = outcome.presenter
    analysis: Analysis | None = None
    if analyze:  # the verdict at the hang was printed: now only what changed since
        analysis = _refresh_after_run(outcome.run_dir, presenter)
        if (outcome.run_dir / "report.html").exists():
            _err(f"the verdict with a timeline of every rank: {outcome.run_dir / 'report.html'}")
    elif presenter is not None:
        presenter.flush_notes()
    if perfetto is not None:
        if analysis is None:  # --no-analyze: analyzed for the picture only, nothing written into the run
            try:
                from ranktrace.analyzers import api
                from ranktrace.tracer.watch import live

                analysis = api.analyze([outcome.run_dir], liveness=live.liveness([outcome.run_dir]))
            except Exception as e:
                _err(f"{perfetto} not written: analysis failed: {type(e).__name__}: {e}")
        if analysis is not None and _write_picture(perfetto, "perfetto", analysis):
            _err(f"the timeline for ui.perfetto.dev: {perfetto}")
    if outcome.killed_on_hang:
        _err(f"hang detected and the job terminated (--on-hang kill): exit code 3 is ranktrace's "
             f"({launcher.describe_exit(outcome.returncode).split(';')[0]}); trace in {outcome.run_dir}")
        sys.exit(3)
    _err(f"{launcher.describe_exit(outcome.returncode)}; trace in {outcome.run_dir}")
    sys.exit(outcome.exit_code)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "output", type=click.Path(path_type=Path), default=None,
              help="Bisect folder to create (default traces/<timestamp>-bisect-<name>/): every run's trace dir under "
                   "runs/, bisect.json, bisect.txt, compare.txt, report.html. Never overwritten.")
@click.option("--budget", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N runs in all, the baseline's included (default 20 unless --time is given).")
@click.option("--time", "time_budget", default=None, metavar="T",
              help="At most this long in all (seconds, or 90s / 15m / 2h): no configuration is started that cannot "
                   "finish in time, and a run still going when it runs out is stopped.")
@click.option("--repeat", type=click.IntRange(min=1), default=2, show_default=True, metavar="K",
              help="Runs per configuration: a knob fixes the hang only if all K of its runs succeed; rates are "
                   "reported for flaky hangs.")
@click.option("--knobs", "knobs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A TOML (or .json) file that adds [[knob]]s, removes some (remove = [name, \"area:net\"]), keeps "
                   "only some (only = [...]) or tries some first (first = [...]).")
@click.option("--framework", default=None, metavar="NAME[==VER]",
              help="sglang, vllm, torch, python or unknown, optionally with its release (detected otherwise).")
@click.option("--hang-after", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds without progress that count as a hang (trace run --hang-after).")
@click.option("--startup-hang-after", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="The same before the first collective (trace run --startup-hang-after).")
@click.option("--ready", default=None, metavar="REGEX",
              help="A line of the job's output that means it serves: the run counts as a success and is stopped "
                   "(default: SGLang's and vLLM's own ready lines); otherwise success is exit status 0.")
@click.option("--run-timeout", default="1h", show_default=True, metavar="T",
              help="Stop a run that neither hangs, ends nor gets ready within this (outcome: timeout).")
@click.option("--hook", "hook_targets", multiple=True, metavar="MODULE:QUALNAME[=CATEGORY]", callback=_check_hooks,
              help="Passed to every trace run (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print bisect.json (schema ranktrace.bisect/1) instead of text.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def bisect(output: Path | None, budget: int | None, time_budget: str | None, repeat: int, knobs_file: Path | None,
           framework: str | None, hang_after: float, startup_hang_after: float, ready: str | None, run_timeout: str,
           hook_targets: tuple[str, ...], as_json: bool, command: tuple[str, ...]) -> None:
    """Find the knob that makes a hang go away: trace bisect [OPTIONS] -- CMD ARGS...

    Runs CMD under `trace run --hang-after S --on-hang kill`, K times as given, then with one knob changed at a time
    (NCCL / torch variables, SGLang / vLLM flags), in the order the verdict points at, one job at a time, each fully
    reaped, until every run of a configuration succeeds; prints the table of runs, the smallest change that fixes it
    and what that suggests. Exit 0 fix found, 3 failure reproduced but no fix found, 4 the command never failed,
    2 usage error, 130 Ctrl-C (what is known is still printed)."""
    import json as _json

    from ranktrace.tracer.launch.bisect import BisectError, BisectOptions, parse_duration, run_bisect

    try:
        seconds = parse_duration(time_budget) if time_budget is not None else None
        per_run = parse_duration(run_timeout)
    except ValueError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    opts = BisectOptions(command=tuple(command), out=output, repeat=repeat,
                         budget_runs=budget if budget is not None or seconds is not None else 20,
                         budget_seconds=seconds, knobs_file=knobs_file, framework=framework, hang_after=hang_after,
                         startup_hang_after=max(startup_hang_after, hang_after), ready=ready, run_timeout=per_run,
                         hooks=hook_targets)
    try:
        result = run_bisect(opts)
    except BisectError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    for p in result.problems:
        _err(p)
    click.echo(_json.dumps(result.doc, indent=2, default=str) if as_json else result.text, nl=as_json)
    sys.exit(result.exit_code)


def _profile_problems_line(problems: list[dict[str, object]]) -> str | None:
    """The profile targets no process could trace, in one line with their count (the ranks said one line at the
    first): 'profile sglang: 15 targets not in the installed release were not traced: A, B, C and 12 more (...)'."""
    by_profile: dict[str, list[str]] = {}
    for p in problems:
        head, _, name = str(p.get("target", "")).partition(": ")
        if head.startswith("profile ") and name:
            by_profile.setdefault(head, []).append(name)
    parts = []
    for head, names in by_profile.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{head}: {len(names)} target{'s' if len(names) != 1 else ''} not in the installed release "
                     f"{'were' if len(names) != 1 else 'was'} not traced: {shown}")
    return "; ".join(parts) + " (meta.json hook_problems says why for each)" if parts else None


def _refresh(run_dir: Path) -> Analysis:
    """verdict.json and report.html of a run dir, analyzed now with what is alive of its job on this machine."""
    from ranktrace.analyzers import api
    from ranktrace.tracer.watch import live

    with working(f"analyzing {run_dir}"):
        refreshed = api.refresh_run(run_dir, live.liveness([run_dir]))
    if refreshed.problem:
        _err(refreshed.problem)
    return refreshed.analysis


def _show_verdict(verdict: Verdict, as_json: bool, err: bool = False) -> None:
    from ranktrace.analyzers.report import json_report, text_report
    from ranktrace.tracer.watch.presenter import terminal_style

    if as_json:
        click.echo(json_report.render(verdict), err=err)
        return
    width, color = terminal_style(sys.stderr if err else sys.stdout)
    click.echo(text_report.render(verdict, width, color), err=err, nl=False, color=color)


def _refresh_after_run(run_dir: Path, presenter: object | None) -> Analysis | None:
    """verdict.json and report.html at the end of `trace run`; the verdict printed, or only what changed since the
    watchdog printed it at the hang (tracer.watch.presenter)."""
    from ranktrace.tracer.watch.presenter import Presenter

    try:
        analysis = _refresh(run_dir)
    except Exception as e:
        _err(f"analysis failed: {type(e).__name__}: {e}")
        return None
    p = presenter if isinstance(presenter, Presenter) else Presenter(sys.stderr)
    try:
        p.final(analysis.verdict)
    except Exception as e:
        _err(f"report failed: {type(e).__name__}: {e}")
    return analysis


def _picture_inputs(renderer: object, result: Analysis) -> dict[str, object]:
    """What a renderer takes besides the analysis: Perfetto draws the run's samples (counters, every stack sample)."""
    from ranktrace.analyzers.report import perfetto_report

    if renderer is not perfetto_report:
        return {}
    from ranktrace.analyzers import export

    try:
        return {"samples": export.sample_tables(result)}
    except Exception as e:  # the samples are extra: the timeline is drawn without them
        _err(f"samples left out of the timeline: {type(e).__name__}: {e}")
        return {}


def _write_picture(out: Path, kind: str, result: Analysis) -> bool:
    """Write one rendering (perfetto | html) of `result` to a new file `out`; a failure is one line (False)."""
    from ranktrace.analyzers.report import html_report, perfetto_report

    renderer = {"perfetto": perfetto_report, "html": html_report}[kind]
    try:
        text = renderer.render(result, **_picture_inputs(renderer, result))  # type: ignore[arg-type]
    except Exception as e:  # a bug of ours in a picture: one line; the verdict still comes
        _err(f"{out} not written (a ranktrace bug, please report): {type(e).__name__}: {e}")
        return False
    try:
        # "x": never over a file that appeared meanwhile; undecodable file names in the text are escaped
        with open(out, "x", encoding="utf-8", errors="backslashreplace") as f:
            try:
                f.write(text)
            except OSError:
                out.unlink(missing_ok=True)  # ours, half written (disk full): not left to block a rerun
                raise
    except OSError as e:
        _err(f"cannot write {out}: {e.strerror or e}")
        return False
    return True


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON (the verdict.json contract).")
@click.option("--perfetto", type=click.Path(path_type=Path), default=None,
              help="Also write a Chrome-trace JSON timeline (open in ui.perfetto.dev); an existing file is refused.")
@click.option("--html", "html_out", type=click.Path(path_type=Path), default=None,
              help="Also write the verdict and a timeline picture as one self-contained HTML page; an existing file "
                   "is refused.")
@click.option("--snapshot/--no-snapshot", default=True, show_default=True,
              help="If a traced job is still running here, dump its stacks (py-spy, non-blocking) first.")
def analyze(paths: tuple[Path, ...], as_json: bool, perfetto: Path | None, html_out: Path | None,
            snapshot: bool) -> None:
    """Analyze a trace directory, or any folder/files of logs and dumps, and print one verdict."""
    from ranktrace.analyzers import api
    from ranktrace.analyzers.report import html_report, perfetto_report
    from ranktrace.tracer.watch import live

    for out in (perfetto, html_out):
        if out is not None and out.exists():  # nothing a user has is ever overwritten: say so before the work
            _err(f"{out} exists: not overwritten (choose another path)")
            sys.exit(EXIT_USAGE)
    if perfetto is not None and html_out is not None and perfetto.resolve() == html_out.resolve():
        _err(f"--perfetto and --html name the same file {perfetto}")
        sys.exit(EXIT_USAGE)
    dirs = [p for p in paths if p.is_dir()]
    if snapshot:
        try:
            for problem in live.snapshot_live(dirs):
                _err(problem)
        except Exception as e:  # a failed snapshot must not stop the analysis of what is on disk
            _err(f"live snapshot skipped: {type(e).__name__}: {e}")

    try:
        with working(f"analyzing {' '.join(map(str, paths))}"):
            result = api.analyze(list(paths), liveness=live.liveness(dirs))
    except api.InputError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    except Exception as e:  # a bug of ours: one line, never a traceback; the verdict is "inconclusive"
        _err(f"analysis failed (a ranktrace bug, please report): {type(e).__name__}: {e}")
        sys.exit(4)
    verdict = result.verdict
    for out, renderer in ((perfetto, perfetto_report), (html_out, html_report)):
        if out is None:
            continue
        try:
            text = renderer.render(result, **_picture_inputs(renderer, result))
        except Exception as e:  # a bug of ours in a picture: one line; the verdict below still comes
            _err(f"{out} not written (a ranktrace bug, please report): {type(e).__name__}: {e}")
            continue
        try:
            # "x": never over a file that appeared meanwhile; undecodable file names in the text are escaped
            with open(out, "x", encoding="utf-8", errors="backslashreplace") as f:
                try:
                    f.write(text)
                except OSError:
                    out.unlink(missing_ok=True)  # ours, half written (disk full): not left to block a rerun
                    raise
        except OSError as e:
            _err(f"cannot write {out}: {e.strerror or e}")
            sys.exit(EXIT_USAGE)
    _show_verdict(verdict, as_json)
    sys.exit(api.exit_code(verdict))


@main.command()
@click.argument("pids", nargs=-1, required=True, type=int)
@click.option("-o", "--output", "out_base", type=click.Path(path_type=Path), default=Path("traces"),
              show_default=True, help="Where the attach trace directory is created.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@_one_line_errors
def attach(pids: tuple[int, ...], out_base: Path, as_json: bool) -> None:
    """Diagnose a running job not started under ranktrace: PIDS are the launcher or any ranks."""
    import os as _os

    from ranktrace.analyzers import api
    from ranktrace.tracer.launch import attach as attach_mod

    missing = [p for p in pids if not _os.path.exists(f"/proc/{p}")]
    if missing:
        _err(f"no such process: {', '.join(map(str, missing))}")
        sys.exit(EXIT_USAGE)
    try:
        res = attach_mod.attach(list(pids), out_base)
    except attach_mod.NothingToRead as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    for problem in res.problems:
        _err(problem)
    verdict = _refresh(res.run_dir).verdict
    _show_verdict(verdict, as_json)
    _err(f"attached to {len(res.pids)} process(es); evidence in {res.run_dir}")
    sys.exit(api.exit_code(verdict))


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@_one_line_errors
def snapshot(run_dir: Path, as_json: bool) -> None:
    """Force a capture burst on a running `trace run`, print the verdict now, and refresh <run>/verdict.json and
    <run>/report.html as the watchdog does."""
    from ranktrace.analyzers import api
    from ranktrace.tracer.watch import live

    hosts = live.host_dirs(run_dir)
    allowed = [live.snapshot_targets(h, top=run_dir) for h in hosts]  # a run this user started, its ranks only
    if not any(pids for pids, _ in allowed):
        for _, why in allowed:
            if why:
                _err(why)
        _err(f"{run_dir}: no live traced job here (finished, or not a trace run directory)")
        sys.exit(EXIT_USAGE)
    for problem in live.snapshot_live([run_dir], reason="trace snapshot"):
        _err(problem)
    verdict = _refresh(run_dir).verdict
    _show_verdict(verdict, as_json)
    sys.exit(api.exit_code(verdict))


@main.command()
@click.argument("a", type=click.Path(exists=True, path_type=Path))
@click.argument("b", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (schema ranktrace.compare/1).")
@click.option("--html", "html_out", type=click.Path(path_type=Path), default=None,
              help="Also write the comparison as one self-contained side-by-side HTML page; an existing file is "
                   "refused.")
@_one_line_errors
def compare(a: Path, b: Path, as_json: bool, html_out: Path | None) -> None:
    """Put two runs side by side (good vs hung, H100 vs Blackwell, NCCL_P2P_DISABLE=1 vs not): run dirs or anything
    `trace analyze` reads. Hardware and software, what NCCL decided, both verdicts, where B departed from A, timings."""
    import json as _json

    from ranktrace.analyzers import compare as compare_mod
    from ranktrace.analyzers import api
    from ranktrace.analyzers.report import compare_html, compare_text
    from ranktrace.tracer.watch import live

    if html_out is not None and html_out.exists():
        _err(f"{html_out} exists: not overwritten (choose another path)")
        sys.exit(EXIT_USAGE)
    try:
        with working(f"comparing {a} and {b}"):
            c = compare_mod.compare_paths(a, b, liveness=live.liveness([p for p in (a, b) if p.is_dir()]))
    except api.InputError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)
    if html_out is not None:
        try:
            with open(html_out, "x", encoding="utf-8", errors="backslashreplace") as f:
                f.write(compare_html.render(c))
        except OSError as e:
            _err(f"cannot write {html_out}: {e.strerror or e}")
            sys.exit(EXIT_USAGE)
    click.echo(_json.dumps(c.to_dict(), indent=2, default=str) if as_json else compare_text.render(c))


def _analyze_for_tables(run: Path) -> Analysis:
    """The analysis `trace export` and `trace sql` read their tables from (a bad input: one line, exit 2)."""
    from ranktrace.analyzers import api
    from ranktrace.tracer.watch import live

    try:
        with working(f"analyzing {run}"):
            return api.analyze([run], liveness=live.liveness([run] if run.is_dir() else []))
    except api.InputError as e:
        _err(str(e))
        sys.exit(EXIT_USAGE)


@main.command(name="export")
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["parquet", "duckdb", "csv"]), default="parquet", show_default=True,
              help="parquet and csv: one file per table; duckdb: one ranktrace.duckdb (needs the sql extra).")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the tables (default RUN/export/); files already there are never overwritten.")
@_one_line_errors
def export_cmd(run: Path, fmt: str, out_dir: Path | None) -> None:
    """Write a run's tables for any tool: ops (rank x channel x seq: issued / returned / completed), spans (one row
    per call with its duration and outcome), stacks, samples_stacks / samples_proc / samples_gpu, phases, events."""
    from ranktrace.analyzers import export

    if fmt == "duckdb":
        try:
            export.duckdb_module()
        except export.NoDuckDB as e:
            _err(f"--format duckdb: {e}")
            sys.exit(EXIT_USAGE)
    tables = export.run_tables(_analyze_for_tables(run))
    target = out_dir or ((run if run.is_dir() else run.parent) / "export")
    try:
        paths = export.write(tables, target, fmt)
    except FileExistsError as e:
        _err(f"{e} exists: not overwritten (choose another --output)")
        sys.exit(EXIT_USAGE)
    except OSError as e:
        _err(f"cannot write into {target}: {e.strerror or e}")
        sys.exit(EXIT_USAGE)
    for name, p in zip(tables, paths) if fmt != "duckdb" else ((", ".join(tables), paths[0]),):
        click.echo(f"{p}" + (f"  ({tables[name].num_rows} rows)" if name in tables else f"  (tables: {name})"))


@main.command(name="sql")
@click.argument("run", type=click.Path(exists=True, path_type=Path))
@click.argument("query")
@click.option("--csv", "as_csv", is_flag=True, help="Print the result as CSV instead of an aligned table.")
@_one_line_errors
def sql_cmd(run: Path, query: str, as_csv: bool) -> None:
    """Query a run's tables with DuckDB, e.g. trace sql RUN "SELECT rank, count(*) FROM spans GROUP BY rank".
    Tables: ops, spans, stacks, samples_stacks, samples_proc, samples_gpu, phases, events (see trace export).
    Needs DuckDB: pip install 'ranktrace[sql]'."""
    from ranktrace.analyzers import export

    try:
        export.duckdb_module()
    except export.NoDuckDB as e:
        _err(f"trace sql needs DuckDB, which is not installed: {export.DUCKDB_HINT}")
        del e
        sys.exit(EXIT_USAGE)
    tables = export.run_tables(_analyze_for_tables(run))
    try:
        result = export.sql(tables, query)
    except Exception as e:  # DuckDB's own message for a bad query: one line
        msg = " ".join(str(e).split())
        _err(f"query failed: {type(e).__name__}: {msg}")
        sys.exit(EXIT_USAGE)
    if as_csv:
        import io

        import pyarrow.csv as pcsv

        buf = io.BytesIO()
        pcsv.write_csv(export._csv_ready(result), buf)
        click.echo(buf.getvalue().decode(), nl=False)
    else:
        click.echo(export.table_text(result), nl=False)


if __name__ == "__main__":
    main()
