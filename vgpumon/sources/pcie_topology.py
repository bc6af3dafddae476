"""Host-side PCIe topology from sysfs: the chain of ports above each GPU and who shares them.

NVML gives a GPU's own link (``nvmlDeviceGetCurrPcieLinkGeneration`` …) but not the switch and root
ports above it, whose upstream links the GPUs below share: eight cards behind two x16 switch
uplinks have a quarter of the host bandwidth that eight cards on their own root ports have.
sysfs has both: ``/sys/bus/pci/devices/<bdf>`` links to the device's path under ``/sys/devices/``
(its parent directories are the bridges above it), and every PCIe function has
``current_link_speed``, ``current_link_width``, ``max_link_speed``, ``max_link_width``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from vgpumon.model import GpuIdentity, PcieHop, PcieTopology

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# sysfs link speed (GT/s) → PCIe generation
_GT_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def nvml_bus_id_to_bdf(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` (8-digit domain) → sysfs ``0000:18:00.0``."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _gen(speed: str | None) -> int | None:
    """``"32.0 GT/s PCIe"`` → 5; ``None`` for unknown or ``"Unknown"``."""
    if not speed:
        return None
    m = re.match(r"([\d.]+)\s*GT/s", speed)
    return _GT_TO_GEN.get(float(m.group(1))) if m else None


def _width(text: str | None) -> int | None:
    try:
        width = int(text) if text is not None else None
    except ValueError:
        return None
    return width if width and width > 0 else None  # 0 / 255 mean "no link"


def device_chain(bdf: str, sysfs_root: str | Path = "/sys") -> list[tuple[str, Path]]:
    """The PCI path of a device in sysfs, host bridge first, the device last.

    ``/sys/bus/pci/devices/<bdf>`` links to ``/sys/devices/pci0000:00/0000:00:01.0/…/<bdf>``:
    the directories on the way are the bridges above the device.

    Returns:
        ``(name, directory)`` per hop (``pci0000:00`` for the host bridge, then BDFs); empty when
        sysfs has no such device (an agent in a container without ``/sys``).
    """
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / bdf
    if not link.exists():
        return []
    parts = Path(os.path.realpath(link)).parts
    try:
        start = next(i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p)
    except StopIteration:
        return []
    cur = Path(*parts[: start + 1])
    chain = [(parts[start], cur)]
    for part in parts[start + 1 :]:
        cur = cur / part
        if _BDF.match(part):
            chain.append((part, cur))
    return chain


def read_topology(gpus: Iterable[GpuIdentity], sysfs_root: str | Path = "/sys") -> PcieTopology:
    """Read the PCIe path of each GPU from sysfs.

    Args:
        gpus: the GPUs (their ``pci_bus_id`` locates them; GPUs without one are skipped).
        sysfs_root: where sysfs is mounted (``/sys``; a copy of it in tests).

    Returns:
        The hops above the GPUs, each once, GPUs first. A GPU whose sysfs entry is missing (the
        agent in a container without ``/sys``) appears alone, with no parent.
    """
    root = Path(sysfs_root)
    hops: dict[str, PcieHop] = {}
    for gpu in gpus:
        if not gpu.pci_bus_id:
            continue
        bdf = nvml_bus_id_to_bdf(gpu.pci_bus_id)
        chain = device_chain(bdf, root)
        if not chain:
            hops.setdefault(bdf, PcieHop(bdf=bdf, kind="gpu", parent_bdf=None, uuid=gpu.uuid))
            continue
        for depth, (name, here) in enumerate(chain):
            if name in hops:
                continue
            if depth == 0:
                hops[name] = PcieHop(bdf=name, kind="host_bridge", parent_bdf=None)
                continue
            kind = "gpu" if depth == len(chain) - 1 else ("root" if depth == 1 else "bridge")
            hops[name] = PcieHop(
                bdf=name,
                kind=kind,
                parent_bdf=chain[depth - 1][0],
                link_gen_current=_gen(_read(here / "current_link_speed")),
                link_width_current=_width(_read(here / "current_link_width")),
                link_gen_max=_gen(_read(here / "max_link_speed")),
                link_width_max=_width(_read(here / "max_link_width")),
                uuid=gpu.uuid if kind == "gpu" else None,
            )
    order = {"gpu": 0, "bridge": 1, "root": 2, "host_bridge": 3}
    return PcieTopology(tuple(sorted(hops.values(), key=lambda h: (order[h.kind], h.bdf))))
