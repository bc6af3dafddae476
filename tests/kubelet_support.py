"""A fake kubelet for the tests: a real gRPC server speaking the pod-resources API v1 on a unix
socket, and builders of the answers a kubelet gives (system pods without devices, NUMA topology
on devices, non-GPU device plugins beside NVIDIA's)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (unix socket paths are limited to 107 bytes), readable by
    every user so a test can connect as another one."""
    d = Path(tempfile.mkdtemp(prefix="vgpumon-k8s-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def fake_kubelet(path: Path, answer, *, hang: bool = False) -> Iterator[list[int]]:
    """Serve ``answer`` to ``PodResourcesLister/List`` on ``path``; with ``hang`` the call never
    returns (a wedged kubelet) until the server stops. Yields the list of calls received."""
    grpc = pytest.importorskip("grpc")
    from vgpumon.sources.podresources import api_pb2_grpc

    release = threading.Event()
    calls: list[int] = []

    class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
        def List(self, request, context):  # noqa: N802 - the gRPC method's name
            calls.append(1)
            if hang:
                release.wait()
            return answer

    server = grpc.server(ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield calls
    finally:
        release.set()
        server.stop(None).wait()


def pb():
    pytest.importorskip("grpc")
    from vgpumon.sources.podresources import api_pb2

    return api_pb2


def devices(resource: str, *ids: str, numa: int = 0):
    api = pb()
    return api.ContainerDevices(
        resource_name=resource, device_ids=list(ids), topology=api.TopologyInfo(nodes=[api.NUMANode(ID=numa)])
    )


def container(name: str, *devs, cpu_ids=(), dra=()):
    return pb().ContainerResources(name=name, devices=list(devs), cpu_ids=list(cpu_ids), dynamic_resources=list(dra))


def pod(namespace: str, name: str, *containers):
    return pb().PodResources(namespace=namespace, name=name, containers=list(containers))


def answer(*pods):
    api = pb()
    system = [
        pod("kube-system", "kube-proxy-x7k2p", container("kube-proxy")),
        pod("gpu-operator", "nvidia-device-plugin-daemonset-9qv4t", container("nvidia-device-plugin")),
    ]
    return api.ListPodResourcesResponse(pod_resources=[*system, *pods])
