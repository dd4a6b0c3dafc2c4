"""analyzers/readers/nsys on the real nsys 2026.2 export and on the generated 2-rank hang export."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import nsys
from ranktrace.analyzers.readers.nsys import export as nsys_export
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, load_script, rows

SCENARIO = REPO / "tests" / "data" / "scenarios" / "nsys_open_range"
make = load_script(SCENARIO / "make.py")


@pytest.fixture(scope="module")
def real_export(shared_data: Path) -> Path:
    return shared_data / "external" / "nsys-ai" / "tests" / "fixtures" / "mfu_2gpu_before.sqlite"


@pytest.fixture(scope="module")
def real(real_export: Path) -> nsys.ReadResult:
    return nsys.read(real_export)


@pytest.fixture()
def hang_db(tmp_path: Path) -> Path:
    return make.build(tmp_path / "hang.sqlite")


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nsys.ReadResult]:
    path = make.build(tmp_path_factory.mktemp("nsys") / "hang.sqlite")
    return path, nsys.read(path)


def _head(path: Path) -> bytes:
    return path.read_bytes()[:65536]


class TestModule:
    def test_declared_mapping_names_real_columns(self) -> None:
        check_field_map(nsys)
        assert nsys.FORMAT == "nsys"
        assert {"FORMAT", "sniff", "read"} <= set(nsys.__all__)

    def test_decode_global_tid(self) -> None:
        assert nsys.decode_global_tid(0x1000090000090) == (144, 144)
        assert nsys.decode_global_tid(281477409406976) == (145, 0)   # a real globalPid
        assert nsys.decode_global_tid(None) == (None, None)

    @pytest.mark.parametrize("name, op, dtype", [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "AllReduce", "float32"),
        ("ncclDevKernel_AllGather_RING_LL", "AllGather", None),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE", "ReduceScatter", "bfloat16"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "AllReduce", "float32"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "Broadcast", "int8"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096>)", "SendRecv", None),
        ("ncclDevKernel_Generic", "Generic", None),
    ])
    def test_nccl_kernel_names(self, name: str, op: str, dtype: str | None) -> None:
        assert nsys.parse_nccl_kernel_name(name) == (op, dtype)


class TestSniff:
    def test_real_and_generated_exports(self, real_export: Path, hang_db: Path) -> None:
        assert nsys.sniff(real_export, _head(real_export))
        assert nsys.sniff(hang_db, _head(hang_db))

    def test_other_content(self, tmp_path: Path) -> None:
        other = tmp_path / "other.sqlite"
        conn = sqlite3.connect(other)
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        conn.commit()
        conn.close()
        assert not nsys.sniff(other, _head(other))
        text = tmp_path / "x.sqlite"
        text.write_text("not a database\n")
        assert not nsys.sniff(text, _head(text))


class TestRealExport:
    """nsys 2026.2.1 export (schema 3.25.0) of a 2-GPU torchrun job, a 300 ms window."""

    def test_contract_and_version(self, real: nsys.ReadResult, real_export: Path) -> None:
        check_contract(real, "nsys", "nsys", real_export)
        assert real.version == "nsys 2026.2.1.210, schema 3.25.0"

    def test_nccl_kernels_per_rank_process(self, real: nsys.ReadResult) -> None:
        kernels = [r for r in real.events.to_pylist()
                   if (r["detail"] or "").startswith("kernel ncclDevKernel_SendRecv")]
        enters = [r for r in kernels if r["kind"] == "enter"]
        exits = [r for r in kernels if r["kind"] == "complete"]
        assert len(enters) == len(exits) == 66
        assert {r["pid"] for r in enters} == {144, 145}
        assert {r["state"] for r in exits} == {"completed"}
        assert {r["category"] for r in enters} <= {"collective", "p2p"}
        # launched from inside PyTorch's emit_nvtx range "nccl:all_to_all, op_id = ..." → named after it
        assert any(r["name"] == "all_to_all" and r["tid"] in (144, 145) for r in enters)

    def test_nvtx_ranges_and_time_base(self, real: nsys.ReadResult) -> None:
        nvtx = rows(real.events, category="user", kind="enter", detail="NVTX")
        assert len(nvtx) > 18000
        first = nvtx[0]
        assert first["host"] == "modal"
        # wall = utcEpochNs + (t - systemClockNs) from TARGET_INFO_SESSION_START_TIME
        assert first["wall_ns"] == 1779782330176752435 + (first["t_ns"] - 28254349605)
        window = rows(real.observations, kind="nsys_capture_window")
        assert window and window[0]["value"] == 147697698573

    def test_processes_threads_devices(self, real: nsys.ReadResult) -> None:
        obs = real.observations
        assert {r["pid"] for r in rows(obs, kind="nsys_process", name="python3")} >= {144, 145}
        assert rows(obs, kind="nsys_thread", name="pt_nccl_watchdg")
        assert {(r["pid"], r["name"]) for r in rows(obs, kind="pid_device")} == {(144, "0"), (145, "1")}
        assert not rows(obs, kind="pid_rank")  # nothing in this export names a rank: not guessed

    def test_missing_tables_and_stream_contents_are_skipped(self, real: nsys.ReadResult) -> None:
        reasons = " | ".join(s.reason for s in real.skipped)
        assert "TARGET_INFO_GPU absent" in reasons
        assert "pid_125_stderr.log: content not in the export" in reasons

    def test_sync_calls(self, real: nsys.ReadResult) -> None:
        sync = rows(real.events, category="sync", name="cudaStreamSynchronize")
        assert len(sync) == 66 and {r["kind"] for r in sync} == {"enter", "exit"}


class TestHangScenario:
    """tests/data/scenarios/nsys_open_range: rank 1 stuck in all_reduce seq 12, rank 0 in a user range."""

    def test_contract(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        path, result = hang
        check_contract(result, "nsys", "nsys", path)
        assert result.world_size == 2
        assert result.skipped == ()

    def test_ranks_from_ranktrace_nvtx(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        pid_rank = {r["pid"]: r["rank"] for r in rows(result.observations, kind="pid_rank")}
        assert pid_rank == {101: 0, 102: 1}
        assert {(r["pid"], r["rank"], r["world"]) for r in result.events.to_pylist()} == {(101, 0, 2), (102, 1, 2)}

    def test_open_range_has_enter_only(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        seq12 = rows(result.events, rank=1, seq=12)
        nvtx = [r for r in seq12 if r["detail"] == nsys.OPEN_AT_END]
        assert len(nvtx) == 1
        r = nvtx[0]
        assert (r["kind"], r["name"], r["category"], r["group"]) == ("enter", "all_reduce", "collective", "default_pg")
        assert not [r for r in seq12 if r["kind"] == "exit"]
        assert not rows(result.events, rank=0, seq=12)   # rank 0 never issued it

    def test_unfinished_kernel_is_inferred_from_its_launch(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        pending = rows(result.events, detail=nsys.NO_COMPLETION)
        assert len(pending) == 1
        p = pending[0]
        assert (p["rank"], p["kind"], p["name"], p["group"], p["seq"], p["state"], p["category"]) == (
            1, "enter", "all_reduce", "default_pg", 12, "scheduled", "collective")
        assert p["callsite"] == f"cudaLaunchKernelExC correlationId={make.HANG_CORRELATION_ID}"

    def test_completed_kernels_align_with_ranges(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        done = rows(result.events, kind="complete", state="completed")
        assert sorted((r["rank"], r["seq"]) for r in done) == [(0, 10), (0, 11), (1, 10), (1, 11)]
        assert {r["dtype"] for r in done} == {"float32"}

    def test_user_range_open_on_rank0(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        stuck = rows(result.events, rank=0, name="load_batch")
        assert [(r["kind"], r["category"], r["detail"]) for r in stuck] == [("enter", "user", nsys.OPEN_AT_END)]

    def test_wall_clock(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        r = rows(result.events, rank=1, seq=12, detail=nsys.OPEN_AT_END)[0]
        assert r["wall_ns"] == make.UTC_EPOCH_NS + r["t_ns"] - make.SESSION_START_NS

    def test_stream_text_and_devices(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        _, result = hang
        lines = rows(result.observations, kind="nsys_stream_text")
        assert len(lines) == 7 and lines[0]["line"] == 1 and lines[0]["pid"] == 100
        assert all("NCCL INFO" in r["detail"] for r in lines)
        assert {r["name"] for r in rows(result.observations, kind="gpu_device")} == {"0", "1"}
        assert {(r["pid"], r["value"]) for r in rows(result.observations, kind="cuda_device")} == {(101, 0), (102, 1)}

    def test_checked_in_copy_matches_generator(self, hang: tuple[Path, nsys.ReadResult]) -> None:
        checked_in = SCENARIO / "nsys_open_range.sqlite"
        assert checked_in.stat().st_size < 200_000
        _, fresh = hang
        stored = nsys.read(checked_in)
        drop = ["file"]
        assert stored.events.drop(drop).equals(fresh.events.drop(drop))

    def test_small_batches_give_the_same_tables(self, hang_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        whole = nsys.read(hang_db)
        monkeypatch.setattr(nsys_export, "BATCH_ROWS", 2)   # nsys re-exports it; the batching reads it here
        batched = nsys.read(hang_db)
        assert batched.events.num_rows == whole.events.num_rows
        assert sorted(map(str, batched.events.to_pylist())) == sorted(map(str, whole.events.to_pylist()))


class TestVariants:
    def test_missing_tables_give_partial_results(self, hang_db: Path) -> None:
        conn = sqlite3.connect(hang_db)
        for table in ("NVTX_EVENTS", "TARGET_INFO_GPU", "ProcessStreams", "TARGET_INFO_SESSION_START_TIME"):
            conn.execute(f"DROP TABLE {table}")
        conn.commit()
        conn.close()
        result = nsys.read(hang_db)
        reasons = " | ".join(s.reason for s in result.skipped)
        for table in ("NVTX_EVENTS", "TARGET_INFO_GPU", "ProcessStreams", "TARGET_INFO_SESSION_START_TIME"):
            assert f"table {table} absent" in reasons
        kernels = rows(result.events, kind="complete", state="completed")
        assert len(kernels) == 4 and {r["seq"] for r in kernels} == {None}   # no ranges left to align them
        assert {r["wall_ns"] for r in kernels} == {None}
        pending = rows(result.events, detail=nsys.NO_COMPLETION)
        assert [(r["pid"], r["name"], r["category"]) for r in pending] == [(102, "kernel_launch", "user")]

    def test_partial_nvtx_event_types(self, hang_db: Path) -> None:
        conn = sqlite3.connect(hang_db)
        gtid = (1 << 48) | (101 << 24) | 101
        conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, NULL, 35, ?, ?)",
                     (5_000_000_000, "pushed, never popped", gtid))
        conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 38, ?, ?)",
                     (1_000_000_500, 1_000_000_500, "ended, started before capture", gtid))
        conn.commit()
        conn.close()
        result = nsys.read(hang_db)
        assert [(r["kind"], r["detail"]) for r in rows(result.events, name="pushed, never popped")] == [
            ("enter", nsys.OPEN_AT_END)]
        assert [(r["kind"], r["detail"]) for r in rows(result.events, name="ended, started before capture")] == [
            ("exit", nsys.OPENED_BEFORE)]

    def test_ranktrace_text_without_domain_row(self, hang_db: Path) -> None:
        conn = sqlite3.connect(hang_db)
        conn.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 75")   # sliced export: domain names lost
        conn.commit()
        conn.close()
        result = nsys.read(hang_db)
        assert [(r["rank"], r["kind"]) for r in rows(result.events, seq=12, detail=nsys.OPEN_AT_END)] == [
            (1, "enter")]      # still an op range, by the shape of its text
        assert rows(result.events, name="all_reduce", category="collective", seq=11, kind="exit")
        # the mark "ranktrace rank=1 world=2" is now an ordinary NVTX text: its rank=1 still names the process
        assert {r["detail"] for r in rows(result.observations, kind="pid_rank")} == {"rank from NVTX text rank="}

    def test_rank_from_process_name_when_nvtx_has_none(self, hang_db: Path) -> None:
        conn = sqlite3.connect(hang_db)
        conn.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 34")
        conn.execute("UPDATE PROCESSES SET name = 'worker_rank3' WHERE pid = 102")
        conn.commit()
        conn.close()
        result = nsys.read(hang_db)
        assert {(r["pid"], r["rank"]) for r in rows(result.observations, kind="pid_rank")} == {(102, 3)}
        assert {r["rank"] for r in rows(result.events, pid=101)} == {None}
        assert result.world_size is None

    def test_rank_from_launch_environment_with_one_process(self, tmp_path: Path) -> None:
        db = make.build(tmp_path / "one.sqlite")
        conn = sqlite3.connect(db)
        conn.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 34 OR globalTid >> 24 & 16777215 = 101")
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid >> 24 & 16777215 = 101")
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid >> 24 & 16777215 = 101")
        conn.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=\"5\"')")
        conn.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'WORLD_SIZE=\"8\"')")
        conn.commit()
        conn.close()
        result = nsys.read(db)
        assert {r["rank"] for r in result.events.to_pylist()} == {5}
        assert result.world_size == 8


class TestBadInput:
    def test_sqlite_of_another_schema(self, tmp_path: Path) -> None:
        other = tmp_path / "app.sqlite"
        conn = sqlite3.connect(other)
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        conn.commit()
        conn.close()
        with pytest.raises(ReaderError, match="without Nsight Systems tables.*users") as e:
            nsys.read(other)
        assert e.value.file == str(other)

    def test_truncated_real_export_gives_partial_results(self, real_export: Path, real: nsys.ReadResult,
                                                        tmp_path: Path) -> None:
        """An interrupted export or copy: the tables whose pages survived are read, each lost stage is one note."""
        cut = tmp_path / "cut.sqlite"
        data = real_export.read_bytes()
        cut.write_bytes(data[: len(data) // 2])
        assert nsys.sniff(cut, _head(cut))
        result = nsys.read(cut)
        check_contract(result, "nsys", "nsys", cut)
        assert result.version == real.version
        assert 0 < result.events.num_rows < real.events.num_rows
        assert result.observations.num_rows
        first = result.skipped[0].reason
        assert first.startswith("truncated SQLite database") and f"file has {len(data) // 2} bytes" in first
        lost = [s.reason for s in result.skipped if "not read or only partly" in s.reason]
        assert lost and all("the file is truncated" in r for r in lost)

    def test_truncated_inside_the_first_page(self, real_export: Path, tmp_path: Path) -> None:
        cut = tmp_path / "cut.sqlite"
        cut.write_bytes(real_export.read_bytes()[:2000])
        with pytest.raises(ReaderError, match="not even the first page") as e:
            nsys.read(cut)
        assert e.value.file == str(cut)

    def test_truncated_inside_header(self, tmp_path: Path) -> None:
        cut = tmp_path / "tiny.sqlite"
        cut.write_bytes(b"SQLite format 3\x00" + b"\x10\x00")
        with pytest.raises(ReaderError, match="truncated SQLite header"):
            nsys.read(cut)

    def test_not_sqlite_named_sqlite(self, tmp_path: Path) -> None:
        bogus = tmp_path / "report.sqlite"
        bogus.write_text("this is a text file, not an export\n")
        with pytest.raises(ReaderError, match="not an SQLite database"):
            nsys.read(bogus)

    def test_empty_file(self, tmp_path: Path) -> None:
        empty = tmp_path / "empty.sqlite"
        empty.touch()
        with pytest.raises(ReaderError, match="empty file"):
            nsys.read(empty)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ReaderError, match="cannot open"):
            nsys.read(tmp_path / "nope.sqlite")

    def test_locked_database(self, hang_db: Path) -> None:
        holder = sqlite3.connect(hang_db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(ReaderError, match="locked"):
                nsys.read(hang_db)
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def test_corrupt_table_pages_give_partial_results(self, hang_db: Path, tmp_path: Path) -> None:
        """A damaged kernel table: its stages become notes, NVTX ranges and processes are still read."""
        broken = tmp_path / "broken.sqlite"
        shutil.copy(hang_db, broken)
        conn = sqlite3.connect(broken)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                            ("CUPTI_ACTIVITY_KIND_KERNEL",)).fetchone()[0]
        conn.close()
        data = bytearray(broken.read_bytes())
        data[(root - 1) * page_size: root * page_size] = b"\xff" * page_size
        broken.write_bytes(bytes(data))
        result = nsys.read(broken)
        check_contract(result, "nsys", "nsys", broken)
        lost = [s.reason for s in result.skipped if "not read or only partly" in s.reason]
        assert any(r.startswith("NCCL kernels:") for r in lost) and all("corrupt export?" in r for r in lost)
        assert not rows(result.events, kind="complete")          # kernel rows lost
        assert [r for r in result.events.to_pylist() if r["category"] == "collective" and r["kind"] == "enter"]
        assert rows(result.observations, kind="nsys_process") and rows(result.observations, kind="pid_rank")

    def test_corrupt_schema_page_is_reader_error(self, hang_db: Path, tmp_path: Path) -> None:
        broken = tmp_path / "broken.sqlite"
        shutil.copy(hang_db, broken)
        data = bytearray(broken.read_bytes())
        data[100:4096] = b"\xff" * (4096 - 100)     # page 1 after the file header: the schema table
        broken.write_bytes(bytes(data))
        assert not nsys.sniff(broken, _head(broken))
        with pytest.raises(ReaderError, match="unreadable SQLite database") as e:
            nsys.read(broken)
        assert e.value.file == str(broken)
