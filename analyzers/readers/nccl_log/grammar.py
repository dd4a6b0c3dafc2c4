"""The line grammar of NCCL debug logs, in one place so that the sniffer, the regex loop, the rarer-line parser and
the numpy path (``scan._COLL_RE2`` mirrors ``COLL_RE``) stay in step: patterns, field tables (datatypes, p2p and
rooted ops), a communicator hash's spelling and the ``[timestamp]`` prefix."""
from __future__ import annotations

import re
from datetime import datetime, timezone

__all__ = ["NCCL_DTYPES", "P2P_RAW", "ROOTED_RAW", "COLL_RE", "SCAN_RE", "NRANKS_RE", "COLL_PREFIX_RE", "MARKER_RE",
           "BARE_VERSION_RE", "BARE_WARN_RE", "MISMATCH_RE", "INIT_RE", "FIELD_RES", "API_RE", "SUMMARY_RE", "TEARDOWN_RE", "TRANSPORT_RE", "RING_RE",
           "CONNECT_FAIL_RE", "INIT_FAIL_RE", "CUDA_FAIL_RE", "NET_FAIL_RE", "OLD_FORMAT_RE", "TRAIL_RE", "SNIFF_RE", "SETTING_RES",
           "TUNING_MARK", "TUNING_RE", "TUNING_ALGOS", "TUNING_PROTOS", "normalize_comm_id", "looks_binary",
           "parse_ts"]

#: ncclDataType_t -> (torch dtype name, bytes per element), formats.md §1.6.
NCCL_DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8_e4m3fn", 1),
    11: ("float8_e5m2", 1),
}

P2P_RAW = frozenset({b"Send", b"Recv", b"PutSignal", b"Signal", b"WaitSignal"})
ROOTED_RAW = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})

# COLL lines: the pattern starts with a literal so `finditer` skips ahead in C.
COLL_RE = re.compile(
    rb"NCCL INFO (\w+): opCount ([0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (\d+) datatype (\d+) "
    rb"op \d+ root (-?\d+) comm (0x[0-9a-fA-F]+) \[nranks=\d+\]"
)
# One scan per chunk finds COLL records (groups 1-6) and the rarer lines worth a per-line parse (Init, teardown,
# transports, rings, trees, bootstrap, WARN, error trail, bare version line; no group set). It starts with the
# literal "NCCL" so sre's prefix search runs in C; TUNING and other INFO lines fail a few bytes after "INFO ".
SCAN_RE = re.compile(
    COLL_RE.pattern[:5] + b"(?:" + COLL_RE.pattern[5:] + rb"|WARN |version \d|INFO (?:NCCL version|Call to connect|socket(?:Poll|Start)Connect: "
    rb"|(?:\[Rank \d+\] )?(?:\w+ )?comm 0x|Channel (?:00/|\d+(?:/\d+)? : \d+\[)|Trees \[0\]|Bootstrap|bootstrap"
    rb"|\d+ coll channels|[\w./+-]+:\d+ (?:\([^)\n]*\) )?-> "
    rb"|NCCL_\w+ set |Using network |NVLS multicast |P2P is disabled |Connected all rings|Check P2P Type "
    rb"|cudaDriverVersion ))"
)
NRANKS_RE = re.compile(rb"\[nranks=(\d+)\]")
# The part of a line before "NCCL INFO" of a COLL line, parsed from its end.
COLL_PREFIX_RE = re.compile(
    rb"(?:\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\] )?(?<![^\s:\[\]|()<>])([^\s:\[\]|()<>]+):(\d+):(\d+)"
    rb"(?: \[(\d+)\])? \Z"
)
# Any NCCL line (formats.md §1.2 tolerant pattern, never anchored at column 0).
MARKER_RE = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\] )?"
    r"(?<![^\s:\[\]|()<>])(?P<host>[^\s:\[\]|()<>]+):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?"
    r"(?:(?P<elapsed>\d+\.\d+) )?"
    r"(?:(?P<file>[\w./+-]+):(?P<fline>\d+) (?:\((?P<func>[^)\n]{0,400})\) )?)?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT) "
)
BARE_VERSION_RE = re.compile(r"(?:^|\s|\])NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
#: a WARN whose ``host:pid:tid [dev]`` prefix is gone (cut by a paste, or a log collector that kept the message only):
#: ``init.cc:1247 NCCL WARN Mismatched collective detected, ...``; anchored at the message start
BARE_WARN_RE = re.compile(r"^\s{0,8}(?:\[(?P<dev>\d+)\] )?(?:(?P<file>[\w./+-]+):(?P<fline>\d+) )?NCCL WARN (?P<msg>.+)$")
#: NCCL <= 2.7's own check that the ranks of a communicator called the same collectives (init.cc / enqueue.cc):
#: "Mismatched collective detected, please check your collective calls at and around rank 39" (NVIDIA/nccl#296, #214)
MISMATCH_RE = re.compile(r"Mismatched collective detected(?:, please check your collective calls at and around "
                         r"rank (?P<rank>\d+))?")

INIT_RE = re.compile(r"- Init (START|COMPLETE)\s*$")
FIELD_RES: dict[str, re.Pattern[str]] = {
    "comm": re.compile(r"\bcomm (0x[0-9a-fA-F]+)"),
    "rank": re.compile(r"\brank (-?\d+)"),
    "nranks": re.compile(r"\bnranks (\d+)", re.IGNORECASE),
    "cudaDev": re.compile(r"\bcudaDev (-?\d+)"),
    "nvmlDev": re.compile(r"\bnvmlDev (-?\d+)"),
    "busId": re.compile(r"\bbusId ([0-9a-fA-Fx]+)"),
    "commId": re.compile(r"\bcommId (0x[0-9a-fA-F]+)"),
    "parent": re.compile(r"\bparent (0x[0-9a-fA-F]+|\(nil\))"),
    "color": re.compile(r"\bcolor (-?\d+)"),
    "key": re.compile(r"\bkey (-?\d+)"),
}
API_RE = re.compile(r"^(?:\[Rank \d+\] )?(nccl\w+) comm ")
SUMMARY_RE = re.compile(
    r"^comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)(?: MNNVL (\d+))?"
)
TEARDOWN_RE = re.compile(
    r"comm (0x[0-9a-fA-F]+) rank (-?\d+) n[Rr]anks (\d+).*- (Destroy|Abort|Revoke) (START|COMPLETE)"
)
TRANSPORT_RE = re.compile(
    r"^Channel (\d+)(?:/(\d+))? : (\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[[0-9a-fA-Fx]+\]"
    r"(?: \[(send|receive)\])? via (.+?)\s*$"
)
RING_RE = re.compile(r"^Channel 00/(\d+) :((?: +\d+)+)")
#: what a WARN (or the INFO "Call to connect ... retrying" line) says failed, when it is a set-up or device failure
#: (EVIDENCE.md: init_failure stage connect / nccl_init before Init COMPLETE, transport_error after; cuda_error)
CONNECT_FAIL_RE = re.compile(
    r"socketStartConnect: exceeded retries|Call to connect (?:returned|failed)|NET/Socket : Connect to \S+ failed|"
    r"Connect to \S+ failed|socketPollConnect|Connection refused|Connection timed out|"
    r"Connection closed by remote peer|socketProgress: Connection closed|No route to host")
INIT_FAIL_RE = re.compile(r"[Bb]ootstrap|[Uu]nhandled [Ss]ystem [Ee]rror|bootstrapNet|remote process exited")
#: the network transport's own failure WARNs (transport/net_ib.cc): an IB work completion with an error status
#: ("NET/IB : Got completion from peer X with status=12 opcode=0 len=0 vendor err 129", older "Got completion with
#: error 4, opcode 1, len 21938, vendor err 81") and the size check of a receive ("NET/IB : req 0/1 tag 0 peer X
#: collective mismatch error, local size 496640 remote size 65536"); NVIDIA/nccl#214, #969, #1937
NET_FAIL_RE = re.compile(r"NET/IB ?: .{0,300}?(?:collective mismatch error|Got completion (?:from peer \S{1,80} )?"
                         r"with (?:status|error))")
CUDA_FAIL_RE = re.compile(r"Cuda failure|CUDA failure|cuda(?:Error|Get|Launch|Memcpy|Malloc)\w* failed|"
                           r"peer access is not supported|an illegal memory access")
#: NCCL < 2.3 wrote "host:pid:tid [dev] INFO" / "[dev] file.cc:N WARN" without the "NCCL" word
OLD_FORMAT_RE = re.compile(
    r"(?m)^((?:\[[^\]\n]{1,40}\]:? ?)?[^\s:\[\]|()<>]{1,128}:\d{1,9}:\d{1,9} (?:\[\d{1,4}\] )?"
    r"(?:[\w./+-]{1,200}:\d{1,7} )?)(INFO|WARN) ")
#: What NCCL decided or was told, one line each (``nccl_setting`` observations: key, value). Env echo lines
#: (ENV subsystem, ``NAME set by environment to VALUE.``; a few say ``NAME set to VALUE``), the network chosen, NVLS
#: multicast support per device, GPU pairs P2P is disabled between, ring PXN/GDR use (2.24+), the P2P type check
#: (2.19+) and the driver's CUDA version (formats.md §1.4).
SETTING_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("env", re.compile(r"^(NCCL_[A-Z0-9_]+) set (?:by environment )?to (.*?)\.?\s*$")),
    ("network", re.compile(r"^Using network (.+?)\s*$")),
    ("nvls_multicast", re.compile(r"^NVLS multicast support is ((?:not )?available) on dev (\d+)")),
    ("p2p_disabled", re.compile(r"^P2P is disabled between connected GPUs (\d+) and (\d+)")),
    ("ring_pxn_gdr", re.compile(r"^Connected all rings(?:, use ring (PXN \d+ GDR \d+))?")),
    ("p2p_type", re.compile(r"^Check P2P Type (.+?)\s*$")),
    ("cuda_driver", re.compile(r"^cudaDriverVersion (\d+)")),
)
#: TUNING lines (rank 0 of a communicator, one per call with ``NCCL_DEBUG_SUBSYS`` TUNING): which algorithm and
#: protocol served which size. 2.24+ names them; 2.21-2.23 print numbers (formats.md §1.6).
TUNING_MARK = b" Bytes -> Algo "
TUNING_RE = re.compile(rb"NCCL INFO (\w+)(?: \[Symmetric\])?: (\d+) Bytes -> Algo (\w+) proto (\w+)")
TUNING_ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
TUNING_PROTOS = ("LL", "LL128", "SIMPLE")
TRAIL_RE = re.compile(
    r"^(?P<file>[\w./+-]+):(?P<line>\d+) (?:\((?P<func>[^)]*)\) )?-> (?P<code>\d+)(?P<rest>.*)$"
)


def normalize_comm_id(raw: str) -> str:
    """One spelling of a communicator hash: ``0x`` + lower-case hex without leading zeros.

    NCCL's Init lines print ``commId 0x%llx``; RAS text prints ``%016lx`` and RAS JSON ``"0x..."``.

    >>> normalize_comm_id("0x54FE282D32A87D85"), normalize_comm_id("027a079b828ff1a75")
    ('0x54fe282d32a87d85', '0x27a079b828ff1a75')
    """
    s = raw.strip().lower()
    try:
        return f"0x{int(s, 16):x}"
    except ValueError:
        return s

SNIFF_RE = re.compile(
    rb"(?<![^\s:\[\]|()<>])[^\s:\[\]|()<>]+:\d+:\d+ (?:\[\d+\] )?(?:\S+ )?(?:\([^)\n]{0,400}\) )?"
    rb"NCCL (?:INFO|WARN|TRACE|CALL) |"
    rb"(?:^|\n)NCCL version \d+\.\d+\.\d+"
)


_NUL_RUN = re.compile(rb"\x00{8,}")


def looks_binary(data: bytes) -> bool:
    """Control bytes once NUL runs (sparse holes, a copytruncate'd front: the reader drops them) are set aside."""
    if not data:
        return False
    sample = _NUL_RUN.sub(b"", data[:65536])
    if not sample:
        return False
    if b"\x00" in sample:   # NULs scattered among the bytes, not a hole: binary
        return True
    ctrl = sum(sample.count(bytes([c])) for c in range(1, 32) if c not in (9, 10, 13, 27))
    return ctrl > len(sample) // 20


_TS_CACHE: dict[str, int | None] = {}


def parse_ts(ts: str) -> int | None:
    """``[%F %T]`` (optionally with a fraction) → ns since the epoch, read as UTC (formats.md §1.1)."""
    got = _TS_CACHE.get(ts)
    if got is not None or ts in _TS_CACHE:
        return got
    frac = 0
    base = ts
    for sep in (".", ","):
        if sep in ts:
            base, fs = ts.split(sep, 1)
            frac = int((fs + "000000000")[:9]) if fs.isdigit() else 0
            break
    try:
        dt = datetime.strptime(base.replace("T", " "), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        val: int | None = int(dt.timestamp()) * 1_000_000_000 + frac
    except ValueError:
        val = None
    if len(_TS_CACHE) < 100_000:
        _TS_CACHE[ts] = val
    return val
