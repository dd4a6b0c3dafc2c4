#!/usr/bin/env python3
"""Fetch the source of every release the shipped profiles pin (tracer/profiles/*.toml, [profile] releases) for
tests/test_profile_sources.py: `pip download --no-deps` of each wheel, then only the .py files the profiles name are
kept under .cache/releases/<pkg>-<ver>/ (a vLLM wheel is ~340 MB; what the test reads is ~2 MB) and the wheel is
deleted. A release already in the cache with the same file list is not fetched again.

    python .ci/fetch_releases.py [--cache DIR]

Exit 0 when every release is in the cache, 1 when some could not be fetched (no network, no wheel for this
Python): the test then skips those releases and says why. Never imports what it fetches.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_CACHE = REPO / ".cache" / "releases"


# what tests/test_bisect_knobs.py reads besides: each framework's argument parser and environment variables (a path
# ending in "/" keeps every .py file under it)
KNOB_FILES = {"sglang": {"sglang/srt/server_args.py", "sglang/srt/environ.py", "sglang/srt/arg_groups/arg_utils.py",
                         "sglang/srt/arg_groups/fields/"},
              "vllm": {"vllm/engine/arg_utils.py", "vllm/envs.py"}}


def knob_attr_files() -> dict[str, set[str]]:
    """pkg -> the files the knob catalogue's `attrs` name ("vllm/config/compilation.py:Class.field")."""
    import tomllib

    out: dict[str, set[str]] = {}

    def walk(x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "attrs" and isinstance(v, list):
                    for a in v:
                        path = str(a).partition(":")[0]
                        out.setdefault(path.split("/")[0], set()).add(path)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(tomllib.loads((REPO / "tracer" / "launch" / "bisect" / "knobs.toml").read_text()))
    return out


def wanted_files() -> dict[str, set[str]]:
    """pkg==ver -> the .py paths (module file or package __init__) the profiles' targets live in, and the files the
    knob catalogue's test reads."""
    import tomllib

    out: dict[str, set[str]] = {}
    for prof in sorted((REPO / "tracer" / "profiles").glob("*.toml")):
        data = tomllib.loads(prof.read_text())
        mods = {a.split(":")[0] for t in data.get("target", []) for a in t.get("targets", [])}
        for release in data.get("profile", {}).get("releases", []):
            pkg = release.split("==")[0]
            files = out.setdefault(release, set(KNOB_FILES.get(pkg, ())) | knob_attr_files().get(pkg, set()))
            for m in mods:
                if m.split(".")[0] == pkg:
                    base = m.replace(".", "/")
                    files.update({f"{base}.py", f"{base}/__init__.py"})
    return out


def fetch(release: str, files: set[str], cache: Path) -> str:
    pkg, ver = release.split("==")
    dest = cache / f"{pkg}-{ver}"
    stamp = hashlib.sha1("\n".join(sorted(files)).encode()).hexdigest()
    done = dest / ".complete.json"
    if done.exists() and json.loads(done.read_text()).get("files_sha1") == stamp:
        return "cached"
    with tempfile.TemporaryDirectory(prefix="rt-release-") as tmp:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                              "--quiet", "-d", tmp, release], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if res.returncode != 0 or not wheels:
            raise RuntimeError((res.stderr.strip().splitlines() or ["no wheel"])[-1])
        if dest.exists():
            shutil.rmtree(dest)
        kept = 0
        with zipfile.ZipFile(wheels[0]) as z:
            for name in z.namelist():
                if name.endswith("/"):
                    continue
                if name in files or any(f.endswith("/") and name.startswith(f) and name.endswith(".py")
                                         for f in files):
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(name))
                    kept += 1
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"release": release, "wheel": wheels[0].name, "wheel_bytes": wheels[0].stat().st_size,
                                    "files_sha1": stamp, "files_kept": kept}) + "\n")
        return f"{wheels[0].stat().st_size >> 20} MiB wheel, {kept} files kept"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = ap.parse_args()
    failed = 0
    t_all = time.monotonic()
    for release, files in sorted(wanted_files().items()):
        t0 = time.monotonic()
        try:
            what = fetch(release, files, args.cache)
        except Exception as e:  # no network, no wheel for this Python: the test skips this release and says so
            failed += 1
            (args.cache / "failed").mkdir(parents=True, exist_ok=True)
            (args.cache / "failed" / f"{release.replace('==', '-')}.txt").write_text(f"{type(e).__name__}: {e}\n")
            print(f"release sources: {release}: not fetched ({e})", flush=True)
            continue
        (args.cache / "failed" / f"{release.replace('==', '-')}.txt").unlink(missing_ok=True)
        print(f"release sources: {release}: {what} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"release sources: done in {time.monotonic() - t_all:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
