"""Build a small Nsight Systems SQLite export of a 2-rank NCCL hang (scenario ``nsys_open_range``).

Written from the export schema documented in ``shared/reference/formats.md`` §2 (column names and types as in the
real nsys 2026.2.1 / schema 3.25.0 sample ``shared/data/external/nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite``);
only the tables a hang reader needs are created, each with the real column set of that schema version.

The story (one node ``node0``, ``torchrun`` pid 100, rank 0 = pid 101 on GPU 0, rank 1 = pid 102 on GPU 1):

* both ranks run ``all_reduce`` seq 10 and 11 on ``default_pg`` (ranktrace NVTX ranges, domain ``ranktrace``,
  text ``all_reduce group=default_pg seq=N``); each launched one ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` that
  completed (kernel rows present);
* rank 0 then enters a user range ``load_batch`` (default NVTX domain) that never ends: it is stuck outside any
  collective and never issues seq 12;
* rank 1 enters ``all_reduce`` seq 12, its range is still open at capture end (``end`` NULL), and the NCCL kernel
  it launched (``cudaLaunchKernelExC``, correlationId 2012) has **no** kernel row — it spins waiting for rank 0;
* ranks are named by a ranktrace NVTX mark ``ranktrace rank=R world=2`` in each process;
* torchrun's captured stderr (``ProcessStreams``) holds a few NCCL INFO lines.

Expected diagnosis: hang, rank 1 waits on rank 0 for ``all_reduce`` seq 12 of ``default_pg``; culprit rank 0.

Run ``python make.py`` to (re)write ``nsys_open_range.sqlite`` next to this file; tests call :func:`build`.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

__all__ = ["build", "SESSION_START_NS", "UTC_EPOCH_NS", "CAPTURE_STOP_NS", "RANK_PIDS", "HANG_CORRELATION_ID"]

SESSION_START_NS = 1_000_000_000          # session clock at capture start
CAPTURE_STOP_NS = 6_000_000_000
UTC_EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
RANK_PIDS = {0: 101, 1: 102}
LAUNCHER_PID = 100
HANG_CORRELATION_ID = 2012
VM = 1 << 48

_DDL = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, systemClockNs INTEGER",
    "ANALYSIS_DETAILS": "globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, startTime INTEGER NOT NULL, "
                        "stopTime INTEGER NOT NULL",
    "TARGET_INFO_SYSTEM_ENV": "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
                              "nameEnum INTEGER NOT NULL, value TEXT NOT NULL",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
                       "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
                       "smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, "
                       "computeMajor INTEGER, computeMinor INTEGER",
    "TARGET_INFO_CUDA_DEVICE": "gpuId INTEGER NOT NULL, cudaId INTEGER NOT NULL, pid INTEGER, uuid TEXT, "
                               "numMultiprocessors INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
                   "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
                   "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, "
                   "uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, "
                   "binaryData TEXT",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
                                   "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER NOT NULL, callchainId INTEGER",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
                                  "shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
                                  "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
                                  "gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, "
                                  "blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
                                  "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
                                  "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, "
                                  "gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
                                  "sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone INTEGER, "
                                  "qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER, "
                                  "clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, "
                                  "clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER, "
                                  "maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER, "
                                  "tensorSizeMinusOneElements TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
                                  "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, "
                                  "copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
                                  "dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, "
                                  "dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, "
                                  "virtualAddress INTEGER, copyCount INTEGER",
    "ProcessStreams": "globalPid INTEGER NOT NULL, filenameId INTEGER NOT NULL, contentId INTEGER NOT NULL",
}

_NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
_NCCL_KERNEL_FULL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
# torchrun's captured stderr: NCCL INFO lines of both ranks. Built from parts so that this script itself does not
# look like an NCCL log to the readers when the scenario folder is analyzed.
_NCCL_LINES = (
    (101, 101, 0, "Bootstrap: Using eth0:10.0.0.1<0>"),
    (102, 102, 1, "Bootstrap: Using eth0:10.0.0.1<0>"),
    (101, 101, 0, "NCCL version 2.21.5+cuda12.4"),
    (101, 130, 0, "comm 0x55d0c0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
    (102, 131, 1, "comm 0x55e1a0 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0"),
    (101, 130, 0, "Init COMPLETE"),
    (102, 131, 1, "Init COMPLETE"),
)
_STDERR = "".join(f"node0:{pid}:{tid} [{dev}] {'NCCL'} INFO {msg}\n" for pid, tid, dev, msg in _NCCL_LINES)


def _gpid(pid: int) -> int:
    return VM | (pid << 24)


def _gtid(pid: int, tid: int) -> int:
    return VM | (pid << 24) | tid


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids) + 1)


def _insert(conn: sqlite3.Connection, table: str, **values: object) -> None:
    cols = ", ".join(f'"{c}"' for c in values)
    conn.execute(f'INSERT INTO "{table}" ({cols}) VALUES ({", ".join("?" * len(values))})', tuple(values.values()))


def build(path: Path) -> Path:
    """Write the scenario export to ``path`` (overwritten) and return it."""
    path = Path(path)
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    s = _Strings()
    for table, cols in _DDL.items():
        conn.execute(f'CREATE TABLE "{table}" ({cols})')
    for name, value in {
        "EXPORT_PRODUCT_NAME": "NVIDIA Nsight Systems", "EXPORT_PRODUCT_VERSION": "2026.2.1.210",
        "EXPORT_SCHEMA_VERSION": "3.25.0", "EXPORT_SCHEMA_VERSION_MAJOR": "3", "EXPORT_SCHEMA_VERSION_MINOR": "25",
        "EXPORT_SCHEMA_VERSION_MICRO": "0", "EXPORT_PARAM_TIME_NORMALIZE": "false",
        "EXPORT_PARAM_INPUT_FILE": "nsys_open_range.nsys-rep",
    }.items():
        _insert(conn, "META_DATA_EXPORT", name=name, value=value)
    for name, value in (("PROCESS_0:COMMAND", "torchrun"), ("PROCESS_0:ARGUMENT_0", "--nproc_per_node=2"),
                        ("PROCESS_0:ARGUMENT_1", "train.py"), ("PROCESS_0:ENVIRONMENT_VARIABLE", 'PATH="/usr/bin"')):
        _insert(conn, "META_DATA_CAPTURE", name=name, value=value)
    _insert(conn, "TARGET_INFO_SESSION_START_TIME", utcEpochNs=UTC_EPOCH_NS, utcTime="2026-01-01T00:00:00",
            localTime="2026-01-01T00:00:00", systemClockNs=SESSION_START_NS)
    _insert(conn, "ANALYSIS_DETAILS", globalVid=VM, duration=CAPTURE_STOP_NS - SESSION_START_NS,
            startTime=SESSION_START_NS, stopTime=CAPTURE_STOP_NS)
    for enum, (name, value) in enumerate((("Hostname", "node0"), ("NvDriverVersion", "550.54.15"),
                                          ("CudaDriverVersion", "12040"), ("GpuInfo", "{}"))):
        _insert(conn, "TARGET_INFO_SYSTEM_ENV", globalVid=VM, devStateName="Default", name=name, nameEnum=enum,
                value=value)
    for gpu in (0, 1):
        _insert(conn, "TARGET_INFO_GPU", vmId=1, id=gpu, name="NVIDIA H100 80GB HBM3",
                busLocation=f"0000:{0x18 + gpu:02x}:00.0", isDiscrete=1, totalMemory=85_520_809_984, smCount=132,
                uuid=f"GPU-0000000{gpu}-aaaa-bbbb-cccc-000000000000",
                cuDevice=gpu, computeMajor=9, computeMinor=0)
    for rank, pid in RANK_PIDS.items():
        _insert(conn, "TARGET_INFO_CUDA_DEVICE", gpuId=rank, cudaId=rank, pid=pid,
                uuid=f"GPU-0000000{rank}-aaaa-bbbb-cccc-000000000000", numMultiprocessors=132)
    _insert(conn, "PROCESSES", globalPid=_gpid(LAUNCHER_PID), pid=LAUNCHER_PID, name="torchrun")
    for pid in RANK_PIDS.values():
        _insert(conn, "PROCESSES", globalPid=_gpid(pid), pid=pid, name="python3")
        _insert(conn, "ThreadNames", nameId=s("python3"), priority=20, globalTid=_gtid(pid, pid))
        _insert(conn, "ThreadNames", nameId=s("pt_nccl_watchdg"), priority=20, globalTid=_gtid(pid, pid + 30))

    corr = 2000
    for rank, pid in RANK_PIDS.items():
        main = _gtid(pid, pid)
        base = SESSION_START_NS + 100_000_000

        def nvtx(start: int, end: int | None, text: str, domain: int, etype: int = 59) -> None:
            _insert(conn, "NVTX_EVENTS", start=start, end=end, eventType=etype, text=text, globalTid=main,
                    endGlobalTid=None if end is None else main, domainId=domain)

        nvtx(base, None, "ranktrace", 1, etype=75)                      # domain create (name in text)
        nvtx(base + 1_000, None, f"ranktrace rank={rank} world=2", 1, etype=34)   # mark
        nvtx(base + 50_000_000, base + 350_000_000, "train_step", 0)    # user range, closed
        for i, seq in enumerate((10, 11)):
            start = base + 100_000_000 + i * 100_000_000
            nvtx(start, start + 20_000_000, f"all_reduce group=default_pg seq={seq}", 1)
            corr += 1
            launch = start + 5_000_000
            _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", start=launch, end=launch + 8_000, eventClass=0,
                    globalTid=main, correlationId=corr, nameId=s("cudaLaunchKernelExC_v11060"), returnValue=0)
            _insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", start=launch + 20_000, end=start + 30_000_000, deviceId=rank,
                    contextId=1, streamId=13, correlationId=corr, globalPid=_gpid(pid),
                    demangledName=s(_NCCL_KERNEL_FULL), shortName=s(_NCCL_KERNEL), registersPerThread=96, gridX=2,
                    gridY=1, gridZ=1, blockX=640, blockY=1, blockZ=1, staticSharedMemory=0,
                    dynamicSharedMemory=0, localMemoryPerThread=0, localMemoryTotal=0, gridId=seq,
                    tensorSizeMinusOneElements="[]")
        # an ordinary compute kernel and a finished async copy, so the tables are not NCCL-only
        corr += 1
        _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", start=base + 60_000_000, end=base + 60_005_000, eventClass=0,
                globalTid=main, correlationId=corr, nameId=s("cudaLaunchKernel_v7000"), returnValue=0)
        _insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", start=base + 60_010_000, end=base + 61_000_000, deviceId=rank,
                contextId=1, streamId=7, correlationId=corr, globalPid=_gpid(pid),
                demangledName=s("void at::native::vectorized_elementwise_kernel<4>(int)"),
                shortName=s("vectorized_elementwise_kernel"), registersPerThread=32, gridX=1, gridY=1, gridZ=1,
                blockX=128, blockY=1, blockZ=1, staticSharedMemory=0, dynamicSharedMemory=0, localMemoryPerThread=0,
                localMemoryTotal=0, gridId=1, tensorSizeMinusOneElements="[]")
        corr += 1
        _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", start=base + 62_000_000, end=base + 62_010_000, eventClass=0,
                globalTid=main, correlationId=corr, nameId=s("cudaMemcpyAsync_v3020"), returnValue=0)
        _insert(conn, "CUPTI_ACTIVITY_KIND_MEMCPY", start=base + 62_020_000, end=base + 62_500_000, deviceId=rank,
                contextId=1, streamId=7, correlationId=corr, globalPid=_gpid(pid), bytes=1 << 20, copyKind=1)
        corr += 1
        _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", start=base + 330_000_000, end=base + 331_000_000, eventClass=0,
                globalTid=main, correlationId=corr, nameId=s("cudaStreamSynchronize_v3020"), returnValue=0)
        hang_start = base + 400_000_000
        if rank == 0:
            nvtx(hang_start, None, "load_batch", 0)                      # stuck in user code, never ends
        else:
            nvtx(hang_start, None, "all_reduce group=default_pg seq=12", 1)  # open at capture end
            _insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", start=hang_start + 5_000_000,
                    end=hang_start + 5_008_000, eventClass=0, globalTid=main, correlationId=HANG_CORRELATION_ID,
                    nameId=s("cudaLaunchKernelExC_v11060"), returnValue=0)   # no kernel row: still spinning
    _insert(conn, "ProcessStreams", globalPid=_gpid(LAUNCHER_PID),
            filenameId=s("/tmp/nvidia/nsight_systems/streams/pid_100_stderr.log"), contentId=s(_STDERR))
    conn.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", [(i, v) for v, i in s.ids.items()])
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("nsys_open_range.sqlite")
    print(build(out))
