"""nccl_log's statement rows (docs/EVIDENCE.md): completion per Destroy COMPLETE, init_failure / transport_error
for bootstrap, socket and CUDA failures, on excerpts posted in public threads and the field corpus."""
from __future__ import annotations

from pathlib import Path

from ranktrace.analyzers.readers import catalogue, nccl_log
from ranktrace.analyzers.readers.text import open_text, text_of_bytes
from tests.readers.shared_reader_checks import REPO, rows

FIX = REPO / "tests" / "data" / "readers" / "nccl"
FIELD = REPO / "tests" / "field"
_KINDS = ("completion", "init_failure", "transport_error")


def _statements(res) -> list[tuple]:
    return [(r["kind"], r["name"], r["pid"], r["rank"], r["line"]) for r in res.observations.to_pylist()
            if r["kind"] in _KINDS]


def _doc(path: Path):
    doc = open_text(path)
    assert "nccl_log" in catalogue.scan(doc).families
    return nccl_log.read_doc(doc)


def test_destroy_complete_is_a_completion_per_rank() -> None:
    res = _doc(FIELD / "aks-rdma-30" / "mpijob.log")
    got = [(k, n, r) for k, n, _, r, _ in _statements(res)]
    assert got == [("completion", "nccl_destroy", r) for r in (15, 1, 13, 14, 6, 5, 7)]
    assert rows(res.observations, kind="completion")[0]["detail"].endswith("- Destroy COMPLETE")
    assert len(rows(res.observations, kind="nccl_destroy")) == 7          # the older rows stay


def test_old_nccl_2_2_lines_without_the_word_nccl() -> None:
    res = _doc(FIELD / "nccltests-15" / "out.txt")
    assert _statements(res) == [("init_failure", "connect", 18553, None, 10)]
    (row,) = rows(res.observations, kind="init_failure")
    assert row["detail"] == "include/socket.h:360: Call to connect failed : Connection timed out"
    assert res.version == "2.2.13+cuda9.0"
    assert any(r["kind"] == "nccl_warn" and r["name"] == "include/socket.h:371" for r in res.observations.to_pylist())


def test_bootstrap_trails_and_socket_connect_abort_before_init() -> None:
    res = nccl_log.read(FIX / "bootstrap_connect_abort.log")
    got = _statements(res)
    # one row per process: the first bootstrap trail of each rank, the WARN of pid 12251
    assert ("init_failure", "nccl_init", 12253, None, 1) in got
    assert ("init_failure", "nccl_init", 12246, None, 13) in got
    assert ("init_failure", "connect", 12251, None, 17) in got
    assert {k for k, *_ in got} == {"init_failure"}
    assert len([g for g in got if g[2] == 12251]) == 1                  # its later trail adds no row


def test_cuda_failure_is_a_cuda_transport_error() -> None:
    res = _doc(FIX / "ray_peer_access.log")
    assert _statements(res) == [("transport_error", "cuda_error", 909608, None, 8)]
    assert "peer access is not supported" in rows(res.observations, kind="transport_error")[0]["detail"]


def test_failure_after_init_complete_is_a_transport_error() -> None:
    text = ("h:1:2 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1000 commId 0xabc - Init START\n"
            "h:1:2 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1000 commId 0xabc - Init COMPLETE\n"
            "h:1:9 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node2<42830>\n"
            "h:3:4 [1] NCCL INFO Call to connect returned Connection refused, retrying\n"
            "h:3:4 [1] NCCL INFO Call to connect returned Connection refused, retrying\n"
            "h:1:2 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE\n")
    res = nccl_log.read_doc(text_of_bytes("x.log", text.encode()))
    assert _statements(res) == [("transport_error", "nccl_warn", 1, None, 3), ("init_failure", "connect", 3, None, 4),
                                ("completion", "nccl_destroy", 1, 0, 6)]


def test_socket_poll_connect_retries_are_a_connect_failure() -> None:
    # NCCL 2.19+: "socketPollConnect: connect returned No route to host, retrying (26/34) after sleep for 2600 msec"
    res = _doc(FIELD / "llamafactory-8045" / "worker_node.log")
    assert _statements(res) == [("init_failure", "connect", 1183664, None, 1)]
