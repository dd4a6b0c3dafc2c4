"""analyzers/readers/env_versions on collect_env / pip / NCCL version lines and environment settings."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import catalogue, env_versions
from ranktrace.analyzers.readers.base import ReaderError
from ranktrace.analyzers.readers.text import Line, LinePrefix, TextDoc, open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map

DATA = REPO / "tests" / "data" / "readers" / "env_versions"
FIELD = REPO / "tests" / "field"


def _read(path: Path) -> env_versions.ReadResult:
    doc = open_text(path)
    assert "env_versions" in catalogue.scan(doc).families
    res = env_versions.read_doc(doc)
    check_contract(res, "env_versions", "env_versions", path)
    return res


def _facts(res) -> list[tuple[str, str, str, int]]:
    return [(r["kind"], r["name"], r["detail"], r["line"]) for r in res.observations.to_pylist()]


def test_declared_mapping() -> None:
    check_field_map(env_versions)


def test_collect_env_rocm_skips_unknown_values() -> None:
    res = _read(DATA / "collect_env_rocm.txt")
    assert _facts(res) == [("version", "torch", "1.7.0a0+9ddd3df", 2), ("version", "python", "3.6", 12),
                           ("version", "torch", "1.7.0a0+a9603c7", 23)]
    assert res.version == "1.7.0a0+9ddd3df"


def test_collect_env_windows() -> None:
    got = {(n, d) for _, n, d, _ in _facts(_read(DATA / "collect_env_windows.txt"))}
    assert got == {("torch", "2.7.0+cu126"), ("torch_cuda", "12.6"), ("python", "3.10.17"), ("cuda", "12.3.107"),
                   ("driver", "560.94")}


def test_pip3_list_names_nccl_wheel() -> None:
    got = [(n, d) for _, n, d, _ in _facts(_read(DATA / "vllm_pip3_nccl.txt"))]
    assert got == [("nccl", "2.19.3"), ("torch", "2.2.1"), ("triton", "2.2.0")]


@pytest.mark.parametrize("case,version,line", [("pytorch-131781-b", "2.20.5", 15), ("hami-2641", "2.28.9", 1),
                                               ("nccltests-15", "2.2.13+cuda9.0", 7)])
def test_field_nccl_versions(case: str, version: str, line: int) -> None:
    (path,) = [p for p in (FIELD / case).iterdir() if p.name != "case.json"]
    assert ("version", "nccl", version, line) in _facts(_read(path))


def test_settings_before_a_command_count_after_it_do_not() -> None:
    text = ("$ env | grep NCCL\nNCCL_DEBUG=INFO\nNCCL_IB_HCA=mlx5_0,mlx5_1\n"
            "export NCCL_P2P_DISABLE=1\ndeclare -x NCCL_SOCKET_IFNAME=\"eth0\"\n"
            "user@h:~/nccl-tests$ NCCL_ALGO=Ring TORCH_NCCL_BLOCKING_WAIT=1 ./build/all_reduce_perf -g 2\n"
            "user@h:~/nccl-tests$ ./build/all_reduce_perf -g 2 NCCL_PROTO=Simple\n"
            "export HF_TOKEN=hf_abcdefghijklmnopqrstu VLLM_API_KEY=supersecret\n"
            "h:1:2 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ib0\n")
    res = env_versions.read_doc(text_of_bytes("env.txt", text.encode()))
    got = [(n, d, ln) for k, n, d, ln in _facts(res)]
    assert got == [("NCCL_DEBUG", "INFO", 2), ("NCCL_IB_HCA", "mlx5_0,mlx5_1", 3), ("NCCL_P2P_DISABLE", "1", 4),
                   ("NCCL_SOCKET_IFNAME", "eth0", 5), ("NCCL_ALGO", "Ring", 6), ("TORCH_NCCL_BLOCKING_WAIT", "1", 6),
                   ("VLLM_API_KEY", "<redacted>", 8), ("NCCL_SOCKET_IFNAME", "ib0", 9)]
    assert "supersecret" not in str(res.observations.to_pylist()) and "hf_abc" not in str(res.observations.to_pylist())


def test_pip_list_freeze_and_install_lines() -> None:
    text = ("Package    Version\n---------- -------\ntorch      2.3.1\nnumpy      1.26.4\ndeepspeed==0.14.2\n"
            "Successfully installed sglang-0.4.1 flashinfer-python-0.2.0 numpy-2.0\n")
    got = [(n, d) for _, n, d, _ in _facts(env_versions.read_doc(text_of_bytes("p.txt", text.encode())))]
    assert got == [("torch", "2.3.1"), ("deepspeed", "0.14.2"), ("sglang", "0.4.1"), ("flashinfer", "0.2.0")]


def test_nothing_stated() -> None:
    with pytest.raises(ReaderError):
        env_versions.read_doc(text_of_bytes("x.txt", b"hello\nPyTorch version: N/A\nFOO=1\n"))


def test_one_megabyte_line_takes_milliseconds() -> None:
    line = "NCCL_X=1 " * 100_000 + "NCCL version " * 10_000 + "=" * 100_000
    doc = TextDoc("big.txt", [Line(1, line, LinePrefix(), "")])
    t = time.perf_counter()
    catalogue.scan(doc)
    env_versions.read_doc(doc)
    assert time.perf_counter() - t < 0.5
