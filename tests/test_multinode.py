"""One run across hosts (issue #19): every node's `trace run` writes into one run folder, `trace analyze` merges the
hosts into one verdict that names the global rank and its host, and the same verdict comes from host dirs copied
from each node or packed as tar files.

The real test is a 2-"node" torchrun job on localhost: two `trace run` processes with distinct host labels, 2 ranks
each (torchrun's static rendezvous: node 1 holds global ranks 2-3), one run folder (-o), the run id taken from
torchrun's --rdzv-id. Rank 3 skips an all_reduce and stalls; gloo's timeout ends the job.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, PY, REPO, TRACE, kill_group, run_trace, trace_env

from ranktrace.tracer.launch import runid


# --- run ids, host labels, joining a run dir -------------------------------------------------------------------

def test_run_id_from_option_env_and_launchers() -> None:
    find = runid.find_run_id
    assert find("exp-1", {"SLURM_JOB_ID": "9"}, ["python"]) == runid.RunId("exp-1", "--run-id", True)
    assert find(None, {"RANKTRACE_RUN_ID": "x"}, []).value == "x"
    assert find(None, {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0"}, ["python", "t.py"]).value == "slurm-4711.0"
    assert find(None, {"SLURM_JOB_ID": "4711"}, ["python", "t.py"]).explicit is False
    tr = ["torchrun", "--nnodes", "2", "--rdzv-id", "job42", "train.py", "--rdzv-id", "not-this-one"]
    assert find(None, {}, tr).value == "torchrun-job42"
    assert find(None, {}, ["python", "-m", "torch.distributed.run", "--rdzv_id=abc", "t.py"]).value == "torchrun-abc"
    assert find(None, {"PET_RDZV_ID": "pet"}, ["torchrun", "t.py"]).value == "torchrun-pet"
    assert find(None, {}, ["torchrun", "--rdzv-id", "none", "t.py"]) is None  # torchrun's own default
    assert find(None, {"PET_RDZV_ID": "pet"}, ["python", "t.py"]) is None     # not torchrun's job
    k8s = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert find(None, {**k8s, "JOBSET_NAME": "llm"}, ["python"]).value == "k8s-llm"
    assert find(None, {**k8s, "MASTER_ADDR": "bert-ft-master-0"}, ["python"]).value == "k8s-bert-ft"
    assert find(None, {"MASTER_ADDR": "bert-ft-master-0"}, ["python"]) is None  # not on Kubernetes
    assert find(None, {}, ["python", "t.py"]) is None


def test_host_label_must_be_a_directory_name() -> None:
    assert runid.host_label("node-4", {}) == "node-4"
    assert runid.host_label(None, {"RANKTRACE_HOST": "gpu07"}) == "gpu07"
    assert runid.host_label(None, {}) is None
    for bad in ("../x", "a/b", "", " node"):
        if bad:
            with pytest.raises(ValueError):
                runid.host_label(bad, {})


def test_slurm_tasks_of_one_node_get_their_own_host_dirs() -> None:
    from ranktrace.tracer.launch import hostinfo

    key, name = hostinfo.host_key(), runid.host_dir_name
    assert name("node-4", {"SLURM_LOCALID": "3", "SLURM_TASKS_PER_NODE": "8"}) == "node-4"  # a label wins
    assert name(None, {}) == key
    assert name(None, {"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x4)"}) == key  # one trace run per node
    assert name(None, {"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "8(x2)"}) == f"{key}.0"
    assert name(None, {"SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "1(x3),2"}) == f"{key}.1"


def test_nodes_join_one_run_dir_and_never_share_a_host_dir(tmp_path: Path) -> None:
    auto = runid.RunId("slurm-7.0", "SLURM_JOB_ID", False)
    run, h0 = runid.claim_run_dir(tmp_path / "slurm-7.0", "node-0", auto, exact=False)
    (h0 / "meta.json").write_text(json.dumps({"run_id": "slurm-7.0"}))
    run1, h1 = runid.claim_run_dir(tmp_path / "slurm-7.0", "node-1", auto, exact=False)
    assert run1 == run and h1 == run / "node-1"
    # node-0 again with the same job id (a second trace run in one batch script): the next run dir, not node-0's
    again, h0b = runid.claim_run_dir(tmp_path / "slurm-7.0", "node-0", auto, exact=False)
    assert again == tmp_path / "slurm-7.0-2" and h0b.is_dir()
    # an explicit id (or -o) never moves on: the clash is said
    explicit = runid.RunId("slurm-7.0", "--run-id", True)
    with pytest.raises(runid.RunDirError, match="host-label"):
        runid.claim_run_dir(tmp_path / "slurm-7.0", "node-1", explicit, exact=False)
    # another run's folder is refused, before anything is made in it
    other = runid.RunId("other", "--run-id", True)
    with pytest.raises(runid.RunDirError, match="never mixes runs"):
        runid.claim_run_dir(tmp_path / "slurm-7.0", "node-9", other, exact=True)
    assert not (tmp_path / "slurm-7.0" / "node-9").exists()


def test_trace_run_joins_with_run_id_and_records_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for label in ("node-a", "node-b"):
        res = run_trace(["run", "-o", str(run), "--run-id", "r1", "--host-label", label, "--no-analyze", "--",
                         PY, "-c", "print('hi')"], timeout=60)
        assert res.returncode == 0, res.stderr
    assert sorted(d.name for d in run.iterdir() if d.is_dir()) == ["node-a", "node-b"]
    meta = json.loads((run / "node-b" / "meta.json").read_text())
    assert (meta["run_id"], meta["run_id_from"], meta["host_label"]) == ("r1", "--run-id", "node-b")
    assert meta["host_key"] != "node-b" and meta["host"] == "node-b"
    assert meta["clock"][0]["mono_ns"] > 0 and meta["clock_end"]["wall_ns"] >= meta["clock"][0]["wall_ns"]
    # the same label again is a clash (exit 2, nothing overwritten); another run's id is refused
    for extra in (["--run-id", "r1", "--host-label", "node-a"], ["--run-id", "r2", "--host-label", "node-c"]):
        res = run_trace(["run", "-o", str(run), *extra, "--no-analyze", "--", PY, "-c", "pass"], timeout=60)
        assert res.returncode == 2, res.stderr
    assert sorted(d.name for d in run.iterdir() if d.is_dir()) == ["node-a", "node-b"]


# --- a real 2-node torchrun job on localhost ----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("twonode")
    run = base / "run"
    port = _free_port()
    procs = []
    for node in (0, 1):
        torchrun = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                    "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                    "--rdzv-id", "job42", "--max-restarts", "0", str(EXAMPLE), "--fault", "skip", "--steps", "6",
                    "--timeout", "12", "--hang-seconds", "20"]
        procs.append(subprocess.Popen(TRACE + ["run", "-o", str(run), "--host-label", f"node-{node}",
                                               "--hang-after", "3", "--", *torchrun],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=trace_env(),
                                      cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            kill_group(p)
    return {"run": run, "base": base, "nodes": outs}


def _verdict(paths: list[Path]) -> dict:
    res = run_trace(["analyze", "--json", *map(str, paths)], timeout=120)
    assert res.returncode == 3, res.stderr
    return json.loads(res.stdout)


def _gist(v: dict) -> tuple:
    op = v["operation"] or {}
    return (v["status"], v["kind"], op.get("name"), op.get("seq"), v["culprit_ranks"], v["waiting_ranks"],
            v["summary"], [(h["host"], h["ranks"]) for h in v["hosts"]])


def test_two_node_torchrun_one_run_folder_one_merged_verdict(two_nodes: dict) -> None:
    run = two_nodes["run"]
    assert sorted(d.name for d in run.iterdir() if d.is_dir()) == ["node-0", "node-1"]
    for node, (code, _out, err) in enumerate(two_nodes["nodes"]):
        assert code == 1, err[-3000:]                      # torchrun's own status: its workers failed
        assert " s silent: " in err, err[-3000:]           # each node's watchdog said its local silence
        meta = json.loads((run / f"node-{node}" / "meta.json").read_text())
        assert (meta["run_id"], meta["run_id_from"]) == ("torchrun-job42", "torchrun --rdzv-id")
        assert {i["rank"] for i in meta["pids"].values() if i["rank"] is not None} == {2 * node, 2 * node + 1}
    v = _verdict([run])
    assert _gist(v)[:6] == ("crashed", "missing_ranks", "all_reduce", 5, [3], [0, 1, 2])
    assert v["summary"].endswith("Culprit: rank 3 on node-1.")
    hosts = {h["host"]: h for h in v["hosts"]}
    assert hosts["node-0"]["ranks"] == [0, 1] and hosts["node-1"]["ranks"] == [2, 3]
    assert hosts["node-0"]["clock_basis"] == "reference"
    # one machine, one clock: the estimate says so within its own error bar
    node1 = hosts["node-1"]
    assert node1["clock_basis"] == "collectives" and node1["clock_ops"] >= 3
    assert abs(node1["clock_offset_ns"]) <= node1["clock_error_ns"] + 1000
    assert v["ranks"]["3"]["host"] == "node-1" and v["ranks"]["0"]["host"] == "node-0"
    # the text names the host too
    text = run_trace(["analyze", str(run)], timeout=120).stdout
    assert "culprit ranks: 3 (on node-1)" in text and "hosts: 2 (node-0 ranks 0-1, node-1 ranks 2-3)" in text


def test_copied_host_dirs_and_tar_files_give_the_same_verdict(two_nodes: dict) -> None:
    run, base = two_nodes["run"], two_nodes["base"]
    whole = _gist(_verdict([run]))
    copies = []
    for node in (0, 1):  # each host's dir copied off "its" node into a folder of its own
        dest = base / f"copy-{node}" / f"node-{node}"
        shutil.copytree(run / f"node-{node}", dest, ignore=shutil.ignore_patterns("*.sock"))
        copies.append(dest)
    assert _gist(_verdict(copies)) == whole
    tars = []
    for node, (name, mode) in enumerate((("node-0.tar", "w"), ("node-1.tgz", "w:gz"))):
        tar = base / name
        with tarfile.open(tar, mode) as t:
            t.add(copies[node], arcname=f"node-{node}")
        tars.append(tar)
    assert _gist(_verdict(tars)) == whole


def test_srun_one_trace_run_per_rank_makes_one_run_folder(tmp_path: Path) -> None:
    """The Slurm recipe without Slurm: `srun --ntasks-per-node=2 trace run -- python train.py` starts one trace run
    per task with srun's environment (job and step id, the task's local id); the script takes its rank from it.
    Both write into traces/slurm-<job>.<step>/, each in its own <host>.<task> directory, and one verdict names the
    rank that skipped an all_reduce."""
    from ranktrace.tracer.launch import hostinfo

    port = _free_port()
    procs = []
    for task in (0, 1):
        env = trace_env(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_LOCALID=str(task), SLURM_PROCID=str(task),
                        SLURM_TASKS_PER_NODE="2", SLURM_NTASKS="2", RANK=str(task), WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(TRACE + ["run", "--hang-after", "3", "--", PY, str(EXAMPLE), "--fault", "skip",
                                               "--steps", "5", "--timeout", "8", "--hang-seconds", "15"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      cwd=tmp_path, stdin=subprocess.DEVNULL, start_new_session=True))
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            kill_group(p)
    run = tmp_path / "traces" / "slurm-4242.0"
    key = hostinfo.host_key()
    assert sorted(d.name for d in run.iterdir() if d.is_dir()) == [f"{key}.0", f"{key}.1"], errs[0][-2000:]
    v = _verdict([run])
    assert (v["kind"], v["culprit_ranks"], v["waiting_ranks"]) == ("missing_ranks", [1], [0])
    (host,) = v["hosts"]  # two task directories of one machine: one host
    assert host["ranks"] == [0, 1] and v["summary"].endswith(f"Culprit: rank 1 on {host['host']}.")
