"""The PCIe tree above a host's GPUs, as data: read from sysfs by ``vgpumon.sources.pcie_topology``,
stored in ``pcie_links`` and read back by reports (the store does not depend on the reader)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PcieHop:
    """One PCI function on the path from a GPU to the host.

    Attributes:
        bdf: ``domain:bus:device.function`` as sysfs writes it (``0000:18:00.0``), or
            ``pci0000:00`` for a host bridge (root complex), which has no link of its own.
        kind: ``gpu``, ``bridge`` (a switch port or any bridge between GPU and root port),
            ``root`` (the root port: first function below the host bridge) or ``host_bridge``.
        parent_bdf: the hop above; ``None`` for a host bridge.
        link_gen_current, link_width_current: the link as trained now (idle links
            down-train; compare under load).
        link_gen_max, link_width_max: what the function supports.
        uuid: the GPU's UUID for ``kind == "gpu"``.
    """

    bdf: str
    kind: str
    parent_bdf: str | None
    link_gen_current: int | None = None
    link_width_current: int | None = None
    link_gen_max: int | None = None
    link_width_max: int | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class PcieTopology:
    """The PCIe tree above the host's GPUs (only hops that lead to a GPU)."""

    hops: tuple[PcieHop, ...]

    def hop(self, bdf: str) -> PcieHop | None:
        """The hop with this address, or ``None``."""
        return next((h for h in self.hops if h.bdf == bdf), None)

    def path(self, uuid: str) -> list[PcieHop]:
        """Hops from the GPU with this UUID up to its host bridge (GPU first); empty if unknown."""
        by_bdf = {h.bdf: h for h in self.hops}
        gpu = next((h for h in self.hops if h.uuid == uuid), None)
        out = []
        while gpu is not None:
            out.append(gpu)
            gpu = by_bdf.get(gpu.parent_bdf) if gpu.parent_bdf else None
        return out

    def gpus_below(self, bdf: str) -> list[str]:
        """UUIDs of the GPUs whose path passes through ``bdf``."""
        return [h.uuid for h in self.hops if h.kind == "gpu" and h.uuid and any(p.bdf == bdf for p in self.path(h.uuid)[1:])]

    def shared(self) -> dict[str, list[str]]:
        """Upstream hops (bridges, root ports, host bridges) above two or more GPUs → those GPUs."""
        out = {}
        for h in self.hops:
            if h.kind != "gpu":
                below = self.gpus_below(h.bdf)
                if len(below) >= 2:
                    out[h.bdf] = below
        return out
