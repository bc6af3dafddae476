"""Kubernetes attribution from the kubelet's pod-resources API (gRPC ``List()``, API v1).

Where the kubelet's socket exists (``/var/lib/kubelet/pod-resources/kubelet.sock``, mounted into
the agent's pod from the host), a slow refresh (every 30 s by default, on a worker thread, never
on the sampling path) asks the kubelet which containers were allocated which GPU devices
(``nvidia.com/gpu``, ``nvidia.com/mig-*``). ``attach`` then names, per snapshot, each GPU's
owner and each GPU process's container. Elsewhere the cgroup container id collected by the host
source (``ProcessInfo.container_id``) stands alone.

The API (Kubernetes 1.20+, GA in 1.28) reports allocations by pod name, namespace and container
name and device id; it carries no container ids and no pod UIDs. What follows from that, and the
failure modes of other exporters this module avoids (time-slicing, MIG, DRA, pods without GPU
limits), is in docs/kubernetes.md.

grpcio and protobuf come with the ``kubernetes`` extra and are imported only when the socket
exists, so the agent starts without them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Protocol

from vgpumon.base.pacing import sleep_unless
from vgpumon.base.workers import name_os_thread
from vgpumon.model import HostSample, ProcessInfo, Snapshot, SourceStatus
from vgpumon.model.kubernetes import (
    DeviceAllocations,
    GpuAttribution,
    KubernetesAttribution,
    PodContainer,
    ProcessAttribution,
)

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# Resource names of NVIDIA's device plugin: whole GPUs (also "nvidia.com/gpu.shared" when
# time-slicing renames them) and MIG profiles under the mixed strategy ("nvidia.com/mig-1g.10gb").
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
EXTRA_HINT = "pip install 'vgpumon[kubernetes]'"
# The kubelet's own gRPC clients accept 16 MiB answers (its CRI client); a node with hundreds of
# pods and their CPU and memory assignments can exceed gRPC's 4 MiB default.
MAX_ANSWER_BYTES = 16 << 20

# States of the last refresh, stable strings (SourceStatus.message starts with one).
OK = "ok"
ABSENT = "no socket"
DENIED = "permission denied"
NO_EXTRA = "extra missing"
TIMEOUT = "timeout"
UNAVAILABLE = "unavailable"
ERROR = "error"

# NVIDIA's device plugin names a time-slicing or MPS replica "<id>::<n>"; GKE's names a shared
# GPU "<id>/vgpu<n>". Either way the device underneath is <id>.
_REPLICA = re.compile(r"(?:::\d+|/vgpu\d+)$")
# MIG ids of drivers before 470 carry the parent: "MIG-GPU-<parent uuid>/<gi>/<ci>". Later drivers
# give MIG devices UUIDs of their own ("MIG-<uuid>"); their parent is known only to NVML.
_OLD_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$")


class PodResourcesError(Exception):
    """The kubelet's pod-resources API gave no answer.

    Attributes:
        state: one of ``ABSENT``, ``DENIED``, ``NO_EXTRA``, ``TIMEOUT``, ``UNAVAILABLE``, ``ERROR``.
    """

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


def normalise_device_id(device_id: str) -> str:
    """The device underneath a device plugin's id: ``"GPU-ab::3"`` → ``"GPU-ab"``.

    Strips NVIDIA's time-slicing/MPS replica suffix ``::<n>`` and GKE's ``/vgpu<n>``; other ids
    (GPU UUIDs, MIG ids, indexes) come back unchanged.
    """
    return _REPLICA.sub("", device_id)


def mig_parent(device_id: str) -> str | None:
    """The parent GPU UUID written into a pre-470-driver MIG id (``MIG-GPU-<uuid>/<gi>/<ci>``);
    ``None`` for any other id."""
    m = _OLD_MIG.match(device_id)
    return m.group(1) if m else None


def _frozen(groups: Mapping[str, set[PodContainer]]) -> Mapping[str, tuple[PodContainer, ...]]:
    return MappingProxyType({k: tuple(sorted(v)) for k, v in sorted(groups.items())})


class _DeviceAnswer(Protocol):
    resource_name: str
    device_ids: Sequence[str]


class _ClaimResourceAnswer(Protocol):
    driver_name: str
    pool_name: str
    device_name: str


class _ClaimAnswer(Protocol):
    claim_resources: Sequence[_ClaimResourceAnswer]


class _ContainerAnswer(Protocol):
    name: str
    devices: Sequence[_DeviceAnswer]
    dynamic_resources: Sequence[_ClaimAnswer]


class _PodAnswer(Protocol):
    namespace: str
    name: str
    containers: Sequence[_ContainerAnswer]


class PodResourcesAnswer(Protocol):
    """What ``allocations_from_answer`` reads of a ``ListPodResourcesResponse`` (api.proto)."""

    pod_resources: Sequence[_PodAnswer]


def allocations_from_answer(
    answer: PodResourcesAnswer, ts: float, resource_prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES
) -> DeviceAllocations:
    """GPU devices of a ``ListPodResourcesResponse`` (pod-resources API v1).

    Args:
        answer: the ``List()`` answer (``pod_resources[].containers[].devices[]`` with
            ``resource_name`` and ``device_ids``; ``dynamic_resources[].claim_resources[]`` with
            ``driver_name``, ``pool_name``, ``device_name``).
        ts: when it was received (epoch seconds).
        resource_prefixes: device-plugin resources that are GPUs, by name prefix.

    Returns:
        ``DeviceAllocations``; a container holding several replicas of one GPU is listed once.
    """
    prefixes = tuple(resource_prefixes)
    devices: dict[str, set[PodContainer]] = {}
    dra: dict[str, set[PodContainer]] = {}
    for pod in answer.pod_resources:
        for c in pod.containers:
            who = PodContainer(pod.namespace, pod.name, c.name)
            for dev in c.devices:
                if not dev.resource_name.startswith(prefixes):
                    continue
                for device_id in dev.device_ids:
                    devices.setdefault(normalise_device_id(device_id), set()).add(who)
            for claim in c.dynamic_resources:
                for res in claim.claim_resources:
                    dra.setdefault(f"{res.driver_name}/{res.pool_name}/{res.device_name}", set()).add(who)
    return DeviceAllocations(ts=ts, devices=_frozen(devices), dra_devices=_frozen(dra), pods=len(answer.pod_resources))


class PodResourcesClient:
    """Asks the kubelet's pod-resources API (v1) which containers hold which GPU devices.

    Blocking: call ``list_allocations`` from a worker thread (``KubernetesSource`` does).

    Args:
        socket_path: the kubelet's socket (``DEFAULT_SOCKET`` on the host; wherever the
            DaemonSet mounts ``/var/lib/kubelet/pod-resources``).
        timeout: seconds the kubelet has to answer one ``List()``.
        resource_prefixes: device-plugin resource names that are GPUs, by prefix.
        clock: wall clock for the answer's time (``time.time``).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET,
        *,
        timeout: float = 5.0,
        resource_prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        self.timeout = timeout
        self.resource_prefixes = tuple(resource_prefixes)
        self.clock = clock

    def socket_present(self) -> bool:
        """Whether the socket file exists (this is a Kubernetes node, or its socket is mounted)."""
        return os.path.exists(self.socket_path)

    def list_allocations(self) -> DeviceAllocations:
        """One ``PodResourcesLister/List`` call.

        Returns:
            the GPU devices of the answer.

        Raises:
            PodResourcesError: ``ABSENT`` (no socket), ``DENIED`` (the socket is not writable
                for this user), ``NO_EXTRA`` (socket present, grpcio/protobuf not installed),
                ``TIMEOUT`` (no answer within ``timeout``), ``UNAVAILABLE`` (nobody listening,
                kubelet restarting), ``ERROR`` (any other gRPC status).
        """
        path = self.socket_path
        if not os.path.exists(path):
            raise PodResourcesError(
                ABSENT, f"no kubelet pod-resources socket at {path} (not a Kubernetes node, or not mounted)"
            )
        # Connecting to a unix socket needs write permission on it; say so before gRPC turns it
        # into a generic "unavailable".
        if not os.access(path, os.R_OK | os.W_OK):
            raise PodResourcesError(
                DENIED, f"permission denied on {path}: the agent must run as root or as the socket's owner"
            )
        try:
            import grpc

            from vgpumon.sources.podresources import api_pb2, api_pb2_grpc
        except ImportError as exc:
            raise PodResourcesError(
                NO_EXTRA, f"{path} exists but {exc.name or 'grpc'} is not installed: {EXTRA_HINT}"
            ) from exc
        options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_http_proxy", 0)]
        with grpc.insecure_channel(f"unix://{path}", options=options) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            try:
                # protobuf's builder makes the message classes at import: the module has no stub
                answer = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)  # type: ignore[attr-defined]
            except grpc.RpcError as exc:
                raise self._classify(exc) from exc
        return allocations_from_answer(answer, self.clock(), self.resource_prefixes)

    def _classify(self, exc: Exception) -> PodResourcesError:
        import grpc

        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PodResourcesError(
                TIMEOUT, f"the kubelet did not answer within {self.timeout:g} s ({self.socket_path})"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            if "ermission denied" in details:
                return PodResourcesError(DENIED, f"permission denied on {self.socket_path}: {details}")
            return PodResourcesError(UNAVAILABLE, f"kubelet not reachable at {self.socket_path}: {details}")
        name = code.name if code is not None else type(exc).__name__
        return PodResourcesError(ERROR, f"kubelet pod-resources List failed: {name}: {details}")


class KubernetesSource:
    """Keeps the kubelet's latest GPU allocations, refreshed on a slow period off the event loop.

    Never raises into the agent: every failure becomes a state with a reason, counted in
    ``outcomes``, logged once when the state changes.

    Args:
        client: the pod-resources client (default: the kubelet's socket on this host).
        period: seconds between refreshes.
        stale_after: an answer older than this is no longer used (default: 3 periods), so a
            kubelet that stops answering does not keep labels of pods long gone.
        monotonic: injected clock for ages and pacing (``time.monotonic``).
    """

    name = "kubernetes"

    def __init__(
        self,
        client: PodResourcesClient | None = None,
        *,
        period: float = 30.0,
        stale_after: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client if client is not None else PodResourcesClient()
        self.period = period
        self.stale_after = stale_after if stale_after is not None else 3 * period
        self.monotonic = monotonic
        self.state: str | None = None
        self.message: str | None = None
        self.outcomes: Counter[str] = Counter()
        # (answer, monotonic time received) in one attribute: the worker thread replaces it
        # while the event loop reads it.
        self._answer: tuple[DeviceAllocations, float] | None = None
        self._last_success_ts: float | None = None
        self._collect_seconds = 0.0
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-kubelet", initializer=name_os_thread)

    def current(self) -> DeviceAllocations | None:
        """The newest answer, or ``None``: never answered, or the answer is older than
        ``stale_after`` (then the cgroup container ids stand alone)."""
        answer = self._answer
        if answer is None or self.monotonic() - answer[1] > self.stale_after:
            return None
        return answer[0]

    def status(self) -> SourceStatus:
        """Self-metrics: ``up`` when the last refresh got an answer; ``message`` starts with
        the state (``"no socket: …"``, ``"timeout: …"``)."""
        return SourceStatus(
            name=self.name,
            up=self.state == OK,
            last_success_ts=self._last_success_ts,
            collect_seconds=self._collect_seconds,
            message=None if self.state in (OK, None) else f"{self.state}: {self.message}",
        )

    def refresh_blocking(self) -> DeviceAllocations | None:
        """One ``List()`` on the calling thread; returns ``current()`` afterwards."""
        t0 = self.monotonic()
        try:
            alloc = self.client.list_allocations()
        except PodResourcesError as exc:
            self._record(exc.state, str(exc))
        except Exception as exc:  # noqa: BLE001 - a broken answer must not take the agent down
            log.debug("kubelet pod-resources refresh failed", exc_info=True)
            self._record(ERROR, f"{type(exc).__name__}: {exc}")
        else:
            self._answer = (alloc, self.monotonic())
            self._last_success_ts = alloc.ts
            holders = {c for h in alloc.devices.values() for c in h}
            self._record(OK, f"{len(alloc.devices)} GPU devices allocated to {len(holders)} containers")
        self._collect_seconds = self.monotonic() - t0
        return self.current()

    async def refresh(self) -> DeviceAllocations | None:
        """``refresh_blocking`` on the source's own worker thread; the event loop keeps running
        while the kubelet takes its time (at most the client's ``timeout``)."""
        return await asyncio.get_running_loop().run_in_executor(self._exec, self.refresh_blocking)

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``period`` seconds until ``stop`` is set."""
        while not stop.is_set():
            await self.refresh()
            await sleep_unless(stop, self.period)

    def close(self) -> None:
        """Stop the worker thread once ``run`` has ended (waits for a call in flight, at most the
        client's ``timeout``)."""
        self._exec.shutdown(wait=True)

    def _record(self, state: str, message: str) -> None:
        self.outcomes[state] += 1
        if state != self.state:
            if state == OK:
                log.info("kubelet pod-resources: %s", message)
            elif state == ABSENT:
                log.info("Kubernetes attribution off: %s", message)
            else:
                log.warning("Kubernetes attribution unavailable (%s): %s", state, message)
        self.state, self.message = state, message


def _sorted_union(groups: Iterable[Iterable[PodContainer]]) -> tuple[PodContainer, ...]:
    return tuple(sorted({c for g in groups for c in g}))


def attribute(
    snapshot: Snapshot,
    allocations: DeviceAllocations,
    *,
    host: HostSample | None = None,
    mig_parents: Mapping[str, str] | None = None,
) -> KubernetesAttribution:
    """Name the Kubernetes owners of a snapshot's GPUs and GPU processes.

    A GPU's holders are the containers allocated the GPU (its UUID, or a time-slicing replica of
    it) or one of its MIG devices. One holder is the owner; several get no owner and a note
    ("shared by 3 containers").

    A process gets an owner only through its cgroup container id: a container id seen alone on
    a GPU with a single holder is that holder's, when the pairing is one-to-one across all such
    GPUs; a process whose container id is paired with one of its GPU's holders is attributed,
    on a shared GPU too. Everything else keeps ``owner=None`` with the reason.

    Args:
        snapshot: one tick (its ``gpus``, ``samples[].processes``, ``host``).
        allocations: the kubelet's answer (``KubernetesSource.current()``).
        host: the host sample to read container ids from; default ``snapshot.host`` (the agent
            takes one every few ticks: pass its newest so processes keep their owner between).
        mig_parents: MIG device UUID → parent GPU UUID, for MIG ids without the parent in them
            (drivers 470+; NVML ``nvmlDeviceGetMigDeviceHandleByIndex`` + ``nvmlDeviceGetUUID``).

    Returns:
        ``KubernetesAttribution`` with one entry per GPU and per (GPU, pid) of the snapshot.
    """
    host = host if host is not None else snapshot.host
    uuids = {g.uuid for g in snapshot.gpus}
    mig_parents = dict(mig_parents or {})
    whole: dict[str, tuple[PodContainer, ...]] = {}
    mig: dict[str, dict[str, tuple[PodContainer, ...]]] = {}
    unmatched: dict[str, tuple[PodContainer, ...]] = {}
    for device_id, holders in allocations.devices.items():
        if device_id in uuids:
            whole[device_id] = holders
            continue
        parent = mig_parent(device_id) or mig_parents.get(device_id)
        if parent in uuids:
            mig.setdefault(parent, {})[device_id] = holders
        else:
            unmatched[device_id] = holders

    gpus: dict[str, GpuAttribution] = {}
    for g in snapshot.gpus:
        migs = mig.get(g.uuid, {})
        holders = _sorted_union([whole.get(g.uuid, ()), *migs.values()])
        note = None
        if len(holders) > 1:
            note = (
                f"MIG: {len(migs)} devices held by {len(holders)} containers"
                if migs
                else f"shared by {len(holders)} containers"
            )
        gpus[g.uuid] = GpuAttribution(
            uuid=g.uuid, holders=holders, mig=MappingProxyType(dict(sorted(migs.items()))), note=note
        )

    procs = host.processes if host is not None else {}
    # Pair container ids with holders on GPUs that have a single holder and processes of a single
    # container; keep a pair only when neither side pairs with anything else anywhere.
    cid_holders: dict[str, set[PodContainer]] = {}
    holder_cids: dict[PodContainer, set[str]] = {}
    mixed: set[str] = set()
    for s in snapshot.samples:
        ga = gpus.get(s.uuid)
        if ga is None or ga.owner is None:
            continue
        cids = {
            p.container_id
            for pid, _ in s.processes
            if (p := procs.get(pid)) is not None and p.resolved and p.container_id
        }
        if len(cids) == 1:
            (cid,) = cids
            cid_holders.setdefault(cid, set()).add(ga.owner)
            holder_cids.setdefault(ga.owner, set()).add(cid)
        elif len(cids) > 1:
            mixed.add(s.uuid)
    paired = {
        cid: next(iter(hs)) for cid, hs in cid_holders.items() if len(hs) == 1 and len(holder_cids[next(iter(hs))]) == 1
    }

    processes: dict[tuple[str, int], ProcessAttribution] = {}
    for s in snapshot.samples:
        ga = gpus.get(s.uuid) or GpuAttribution(uuid=s.uuid)
        for pid, _ in s.processes:
            owner, reason = _process_owner(procs.get(pid), host is not None, ga, paired, s.uuid in mixed)
            processes[(s.uuid, pid)] = ProcessAttribution(uuid=s.uuid, pid=pid, owner=owner, reason=reason)

    return KubernetesAttribution(
        allocations_ts=allocations.ts,
        gpus=MappingProxyType(gpus),
        processes=MappingProxyType(processes),
        unmatched=MappingProxyType(unmatched),
        dra_devices=allocations.dra_devices,
    )


def _process_owner(
    p: ProcessInfo | None, have_host: bool, ga: GpuAttribution, paired: Mapping[str, PodContainer], mixed: bool
) -> tuple[PodContainer | None, str | None]:
    if p is None:
        return None, "process not looked up (no host sample)" if not have_host else "process not in the host sample"
    if not p.resolved:
        return None, f"process not resolved ({p.unresolved_reason})"
    if not p.container_id:
        return None, "not in a container"
    owner = paired.get(p.container_id)
    if owner is not None and owner in ga.holders:
        return owner, None
    if not ga.holders:
        return None, "GPU not allocated by Kubernetes: a pod without GPU limits, or a container outside Kubernetes"
    if owner is not None:
        return None, f"its container is {owner}, which this GPU is not allocated to (a pod without GPU limits?)"
    if len(ga.holders) > 1:
        return None, f"GPU shared by {len(ga.holders)} containers; the kubelet does not say which one runs this process"
    if mixed:
        return None, "processes of several containers on a GPU allocated to one (a pod without GPU limits uses it too)"
    return None, "its container id and this GPU's holder do not pair one to one across the host's GPUs"


def attach(
    snapshot: Snapshot,
    allocations: DeviceAllocations | None,
    *,
    host: HostSample | None = None,
    mig_parents: Mapping[str, str] | None = None,
) -> Snapshot:
    """The snapshot with ``kubernetes`` set from ``attribute(snapshot, allocations, ...)``;
    unchanged when ``allocations`` is ``None`` (no kubelet, or its answer is stale)."""
    if allocations is None:
        return snapshot
    return dataclasses.replace(snapshot, kubernetes=attribute(snapshot, allocations, host=host, mig_parents=mig_parents))
