"""The machine facts `trace run` gathers for `trace compare` (tracer/launch/sysfacts.py): IOMMU from sysfs and the
kernel command line, ACS from `lspci -vvv`, the topo matrix kept for the nvidia-smi reader, system.json shown as
meta.json's `system` and compared."""
from __future__ import annotations

import json
from pathlib import Path

from ranktrace.analyzers.compare import facts
from ranktrace.analyzers.model.values import Analysis, HostRun
from ranktrace.tracer.launch import sysfacts


def test_iommu_from_sysfs_and_cmdline(tmp_path: Path):
    sysfs, cmdline = tmp_path / "sys", tmp_path / "cmdline"
    cmdline.write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet\n")
    assert sysfacts.iommu_state(sysfs, cmdline) == "off (no IOMMU units or groups in sysfs); cmdline intel_iommu=on " \
                                                   "iommu=pt"
    for unit in ("dmar0", "dmar1"):
        (sysfs / "class" / "iommu" / unit).mkdir(parents=True)
    for g in range(3):
        (sysfs / "kernel" / "iommu_groups" / str(g)).mkdir(parents=True)
    assert sysfacts.iommu_state(sysfs, cmdline).startswith("on: 2 IOMMU units, 3 groups; cmdline intel_iommu=on")


def test_acs_from_lspci():
    bridge = ("00:01.0 PCI bridge: Intel Corporation Device\n\tCapabilities: [220 v1] Access Control Services\n"
              "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
              "\t\tACSCtl:\tSrcValid{} TransBlk- ReqRedir{} CmpltRedir{} UpstreamFwd{} EgressCtrl- DirectTrans-\n")
    assert sysfacts.acs_state(bridge.format("+", "+", "+", "+") * 2) == "enabled (SrcValid+) on 2 of 2 ports"
    assert sysfacts.acs_state(bridge.format("-", "-", "-", "-")) == "disabled on all 1 ports"
    assert sysfacts.acs_state("00:01.0 PCI bridge\n\tCapabilities: <access denied>\n") == \
        "not visible (lspci needs root)"
    assert sysfacts.acs_state(None).startswith("not visible")


def test_system_json_written_and_compared(tmp_path: Path):
    got = sysfacts.collect(tmp_path)
    written = json.loads((tmp_path / "system.json").read_text())
    assert written["kernel"] == got["kernel"] and written["iommu"].startswith(("on", "off"))

    def run(system: dict) -> Analysis:
        from ranktrace.tracer.formats import schema
        from ranktrace.analyzers.model.values import JobStatus
        from ranktrace.analyzers.model.timeline import OPS
        from ranktrace.analyzers.verdict import Verdict

        meta = {"schema": "ranktrace.meta/1", "env": {}, "system": system}
        return Analysis(Verdict("completed", "no_hang", "ok"), schema.empty(schema.EVENTS), OPS.empty_table(),
                        schema.empty(schema.STACKS), schema.empty(schema.OBSERVATIONS), (), (),
                        JobStatus(True, True, 0, None), None, (HostRun(tmp_path, meta, True),))

    a = facts.run_facts(run({"iommu": "off (no IOMMU units or groups in sysfs)", "acs": "disabled on all 4 ports"}))
    b = facts.run_facts(run({"iommu": "on: 2 IOMMU units, 87 groups", "acs": "enabled (SrcValid+) on 4 of 4 ports"}))
    rows = {r.key: r for r in facts.context_diff(a, b)}
    assert rows["IOMMU"].status == "differs" and rows["PCIe ACS"].status == "differs"
    assert rows["IOMMU"].section == "topology"
