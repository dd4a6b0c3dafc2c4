"""analyzers/readers/nvidia_smi on nvidia-smi tables and topo matrices of several driver generations."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.analyzers.readers import nvidia_smi
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, rows

DATA = REPO / "tests" / "data" / "readers" / "nvidia_smi"


def _read(name: str) -> nvidia_smi.ReadResult:
    path = DATA / name
    result = nvidia_smi.read(path)
    check_contract(result, "nvidia_smi", "nvidia_smi", path)
    assert result.events.num_rows == 0
    assert set(result.observations.column("kind").to_pylist()) <= set(nvidia_smi.OBSERVATION_KINDS)
    return result


def test_declared_mapping_names_real_columns() -> None:
    check_field_map(nvidia_smi)
    assert nvidia_smi.FORMAT == "nvidia_smi"


class TestSniff:
    @pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.name)
    def test_fixtures(self, path: Path) -> None:
        assert nvidia_smi.sniff(path, path.read_bytes()[:65536])

    def test_other_text(self, tmp_path: Path) -> None:
        f = tmp_path / "x.log"
        f.write_text("GPU 0 is fine\n| a | b |\n")
        assert not nvidia_smi.sniff(f, f.read_bytes())


class TestDefaultTable:
    def test_wide_560_table_processes_and_topology(self) -> None:
        result = _read("h100_560_with_topo.txt")
        assert result.version == "driver 560.35.03, CUDA 12.6"
        obs = result.observations
        assert {r["name"]: r["value"] for r in rows(obs, kind="gpu_util")} == {"0": 100, "1": 100, "2": 100, "3": 0}
        mem = {r["name"]: (r["value"], r["detail"]) for r in rows(obs, kind="gpu_memory")}
        assert mem["3"] == (70110, "total 81559 MiB")
        assert rows(obs, kind="gpu_util", name="0")[0]["detail"] == "NVIDIA H100 80GB HBM3"
        procs = {r["pid"]: (r["name"], r["value"]) for r in rows(obs, kind="gpu_process")}
        assert procs == {4101: ("0", 71224), 4102: ("1", 71224), 4103: ("2", 71224), 4104: ("3", 71224),
                         4177: ("3", None)}
        assert rows(obs, kind="gpu_process", pid=4177)[0]["detail"] == "/usr/lib/xorg/Xorg (type G)"
        assert {r["wall_ns"] for r in obs.to_pylist()} == {1741083302 * 10**9}   # Tue Mar  4 10:15:02 2025
        topo = rows(obs, kind="topology")
        assert [(r["detail"], r["value"]) for r in topo] == [("nvlink", 4)]
        links = {r["name"]: (r["detail"], r["value"]) for r in rows(obs, kind="topology_link")}
        assert len(links) == 6 and links["GPU0-GPU3"] == ("NV18", 18)

    def test_two_snapshots_old_layout(self) -> None:
        result = _read("v100_450_two_snapshots.txt")
        util = rows(result.observations, kind="gpu_util")
        assert [(r["name"], r["value"]) for r in util] == [("0", 100), ("1", 0), ("0", 100), ("1", 0)]
        assert len({r["wall_ns"] for r in util}) == 2
        assert util[0]["detail"] == "Tesla V100-SXM2..."
        assert {(r["pid"], r["name"]) for r in rows(result.observations, kind="gpu_process")} == {
            (22100, "0"), (22101, "1")}

    def test_pre_450_process_table_and_torn_rows(self) -> None:
        result = _read("p100_418_torn.txt")
        assert [(r["name"], r["value"]) for r in rows(result.observations, kind="gpu_memory")] == [("0", 311)]
        assert [(r["pid"], r["value"]) for r in rows(result.observations, kind="gpu_process")] == [(31337, 301)]
        reasons = sorted((s.line, s.reason) for s in result.skipped)
        assert reasons[0] == (10, "GPU 1: no memory/utilisation row after it")
        assert reasons[1][0] == 19 and "unparsed process row" in reasons[1][1]


class TestTopology:
    def test_pcie_copied_with_spaces(self) -> None:
        result = _read("topo_pcie_spaces.txt")
        obs = result.observations
        assert [(r["detail"], r["value"]) for r in rows(obs, kind="topology")] == [("pcie", 4)]
        links = {r["name"]: r["detail"] for r in rows(obs, kind="topology_link")}
        assert links == {"GPU0-GPU1": "PIX", "GPU0-GPU2": "SYS", "GPU0-GPU3": "SYS", "GPU1-GPU2": "SYS",
                         "GPU1-GPU3": "SYS", "GPU2-GPU3": "PIX"}
        assert result.version is None

    def test_mixed(self) -> None:
        obs = _read("topo_mixed.txt").observations
        assert rows(obs, kind="topology")[0]["detail"] == "mixed"
        assert rows(obs, kind="topology_link", name="GPU2-GPU3")[0]["value"] == 4


class TestBadInput:
    def test_not_nvidia_smi(self, tmp_path: Path) -> None:
        f = tmp_path / "smi.txt"
        f.write_text("No devices were found\n")
        with pytest.raises(ReaderError, match="no nvidia-smi table") as e:
            nvidia_smi.read(f)
        assert e.value.file == str(f)

    def test_empty_and_missing(self, tmp_path: Path) -> None:
        f = tmp_path / "empty.txt"
        f.touch()
        with pytest.raises(ReaderError):
            nvidia_smi.read(f)
        with pytest.raises(ReaderError, match="cannot open"):
            nvidia_smi.read(tmp_path / "missing.txt")

    def test_cut_in_half_never_raises(self, tmp_path: Path) -> None:
        text = (DATA / "h100_560_with_topo.txt").read_text()
        f = tmp_path / "cut.txt"
        f.write_text(text[: len(text) // 2])
        result = nvidia_smi.read(f)
        assert rows(result.observations, kind="gpu_util")
