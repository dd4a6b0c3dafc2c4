"""analyzers/readers/kineto on the six real HTA traces and a hand-made one."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ranktrace.analyzers.readers import kineto
from ranktrace.analyzers.readers.kineto import collect as kineto_collect, stream as kineto_json_stream
from ranktrace.analyzers.readers.base import ReaderError
from tests.readers.shared_reader_checks import REPO, check_contract, check_field_map, rows

HANDMADE = REPO / "tests" / "data" / "readers" / "kineto" / "handmade_p2p_relative_time.json"


@pytest.fixture(scope="module")
def hta(shared_data: Path) -> Path:
    return shared_data / "external" / "HolisticTraceAnalysis"


def _read(path: Path) -> kineto.ReadResult:
    result = kineto.read(path)
    check_contract(result, "kineto", "kineto", path)
    return result


def _ops(result: kineto.ReadResult, kind: str = "enter") -> list[dict]:
    return [r for r in result.events.to_pylist() if r["kind"] == kind and r["category"] in ("collective", "p2p")]


def test_declared_mapping_names_real_columns() -> None:
    check_field_map(kineto)
    assert kineto.FORMAT == "kineto"


class TestSniff:
    def test_all_real_traces(self, hta: Path) -> None:
        files = sorted(hta.rglob("*.json.gz"))
        assert len(files) == 6
        for f in files:
            assert kineto.sniff(f, f.read_bytes()[:65536]), f

    def test_handmade_and_others(self, tmp_path: Path) -> None:
        assert kineto.sniff(HANDMADE, HANDMADE.read_bytes()[:65536])
        other = tmp_path / "config.json"
        other.write_text('{"model": "llama", "layers": 32}')
        assert not kineto.sniff(other, other.read_bytes())
        log = tmp_path / "x.log"
        log.write_text("NCCL INFO Init COMPLETE\n")
        assert not kineto.sniff(log, log.read_bytes())


class TestRealTraces:
    def test_nccl_trace_with_full_comm_args(self, hta: Path) -> None:
        """nccl_data: rank 0 of 2, NCCL 2.17.1, record_param_comms + kernels with PG name/desc/ranks."""
        path = hta / "nccl_parser_config" / "nccl_data.json.gz"
        result = _read(path)
        assert (result.world_size, result.version) == (2, "schemaVersion 1, nccl 2.17.1")
        enters = _ops(result)
        assert [r["name"] for r in enters].count("all_reduce") == 15
        assert [r["name"] for r in enters].count("broadcast") == 6
        assert {(r["rank"], r["world"], r["group"], r["group_desc"], r["backend"]) for r in enters} == {
            (0, 2, "0", "default_pg", "nccl")}
        assert {tuple(r["group_ranks"]) for r in enters} == {(0, 1)}
        # seq: 1..21 in start order on the one group, across the main and the autograd thread
        assert [r["seq"] for r in sorted(enters, key=lambda r: r["wall_ns"])] == list(range(1, 22))
        assert len({r["tid"] for r in enters}) == 2
        exits = {r["seq"]: r for r in _ops(result, "exit")}
        assert all(exits[r["seq"]]["wall_ns"] >= r["wall_ns"] for r in enters)
        first_ar = next(r for r in enters if r["name"] == "all_reduce")
        assert (first_ar["dtype"], first_ar["nbytes"]) == ("float32", 2049000 * 4)
        assert len(_ops(result, "complete")) == 21
        assert rows(result.events, kind="identity")[0]["backend"] == "nccl"
        assert [(r["group"], r["group_desc"], r["group_ranks"]) for r in rows(result.events, kind="group")] == [
            ("0", "default_pg", [0, 1])]

    def test_new_time_base(self, hta: Path) -> None:
        """wall = baseTimeNanoseconds + ts µs × 1000 (formats.md §5.2 regime 2)."""
        path = hta / "nccl_parser_config" / "nccl_data.json.gz"
        doc = json.load(gzip.open(path))
        base = doc["baseTimeNanoseconds"]
        index = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("name") == "record_param_comms"
                     and e["args"].get("Collective name") == "allreduce")
        raw = doc["traceEvents"][index]
        got = rows(_read(path).events, kind="enter", line=index)
        assert got and got[0]["wall_ns"] == base + round(raw["ts"] * 1000) and got[0]["t_ns"] is None

    def test_older_comm_args_and_absolute_time(self, hta: Path) -> None:
        """ns_resolution_trace: 'Process Group ID' instead of name, pg_config with uid, epoch-µs ts."""
        path = hta / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
        result = _read(path)
        enters = _ops(result)
        assert len(enters) == 35
        assert {(r["group"], tuple(r["group_ranks"]), r["backend"]) for r in enters} == {("0", (0,), "nccl")}
        assert all(1_712_000_000 * 10**9 < r["wall_ns"] < 1_713_000_000 * 10**9 for r in enters)
        assert not _ops(result, "complete")   # world of 1: NCCL launched no kernel

    def test_multi_rank_sampled_set(self, hta: Path) -> None:
        """trace_filter/sampled_rank-{0,1}: one file per rank of a 128-rank job, old naming, no args."""
        results = [_read(hta / "trace_filter" / f"sampled_rank-{r}.json.gz") for r in (0, 1)]
        assert [r.world_size for r in results] == [128, 128]
        for rank, result in enumerate(results):
            enters = _ops(result)
            assert {r["rank"] for r in enters} == {rank}
            assert {r["name"] for r in enters} >= {"all_reduce", "all_to_all"}
            assert {r["group"] for r in enters} == {None}   # this PyTorch wrote no group args
            assert [r["seq"] for r in sorted(enters, key=lambda r: r["wall_ns"])] == list(range(1, len(enters) + 1))
            ar = next(r for r in enters if r["name"] == "all_reduce")
            assert (ar["dtype"], ar["shape"], ar["nbytes"]) == ("float32", "[19618307]", 19618307 * 4)
            assert _ops(result, "complete")

    def test_gloo_cpu_only(self, hta: Path) -> None:
        result = _read(hta / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
        enters = _ops(result)
        assert len(enters) == 10
        assert {(r["rank"], r["world"], r["backend"], r["name"]) for r in enters} == {(34, 300, "gloo", "all_reduce")}
        groups = rows(result.events, kind="group")
        assert len(groups) == 11 and groups[0]["group_desc"] == "default_pg" and len(groups[0]["group_ranks"]) == 300
        assert {r["backend"] for r in groups} == {"gloo"}

    def test_rocm_trace_without_distributed_info(self, hta: Path) -> None:
        result = _read(hta / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
        assert result.events.num_rows == 0 and result.world_size is None and result.skipped == ()


class TestHandmade:
    def test_p2p_seq_peer_and_relative_time(self) -> None:
        result = _read(HANDMADE)
        ops = {r["name"]: r for r in _ops(result)}
        send, recv = ops["send"], ops["recv"]
        assert (send["peer"], send["backend_seq"], send["seq"], send["category"]) == (1, 7, 1, "p2p")
        assert (recv["peer"], recv["backend_seq"], recv["seq"], recv["dtype"], recv["nbytes"]) == (
            1, 8, 1, "bfloat16", 16)
        assert (send["t_ns"], send["wall_ns"]) == (1000125, None)   # no base, small ts: trace-local clock
        complete = _ops(result, "complete")
        assert [(r["name"], r["t_ns"], r["state"]) for r in complete] == [("send", 1520000, "completed")]

    def test_coalesced_block_wait_and_threads(self) -> None:
        result = _read(HANDMADE)
        default_pg = sorted((r for r in _ops(result) if r["group"] == "0"), key=lambda r: r["t_ns"])
        assert [(r["name"], r["seq"], r["tid"]) for r in default_pg] == [
            ("all_reduce_coalesced", 1, 700), ("all_reduce", 2, 701)]
        assert "nested" in default_pg[0]["detail"]
        assert not [r for r in _ops(result) if r["name"] == "wait"]

    def test_bad_elements_are_counted(self) -> None:
        reasons = [s.reason for s in _read(HANDMADE).skipped]
        assert reasons == ["1 × collective event without a numeric ts/dur",
                           "1 × traceEvents element that is not an object"]

    def test_tiny_stream_chunks_give_the_same_result(self, monkeypatch: pytest.MonkeyPatch) -> None:
        whole = kineto.read(HANDMADE)
        monkeypatch.setattr(kineto_json_stream, "_CHUNK", 5)
        assert kineto.read(HANDMADE).events.equals(whole.events)


class TestBadInput:
    def test_truncated_json(self, hta: Path, tmp_path: Path) -> None:
        text = gzip.open(hta / "nccl_parser_config" / "nccl_data.json.gz", "rt").read()
        cut = tmp_path / "cut.pt.trace.json"
        cut.write_text(text[: len(text) // 2])
        result = _read(cut)
        assert _ops(result)
        assert any("truncated trace" in s.reason for s in result.skipped)

    def test_truncated_gzip(self, hta: Path, tmp_path: Path) -> None:
        data = (hta / "nccl_parser_config" / "nccl_data.json.gz").read_bytes()
        cut = tmp_path / "cut.json.gz"
        cut.write_bytes(data[: len(data) // 2])
        result = _read(cut)
        assert any("truncated trace" in s.reason for s in result.skipped)

    def test_not_json(self, tmp_path: Path) -> None:
        bad = tmp_path / "trace.json"
        bad.write_text("hello, I am not JSON\n")
        with pytest.raises(ReaderError, match="not a Kineto trace") as e:
            kineto.read(bad)
        assert e.value.file == str(bad)

    def test_json_without_trace_events(self, tmp_path: Path) -> None:
        bad = tmp_path / "trace.json"
        bad.write_text('{"schemaVersion": 1, "deviceProperties": []}')
        with pytest.raises(ReaderError, match="without 'traceEvents'"):
            kineto.read(bad)

    def test_empty_and_missing(self, tmp_path: Path) -> None:
        empty = tmp_path / "empty.json"
        empty.touch()
        with pytest.raises(ReaderError, match="empty file"):
            kineto.read(empty)
        with pytest.raises(ReaderError, match="cannot open"):
            kineto.read(tmp_path / "missing.json")

    def test_array_form_and_torn_tail(self, tmp_path: Path) -> None:
        trace = tmp_path / "array.json"
        ev = {"ph": "X", "cat": "user_annotation", "name": "gloo:broadcast", "pid": 1, "tid": 1, "ts": 10, "dur": 2}
        trace.write_text("[" + json.dumps(ev) + ", {\"ph\": \"X\", \"na")
        result = _read(trace)
        assert [r["name"] for r in _ops(result)] == ["broadcast"]
        assert any("truncated" in s.reason for s in result.skipped)


class TestRealTorch213Gloo:
    """Traces of a 2-rank gloo job made with torch 2.13 (tests/data/readers/kineto/README.md)."""

    def test_both_ranks_align_by_seq(self) -> None:
        data = REPO / "tests" / "data" / "readers" / "kineto"
        results = [_read(data / f"torch2.13_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
        per_rank = []
        for rank, result in enumerate(results):
            assert result.world_size == 2
            assert [r["group_desc"] for r in rows(result.events, kind="group")] == ["default_pg", "tp_group"]
            enters = sorted(_ops(result), key=lambda r: (r["category"], r["seq"]))
            assert {(r["rank"], r["backend"], r["group"]) for r in enters} == {(rank, "gloo", None)}
            per_rank.append([(r["category"], r["seq"], r["name"]) for r in enters])
        collectives = [("collective", 1, "all_reduce"), ("collective", 2, "broadcast"), ("collective", 3, "all_reduce"),
                       ("collective", 4, "all_gather"), ("collective", 5, "barrier")]
        assert per_rank[0] == collectives + [("p2p", 1, "send")]
        assert per_rank[1] == collectives + [("p2p", 1, "recv")]


class TestBigTrace:
    @staticmethod
    def _write(path: Path, steps: int, per_step: int) -> None:
        """A trace of ``steps`` all_reduce ops, each after ``per_step`` (cpu op, CUDA launch, GEMM kernel) triples."""
        mm = ('{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":%d,"dur":5,'
              '"args":{"External id":%d,"Input Dims":[[1024,1024],[1024,1024]],"Input type":["float","float"]}},\n'
              '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":%d,"dur":2,'
              '"args":{"correlation":%d,"cbid":211}},\n'
              '{"ph":"X","cat":"kernel","name":"ampere_sgemm_128x64_nn","pid":0,"tid":7,"ts":%d,"dur":50,'
              '"args":{"correlation":%d,"device":0,"stream":7}},\n')
        coll = ('{"ph":"X","cat":"user_annotation","name":"nccl:all_reduce","pid":1,"tid":1,"ts":%d,"dur":20},\n'
                '{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":%d,"dur":18,"args":'
                '{"Collective name":"allreduce","dtype":"Float","In msg nelems":1024,"Group size":2,'
                '"Process Group Name":"0","Seq":%d}},\n'
                '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":%d,"dur":3,'
                '"args":{"correlation":%d}},\n'
                '{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,"tid":8,'
                '"ts":%d,"dur":40,"args":{"correlation":%d}}')
        with open(path, "w") as f:
            f.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},\n'
                    '"traceEvents": [\n')
            corr, t = 0, 1000
            for s in range(steps):
                f.write("".join(mm % (t + 60 * k, corr + k, t + 60 * k + 1, corr + k, t + 60 * k + 3, corr + k)
                                for k in range(per_step)))
                corr += per_step
                t += 60 * per_step
                f.write(coll % (t, t + 1, s + 1, t + 2, corr, t + 5, corr) + (",\n" if s + 1 < steps else "\n"))
                corr += 1
                t += 100
            f.write("]}\n")

    @pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak RSS read from /proc (Linux)")
    def test_giant_trace_streams_in_bounded_memory(self, tmp_path: Path) -> None:
        """BIG INPUT (a few seconds): a ~75 MB trace of 480k events, 200 of them collectives. json.load would hold
        it all (several times its size); the stream keeps the collectives and ~20 bytes per CUDA launch."""
        path = tmp_path / "big.pt.trace.json"
        self._write(path, steps=200, per_step=800)
        assert path.stat().st_size > 70e6
        code = (f"import json, sys; sys.path.insert(0, {str(REPO)!r})\n"
                "from ranktrace.analyzers.readers import kineto\n"
                "hwm = lambda: next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
                f"base = hwm(); r = kineto.read({str(path)!r})\n"
                "ops = [e for e in r.events.to_pylist() if e['kind'] == 'complete']\n"
                "print(json.dumps(dict(growth=hwm() - base, completes=len(ops), seq=ops[-1]['seq'], "
                "skipped=[s.reason for s in r.skipped])))\n")
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert (got["completes"], got["seq"], got["skipped"]) == (200, 200, [])   # every NCCL kernel tied to its op
        assert got["growth"] < 28, f"peak RSS grew by {got['growth']:.0f} MB reading a 75 MB trace"

    def test_one_huge_value_stops_the_stream_with_a_note(self, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        path = tmp_path / "huge.json"
        self._write(path, steps=3, per_step=1)
        text = path.read_text()
        path.write_text(text[: text.rindex("]")] + ', {"ph": "X", "name": "' + "x" * (3 << 20) + "]}\n")
        monkeypatch.setattr(kineto_json_stream, "_MAX_VALUE_CHARS", 1 << 20)
        result = _read(path)
        assert len([r for r in result.events.to_pylist() if r["kind"] == "enter"]) == 3
        assert any("runs past 1 MiB without ending" in s.reason for s in result.skipped), result.skipped

    def test_launch_lookup_keeps_the_last_of_repeated_correlations(self) -> None:
        c = kineto_collect.Collector("x")
        for ts, corr in ((1.0, 5), (2.0, 7), (3.0, 5), (4.0, 1 << 70)):
            c.take(("event", 0, {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
                                 "ts": ts, "dur": 1, "args": {"correlation": corr}}))
        assert c.launches({5, 1 << 70, 9}) == {5: (1, 2, 3.0), 1 << 70: (1, 2, 4.0)}
