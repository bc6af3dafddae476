"""Immutable data model: what the sources saw, in base units, and what the store keeps.

Data that crosses from a source to the store lives here, so history never depends on the code
that reads hardware (``tests/test_catalogue.py`` checks that ``vgpumon.store`` imports no source).
Units: seconds, bytes, bytes/s, ratio 0–1, celsius, watts, joules, hertz. ``None`` always means
"not known"; the reason is kept beside the value where the source knows it.
"""

from vgpumon.model.alert import Alert, fingerprint
from vgpumon.model.gpu import (
    GpuIdentity,
    GpuSample,
    HostEvent,
    HostSample,
    NvmlReading,
    ProcessInfo,
    Snapshot,
    SourceStatus,
    XidEvent,
)
from vgpumon.model.kubernetes import (
    DeviceAllocations,
    GpuAttribution,
    KubernetesAttribution,
    PodContainer,
    ProcessAttribution,
)
from vgpumon.model.topology import PcieHop, PcieTopology
from vgpumon.model.vllm import EngineSample, InstanceIdentity, ServerProcess, ServerSample, ServerState, VllmServers

__all__ = [
    "Alert",
    "DeviceAllocations",
    "EngineSample",
    "GpuAttribution",
    "GpuIdentity",
    "GpuSample",
    "HostEvent",
    "HostSample",
    "InstanceIdentity",
    "KubernetesAttribution",
    "NvmlReading",
    "PcieHop",
    "PcieTopology",
    "PodContainer",
    "ProcessAttribution",
    "ProcessInfo",
    "ServerProcess",
    "ServerSample",
    "ServerState",
    "Snapshot",
    "SourceStatus",
    "VllmServers",
    "XidEvent",
    "fingerprint",
]
