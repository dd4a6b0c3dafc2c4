"""One run across hosts (issue #19): the run id every node's ``trace run`` agrees on, the host label that names a
node's directory, and how a node joins a run directory another node may have made already.

``trace run`` on every node of a job writes into one run folder on a shared filesystem, ``<run>/<host>/``. For that
each node needs the same run folder without talking to the others: the run id, from ``--run-id`` (or
``RANKTRACE_RUN_ID``), else from the launcher's own job id —

* Slurm: ``SLURM_JOB_ID`` (and ``SLURM_STEP_ID``: every ``srun`` step is its own run) -> ``slurm-<job>.<step>``;
* torchrun: its ``--rdzv-id`` / ``--rdzv_id`` on the command line, or ``PET_RDZV_ID`` -> ``torchrun-<id>``;
* Kubernetes: a JobSet's ``JOBSET_NAME``, a Kubeflow PyTorchJob's ``MASTER_ADDR`` (``<job>-master-0``) -> ``k8s-<name>``
  (a plain Job: set ``RANKTRACE_RUN_ID`` from the pod's ``job-name`` label through the downward API).

A node claims ``<run>/<host>/`` by creating it (``mkdir``, atomic): it never writes into another host's directory.
The host is ``hostname-bootid`` (hostinfo.host_key), or ``--host-label`` / ``RANKTRACE_HOST`` where several
``trace run`` share one machine (a 2-"node" test on localhost); meta.json keeps the real key either way.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["RunId", "find_run_id", "host_label", "host_dir_name", "claim_run_dir", "RunDirError", "safe_name",
           "meta_fields"]

_TORCHRUN = re.compile(r"(^|/)(torchrun|torch\.distributed\.(run|launch))$")
_RDZV_ID = ("--rdzv-id", "--rdzv_id")
_KUBEFLOW_MASTER = re.compile(r"^(?P<job>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-master-\d+$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class RunDirError(Exception):
    """The run directory cannot be joined (another run's, or this host's place in it taken): exit 2."""


@dataclass(frozen=True)
class RunId:
    value: str
    source: str       # where it came from: "--run-id", "RANKTRACE_RUN_ID", "SLURM_JOB_ID", ...
    explicit: bool    # given by the user (a clash is an error) rather than taken from the launcher's job id

    @property
    def dir_name(self) -> str:
        return safe_name(self.value)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"


def find_run_id(option: str | None, env: Mapping[str, str], command: Sequence[str]) -> RunId | None:
    """The run id from the option, the environment or the launcher's job id; None for a run of its own."""
    if option:
        return RunId(option, "--run-id", True)
    if env.get("RANKTRACE_RUN_ID"):
        return RunId(env["RANKTRACE_RUN_ID"], "RANKTRACE_RUN_ID", True)
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job:
        step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
        return RunId(f"slurm-{job}" + (f".{step}" if step not in (None, "") else ""), "SLURM_JOB_ID", False)
    rdzv = _torchrun_rdzv_id(command) or (env.get("PET_RDZV_ID") if _is_torchrun(command) else None)
    if rdzv and rdzv.lower() != "none":
        return RunId(f"torchrun-{rdzv}", "torchrun --rdzv-id", False)
    if env.get("KUBERNETES_SERVICE_HOST"):
        if env.get("JOBSET_NAME"):
            return RunId(f"k8s-{env['JOBSET_NAME']}", "JOBSET_NAME", False)
        m = _KUBEFLOW_MASTER.match(env.get("MASTER_ADDR", ""))
        if m:
            return RunId(f"k8s-{m.group('job')}", "MASTER_ADDR (Kubeflow PyTorchJob)", False)
    return None


def _is_torchrun(command: Sequence[str]) -> bool:
    return any(_TORCHRUN.search(a) for a in command[:4])


def _torchrun_rdzv_id(command: Sequence[str]) -> str | None:
    """torchrun's --rdzv-id from its command line (torchrun, python -m torch.distributed.run / .launch)."""
    if not _is_torchrun(command):
        return None
    for i, a in enumerate(command):
        for flag in _RDZV_ID:
            if a == flag and i + 1 < len(command):
                return command[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        if not a.startswith("-") and a.endswith(".py"):  # the training script: its own arguments follow
            break
    return None


def host_label(option: str | None, env: Mapping[str, str]) -> str | None:
    """--host-label, else RANKTRACE_HOST; ValueError for a name that cannot be a directory name."""
    label = option or env.get("RANKTRACE_HOST") or None
    if label is not None and not _LABEL.match(label):
        raise ValueError(f"host label {label!r}: use letters, digits, '.', '_' and '-' (up to 128)")
    return label


def host_dir_name(label: str | None, env: Mapping[str, str]) -> str:
    """This trace run's directory in the run: its label, else the host key — and, when Slurm runs several tasks of
    the step on this node (``srun --ntasks-per-node=8 trace run -- python train.py``: one trace run per rank), the
    task's local id after it (``<host>.<localid>``), so the node's trace runs never share a directory. Reports show
    them as one host."""
    from ranktrace.tracer.launch import hostinfo

    if label:
        return label
    local = env.get("SLURM_LOCALID")
    # SLURM_TASKS_PER_NODE lists each node's task count, repeats as "(xN)": "2(x3),1" is 2, 2, 2, 1
    per_node = [int(m) for m in re.findall(r"\d+", re.sub(r"\(x\d+\)", "", env.get("SLURM_TASKS_PER_NODE", "")))]
    if local not in (None, "") and local.isdigit() and (max(per_node, default=1) > 1 or int(local) > 0):
        return f"{hostinfo.host_key()}.{local}"
    return hostinfo.host_key()


def claim_run_dir(first: Path, host: str, rid: RunId, *, exact: bool) -> tuple[Path, Path]:
    """Join (or make) the run directory `first` of run `rid` and claim ``<run>/<host>/`` in it.

    A run directory holding another run's host directories is refused. When this host's directory is there already
    (the same host ran this run id before: two ``trace run`` in one Slurm batch script), an id taken from the job is
    moved on to ``<id>-2``, ``<id>-3``, ... — every node does the same, so they stay together; an explicit id, or an
    exact directory (``-o``), is an error instead. Returns (run dir, host dir); raises RunDirError."""
    n = 1
    while True:
        run_dir = first if n == 1 else first.with_name(f"{first.name}-{n}")
        _check_same_run(run_dir, rid)
        run_dir.mkdir(parents=True, exist_ok=True)
        host_dir = run_dir / host
        try:
            host_dir.mkdir()  # the claim: atomic, also between nodes on a shared filesystem
            return run_dir, host_dir
        except FileExistsError:
            if rid.explicit or exact:
                raise RunDirError(f"{host_dir} exists: another trace run of run {rid.value!r} on this host "
                                  f"(give each a --host-label, or a new --run-id)") from None
        n += 1
        if n > 1000:
            raise RunDirError(f"{first}: no free run directory for run {rid.value!r}")


def _check_same_run(run_dir: Path, rid: RunId) -> None:
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise RunDirError(f"output directory {run_dir} exists and is not a directory")
    for d in run_dir.iterdir():
        meta = d / "meta.json"
        if not d.is_dir() or not meta.exists():
            continue  # run-level files, or a host dir another node is making right now
        try:
            theirs = json.loads(meta.read_text()).get("run_id")
        except (OSError, ValueError):
            continue
        if theirs != rid.value:
            raise RunDirError(f"output directory {run_dir} holds {d.name} of "
                              f"{'run ' + repr(theirs) if theirs else 'a run without a run id'}, not of run "
                              f"{rid.value!r}; ranktrace never mixes runs")


def meta_fields(rid: RunId | None, label: str | None) -> dict[str, object]:
    """What meta.json says of the run and the host: the run id and where it came from, the real host key (the
    directory may be named by a label), the label."""
    from ranktrace.tracer.launch import hostinfo

    return {"run_id": rid.value if rid else None, "run_id_from": rid.source if rid else None,
            "host_key": hostinfo.host_key(), "host_label": label, "clock": [hostinfo.clock_pair()]}
