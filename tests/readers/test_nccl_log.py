"""NCCL debug-log reader: the real nccl-tests sample, launcher prefixes, torn / truncated / binary / empty /
mixed-encoding files, seq rules, and the two NCCL scenarios the verdict tests use."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ranktrace.analyzers.readers import nccl_log
from ranktrace.analyzers.readers.nccl_log import interpret as nccl_log_interpret, scan as nccl_log_scan
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import check_contract, rows

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "data" / "readers" / "nccl"
SCEN = HERE.parent / "data" / "scenarios"


def read(path: Path) -> Any:
    result = nccl_log.read(path)
    check_contract(result, "nccl_log", "nccl", path)
    return result


def sniff(path: Path) -> bool:
    return nccl_log.sniff(path, path.read_bytes()[:65536])


# ---------------------------------------------------------------------------------------- the real sample

@pytest.fixture(scope="module")
def sample(shared_data: Path) -> Any:
    path = shared_data / "external" / "nccl-tests-Timez-zx" / "nccl.log"
    assert sniff(path)
    return read(path)


def test_sample_version_world_and_both_ranks_of_one_communicator(sample: Any) -> None:
    assert sample.version == "2.27.7+cuda13.0"
    assert sample.world_size == 2
    starts = rows(sample.observations, kind="nccl_init_start")
    done = rows(sample.observations, kind="nccl_init_complete")
    # one process drives two GPUs: two comm pointers, one commId
    assert sorted((r["rank"], r["name"]) for r in starts) == [(0, "0x55b6aa64a990"), (1, "0x55b6aa754530")]
    assert {r["group"] for r in starts + done} == {"0x54fe282d32a87d85"}
    assert {r["value"] for r in done} == {2}
    assert "nNodes=1" in done[0]["detail"] and "localRanks=2" in done[0]["detail"]
    assert sorted(r["rank"] for r in rows(sample.observations, kind="nccl_destroy")) == [0, 1]


def test_sample_coll_lines_with_frozen_opcount_are_numbered_per_communicator(sample: Any) -> None:
    ev = sample.events
    assert ev.num_rows == 990  # every "AllReduce: opCount" line of the file
    for rank in (0, 1):
        mine = rows(ev, rank=rank)
        assert [r["seq"] for r in mine] == list(range(1, 496))
        assert {r["backend_seq"] for r in mine} == {0}  # opCount stays 0 on NCCL 2.27 (formats.md §1.6)
        assert {(r["name"], r["category"], r["group"], r["dtype"]) for r in mine} == {
            ("all_reduce", "collective", "0x54fe282d32a87d85", "float32")}
    first = rows(ev, line=523)[0]
    assert (first["kind"], first["host"], first["pid"], first["nbytes"]) == ("enter", "mew0", 64904, 8388608)
    assert rows(sample.observations, kind="nccl_seq_basis")[0]["detail"] == "line"


def test_sample_line_glued_behind_a_result_table_row_keeps_its_host(sample: Any) -> None:
    glued = rows(sample.events, line=1666)  # "...  -1mew0:64904:64904 [1] NCCL INFO AllReduce: ..."
    assert len(glued) == 1 and glued[0]["host"] == "mew0" and glued[0]["rank"] == 0
    assert not sample.skipped


def test_sample_transports_and_topology(sample: Any) -> None:
    tr = rows(sample.observations, kind="nccl_transport")
    assert sorted((r["name"], r["detail"], r["value"]) for r in tr) == [
        ("0->1", "P2P/direct", 24), ("1->0", "P2P/direct", 24)]
    names = {r["name"] for r in rows(sample.observations, kind="nccl_topology")}
    assert {"summary", "ring", "tree", "channels"} <= names


def test_sample_settings_and_tuning_what_nccl_decided(sample: Any) -> None:
    """ENV echo lines, the network, the P2P type check, ring PXN/GDR, the driver's CUDA version, and the TUNING
    lines counted per op and algorithm/protocol (495 AllReduce calls, all RING/SIMPLE)."""
    got = {(r["name"], r["detail"]) for r in rows(sample.observations, kind="nccl_setting")}
    assert {("cuda_driver", "13.0"), ("network", "IB"), ("NCCL_TOPO_DUMP_FILE", "nccl_topo_dump.xml"),
            ("ring_pxn_gdr", "PXN 0 GDR 1"), ("p2p_type", "isAllDirectP2p 1 directMode 1")} <= got
    tuning = rows(sample.observations, kind="nccl_tuning")
    assert [(r["name"], r["detail"], r["value"]) for r in tuning] == [
        ("all_reduce", "RING/SIMPLE bytes=8388608..8589934592", 495)]


def test_setting_lines_of_real_logs_from_issue_threads(tmp_path: Path) -> None:
    pairs = HERE.parent / "data" / "nccl_pairs"
    b200 = rows(read(pairs / "b200_vs_a100" / "a_b200_nvls.log").observations, kind="nccl_setting")
    assert {(r["name"], r["detail"]) for r in b200} >= {("nvls_multicast dev 0", "available"),
                                                      ("p2p_type", "intraNodeP2pSupport 1 directMode 0")}
    path = tmp_path / "numeric_tuning.log"
    path.write_text("h:1:2 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to LOC\n"
                    "h:1:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
                    "h:1:2 [0] NCCL INFO P2P is disabled between connected GPUs 6 and 7. You can repress this message "
                    "with NCCL_IGNORE_DISABLED_P2P=1.\n"
                    "h:1:2 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 0 time 12.500000\n"
                    "h:1:2 [0] NCCL INFO AllReduce: 65536 Bytes -> Algo 0 proto 2 time 30.100000\n")
    res = read(path)
    got = {(r["name"], r["detail"]) for r in rows(res.observations, kind="nccl_setting")}
    assert got == {("NCCL_P2P_LEVEL", "LOC"), ("NCCL_IB_DISABLE", "1"), ("p2p_disabled", "GPU 6 - GPU 7")}
    tuning = sorted((r["detail"], r["value"]) for r in rows(res.observations, kind="nccl_tuning"))
    assert tuning == [("RING/LL bytes=4096..4096", 1), ("TREE/SIMPLE bytes=65536..65536", 1)]


# ---------------------------------------------------------------------------------------- fixtures

def test_launcher_prefixes_and_glued_progress_bar() -> None:
    r = read(FIX / "prefixes.log")
    assert sniff(FIX / "prefixes.log")
    assert r.world_size == 2 and r.version == "2.26.2+cuda12.8"
    ev = r.events
    assert {x["host"] for x in ev.to_pylist()} == {"worker-a"}
    assert [(x["rank"], x["name"], x["seq"]) for x in rows(ev, category="collective")] == [
        (0, "all_reduce", 1), (1, "all_reduce", 1), (0, "broadcast", 2), (1, "broadcast", 2), (0, "all_reduce", 3)]
    bc = rows(ev, name="broadcast")
    assert bc[0]["line"] == 16 and "root=1" in bc[0]["detail"] and bc[0]["dtype"] == "bfloat16"
    # p2p counts per (communicator, src, dst): rank 0's first Send and rank 1's Recv from 0 share seq 1
    p2p = [(x["rank"], x["name"], x["peer"], x["seq"]) for x in rows(ev, category="p2p")]
    assert p2p == [(0, "send", 1, 1), (1, "recv", 0, 1), (0, "send", 1, 2)]
    assert {x["group"] for x in ev.to_pylist()} == {"0xc0ffee0012345678"}


def test_warn_lines_timestamps_error_trail_and_transports() -> None:
    r = read(FIX / "prefixes.log")
    warns = rows(r.observations, kind="nccl_warn")
    assert [(w["line"], w["name"]) for w in warns] == [
        (23, "misc/socket.cc:71"), (24, "misc/socket.cc:80"), (25, "transport/net_ib.cc:2112")]
    assert warns[0]["detail"].startswith("socketProgress: Connection closed by remote peer")
    assert warns[0]["wall_ns"] == 1746094272 * 10**9  # [2025-05-01 10:11:12], read as UTC
    assert warns[1]["value"] == 6  # "-> 6": ncclRemoteError
    tr = {(t["name"], t["detail"]) for t in rows(r.observations, kind="nccl_transport")}
    assert tr == {("0->1", "P2P/IPC"), ("1->0", "SHM")}


def test_torn_and_interleaved_lines_are_skipped_not_fatal() -> None:
    r = read(FIX / "torn.log")
    got = [(x["line"], x["rank"], x["seq"], x["nbytes"]) for x in r.events.to_pylist()]
    # line 5 holds two records glued together: both are read
    assert got == [(5, 0, 1, 64), (5, 1, 1, 64), (9, 1, 2, 256), (10, 0, 2, 256)]
    assert {x["host"] for x in r.events.to_pylist()} == {"node7"}
    torn = {s.line: s.reason for s in r.skipped}
    assert set(torn) == {6, 8}
    assert all("torn" in reason for reason in torn.values())


def test_truncated_file_keeps_what_came_before_the_cut() -> None:
    r = read(FIX / "truncated.log")
    assert [(x["rank"], x["seq"]) for x in r.events.to_pylist()] == [(0, 1)]
    assert [s.line for s in r.skipped] == [6]
    assert len(rows(r.observations, kind="nccl_init_complete")) == 2


def test_log_without_init_lines_uses_opcount_and_says_so() -> None:
    r = read(FIX / "no_init.log")
    ev = r.events.to_pylist()
    assert [(x["group"], x["seq"], x["backend_seq"], x["rank"]) for x in ev] == [
        ("comm:0x55d0c0de0000", 417, 416, None), ("comm:0x55d0c0de0000", 418, 417, None),
        ("comm:0x55d0c0de0000", 419, 418, None)]
    assert rows(r.observations, kind="nccl_seq_basis")[0]["detail"] == "opcount"
    reasons = " ".join(s.reason for s in r.skipped)
    assert "no Init line" in reasons and "opCount + 1" in reasons


def test_nccl_2_18_shapes_bare_version_and_complete_without_start() -> None:
    r = read(FIX / "old_2_18.log")
    assert r.version == "2.18.1+cuda12.1"
    assert not rows(r.observations, kind="nccl_init_start")
    done = rows(r.observations, kind="nccl_init_complete")
    assert [(d["rank"], d["group"]) for d in done] == [(0, "0xabcdef0123")]
    assert [(x["seq"], x["backend_seq"], x["dtype"]) for x in r.events.to_pylist()] == [
        (1, 0, "float64"), (2, 1, "float64")]
    assert {t["detail"] for t in rows(r.observations, kind="nccl_transport")} == {"P2P/direct", "NET/Socket"}


def test_split_communicator_is_grouped_by_parent_and_color_and_is_comm_local() -> None:
    r = read(FIX / "split.log")
    assert r.world_size == 4
    child = "split:0x77aa88bb99cc0011:0"
    assert [(x["group"], x["seq"]) for x in r.events.to_pylist()] == [
        ("0x77aa88bb99cc0011", 1), (child, 1), ("0x77aa88bb99cc0011", 2)]
    space = rows(r.observations, kind="rank_space")
    assert [(s["group"], s["detail"], s["value"]) for s in space] == [(child, f"comm:{child}", 2)]


def test_mixed_encodings_are_decoded_with_replacement_and_noted() -> None:
    r = read(FIX / "mixed_encoding.log")
    assert r.events.num_rows == 1
    assert any("UTF-8" in s.reason and s.line == 1 for s in r.skipped)
    warn = rows(r.observations, kind="nccl_warn")[0]
    assert "\ufffd" in warn["detail"]


def test_empty_and_binary_files() -> None:
    assert not sniff(FIX / "empty.log")
    r = nccl_log.read(FIX / "empty.log")
    assert r.events.num_rows == 0 and [s.reason for s in r.skipped] == ["empty file"]
    assert not sniff(FIX / "binary.bin")
    with pytest.raises(ReaderError):
        nccl_log.read(FIX / "binary.bin")


def test_text_without_nccl_lines_is_not_an_nccl_log(tmp_path: Path) -> None:
    p = tmp_path / "train.log"
    p.write_text("epoch 1 loss 2.0\nepoch 2 loss 1.5\n")
    assert not sniff(p)
    with pytest.raises(ReaderError):
        nccl_log.read(p)


def test_missing_file_raises_reader_error(tmp_path: Path) -> None:
    with pytest.raises(ReaderError):
        nccl_log.read(tmp_path / "nope.log")


def test_chunk_boundaries_do_not_change_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = read(FIX / "prefixes.log")
    monkeypatch.setattr(nccl_log_scan, "_CHUNK", 97)  # cut the file in many pieces, mid-line
    cut = nccl_log.read(FIX / "prefixes.log")
    assert cut.events.to_pylist() == whole.events.to_pylist()
    assert cut.observations.to_pylist() == whole.observations.to_pylist()


def test_normalize_comm_id() -> None:
    assert nccl_log.normalize_comm_id("027a079b828ff1a75") == "0x27a079b828ff1a75"
    assert nccl_log.normalize_comm_id("0xABC") == "0xabc"


# ---------------------------------------------------------------------------------------- scenarios

def test_scenario_coll_mismatch_rank1_calls_all_gather_at_seq_5() -> None:
    path = SCEN / "nccl_coll_mismatch" / "nccl.log"
    assert sniff(path)
    r = read(path)
    assert r.world_size == 4 and not r.skipped
    ev = r.events
    assert ev.num_rows == 20
    assert {x["group"] for x in ev.to_pylist()} == {"0x3f9d2c7e51a04b88"}
    for rank in range(4):
        assert [x["seq"] for x in rows(ev, rank=rank)] == [1, 2, 3, 4, 5]
    at5 = {x["rank"]: x["name"] for x in rows(ev, seq=5)}
    assert at5 == {0: "all_reduce", 1: "all_gather", 2: "all_reduce", 3: "all_reduce"}
    assert {x["name"] for x in ev.to_pylist() if x["seq"] < 5} == {"all_reduce"}
    assert len(rows(r.observations, kind="nccl_init_complete")) == 4


def test_scenario_init_incomplete_rank3_never_completes_init() -> None:
    files = sorted((SCEN / "nccl_init_incomplete").glob("nccl.*.log"))
    assert len(files) == 4 and all(sniff(f) for f in files)
    results = [read(f) for f in files]
    assert {r.world_size for r in results} == {4}
    obs = [o for r in results for o in r.observations.to_pylist()]
    started = {o["rank"] for o in obs if o["kind"] == "nccl_init_start"}
    completed = {o["rank"] for o in obs if o["kind"] == "nccl_init_complete"}
    assert started == {0, 1, 2, 3}
    assert completed == {0, 1, 2}  # rank 3's comm never completed init
    assert {o["group"] for o in obs if o["kind"].startswith("nccl_init")} == {"0x8c41d07aa93e2f15"}
    rank3 = [r for r in results if r.file.endswith("nccl.node1.8802.log")][0]
    assert rank3.events.num_rows == 0
    assert [(e["rank"], e["seq"]) for r in results for e in r.events.to_pylist()] == [(0, 1), (1, 1), (2, 1)]


# ---------------------------------------------------------------------------------------- big and odd inputs

def _coll_lines(rank: int, comm: str, first_op: int, n: int, prefix: str = "") -> list[str]:
    ops = (("AllReduce", 7), ("AllGather", 9), ("Broadcast", 7), ("ReduceScatter", 9))
    out = []
    for i in range(n):
        op, dt = ops[i % len(ops)]
        out.append(f"{prefix}node3:{700 + rank}:{700 + rank} [{rank}] NCCL INFO {op}: opCount {first_op + i:x} "
                   f"sendbuff 0x7f{i:010x} recvbuff 0x7f{i + 1:010x} count {1024 * (i % 5 + 1)} datatype {dt} op 0 "
                   f"root {i % 2} comm {comm} [nranks=2] stream 0x5500{rank}\n")
        if rank == 0 and i % 8 == 7:
            out.append(f"node3:700:700 [0] NCCL INFO {op}: 4096 Bytes -> Algo RING proto SIMPLE channel{{0..1}}\n")
    return out


def _init_lines(comm: str, rank: int) -> list[str]:
    return [f"node3:{700 + rank}:{710 + rank} [{rank}] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks 2 "
            f"cudaDev {rank} nvmlDev {rank} busId {rank}000 commId 0xfeed0000beef - Init {what}\n"
            for what in ("START", "COMPLETE")]


def test_numpy_path_and_regex_loop_give_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """COLL lines are parsed in bulk with numpy; the regex loop is the reference. Rarer, torn, glued, CRLF and
    odd-number lines interleaved with runs of COLL lines must give identical tables either way."""
    extra = (FIX / "prefixes.log").read_text().splitlines(keepends=True) + (
        FIX / "torn.log").read_text().splitlines(keepends=True)
    lines = _init_lines("0x5501", 0) + _init_lines("0x5502", 1)
    for k in range(40):
        lines += _coll_lines(0, "0x5501", k * 100, 60, prefix="[rank0]:")
        lines += _coll_lines(1, "0x5502", k * 100, 60 + k % 3)
        lines.append(extra[k % len(extra)])
        if k % 7 == 3:
            one, two = _coll_lines(0, "0x5501", 9000 + k, 2)[:2]
            lines.append(one.rstrip("\n") + "\r\n")  # CRLF
            lines.append(one.replace("opCount ", "opCount fffffffffffffffff", 1))  # beyond 64 bits
            lines.append(one.rstrip("\n") + two)  # two records glued
            lines.append(two.replace("root 1", "root -3", 1).replace("AllGather", "Send", 1))
        if k == 20:  # the comm pointer is destroyed and reused by a new communicator
            lines.append("node3:700:799 [0] NCCL INFO comm 0x5501 rank 0 nranks 2 busId 0 - Destroy COMPLETE\n")
            lines += _init_lines("0x5501", 0)
    path = tmp_path / "mixed.log"
    path.write_text("".join(lines))
    monkeypatch.setattr(nccl_log_scan, "_CHUNK", 256 << 10)
    monkeypatch.setattr(nccl_log_interpret, "_VEC_MIN_ROWS", 8)
    bulk = read(path)
    monkeypatch.setattr(nccl_log_interpret, "_VEC_MIN_BYTES", 1 << 62)  # regex loop only
    loop = read(path)
    assert bulk.events.num_rows > 4000
    assert bulk.events.to_pylist() == loop.events.to_pylist()
    assert bulk.observations.to_pylist() == loop.observations.to_pylist()
    assert bulk.skipped == loop.skipped
    assert any("beyond 64 bits" in s.reason for s in bulk.skipped)
    assert -3 in {r["peer"] for r in bulk.events.to_pylist() if r["category"] == "p2p"}


_STREAM_CHECK = """
import json, sys
sys.path.insert(0, {root!r})
from ranktrace.analyzers.readers import nccl_log

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

base = hwm()
r = nccl_log.read({path!r})
print(json.dumps(dict(growth=hwm() - base, rows=r.events.num_rows, seqs=r.events.column("seq").to_pylist()[-2:],
                      skipped=[s.reason for s in r.skipped])))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak RSS read from /proc (Linux)")
def test_big_log_streams_in_bounded_memory(tmp_path: Path) -> None:
    """BIG INPUT (a few seconds): 256 MB of log text followed by a 1 GiB sparse hole (NUL bytes when read) and
    one more block. Memory must stay far below the input size: the reader holds one 4 MiB chunk plus the rows it
    keeps (few here: the text is mostly TUNING and program lines), and skips the hole."""
    block_lines: list[str] = []
    for k in range(200):
        block_lines += _coll_lines(0, "0x5501", k, 1)
        block_lines += [f"step {k} loss 1.{k:04d} lr 3.0e-4 tokens/s 10000 {'.' * 200}\n"] * 20
        block_lines += [f"node3:700:700 [0] NCCL INFO AllReduce: {k} Bytes -> Algo RING proto LL\n"] * 10
    block = "".join(block_lines).encode()
    reps = (256 << 20) // len(block)
    path = tmp_path / "big.log"
    with open(path, "wb") as f:
        f.write("".join(_init_lines("0x5501", 0)).encode())
        for _ in range(reps):
            f.write(block)
        f.truncate(f.tell() + (1 << 30))   # a sparse hole: reads back as NUL bytes
        f.seek(0, 2)
        f.write(block)
    assert path.stat().st_size > (1 << 30) + (250 << 20)
    code = _STREAM_CHECK.format(root=str(HERE.parents[1]), path=str(path))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == 200 * (reps + 1)
    assert got["seqs"] == [200 * (reps + 1) - 1, 200 * (reps + 1)]   # Init seen: seq = line order, hole or not
    assert any("NUL bytes ignored" in s for s in got["skipped"]), got["skipped"]
    assert got["growth"] < 100, f"peak RSS grew by {got['growth']:.0f} MB reading a 1.3 GB file"


def test_leading_nul_bytes_of_a_copytruncated_log(tmp_path: Path) -> None:
    """``logrotate copytruncate``: the writer keeps its offset, so the file starts with a run of NUL bytes."""
    path = tmp_path / "rotated.log"
    path.write_bytes(b"\0" * 100_000 + "".join(_init_lines("0x5501", 0) + _coll_lines(0, "0x5501", 0, 3)).encode())
    assert sniff(path)
    r = read(path)
    assert [e["seq"] for e in r.events.to_pylist()] == [1, 2, 3]
    assert [(s.line, s.reason.split(",")[0]) for s in r.skipped] == [(1, "100000 NUL bytes ignored")]


def test_file_of_nul_bytes_only(tmp_path: Path) -> None:
    path = tmp_path / "zeros.log"
    with open(path, "wb") as f:
        f.truncate(20 << 20)
    assert not sniff(path)
    with pytest.raises(ReaderError, match="NUL bytes") as e:
        nccl_log.read(path)
    assert e.value.file == str(path)


def test_binary_garbage_inside_a_log_is_skipped_and_the_rest_is_read(tmp_path: Path) -> None:
    """A core dump or a torn binary write in the middle of a log: the lines around it are still used."""
    rnd = random.Random(7)
    garbage = bytes(rnd.getrandbits(8) for _ in range(1 << 20))
    before = "".join(_init_lines("0x5501", 0) + _coll_lines(0, "0x5501", 0, 400)).encode()
    after = "".join(_coll_lines(0, "0x5501", 400, 400)).encode()
    path = tmp_path / "garbled.log"
    path.write_bytes(before + garbage + b"\n" + after)
    assert sniff(path)
    r = read(path)
    assert [e["seq"] for e in r.events.to_pylist()] == list(range(1, 801))
    reasons = " | ".join(s.reason for s in r.skipped)
    assert "NUL bytes ignored" in reasons and "not UTF-8" in reasons
