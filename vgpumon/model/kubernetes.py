"""Kubernetes attribution: which containers the kubelet gave each GPU, and who runs on it.

Source: the kubelet's pod-resources API v1, ``List()`` (``vgpumon.sources.kubernetes``). The
kubelet reports allocations, not use: a GPU's holders are the containers it was assigned to, and
the API carries no container ids, so a process is matched to a container only where the process's
cgroup container id pins it down (see ``vgpumon.sources.kubernetes.attach``). Where one owner
cannot be named (time-slicing, a GPU shared by several containers, a pod without GPU limits) the
owner is ``None`` and ``note``/``reason`` says why — never a guess.

Label names are ``namespace``, ``pod`` and ``container`` (lower_snake_case, as dcgm-exporter and
kube-state-metrics name them); their values change only when the allocation changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

LABEL_NAMES = ("namespace", "pod", "container")


@dataclass(frozen=True, slots=True, order=True)
class PodContainer:
    """One container of one pod, as the kubelet names it (``PodResources.namespace``, ``.name``,
    ``ContainerResources.name``)."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        """``{"namespace": …, "pod": …, "container": …}`` for a metric's label set."""
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class DeviceAllocations:
    """What one ``List()`` answer said about GPU devices.

    Attributes:
        ts: when the kubelet answered (epoch seconds).
        devices: device id → the containers it is allocated to, sorted, each once. Ids as the
            device plugin named them, with a sharing replica suffix removed (NVIDIA time-slicing
            and MPS ``<id>::<n>``, GKE ``<id>/vgpu<n>``): a GPU UUID (``GPU-…``), a MIG device id
            (``MIG-…``), or something else the plugin chose (an index under
            ``device-id-strategy=index``). More than one container under one id means the
            device is shared (or, with some kubelets, that a finished pod is still listed).
        dra_devices: ``driver/pool/device`` → containers, for devices allocated through Dynamic
            Resource Allocation. DRA names are not GPU UUIDs (the mapping lives in the API
            server's ResourceSlices), so these are reported, not attributed.
        pods: pods in the answer, GPU or not.
    """

    ts: float
    devices: Mapping[str, tuple[PodContainer, ...]] = field(default_factory=dict)
    dra_devices: Mapping[str, tuple[PodContainer, ...]] = field(default_factory=dict)
    pods: int = 0


@dataclass(frozen=True, slots=True)
class GpuAttribution:
    """The containers that hold one GPU.

    Attributes:
        uuid: the GPU (``GpuIdentity.uuid``).
        holders: containers allocated this GPU or any of its MIG devices, sorted; empty when
            Kubernetes allocated it to no container.
        mig: MIG device id → its holders, for this GPU's MIG devices the kubelet listed.
        note: why there is no single owner (``"shared by 3 containers"``, ``"MIG: 2 devices
            held by 2 containers"``); ``None`` when one container owns it or none holds it.
    """

    uuid: str
    holders: tuple[PodContainer, ...] = ()
    mig: Mapping[str, tuple[PodContainer, ...]] = field(default_factory=dict)
    note: str | None = None

    @property
    def owner(self) -> PodContainer | None:
        """The one container holding the GPU; ``None`` when none or several do."""
        return self.holders[0] if len(self.holders) == 1 else None

    def labels(self) -> dict[str, str]:
        """``namespace``/``pod``/``container`` of the owner; ``{}`` without a single owner."""
        owner = self.owner
        return owner.labels() if owner is not None else {}


@dataclass(frozen=True, slots=True)
class ProcessAttribution:
    """The container one GPU process belongs to, in Kubernetes terms.

    Attributes:
        uuid: the GPU the process holds memory on.
        pid: host PID (``GpuSample.processes``).
        owner: its container; ``None`` when it cannot be named.
        reason: why ``owner`` is ``None`` (``"not in a container"``, ``"GPU shared by 2
            containers; …"``); ``None`` when ``owner`` is set.
    """

    uuid: str
    pid: int
    owner: PodContainer | None = None
    reason: str | None = None

    def labels(self) -> dict[str, str]:
        """``namespace``/``pod``/``container`` of the owner; ``{}`` without one."""
        return self.owner.labels() if self.owner is not None else {}


@dataclass(frozen=True, slots=True)
class KubernetesAttribution:
    """Kubernetes owners of one snapshot's GPUs and GPU processes.

    Attributes:
        allocations_ts: when the kubelet gave the answer this rests on (epoch seconds).
        gpus: GPU UUID → ``GpuAttribution``, one per GPU of the snapshot.
        processes: ``(GPU UUID, pid)`` → ``ProcessAttribution``, one per GPU process of the
            snapshot.
        unmatched: device id → holders, for kubelet devices that match no GPU of the snapshot
            (index ids, MIG ids whose parent is not known, GPUs this agent does not see).
        dra_devices: as ``DeviceAllocations.dra_devices`` (allocated, not attributed).
    """

    allocations_ts: float
    gpus: Mapping[str, GpuAttribution] = field(default_factory=dict)
    processes: Mapping[tuple[str, int], ProcessAttribution] = field(default_factory=dict)
    unmatched: Mapping[str, tuple[PodContainer, ...]] = field(default_factory=dict)
    dra_devices: Mapping[str, tuple[PodContainer, ...]] = field(default_factory=dict)
