"""`trace run --nsys` with a stand-in for nsys (tests/scripts/nsys: the documented CLI subset, every call recorded):
the command line, the report written and exported before --on-hang kill, the export fused into the verdict, a job
that ends on its own, and a clean degrade without nsys or with one too old. nsys itself cannot be installed here;
bench/device_check_nsys.py runs the real one on a GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ranktrace.tracer.launch import nsys
from tests.helpers import EXAMPLE, PY, SCRIPTS, host_dir, run_trace, trace_env

HELP = ("usage: nsys profile [<args>] [application]\n\t-t, --trace=<value>\n\t   Possible values: cuda, nvtx, osrt\n"
        "\t--cuda-graph-trace=<graph|node>\n\t-s, --sample=<value>\n")


def standin_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return trace_env(PATH=f"{SCRIPTS}{os.pathsep}{os.environ.get('PATH', '')}",
                     NSYS_STANDIN_LOG=str(tmp_path / "nsys-calls.jsonl"), NSYS_STANDIN_STATE=str(tmp_path / "state"),
                     **extra)


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "nsys-calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# --- the command line, as the User Guide documents it ------------------------------------------------------------

def test_profile_command_line_is_a_stoppable_session_that_never_kills_the_job(tmp_path: Path):
    argv = nsys.profile_argv("/opt/nsys", "ranktrace-abc", tmp_path / "report", ["--trace=cuda,nvtx", "-o", "x",
                                                                                "--stats=true"], HELP,
                             ["python", "job.py", "--world", "2"])
    assert argv[:3] == ["/opt/nsys", "profile", "--session-new=ranktrace-abc"]
    # the user's --trace wins over ours; ours fill in the rest; --kill=none: stopping the collection leaves the job
    assert "--trace=cuda,nvtx" in argv and not [a for a in argv if a.startswith("--trace=cuda,nvtx,osrt")]
    assert {"--sample=none", "--cpuctxsw=none", "--kill=none", "--cuda-graph-trace=node",
            f"--output={tmp_path / 'report'}", "--force-overwrite=true", "--stats=true"} <= set(argv)
    assert "-o" not in argv and "x" not in argv   # the report's place is ranktrace's
    assert argv[-4:] == ["python", "job.py", "--world", "2"]
    plain = nsys.profile_argv("nsys", "s", tmp_path / "r", [], "no such switches here", ["job"])
    assert "--trace=cuda,nvtx,osrt" in plain and not any(a.startswith("--cuda-graph-trace") for a in plain)
    with_nccl = nsys.profile_argv("nsys", "s", tmp_path / "r", [], HELP.replace("osrt", "osrt, nccl"), ["job"])
    assert "--trace=cuda,nvtx,osrt,nccl" in with_nccl


def test_version_parsing():
    assert nsys.parse_version("NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0") == (2024, 5, 1)
    assert nsys.parse_version("NVIDIA Nsight Systems version 2023.1.1.127-32365746v0") == (2023, 1, 1)
    assert nsys.parse_version("command not found") is None


def test_capture_stops_writes_and_exports_once_in_that_order(tmp_path: Path):
    said: list[str] = []
    done: list[list[str]] = []
    session = nsys.NsysSession("nsys", "2024.5.1", "s1", tmp_path, said.append, run=None)  # type: ignore[arg-type]

    def run(argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        done.append(argv[1:])
        if argv[1] == "stop":
            session.report.parent.mkdir(parents=True, exist_ok=True)
            session.report.write_text("report")
        elif argv[1] == "export":
            Path(argv[3].split("=", 1)[1]).write_text("sqlite")
        return subprocess.CompletedProcess(argv, 0, "", "")

    session.run = run
    session.stop_timeout_s = 10
    assert session.capture("silence after 60 s") and session.capture("again")
    assert done == [["stop", "--session=s1"],
                    ["export", "--type=sqlite", f"--output={tmp_path / 'nsys' / 'report.sqlite'}",
                     "--force-overwrite=true", str(tmp_path / "nsys-rep" / "report.nsys-rep")]]
    assert session.summary()["export"] == str(tmp_path / "nsys" / "report.sqlite")


# --- a real hung gloo job under the stand-in ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def hung_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("nsys_hang")
    run_dir = tmp / "run"
    res = run_trace(["run", "--nsys", "--nsys-args", "--stats=false", "--hang-after", "3", "--on-hang", "kill",
                     "-o", str(run_dir), "--", PY, str(EXAMPLE), "--world", "2", "--steps", "6", "--fault", "skip",
                     "--timeout", "60", "--hang-seconds", "60"], timeout=240, env=standin_env(tmp))
    return tmp, run_dir, res


def test_the_documented_session_commands_in_order(hung_run):
    tmp, run_dir, res = hung_run
    assert res.returncode == 3, res.stderr
    got = calls(tmp)
    order = [c["call"] for c in got]
    assert order[:3] == ["--version", "profile --help", "profile"]
    assert order.index("stop") < order.index("export") < order.index("profile exit")
    profile = next(c for c in got if c["call"] == "profile")
    session = profile["session"]
    assert profile["options"]["--session-new"] == session and profile["options"]["--kill"] == "none"
    assert profile["options"]["--trace"] == "cuda,nvtx,osrt" and profile["options"]["--stats"] == "false"
    assert profile["command"][:2] == [PY, str(EXAMPLE)]
    stop = next(c for c in got if c["call"] == "stop")
    assert stop["argv"] == ["stop", f"--session={session}"] and stop["found"]
    export = next(c for c in got if c["call"] == "export")
    assert export["argv"][:2] == ["export", "--type=sqlite"]


def test_report_written_and_exported_while_the_job_is_still_hung_then_killed(hung_run):
    tmp, run_dir, res = hung_run
    got = calls(tmp)
    stop = next(c for c in got if c["call"] == "stop")
    export = next(c for c in got if c["call"] == "export")
    # both ranks (and the spawning parent) were alive when nsys stopped and when the report was exported
    assert len(stop["app_alive"]) >= 3 and len(export["app_alive"]) >= 3
    err = res.stderr
    assert err.index("nsys: stopping collection") < err.index("exported to") < err.index("--on-hang kill: SIGTERM sent")
    hd = host_dir(run_dir)
    assert (hd / "nsys" / "report.sqlite").exists() and (hd / "nsys-rep" / "report.nsys-rep").exists()
    meta = json.loads((hd / "meta.json").read_text())
    assert meta["nsys"]["stopped_on_hang"] and meta["nsys"]["export"].endswith("report.sqlite")


def test_the_export_is_fused_into_the_same_verdict(hung_run):
    from ranktrace.analyzers import api

    _tmp, run_dir, _res = hung_run
    v = json.loads((run_dir / "verdict.json").read_text())
    assert (v["status"], v["kind"], v["culprit_ranks"]) == ("hang", "missing_ranks", [1])
    an = api.analyze([run_dir], liveness=None)
    assert any(f.endswith("nsys/report.sqlite") for f in an.files)
    nsys_rows = [r for r in an.events.to_pylist() if r["source"] == "nsys"]
    # the export's pids are the ranks' pids: they take the ranks of the rings
    assert {r["rank"] for r in nsys_rows} >= {0, 1}
    gpus = [r["detail"] for r in an.observations.to_pylist() if r["kind"] == "gpu_device" and r["source"] == "nsys"]
    assert gpus and gpus[0].startswith("NVIDIA H100")


def test_the_device_checks_logic_passes_on_the_stand_in_run(hung_run):
    """bench/device_check_nsys.py's checks (the GPU-only ones aside) on the stand-in run: the real run on a GPU
    machine is judged by the same code."""
    import importlib.util

    from tests.helpers import REPO

    spec = importlib.util.spec_from_file_location("device_check_nsys", REPO / "bench" / "device_check_nsys.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["device_check_nsys"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    _tmp, run_dir, res = hung_run
    checks = mod.check_run(run_dir, res.returncode, res.stderr, gpus=2, standin=True)
    assert [c.name for c in checks if c.ok is False] == []
    assert sum(c.ok is True for c in checks) == 6


# --- a job that ends on its own; no nsys; an nsys too old ----------------------------------------------------------

def test_a_job_that_ends_gets_the_report_nsys_writes_at_exit(tmp_path: Path):
    run_dir = tmp_path / "run"
    res = run_trace(["run", "--nsys", "-o", str(run_dir), "--", PY, "-c", "print('done')"], timeout=120,
                    env=standin_env(tmp_path))
    assert res.returncode == 0 and "done" in res.stdout
    assert [c["call"] for c in calls(tmp_path)] == ["--version", "profile --help", "profile", "profile exit",
                                                    "export"]
    assert (host_dir(run_dir) / "nsys" / "report.sqlite").exists()


@pytest.mark.parametrize("case", ["missing", "too_old"])
def test_without_a_usable_nsys_one_line_and_the_run_goes_on(tmp_path: Path, case: str):
    run_dir = tmp_path / "run"
    if case == "missing":
        env = trace_env(PATH=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                             if not (Path(p) / "nsys").exists()))
        expect = "--nsys: nsys not found on PATH: running without Nsight Systems"
    else:
        env = standin_env(tmp_path, NSYS_STANDIN_VERSION="2022.4.2.18-32044902v0")
        expect = "--nsys: nsys 2022.4.2 is older than 2023.1"
    res = run_trace(["run", "--nsys", "-o", str(run_dir), "--", PY, "-c", "print('ran')"], timeout=120, env=env)
    assert res.returncode == 0 and "ran" in res.stdout
    lines = [x for x in res.stderr.splitlines() if x.startswith(("[ranktrace] --nsys", "[ranktrace] nsys"))]
    assert len(lines) == 1 and expect in lines[0], res.stderr
    assert not (host_dir(run_dir) / "nsys").exists()
    if case == "too_old":
        assert [c["call"] for c in calls(tmp_path)] == ["--version", "profile --help"]   # never profiled
