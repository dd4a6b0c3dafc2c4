"""ranktrace's own helper processes never run the user's sitecustomize (issue #31): it may print, hang or import
the job's world. The GPU sampler child is started with -s and an empty sitecustomize first on its path; the job
itself still gets the user's (ranktrace's own sitecustomize chains to it)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ranktrace.tracer.watch.gpu_sampler import GpuSampler


def test_the_gpu_sampler_child_does_not_run_the_users_sitecustomize(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "usersite"
    site.mkdir()
    mark = tmp_path / "ran.txt"
    (site / "sitecustomize.py").write_text(f"open({str(mark)!r}, 'a').write('ran\\n')\n")
    monkeypatch.setenv("PYTHONPATH", str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.system(f"{sys.executable} -c pass")  # the user's sitecustomize does run in a plain python of theirs
    assert mark.read_text() == "ran\n"
    mark.unlink()
    said: list[str] = []
    g = GpuSampler(log=said.append, timeout_s=10.0)
    g.start()
    try:
        hello = g.wait_hello(10.0)  # the child got past its start-up (and with it, site and sitecustomize)
    finally:
        g.close()
    assert hello is not None or said, "the sampler child never answered"
    assert not mark.exists(), mark.read_text()
