"""`pip install ranktrace` next to other projects called `tracer` and `analyzers` (both names are taken on PyPI,
issue #15). The wheel built from this tree holds the one top-level name `ranktrace`. In a fresh venv that already
has a `tracer` and an `analyzers` package, installing and then uninstalling ours leaves both of them importable
and byte-identical, and ours imports as `ranktrace.tracer` / `ranktrace.analyzers`."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"  # a copy: a build in the checkout would leave build/ and egg-info behind
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", ".cache", "traces",
                                                            "__pycache__", "*.egg-info", ".pytest_cache", "*.so"))
    res = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, src)
    if res.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {res.stderr.strip().splitlines()[-1:]}")
    (whl,) = out.glob("ranktrace-*.whl")
    return whl


def test_the_wheel_has_one_top_level_name(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ranktrace"}, tops
    names = zipfile.ZipFile(wheel).namelist()
    # what the injected tracer and the bisect need at run time travels with it
    assert "ranktrace/tracer/rank/_inject/sitecustomize.py" in names
    assert "ranktrace/tracer/rank/_fastspan.c" in names
    assert "ranktrace/tracer/launch/bisect/knobs.toml" in names
    assert any(n.startswith("ranktrace/tracer/profiles/") and n.endswith(".toml") for n in names)


def test_install_and_uninstall_leave_other_tracer_and_analyzers_alone(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    res = _run(sys.executable, "-m", "venv", venv)
    assert res.returncode == 0, res.stderr
    py = venv / "bin" / "python"
    purelib = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    others = {}
    for name in ("tracer", "analyzers"):  # as another project's wheel would have put them there
        pkg = purelib / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"OWNER = 'another project: {name}'\n")
        (pkg / "core.py").write_text("def hello():\n    return 'still here'\n")
        others[name] = {p.name: p.read_bytes() for p in pkg.iterdir()}
    res = _run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    assert res.returncode == 0, res.stderr
    check = ("import importlib, tracer, analyzers, tracer.core, analyzers.core\n"
             "print(tracer.OWNER, '|', analyzers.OWNER, '|', tracer.core.hello())\n"
             "import ranktrace.tracer.formats.ringformat as rf\n"
             "print(rf.__name__, rf.__file__.startswith(%r))\n" % str(purelib))
    got = _run(py, "-c", check, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["another project: tracer | another project: analyzers | still here",
                                       "ranktrace.tracer.formats.ringformat True"], got.stdout
    res = _run(py, "-m", "pip", "uninstall", "-q", "-y", "ranktrace")
    assert res.returncode == 0, res.stderr
    for name, files in others.items():
        assert {p.name: p.read_bytes() for p in (purelib / name).iterdir() if p.suffix == ".py"} == files
    assert not (purelib / "ranktrace").exists()

