"""Series the exporter derives at each scrape and the store does not keep (``table=None``,
cadence ``export``): the rule twins (``rules/*.rules.yml``) query them beside the sampled fields.

They come from facts the agent already has — a GPU's identity and max link, the stored PCIe tree
(``pcie_links``), a vLLM start's ready time and GPUs, each source's status — so serving them costs
no NVML call. Labels: GPU series carry ``hostname``, ``gpu`` (index) and ``uuid``; vLLM series
``hostname`` and ``server`` (the server's base URL); PCIe ports ``hostname`` and ``port`` (the
port's sysfs address); sources ``hostname`` and ``source``.
"""

from __future__ import annotations

from vgpumon.catalogue.core import BOOL, BYTES_PER_SECOND, Encoding, Field

_SECONDS = Encoding("fixed", 1_000)
_EPOCH_MAX = 2**40  # seconds: far beyond any timestamp


def _exported(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, prometheus: str, **kw: object) -> Field:
    return Field(name=name, table=None, kind=kind, unit=unit, help=help, source=source, cadence="export",
                 encoding=encoding, prometheus=prometheus, prom_type="gauge", **kw)  # type: ignore[arg-type]


EXPORTED: tuple[Field, ...] = (
    _exported(
        "gpu_info", "info", "bool",
        "1 per GPU the agent reads now; identity attributes (name, serial, pci_bus_id, gpm_supported) as labels.",
        "the GPU's identity (gpus)", BOOL, "vgpumon_gpu_info", lo=0, hi=1,
        note="a GPU that drops out of NVML's list drops out of this metric: GpuMissing's twin compares it with a day ago",
    ),
    _exported(
        "pcie_link_capacity_bytes_per_second", "derived", "bytes_per_second",
        "Capacity of one direction of the GPU's max link (device ∧ slot generation × width).",
        "pcie_link_gen_max × pcie_link_width_max (vgpumon.pcie, FACTS §3)", BYTES_PER_SECOND,
        "vgpumon_gpu_pcie_link_capacity_bytes_per_second", lo=0, hi=1e12,
        note="the denominator of every PCIe share (FACTS §2)",
    ),
    _exported(
        "pcie_port_gpu_info", "info", "bool",
        "1 per (shared PCIe switch or root port, GPU below it): which GPUs share an upstream link.",
        "pcie_links (stored topology)", BOOL, "vgpumon_pcie_port_gpu_info", lo=0, hi=1,
        note="labels hostname, port (sysfs address), gpu, uuid; only ports above two or more GPUs",
    ),
    _exported(
        "pcie_port_capacity_bytes_per_second", "derived", "bytes_per_second",
        "Capacity of one direction of a shared PCIe switch or root port's max link.",
        "pcie_links link_gen_max × link_width_max", BYTES_PER_SECOND, "vgpumon_pcie_port_capacity_bytes_per_second",
        lo=0, hi=1e12, note="labels hostname, port, kind (bridge, root); host bridges have no link and no series",
    ),
    _exported(
        "vllm_server_gpu_info", "info", "bool", "1 per (live vLLM server, GPU holding one of its processes).",
        "vllm_gpu_map of the server's current start", BOOL, "vgpumon_vllm_server_gpu_info", lo=0, hi=1,
        note="labels hostname, server, uuid",
    ),
    _exported(
        "vllm_ready_timestamp_seconds", "derived", "seconds",
        "When the server's current start first answered /health 200 (end of prewarm), epoch seconds.",
        "vllm_instances.ready", _SECONDS, "vgpumon_vllm_ready_timestamp_seconds", lo=0, hi=_EPOCH_MAX,
        note="absent while the server is starting",
    ),
    _exported(
        "source_last_success_timestamp_seconds", "derived", "seconds",
        "Newest time each source (nvml, host, vllm) answered, epoch seconds.",
        "SourceStatus.last_success_ts", _SECONDS, "vgpumon_source_last_success_timestamp_seconds", lo=0, hi=_EPOCH_MAX,
        note="labels hostname, source; VgpumonSourceSilent's twin compares it with time()",
    ),
)
