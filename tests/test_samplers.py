"""Samplers and live view (issue #6): samples/*.arrow, the live status line, NVML in a child, NCCL RAS pairs.

One real 4-rank gloo job (``--fault straggler``: rank 3 computes for 8 s at step 3 while ranks 0-2 wait in that
step's all_reduce, then the job completes) runs under ``trace run`` with its stderr on a pseudo-terminal and is
shared by every job-level check. The RAS poller talks to a fake RAS service on a loopback port serving the
documented sample outputs (tests/data/readers/ras); the GPU child runs against a fake ``pynvml`` module.
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.helpers import EXAMPLE, PY, REPO, TRACE, host_dir, kill_group, trace_env

RAS_DATA = REPO / "tests" / "data" / "readers" / "ras"


# ------------------------------------------------------------------------------------------- the shared job

@dataclass
class TtyRun:
    run_dir: Path
    returncode: int
    stdout: str
    tty: str          # everything written to the pseudo-terminal (our stderr), decoded
    elapsed: float


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> TtyRun:
    run_dir = tmp_path_factory.mktemp("samplers") / "run"
    env = trace_env(RANKTRACE_STACK_EVERY="1", RANKTRACE_FLUSH_EVERY="1", TERM="xterm")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        TRACE + ["run", "-o", str(run_dir), "--", PY, str(EXAMPLE), "--world", "4", "--steps", "5", "--fault",
                 "straggler", "--hang-seconds", "8", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True)
    os.close(slave)
    out_box: list[bytes] = []
    reader = threading.Thread(target=lambda: out_box.append(proc.stdout.read()), daemon=True)  # type: ignore
    reader.start()
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every holder of the slave side has gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None and not r:
                # the job's processes may still hold the slave briefly; drain what is left
                continue
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
        os.close(master)
    reader.join(timeout=10)
    return TtyRun(run_dir, proc.returncode, (out_box[0] if out_box else b"").decode(),
                  b"".join(chunks).decode("utf-8", "replace"), time.monotonic() - t0)


def _table(path: Path) -> pa.Table:
    from ranktrace.analyzers.readers import ranktrace_samples

    table, _kind, skipped = ranktrace_samples.read_table(path)
    assert not skipped
    return table


def test_job_completes_and_the_three_sample_files_have_their_schemas(straggler: TtyRun):
    from ranktrace.tracer.watch.sample_log import SCHEMAS

    assert straggler.returncode == 0, straggler.tty[-3000:]
    samples = host_dir(straggler.run_dir) / "samples"
    pids = {int(p): info for p, info in json.loads((host_dir(straggler.run_dir) / "meta.json").read_text())[
        "pids"].items()}
    rank_pids = {info["rank"]: p for p, info in pids.items() if info.get("rank") is not None}
    assert sorted(rank_pids) == [0, 1, 2, 3]
    for name, sch in SCHEMAS.items():
        t = _table(samples / f"{name}.arrow")
        assert t.schema.names == sch.names
        assert t.schema.metadata[b"schema"] == f"ranktrace.samples.{name}/1".encode()
    proc = _table(samples / "proc.arrow")
    procs = proc.filter(pc.equal(proc["kind"], "process"))
    per_rank = {r: procs.filter(pc.equal(procs["pid"], p)).num_rows for r, p in rank_pids.items()}
    assert all(n >= 8 for n in per_rank.values()), per_rank  # one row a second over a >= 10 s life
    row = procs.filter(pc.equal(procs["pid"], rank_pids[3])).to_pylist()[-1]
    assert row["rank"] == 3 and row["rss_bytes"] > 10 << 20 and row["vms_bytes"] > row["rss_bytes"]
    assert row["utime_ns"] > 0 and row["rchar"] is not None and row["num_threads"] >= 1
    threads = proc.filter(pc.equal(proc["kind"], "thread"))
    main3 = threads.filter(pc.equal(threads["tid"], rank_pids[3])).to_pylist()
    assert main3 and {r["state"] for r in main3} <= set("RSDI") and any(r["wchan"] is not None for r in main3)
    # a running thread gets a row whenever its CPU time moved: rank 3's main thread, computing, many rows
    assert len(main3) >= 6
    stacks = _table(samples / "stacks.arrow")
    kinds = set(stacks["kind"].to_pylist())
    assert {"stack", "sample"} <= kinds
    defs = stacks.filter(pc.equal(stacks["kind"], "stack"))
    assert defs.num_rows == len(set(defs["stack_id"].to_pylist()))  # each distinct stack stored once
    refs = stacks.filter(pc.equal(stacks["kind"], "sample"))
    assert refs.num_rows > 3 * defs.num_rows  # then referenced
    assert set(refs["thread_name"].to_pylist()) >= {"MainThread"}
    gpu = _table(samples / "gpu.arrow")
    assert gpu.num_rows == 0  # no NVML here: the file holds the schema only


def test_a_waiting_rank_stack_stops_changing_while_a_computing_rank_changes(straggler: TtyRun):
    stacks = _table(host_dir(straggler.run_dir) / "samples" / "stacks.arrow")
    frames = {r["stack_id"]: r["frames"] for r in stacks.filter(pc.equal(stacks["kind"], "stack")).to_pylist()}
    refs = stacks.filter(pc.and_(pc.equal(stacks["kind"], "sample"), pc.equal(stacks["thread_name"], "MainThread")))
    rows = [r for r in refs.to_pylist() if r["rank"] is not None]
    window = sorted({r["sample_id"] for r in rows if r["rank"] == 3
                     and any("straggle" in f for f in frames[r["stack_id"]])})
    assert len(window) >= 4, "rank 3 was sampled inside straggle() only a few times"
    # inside the window, leaving out its edges (the dumps of one round are milliseconds apart)
    inside = [r for r in rows if r["sample_id"] in window[1:-1]]
    for rank in (0, 1, 2):
        mine = sorted((r for r in inside if r["rank"] == rank), key=lambda r: r["sample_id"])
        # on a loaded machine a waiting rank may reach its all_reduce a sample after rank 3 began to straggle: from
        # its first sample inside all_reduce on, its stack does not change
        first = next((i for i, r in enumerate(mine) if any(f.startswith("all_reduce") for f in frames[r["stack_id"]])),
                     None)
        settled = mine[first + 1:] if first is not None else []
        assert settled and all(r["changed"] is False for r in settled), (rank, mine)
        assert all(any(f.startswith("all_reduce") for f in frames[r["stack_id"]]) for r in settled)
    computing = [r for r in inside if r["rank"] == 3]
    assert any(r["changed"] for r in computing), computing
    assert len({r["stack_id"] for r in computing}) >= 2
    assert {r["trigger"] for r in rows} <= {"periodic", "quiet", "burst"}


def test_status_line_is_drawn_on_the_bottom_row_of_a_tty_and_released_at_the_end(straggler: TtyRun):
    tty = straggler.tty
    draws = re.findall(r"\x1b7\x1b\[40;1H\x1b\[2K\x1b\[0m(\[ranktrace\] [ -~]*)\x1b8", tty)
    assert tty.count("\x1b[1;39r") == 1 and tty.rindex("\x1b[r") > tty.rindex("\x1b[40;1H\x1b[2K\x1b[0m")
    assert len(draws) >= 5, tty[-2000:]
    assert len(draws) <= straggler.elapsed + 2  # at most one redraw a second
    assert any("4/4 ranks alive" in d for d in draws), draws[-5:]
    assert any(re.search(r"\| group 0 at seq \d+", d) for d in draws), draws[-5:]  # group "0" (default_pg), its seq
    assert any("quiet" in d and "running" in d for d in draws), draws[-5:]
    last = [ln for ln in tty.replace("\r\n", "\n").split("\n") if "[ranktrace]" in ln][-1]
    assert last.startswith("\r\x1b[K[ranktrace] job exited with status 0") or \
        last.endswith("exit code 0 is the job's; trace in " + str(straggler.run_dir)), repr(last[-300:])
    assert "\x1b[K" not in straggler.stdout and "[ranktrace]" not in straggler.stdout


def test_nvml_absent_is_said_once(straggler: TtyRun):
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except Exception:
        pass
    lines = [ln for ln in re.split(r"[\r\n]+", straggler.tty) if "NVML" in ln]
    assert len(lines) == 1, lines
    assert lines[0].removeprefix("\x1b[K").startswith("[ranktrace] ") and "no GPU samples" in lines[0]
    m = json.loads((host_dir(straggler.run_dir) / "meta.json").read_text())
    assert m["gpus"] == []


def test_analyze_reads_the_samples(straggler: TtyRun):
    from ranktrace.analyzers.inputs import collect as sources
    from ranktrace.analyzers.readers import ranktrace_samples

    inputs = sources.collect([straggler.run_dir])
    obs = inputs.observations
    kinds = set(obs["kind"].to_pylist())
    assert {"stack_change", "thread_state", "proc_memory"} <= kinds
    sc = obs.filter(pc.equal(obs["kind"], "stack_change")).to_pylist()
    by_rank = {o["rank"]: o for o in sc if o["name"] == "MainThread" and o["rank"] is not None}
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert not any(s.startswith(str(host_dir(straggler.run_dir) / "samples")) for s in
                   [sk.file for sk in inputs.skipped])
    # a clean exit: sampled stacks are older than the end and are left out of STACKS
    assert not any("stacks.arrow" in (f or "") for f in inputs.stacks["file"].to_pylist())
    res = ranktrace_samples.read(host_dir(straggler.run_dir) / "samples" / "stacks.arrow", with_stacks=True)
    st = res.stacks
    assert st.num_rows and st["wall_ns"].null_count == 0 and set(st["source"].to_pylist()) == {"pyspy"}
    per_pid = {}
    for s in st["snapshot"].to_pylist():
        m = re.fullmatch(r"stacks\.arrow\[sample (\d+) pid (\d+)\]", s)
        assert m
        per_pid.setdefault(m.group(2), set()).add(m.group(1))
    assert all(len(v) <= ranktrace_samples.MAX_SNAPSHOTS for v in per_pid.values())


# -------------------------------------------------------------------------------------------- arrow streams

def test_a_killed_writer_loses_at_most_the_last_interval(tmp_path: Path):
    from ranktrace.analyzers.readers import ranktrace_samples
    from ranktrace.tracer.watch.sample_log import ArrowStreamLog, PROC_SCHEMA

    path = tmp_path / "samples" / "proc.arrows"
    log = ArrowStreamLog(path, PROC_SCHEMA)
    assert ranktrace_samples.read_table(path)[0].num_rows == 0  # schema on disk before any row
    for i in range(3):
        for j in range(5):
            log.add({"kind": "process", "pid": 100 + j, "wall_ns": i, "state": "S"})
        log.flush()
    log.add({"kind": "process", "pid": 999, "wall_ns": 3})   # pending, never flushed: the writer is "killed"
    data = path.read_bytes()
    assert ranktrace_samples.read_table(path)[0].num_rows == 15   # no end-of-stream marker needed
    path.write_bytes(data[:-40])                                   # last batch cut mid-write
    table, kind, skipped = ranktrace_samples.read_table(path)
    assert kind == "proc" and table.num_rows == 10 and len(skipped) == 1 and "cut" in skipped[0].reason


def test_ring_tail_follows_a_wrapping_ring(tmp_path: Path):
    from ranktrace.tracer.watch.ring_tail import RingTail
    from ranktrace.tracer.rank.recorder import Recorder

    rec = Recorder(str(tmp_path / "4242-x.ring"), slots=64, meta_bytes=1 << 16)
    rec.meta({"type": "identity", "rank": 2, "world": 4})
    rec.meta({"type": "group", "name": "0", "desc": "default_pg", "backend": "gloo", "ranks": [0, 1, 2, 3]})
    name, group = rec.intern("all_reduce"), rec.intern("0")
    tail = RingTail(tmp_path / "4242-x.ring")

    def ops(first: int, last: int) -> None:
        for seq in range(first, last + 1):
            rec.op("enter", "collective", name, tid=1, group_id=group, seq=seq)
            rec.op("exit", "collective", name, tid=1, group_id=group, seq=seq)

    ops(1, 20)
    assert tail.update() and (tail.rank, tail.world, tail.newest, tail.group_seq) == (2, 4, 40, {"0": 20})
    assert not tail.update()              # nothing new: nothing changed
    ops(21, 25)
    assert tail.update() and tail.newest == 50 and tail.group_seq == {"0": 25}
    ops(26, 400)                          # wraps the 64-slot ring many times between two reads
    assert tail.update() and tail.newest == 800 and tail.group_seq == {"0": 400} and tail.last_op == "all_reduce"
    rec.close()


def test_ring_tail_skips_a_slot_the_writer_is_inside(tmp_path: Path, monkeypatch):
    """Seqlock: a slot whose commit word changes between the two reads of a range (the writer zeroed it to start
    rewriting) is not applied from the first read's bytes; the next update reads it whole."""
    from ranktrace.tracer.formats import ringformat as rf
    from ranktrace.tracer.watch.ring_tail import RingTail
    from ranktrace.tracer.rank.recorder import Recorder

    path = tmp_path / "4243-x.ring"
    rec = Recorder(str(path), slots=64, meta_bytes=1 << 16)
    rec.meta({"type": "identity", "rank": 0, "world": 2})
    name, group = rec.intern("all_reduce"), rec.intern("0")
    for seq in (1, 2, 3):
        rec.op("enter", "collective", name, tid=1, group_id=group, seq=seq)
    tail = RingTail(path)
    assert tail.update() and tail.newest == 3 and tail.group_seq == {"0": 3}
    rec.op("enter", "collective", name, tid=1, group_id=group, seq=999)  # index 4, read while being rewritten
    slot4 = rf.META_OFFSET + (1 << 16) + 3 * rf.SLOT_SIZE
    real_open = open
    fired = []

    class Racing:
        """The ring file as the tail reads it, with the writer zeroing slot 4's commit word right after the tail's
        first read of that slot (the moment a rewrite begins)."""

        def __init__(self, f):  # noqa: ANN001
            self.f = f

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc):  # noqa: ANN002, ANN204
            self.f.close()

        def seek(self, off: int) -> int:
            return self.f.seek(off)

        def read(self, n: int = -1) -> bytes:
            at = self.f.tell()
            data = self.f.read(n)
            if at == slot4 and not fired:
                fired.append(at)
                fd = os.open(path, os.O_WRONLY)
                os.pwrite(fd, b"\0" * 8, slot4)
                os.close(fd)
            return data

    from ranktrace.tracer.watch import ring_tail

    monkeypatch.setattr(ring_tail, "open", lambda p, mode="r": Racing(real_open(p, mode)), raising=False)
    tail.update()
    assert fired and tail.group_seq == {"0": 3} and tail.newest == 3  # the half-rewritten record was not applied
    monkeypatch.undo()
    rec.op("enter", "collective", name, tid=1, group_id=group, seq=4)  # the writer's next record lands in slot 5
    fd = os.open(path, os.O_WRONLY)  # and slot 4 is whole again (the rewrite finished: seq 4 issued there)
    os.pwrite(fd, struct.pack("<Q", 4), slot4)
    os.close(fd)
    assert tail.update() and tail.newest == 5 and tail.group_seq == {"0": 4}
    rec.close()


def test_status_line_rate_and_format():
    from ranktrace.tracer.watch.statusline import StatusLine, compact_group, format_status

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    stream = open(slave, "w")
    now = [100.0]
    s = StatusLine(stream, clock=lambda: now[0], enabled=True)
    s.update(lambda w: "one")
    now[0] += 0.5
    s.update(lambda w: "two")   # too soon: not drawn
    now[0] += 0.6
    s.update(lambda w: f"three {w}")
    s.clear()
    stream.close()
    got = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            got += os.read(master, 4096)
        except OSError:
            break
    os.close(master)
    reserve, draw = "\x1bD\x1b[1A\x1b7\x1b[1;23r\x1b8", "\x1b7\x1b[24;1H\x1b[2K\x1b[0m"
    release = "\x1b7\x1b[24;1H\x1b[2K\x1b[r\x1b8"
    assert got.decode() == f"{reserve}{draw}one\x1b8{draw}three 79\x1b8{release}"
    quiet = StatusLine(io.StringIO())
    quiet.update(lambda w: "x")
    quiet.clear()
    assert quiet.stream.getvalue() == ""
    assert compact_group("0", {0: 7, 1: 7, 2: 7, 3: 6}) == "group 0 at seq 7, rank 3 at 6"
    assert compact_group("tp", {0: 9, 1: 8, 2: 9, 3: 8, 4: 7, 5: 9}) == "group tp at seq 9, ranks 1,3 at 8, rank 4 at 7"
    assert compact_group("0", {}) == "group 0: no op yet"
    text = format_status(3, 4, 4, {"0": {0: 7, 1: 7, 2: 7}}, 12.4, "running")
    assert text == "[ranktrace] 3/4 ranks alive | group 0 at seq 7 | quiet 12s | running"
    assert format_status(0, 0, None, {}, 2, "starting") == "[ranktrace] no rank yet | quiet 2s | starting"


# ------------------------------------------------------------------------------------------------- NCCL RAS

class FakeRas:
    """A loopback server speaking NCCL's RAS client protocol, answering STATUS with the given outputs in turn."""

    def __init__(self, answers: list[str], json_format: bool) -> None:
        self.answers, self.json_format = answers, json_format
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.served = 0
        self.commands: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as f:
                for raw in f:
                    cmd = raw.decode().strip()
                    self.commands.append(cmd)
                    up = cmd.upper()
                    if up.startswith("CLIENT PROTOCOL"):
                        conn.sendall(b"SERVER PROTOCOL 2\n")
                    elif up.startswith("TIMEOUT"):
                        conn.sendall(b"OK\n")
                    elif up == "SET FORMAT JSON":
                        conn.sendall(b"OK\n" if self.json_format else f"ERROR: Unknown command {cmd}\n".encode())
                    elif up == "STATUS":
                        conn.sendall(self.answers[min(self.served, len(self.answers) - 1)].encode())
                        self.served += 1
                        break

    def close(self) -> None:
        self.sock.close()


def test_ras_pair_json_counts_moved_and_missing_rank(tmp_path: Path):
    from ranktrace.analyzers.readers import nccl_ras, ranktrace_samples
    from ranktrace.tracer.watch import ras

    doc = (RAS_DATA / "json_2_29.json").read_text()
    later = doc.replace('"AllReduce": 0', '"AllReduce": 12')
    server = FakeRas([doc, later], json_format=True)
    try:
        t0 = time.monotonic()
        res = ras.poll(server.addr, budget_s=2.0, gap_s=0.3)
        assert time.monotonic() - t0 < 2.0
    finally:
        server.close()
    assert res.absent is None and not res.problems and [a.format for a in res.answers] == ["json", "json"]
    assert server.commands[:4] == ["CLIENT PROTOCOL 2", "TIMEOUT 1", "SET FORMAT json", "STATUS"]
    path = ras.save(res, tmp_path)
    assert path is not None and path.name == "ras.json"
    assert nccl_ras.sniff(path, path.read_bytes()[:65536])
    s = ras.summarize(res)
    assert s["snapshots"] == 2 and s["moved"] is True
    assert s["missing"] == [{"group": "0xae94423cfbb2ef4a", "rank": 1, "pid": 1524345, "host": "172.16.64.245"}]
    obs = ranktrace_samples.ras_progress(path).to_pylist()
    assert [(o["kind"], o["group"], o["value"], o["source"]) for o in obs] == [
        ("ras_progress", "0xae94423cfbb2ef4a", 1, "ras")]
    assert "rank 0 all_reduce 0->12" in obs[0]["detail"]


def test_ras_pair_text_from_an_older_nccl_that_stands_still(tmp_path: Path):
    from ranktrace.analyzers.readers import ranktrace_samples
    from ranktrace.tracer.watch import ras

    text = (RAS_DATA / "text_2_26_ahead.txt").read_text()
    server = FakeRas([text], json_format=False)
    try:
        res = ras.poll(server.addr, budget_s=2.0, gap_s=0.3)
    finally:
        server.close()
    assert [a.format for a in res.answers] == ["text", "text"]
    path = ras.save(res, tmp_path)
    assert path is not None and path.name == "ras.txt"
    s = ras.summarize(res)
    assert s["snapshots"] == 2 and s["moved"] is False
    obs = ranktrace_samples.ras_progress(path).to_pylist()
    assert obs and all(o["value"] == 0 for o in obs)


def test_no_ras_listening_costs_nothing_and_is_said_once(tmp_path: Path):
    from ranktrace.tracer.watch import burst
    from ranktrace.tracer.watch import ras
    from ranktrace.tracer.watch.monitor import Monitor, MonitorOptions

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()   # nothing listens there now
    t0 = time.monotonic()
    res = ras.poll(addr)
    assert time.monotonic() - t0 < 0.5 and res.absent == f"no NCCL RAS on {addr}" and not res.answers
    run = tmp_path / "run"
    hd = run / "host-1"
    (hd / "rings").mkdir(parents=True)
    logs: list[str] = []
    mon = Monitor(run, hd, MonitorOptions(samples=False, gpu=False, ras_addr=addr), log=logs.append,
                  show=logs.append)
    for _ in range(2):
        b = burst.capture_burst(hd, [], ras_addr=None if mon._ras_off else addr)
        mon._ras_said(b.ras)
    assert logs == [f"no NCCL RAS on {addr}"]
    # a RAS that answers with moving counts: NCCL still issues work, the monitor says so and reports no hang
    doc = (RAS_DATA / "json_2_29.json").read_text()
    server = FakeRas([doc, doc.replace('"Broadcast": 0', '"Broadcast": 3')], json_format=True)
    try:
        b = burst.capture_burst(hd, [], ras_addr=server.addr)
    finally:
        server.close()
    assert (b.directory / "ras.json").exists() and b.ras is not None and b.ras.moved is True
    logs.clear()
    assert mon._ras_said(b.ras) is True
    assert any("missing rank 1 of 0xae94423cfbb2ef4a" in ln for ln in logs)
    assert any("counts moved" in ln and "not reporting a hang" in ln for ln in logs)
    mon.close()


# ---------------------------------------------------------------------------------------------- NVML child

FAKE_PYNVML = '''
import os, time
class NVMLError(Exception): pass
class NVMLError_NotSupported(NVMLError): pass
class NVMLError_Timeout(NVMLError): pass
NVML_CLOCK_SM = 1; NVML_TEMPERATURE_GPU = 0; NVML_PCIE_UTIL_TX_BYTES = 0; NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138; NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1; NVML_MEMORY_ERROR_TYPE_CORRECTED = 0; NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 8; nvmlEventTypeDoubleBitEccError = 2
class _NS:
    def __init__(self, **kw): self.__dict__.update(kw)
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return b"550.54.15"
def nvmlSystemGetCudaDriverVersion(): return 12040
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUUID(h): return "GPU-%d" % h
def nvmlDeviceGetCudaComputeCapability(h): return (9, 0)
def nvmlDeviceGetMemoryInfo(h): return _NS(total=80 << 30, used=(1 + h) << 30)
def nvmlDeviceGetPciInfo(h): return _NS(busId=b"00000000:%02X:00.0" % (0x18 + h))
def nvmlDeviceGetUtilizationRates(h):
    if os.environ.get("FAKE_NVML_WEDGE") == "1":
        time.sleep(3600)  # a wedged driver
    return _NS(gpu=97, memory=40)
def nvmlDeviceGetPowerUsage(h): return 350000
def nvmlDeviceGetClockInfo(h, c): return 1980
def nvmlDeviceGetTemperature(h, t): return 61
def nvmlDeviceGetPcieThroughput(h, c): return 1234 + c
def nvmlDeviceGetFieldValues(h, ids): raise NVMLError_NotSupported("Not Supported")
def nvmlDeviceGetTotalEccErrors(h, t, c): return 2 if (h, t) == (1, 1) else 0
def nvmlDeviceGetComputeRunningProcesses(h): return [_NS(pid=4242 + h, usedGpuMemory=(1 + h) << 30)]
_events = [_NS(device=1, eventData=79, eventType=8)]
def nvmlEventSetCreate(): return "set"
def nvmlDeviceRegisterEvents(h, mask, s): pass
def nvmlEventSetWait_v2(s, ms):
    if _events:
        return _events.pop()
    raise NVMLError_Timeout("Timeout")
'''


def _fake_child(tmp_path: Path) -> list[str]:
    (tmp_path / "fake").mkdir(exist_ok=True)
    (tmp_path / "fake" / "pynvml.py").write_text(FAKE_PYNVML)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path / 'fake')!r}); "
            "from ranktrace.tracer.watch.gpu_sampler import child_main; sys.exit(child_main())")
    return [sys.executable, "-c", code]


def test_gpu_child_samples_devices_processes_and_xids(tmp_path: Path):
    from ranktrace.analyzers.readers import ranktrace_samples
    from ranktrace.tracer.watch.sample_log import ArrowStreamLog, GPU_SCHEMA
    from ranktrace.tracer.watch.gpu_sampler import GpuSampler

    logs: list[str] = []
    g = GpuSampler(log=logs.append, timeout_s=10, command=_fake_child(tmp_path))
    g.start()
    rows: list[dict] = []
    deadline = time.monotonic() + 15
    while not rows and time.monotonic() < deadline:
        rows.extend(g.poll())
        g.request()
        time.sleep(0.02)
    g.close()
    assert logs == [] and g.hello["driver"] == "550.54.15" and g.hello["cuda_driver"] == "12.4"
    assert [d["bus_id"] for d in g.hello["gpus"]] == ["00000000:18:00.0", "00000000:19:00.0"]
    dev = [r for r in rows if r["kind"] == "device"]
    assert [(r["gpu"], r["util_gpu"], r["mem_used"], r["power_mw"], r["sm_clock_mhz"], r["pcie_rx_kbps"])
            for r in dev] == [(0, 97, 1 << 30, 350000, 1980, 1235), (1, 97, 2 << 30, 350000, 1980, 1235)]
    assert all(r.get("nvlink_tx_kib") is None for r in dev)  # not supported: null, and not asked again
    assert [(r["gpu"], r["pid"], r["mem_used"]) for r in rows if r["kind"] == "process"] == [
        (0, 4242, 1 << 30), (1, 4243, 2 << 30)]
    assert [(r["gpu"], r["xid"]) for r in rows if r["kind"] == "xid"] == [(1, 79)]
    log = ArrowStreamLog(tmp_path / "samples" / "gpu.arrows", GPU_SCHEMA)
    for r in rows:
        log.add(r)
    log.close()
    obs = ranktrace_samples.read(tmp_path / "samples" / "gpu.arrows").observations.to_pylist()
    got = {(o["kind"], o["name"], o["pid"]): o["value"] for o in obs}
    assert got[("gpu_util", "gpu0", None)] == 97 and got[("gpu_memory", "gpu1", None)] == 2 << 30
    assert got[("gpu_memory", "gpu1", 4243)] == 2 << 30 and got[("gpu_xid", "gpu1", None)] == 79
    assert got[("gpu_ecc", "gpu1", None)] == 2


def test_a_wedged_nvml_is_given_up_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from ranktrace.tracer.watch.gpu_sampler import GpuSampler

    monkeypatch.setenv("FAKE_NVML_WEDGE", "1")
    logs: list[str] = []
    g = GpuSampler(log=logs.append, timeout_s=1.0, command=_fake_child(tmp_path))
    g.start()
    assert g.wait_hello(10) is not None     # the hello does not touch the wedged call
    g.request()
    deadline = time.monotonic() + 5
    while g.active and time.monotonic() < deadline:
        assert g.poll() == []
        g.request()
        time.sleep(0.05)
    assert not g.active and g.proc is None
    assert logs == ["NVML did not answer within 1 s (wedged driver?): GPU sampling off"]
    g.poll()
    g.request()
    assert len(logs) == 1


def test_a_failed_py_spy_dump_says_py_spys_error_not_the_last_line_of_its_backtrace():
    """py-spy ends a failure with a Rust backtrace; its last line ("10: main") was what the status line and the
    dump's error said. A real py-spy on a gone pid and on a process that is not Python."""
    import shutil

    from ranktrace.tracer.watch.stack_sampler import pyspy_dump

    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        pytest.skip("py-spy not installed here")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        for pid in (dead.pid, sleeper.pid):
            err = pyspy_dump(exe, pid).error
            assert err and err.startswith(f"py-spy dump of pid {pid} failed: "), err
            said = err.split("failed: ", 1)[1]
            assert not re.match(r"^\d+:", said) and "main" != said.split()[-1], err
            assert re.search(r"(?i)process|python", said), err  # py-spy's own reason, in its words
    finally:
        sleeper.kill()
        sleeper.wait()
