"""A synthetic PCIe capacity story for ``vgpumon capacity``: a host whose cards sit behind shared
PCIe switches, with a steady per-card load, written straight into the store as 1-minute rollups
(what the review reads) and a PCIe tree (``pcie_links``).

The story is the one of docs/capacity.md: a 16-card chassis with two PCIe switches of eight cards
each, every switch on a Gen3 x16 uplink (15.75 GB/s per direction, FACTS §3), the cards' slots
Gen3 x16 too (an older PLX-based chassis holding Gen5 cards). Each card moves ``rx`` bytes/s
host→device at p95 (and a third of it device→host): at 1.625 GB/s per card a switch carries
13 GB/s, 83 % of its uplink — saturated, though each card uses a tenth of its own link. This is
invented data, labelled as such; the rollup arithmetic it feeds is the store's own.
"""

from __future__ import annotations

import random

from vgpumon import catalogue
from vgpumon.model import GpuIdentity, PcieHop
from vgpumon.store import Store, StoredGpu
from vgpumon.store.codec import ROLLUP_ROW_COLUMNS, RollupRow, encoder

_COL = {c: i for i, c in enumerate(ROLLUP_ROW_COLUMNS)}
_ENC = {d: encoder(catalogue.get("gpu_samples", f"pcie_{d}_bytes_per_second")) for d in ("tx", "rx")}
#: Per-minute statistics of a steady load around its p95 (a minute's p95 is the load itself).
_SHAPE = {"min": 0.5, "mean": 0.9, "p50": 0.9, "p95": 1.0, "p99": 1.02, "max": 1.05}


def identities(hostname: str, cards: int, *, slot_gen: int = 3, card_gen: int = 5) -> list[GpuIdentity]:
    """The host's cards: NVIDIA H200 (as recorded: Gen5 x16, 141 GB) held to ``slot_gen`` by the slots."""
    return [
        GpuIdentity(index=i, uuid=f"GPU-{hostname}-{i:04d}", name="NVIDIA H200", serial=f"{hostname}-{i:04d}",
                    pci_bus_id=f"00000000:{0x80 + i:02X}:00.0", memory_total_bytes=150754820096,
                    pcie_link_gen_max=slot_gen, pcie_link_width_max=16, pcie_link_gen_gpu_max=card_gen, gpm_supported=True)
        for i in range(cards)
    ]


def switch_tree(gpus: list[GpuIdentity], *, per_switch: int, uplink: tuple[int, int], card_link: tuple[int, int]) -> list[PcieHop]:
    """``per_switch`` cards behind each switch (upstream port on a root port), the switch's
    uplink and root port at ``uplink`` (generation, width), each card's slot at ``card_link``."""
    hops = [PcieHop(bdf="pci0000:00", kind="host_bridge", parent_bdf=None)]
    for sw in range((len(gpus) + per_switch - 1) // per_switch):
        root, up = f"0000:00:{0x01 + 2 * sw:02x}.0", f"0000:{0x10 + 0x10 * sw:02x}:00.0"
        hops.append(PcieHop(root, "root", "pci0000:00", *uplink, *uplink))
        hops.append(PcieHop(up, "bridge", root, *uplink, *uplink))
    for i, g in enumerate(gpus):
        sw = i // per_switch
        up = f"0000:{0x10 + 0x10 * sw:02x}:00.0"
        down = f"0000:{0x11 + 0x10 * sw:02x}:{i % per_switch:02x}.0"
        bdf = f"0000:{0x80 + i:02x}:00.0"
        hops.append(PcieHop(down, "bridge", up, *card_link, *card_link))
        hops.append(PcieHop(bdf, "gpu", down, *card_link, *card_link, uuid=g.uuid))
    return hops


def rollup_rows(gpu_id: int, start: float, minutes: int, *, rx: float, tx: float, link: tuple[int, int], seed: int = 0) -> list[RollupRow]:
    """``minutes`` rollup rows of one card from ``start`` (a whole minute, epoch seconds) with a
    steady load: p95 exactly ``rx``/``tx`` bytes/s, the other statistics in ``_SHAPE`` proportion
    with ±2 % of seeded jitter (never above the p99)."""
    rng = random.Random(seed)  # noqa: S311  test data, seeded for repeatability
    rows = []
    for m in range(minutes):
        row: list[object] = [None] * len(ROLLUP_ROW_COLUMNS)  # each column's stored value
        row[_COL["gpu_id"]], row[_COL["ts"]] = gpu_id, int((start + 60 * m) * 1000)
        row[_COL["samples"]] = row[_COL["up_samples"]] = 60
        row[_COL["folded_samples"]] = 0
        for d, load in (("rx", rx), ("tx", tx)):
            for stat, k in _SHAPE.items():
                jitter = 1.0 if stat in ("p95", "p99", "max") else 1.0 + rng.uniform(-0.02, 0.02)
                row[_COL[f"pcie_{d}_bytes_per_second_{stat}"]] = _ENC[d](load * k * jitter)
        for agg in ("min", "mean", "max"):
            row[_COL[f"pcie_link_gen_current_{agg}"]] = link[0]
            row[_COL[f"pcie_link_width_current_{agg}"]] = link[1]
        rows.append(tuple(row))
    return rows


def write_host(
    store: Store,
    hostname: str,
    *,
    cards: int = 16,
    per_switch: int = 8,
    rx_per_card: float = 13e9 / 8,
    uplink: tuple[int, int] = (3, 16),
    card_link: tuple[int, int] = (3, 16),
    start: float = 1_796_000_000.0,
    minutes: int = 120,
    seed: int = 0,
) -> list[StoredGpu]:
    """Register the host's cards, store its PCIe tree and ``minutes`` of rollups.

    Returns:
        The stored GPUs.
    """
    gpus = identities(hostname, cards, slot_gen=card_link[0])
    ids = store.register_gpus(hostname, gpus)
    host_id = store.host_id(hostname)
    assert host_id is not None
    store.replace_topology(host_id, switch_tree(gpus, per_switch=per_switch, uplink=uplink, card_link=card_link), ids, start)
    rows = []
    for g in gpus:
        rows += rollup_rows(ids[g.uuid], start, minutes, rx=rx_per_card, tx=rx_per_card / 3, link=card_link, seed=seed + g.index)
    store.write_rollup_rows(rows)
    return store.gpus_of(hostname)
