"""Record and re-create the sysfs entries that PCIe topology reading uses.

``snapshot(gpus)`` keeps, for each GPU, the ``/sys/bus/pci/devices/<bdf>`` link target and the
link files of every function on its path; ``materialize(snapshot, dest)`` lays them out again
under ``dest`` so ``read_topology(gpus, dest)`` reads them as it reads ``/sys``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict

from vgpumon.model import GpuIdentity
from vgpumon.sources.pcie_topology import device_chain, nvml_bus_id_to_bdf


class SysfsSnapshot(TypedDict):
    """The sysfs facts above some GPUs: ``links`` (bus id → its device directory) and ``files``
    (path → the link file's text), both relative to the sysfs root."""

    links: dict[str, str]
    files: dict[str, str]


LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


def snapshot(gpus: Iterable[GpuIdentity], sysfs_root: str | Path = "/sys") -> SysfsSnapshot:
    """The sysfs facts above each GPU as plain data (see module docstring)."""
    root = Path(sysfs_root)
    links: dict[str, str] = {}
    files: dict[str, str] = {}
    for g in gpus:
        if not g.pci_bus_id:
            continue
        bdf = nvml_bus_id_to_bdf(g.pci_bus_id)
        chain = device_chain(bdf, root)
        if not chain:
            continue
        real = root.resolve()
        links[bdf] = str(chain[-1][1].relative_to(real))
        for _, here in chain:
            for name in LINK_FILES:
                try:
                    files[str((here / name).relative_to(real))] = (here / name).read_text().strip()
                except OSError:
                    pass
    return {"links": links, "files": files}


def materialize(snap: SysfsSnapshot, dest: str | Path) -> Path:
    """Lay a snapshot out under ``dest`` (created); returns ``dest``."""
    dest = Path(dest)
    for rel, text in snap["files"].items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
    devices = dest / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for bdf, target in snap["links"].items():
        (dest / target).mkdir(parents=True, exist_ok=True)
        (devices / bdf).symlink_to(os.path.relpath(dest / target, devices))
    return dest


def switch_tree(real: SysfsSnapshot, gpus: list[GpuIdentity], per_switch: int = 4) -> SysfsSnapshot:
    """Derive an 8-GPU-style sysfs tree from a real one-GPU snapshot: ``per_switch`` GPUs behind
    each PCIe switch (upstream port + one downstream port per GPU), one switch per root port,
    every hop with the link files the real GPU had. GPUs are placed at their ``pci_bus_id``."""
    files_of_real = {k.rsplit("/", 1)[1]: v for k, v in real["files"].items()}
    links: dict[str, str] = {}
    files: dict[str, str] = {}

    def add(path: str) -> None:
        for name in LINK_FILES:
            if name in files_of_real:
                files[f"{path}/{name}"] = files_of_real[name]

    for i, g in enumerate(gpus):
        sw = i // per_switch
        root = f"0000:00:{0x01 + 2 * sw:02x}.0"
        up = f"0000:{0x10 + 0x10 * sw:02x}:00.0"
        down = f"0000:{0x11 + 0x10 * sw:02x}:{i % per_switch:02x}.0"
        bdf = nvml_bus_id_to_bdf(g.pci_bus_id or "")
        path = f"devices/pci0000:00/{root}/{up}/{down}/{bdf}"
        for p in (f"devices/pci0000:00/{root}", f"devices/pci0000:00/{root}/{up}", f"devices/pci0000:00/{root}/{up}/{down}", path):
            add(p)
        links[bdf] = path
    return {"links": links, "files": files}


def main() -> None:  # pragma: no cover - run on a GPU host to record a fixture
    """``python -m vgpumon.testing.sysfs OUT.json``: snapshot this host's GPUs."""
    import sys

    from vgpumon.sources.nvml import NvmlSource

    src = NvmlSource()
    gpus = src.start()
    Path(sys.argv[1]).write_text(json.dumps(snapshot(gpus), indent=1, sort_keys=True))
    src.close()


if __name__ == "__main__":
    main()
