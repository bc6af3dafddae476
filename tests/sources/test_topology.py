"""PCIe topology from sysfs: the path above each GPU and which GPUs share an upstream port."""

from __future__ import annotations

import asyncio
import json

from conftest import DATA, H200_CAPTURE

from vgpumon.agent import Agent
from vgpumon.diagnose import build_report
from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.pcie_topology import nvml_bus_id_to_bdf, read_topology
from vgpumon.store import open_store
from vgpumon.testing import scenarios, sysfs

REAL = json.loads((DATA / "h200-sysfs.json").read_text())  # recorded on the H200 host
H200 = GpuIdentity(index=0, uuid="GPU-h200", pci_bus_id="00000000:00:06.0")


def test_bus_id_conversion():
    assert nvml_bus_id_to_bdf("00000000:18:00.0") == "0000:18:00.0"
    assert nvml_bus_id_to_bdf("00000001:AB:00.0") == "0001:ab:00.0"


def test_real_h200_sits_on_the_host_bridge_at_gen5_x16(tmp_path):
    topo = read_topology([H200], sysfs.materialize(REAL, tmp_path))
    path = topo.path("GPU-h200")
    assert [h.kind for h in path] == ["gpu", "host_bridge"]
    gpu = path[0]
    assert (gpu.bdf, gpu.link_gen_current, gpu.link_width_current, gpu.link_gen_max, gpu.link_width_max) == (
        "0000:00:06.0", 5, 16, 5, 16,
    )
    assert topo.shared() == {}  # one GPU shares nothing


def _eight():
    return [GpuIdentity(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(8)]


def test_eight_gpus_behind_two_switches_share_root_ports(tmp_path):
    gpus = _eight()
    root = sysfs.materialize(sysfs.switch_tree(REAL, gpus, per_switch=4), tmp_path)
    topo = read_topology(gpus, root)
    assert [h.kind for h in topo.path("GPU-5")] == ["gpu", "bridge", "bridge", "root", "host_bridge"]
    shared = topo.shared()
    assert shared["0000:00:01.0"] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert shared["0000:00:03.0"] == ["GPU-4", "GPU-5", "GPU-6", "GPU-7"]
    assert len(shared["pci0000:00"]) == 8
    assert all(h.link_gen_max == 5 and h.link_width_max == 16 for h in topo.hops if h.kind != "host_bridge")


def test_missing_sysfs_gives_lone_gpus_not_an_error(tmp_path):
    topo = read_topology(_eight()[:2], tmp_path)
    assert [(h.kind, h.parent_bdf) for h in topo.hops] == [("gpu", None), ("gpu", None)]


def test_agent_stores_topology_and_diagnose_names_the_sharers(tmp_path):
    """An 8-GPU replay with the derived switch tree as sysfs: diagnose shows, for GPU 5, its
    root port and the GPUs that share it."""
    header, ticks = scenarios.replicate_devices(*scenarios.load(str(H200_CAPTURE)), 8)
    src = NvmlSource(scenarios.backend(header, ticks))
    # the replicated capture's bus ids (see scenarios._relabel)
    gpus = [GpuIdentity(index=i, uuid=f"u{i}", pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0") for i in range(8)]
    root = sysfs.materialize(sysfs.switch_tree(REAL, gpus, per_switch=4), tmp_path / "sys")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = open_store(url)
    asyncio.run(Agent(src, store, hostname="h8", paced=False, sysfs_root=str(root)).run())
    report = build_report(store, "h8")
    store.close()
    path = report["gpus"][5]["pcie"]["path"]
    assert [h["kind"] for h in path] == ["gpu", "bridge", "bridge", "root", "host_bridge"]
    assert path[3]["bdf"] == "0000:00:03.0" and path[3]["shared_with_gpus"] == [4, 6, 7]
    assert path[3]["capacity_bytes_per_second"] > 60e9
    from vgpumon.diagnose.render import render_diagnose

    assert "root 0000:00:03.0 Gen5 x16, shared with GPU 4, 6, 7" in render_diagnose(report)


def test_sysfs_snapshot_of_a_materialized_snapshot_is_the_same(tmp_path):
    """Recording (snapshot) and re-creating (materialize) sysfs are inverse: what a GPU host
    records is what the tests read."""
    assert sysfs.snapshot([H200], sysfs.materialize(REAL, tmp_path)) == REAL
