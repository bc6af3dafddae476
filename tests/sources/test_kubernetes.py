"""Kubernetes attribution against a real gRPC server speaking the kubelet's pod-resources API v1
on a unix socket, as the kubelet does (``/var/lib/kubelet/pod-resources/kubelet.sock``).

Answers have the shape a kubelet gives: every pod on the node, system pods without devices,
NUMA topology on devices, non-GPU device plugins beside NVIDIA's, fields a newer kubelet adds.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from kubelet_support import answer, container, devices, fake_kubelet, pb, pod, sock_dir  # noqa: F401 - sock_dir: the fixture

from vgpumon.model import GpuIdentity, GpuSample, HostSample, ProcessInfo, Snapshot
from vgpumon.model.kubernetes import PodContainer
from vgpumon.sources import kubernetes as k8s
from vgpumon.sources.kubernetes import KubernetesSource, PodResourcesClient, attach

REPO = ROOT

GPU0 = "GPU-5f2d2c47-6a3e-4b1b-9a1f-0c8d3e2b7a10"
GPU1 = "GPU-8c1e7d55-02b4-4f7e-b3a9-6d1f0e9c2a31"
GPU2 = "GPU-0a9b8c7d-1e2f-4a5b-8c6d-7e8f9a0b1c2d"
GPU3 = "GPU-e4d3c2b1-a098-4f7e-9d6c-5b4a39281706"
MIG_A = "MIG-1b2c3d4e-5f60-5718-9a0b-1c2d3e4f5a6b"
MIG_B = "MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d"
CID = {name: (name * 64)[:64] for name in ("a", "b", "c", "d", "e", "f")}

VLLM = PodContainer("serving", "vllm-llama-0", "vllm")
TRAIN = PodContainer("research", "train-7f9c4-xk2lp", "trainer")
NOTEBOOK = PodContainer("research", "jupyter-alice", "notebook")


def snapshot(gpu_pids: dict[str, list[int]], procs: dict[int, ProcessInfo] | None) -> Snapshot:
    uuids = list(gpu_pids)
    return Snapshot(
        ts=1000.0,
        hostname="gpu-node-3",
        gpus=tuple(GpuIdentity(index=i, uuid=u) for i, u in enumerate(uuids)),
        samples=tuple(
            GpuSample(ts=1000.0, uuid=u, index=i, processes=tuple((pid, 1 << 30) for pid in gpu_pids[u]))
            for i, u in enumerate(uuids)
        ),
        host=None if procs is None else HostSample(ts=1000.0, processes=procs),
    )


def proc(pid: int, container_id: str | None) -> ProcessInfo:
    return ProcessInfo(pid=pid, resolved=True, start_time=900.0, name="python3", container_id=container_id)


def refreshed(path: Path, **kw) -> KubernetesSource:
    src = KubernetesSource(PodResourcesClient(path, **kw))
    src.refresh_blocking()
    return src


# -- what gets labelled ---------------------------------------------------------------------------


def test_exclusive_gpus_label_their_gpu_and_processes_by_pod_namespace_container(sock_dir):
    sock = sock_dir / "kubelet.sock"
    kubelet_answer = answer(
        pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", GPU0), cpu_ids=[2, 3])),
        pod(
            "research",
            "train-7f9c4-xk2lp",
            container("trainer", devices("nvidia.com/gpu", GPU1, numa=1)),
            # The network operator's devices share the vendor prefix; they are not GPUs.
            container("rdma-sidecar", devices("nvidia.com/rdma_shared_device_a", "rdma0")),
        ),
    )
    snap = snapshot(
        {GPU0: [4101], GPU1: [5202], GPU2: [77]},
        {4101: proc(4101, CID["a"]), 5202: proc(5202, CID["b"]), 77: proc(77, None)},
    )

    async def run_source() -> k8s.DeviceAllocations | None:
        src = KubernetesSource(PodResourcesClient(sock), period=3600)
        stop = asyncio.Event()
        task = asyncio.create_task(src.run(stop))
        while src.state is None:
            await asyncio.sleep(0.01)
        stop.set()
        await task
        src.close()
        assert src.status().up and src.outcomes == {"ok": 1}
        return src.current()

    with fake_kubelet(sock, kubelet_answer):
        alloc = asyncio.run(run_source())

    assert alloc is not None and alloc.pods == 4
    assert set(alloc.devices) == {GPU0, GPU1}  # the RDMA device is not a GPU
    k = attach(snap, alloc).kubernetes
    assert k.gpus[GPU0].labels() == {"namespace": "serving", "pod": "vllm-llama-0", "container": "vllm"}
    assert k.gpus[GPU1].labels() == TRAIN.labels()
    assert k.gpus[GPU2].labels() == {} and k.gpus[GPU2].holders == ()
    assert k.processes[(GPU0, 4101)].labels() == VLLM.labels()
    assert k.processes[(GPU1, 5202)].owner == TRAIN
    assert k.processes[(GPU2, 77)].owner is None
    assert k.processes[(GPU2, 77)].reason == "not in a container"


def test_time_sliced_gpu_is_shared_by_its_containers_not_owned_by_one(sock_dir):
    sock = sock_dir / "kubelet.sock"
    # NVIDIA's device plugin names time-slicing replicas "<uuid>::<n>".
    kubelet_answer = answer(
        pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", f"{GPU0}::0"))),
        pod("research", "jupyter-alice", container("notebook", devices("nvidia.com/gpu", f"{GPU0}::3"))),
    )
    snap = snapshot({GPU0: [4101, 6303]}, {4101: proc(4101, CID["a"]), 6303: proc(6303, CID["c"])})
    with fake_kubelet(sock, kubelet_answer):
        alloc = refreshed(sock).current()

    k = attach(snap, alloc).kubernetes
    gpu = k.gpus[GPU0]
    assert gpu.holders == (NOTEBOOK, VLLM)
    assert gpu.owner is None and gpu.labels() == {}
    assert gpu.note == "shared by 2 containers"
    for pid in (4101, 6303):
        assert k.processes[(GPU0, pid)].owner is None
        assert "GPU shared by 2 containers" in k.processes[(GPU0, pid)].reason


def test_process_on_a_shared_gpu_is_named_through_its_container_exclusive_gpu(sock_dir):
    sock = sock_dir / "kubelet.sock"
    kubelet_answer = answer(
        pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", GPU1, f"{GPU0}::0"))),
        pod("research", "jupyter-alice", container("notebook", devices("nvidia.com/gpu", f"{GPU0}::1"))),
    )
    # vLLM's container runs alone on GPU1, which is allocated to it alone: that pins its
    # container id, so its process on the shared GPU0 is named; the notebook's is not.
    snap = snapshot(
        {GPU0: [4101, 6303], GPU1: [4102]},
        {4101: proc(4101, CID["a"]), 4102: proc(4102, CID["a"]), 6303: proc(6303, CID["c"])},
    )
    with fake_kubelet(sock, kubelet_answer):
        k = attach(snap, refreshed(sock).current()).kubernetes

    assert k.gpus[GPU0].note == "shared by 2 containers"
    assert k.processes[(GPU0, 4101)].owner == VLLM
    assert k.processes[(GPU0, 6303)].owner is None


def test_mig_devices_are_matched_by_their_own_ids(sock_dir):
    sock = sock_dir / "kubelet.sock"
    kubelet_answer = answer(
        # mixed strategy: one resource per MIG profile, ids are MIG device UUIDs (driver 470+)
        pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/mig-3g.71gb", MIG_A))),
        pod("research", "jupyter-alice", container("notebook", devices("nvidia.com/mig-1g.18gb", MIG_B))),
        # ids of drivers before 470 name the parent GPU themselves
        pod(
            "research", "train-7f9c4-xk2lp", container("trainer", devices("nvidia.com/mig-7g.141gb", f"MIG-{GPU1}/0/0"))
        ),
    )
    snap = snapshot({GPU0: [], GPU1: []}, {})
    with fake_kubelet(sock, kubelet_answer):
        alloc = refreshed(sock).current()

    k = attach(snap, alloc, mig_parents={MIG_A: GPU0, MIG_B: GPU0}).kubernetes
    assert dict(k.gpus[GPU0].mig) == {MIG_A: (VLLM,), MIG_B: (NOTEBOOK,)}
    assert k.gpus[GPU0].owner is None
    assert k.gpus[GPU0].note == "MIG: 2 devices held by 2 containers"
    assert k.gpus[GPU1].owner == TRAIN  # its one MIG device is held by one container
    assert dict(k.unmatched) == {}

    # Without NVML's MIG → parent map, the new-style ids match no GPU: reported, not guessed.
    k = attach(snap, alloc).kubernetes
    assert dict(k.unmatched) == {MIG_A: (VLLM,), MIG_B: (NOTEBOOK,)}
    assert k.gpus[GPU0].holders == ()


def test_pod_without_gpu_limits_is_never_credited_with_a_gpu(sock_dir):
    sock = sock_dir / "kubelet.sock"
    # The notebook asked for no GPU (no devices in the answer) yet its image sets
    # NVIDIA_VISIBLE_DEVICES=all: it runs on GPU0, allocated to vLLM, and on unallocated GPU2.
    kubelet_answer = answer(
        pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", GPU0))),
        pod("research", "jupyter-alice", container("notebook")),
    )
    snap = snapshot(
        {GPU0: [4101, 6303], GPU2: [6304]},
        {4101: proc(4101, CID["a"]), 6303: proc(6303, CID["c"]), 6304: proc(6304, CID["c"])},
    )
    with fake_kubelet(sock, kubelet_answer):
        k = attach(snap, refreshed(sock).current()).kubernetes

    assert k.gpus[GPU0].owner == VLLM  # the allocation is what the kubelet says
    assert k.gpus[GPU2].holders == ()
    # Two containers' processes on a GPU allocated to one: which is vLLM's cannot be told.
    for pid in (4101, 6303):
        assert k.processes[(GPU0, pid)].owner is None
        assert "a pod without GPU limits" in k.processes[(GPU0, pid)].reason
    assert k.processes[(GPU2, 6304)].owner is None
    assert k.processes[(GPU2, 6304)].reason.startswith("GPU not allocated by Kubernetes")
    # the cgroup container id still identifies the process
    assert snap.host.processes[6304].container_id == CID["c"]


def test_dra_and_index_ids_are_reported_not_attributed(sock_dir):
    sock = sock_dir / "kubelet.sock"
    api = pb()
    claim = api.DynamicResource(
        claim_name="llm-gpu",
        claim_namespace="serving",
        claim_resources=[api.ClaimResource(driver_name="gpu.nvidia.com", pool_name="gpu-node-3", device_name="gpu-0")],
    )
    kubelet_answer = answer(
        pod("serving", "vllm-llama-0", container("vllm", dra=[claim])),
        # device-id-strategy=index: "0" is the plugin's index, not ours to trust
        pod("research", "train-7f9c4-xk2lp", container("trainer", devices("nvidia.com/gpu", "0"))),
    )
    snap = snapshot({GPU0: [4101]}, {4101: proc(4101, CID["a"])})
    with fake_kubelet(sock, kubelet_answer):
        k = attach(snap, refreshed(sock).current()).kubernetes

    assert dict(k.dra_devices) == {"gpu.nvidia.com/gpu-node-3/gpu-0": (VLLM,)}
    assert dict(k.unmatched) == {"0": (TRAIN,)}
    assert k.gpus[GPU0].holders == ()
    assert k.processes[(GPU0, 4101)].owner is None


def test_answer_of_a_newer_kubelet_with_undeclared_fields_is_read(sock_dir):
    sock = sock_dir / "kubelet.sock"
    api = pb()

    def with_field(msg, number: int, payload: bytes):
        """``msg`` plus a length-delimited field this schema does not declare."""
        tag, size = bytes([number << 3 | 2]), bytes([len(payload)])
        out = type(msg)()
        out.ParseFromString(msg.SerializeToString() + tag + size + payload)
        return out

    memory = api.ContainerDevices(resource_name="memory").SerializeToString()  # any message bytes
    trainer = with_field(container("trainer", devices("nvidia.com/gpu", GPU1)), 4, memory)  # ContainerMemory
    the_pod = with_field(pod("research", "train-7f9c4-xk2lp", trainer), 5, memory)  # pod-level memory (1.37)
    with fake_kubelet(sock, answer(the_pod)):
        alloc = refreshed(sock).current()
    assert alloc.devices == {GPU1: (TRAIN,)}


# -- when there is no answer ----------------------------------------------------------------------


def test_no_socket_leaves_the_container_id_alone(sock_dir):
    src = refreshed(sock_dir / "kubelet.sock")
    snap = snapshot({GPU0: [4101]}, {4101: proc(4101, CID["a"])})

    assert src.current() is None
    status = src.status()
    assert not status.up and status.message.startswith("no socket: no kubelet pod-resources socket at")
    assert src.outcomes == {"no socket": 1}
    assert attach(snap, src.current()) is snap
    assert snap.kubernetes is None and snap.host.processes[4101].container_id == CID["a"]


def test_kubelet_that_never_answers_times_out_while_the_event_loop_runs(sock_dir):
    sock = sock_dir / "kubelet.sock"

    async def refresh_while_ticking() -> tuple[KubernetesSource, int]:
        src = KubernetesSource(PodResourcesClient(sock, timeout=0.5))
        ticks = 0
        refresh = asyncio.create_task(src.refresh())
        while not refresh.done():
            ticks += 1
            await asyncio.sleep(0.01)
            assert ticks < 10_000, "List() still waiting after 100 s: the 0.5 s timeout was not honoured"
        await refresh
        src.close()
        return src, ticks

    with fake_kubelet(sock, answer(), hang=True) as calls:
        src, ticks = asyncio.run(refresh_while_ticking())

    assert calls == [1]  # the kubelet got the call and sat on it
    assert src.state == k8s.TIMEOUT
    assert "did not answer within 0.5 s" in src.status().message
    assert src.current() is None
    assert ticks > 1  # other tasks ran while the call waited for its deadline


def test_socket_without_a_kubelet_behind_it_is_unavailable(sock_dir):
    sock = sock_dir / "kubelet.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # the file a stopped kubelet leaves behind: nobody listens
    stale.close()
    pytest.importorskip("grpc")
    src = refreshed(sock, timeout=5)
    assert src.state == k8s.UNAVAILABLE and src.current() is None
    assert src.status().message.startswith("unavailable: kubelet not reachable at")


def test_last_answer_is_used_until_it_goes_stale(sock_dir):
    sock = sock_dir / "kubelet.sock"
    now = [0.0]
    src = KubernetesSource(PodResourcesClient(sock), period=30, monotonic=lambda: now[0])
    with fake_kubelet(sock, answer(pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", GPU0))))):
        src.refresh_blocking()
    sock.unlink(missing_ok=True)  # kubelet gone
    now[0] = 60.0
    src.refresh_blocking()
    assert src.state == k8s.ABSENT
    assert src.current().devices == {GPU0: (VLLM,)}  # 60 s old: still within 3 periods
    now[0] = 91.0
    assert src.current() is None  # older than 3 periods: labels of pods maybe long gone
    assert src.outcomes == {"ok": 1, "no socket": 1}


# -- permissions and the optional extra (separate processes: another user, no grpc) --------------


def _run_client(sock: Path, *, user: pwd.struct_passwd | None = None, block_grpc: bool = False) -> dict:
    """Refresh once in a fresh interpreter; ``user``: drop to that user first (after the imports,
    as the interpreter itself may live where that user cannot read)."""
    lines = ["import json, os, sys"]
    if block_grpc:
        lines.append("sys.modules['grpc'] = None")
    lines.append("from vgpumon.sources.kubernetes import KubernetesSource, PodResourcesClient")
    if user is not None:
        lines += [
            "import grpc, vgpumon.sources.podresources.api_pb2_grpc",
            f"os.setgroups([]); os.setgid({user.pw_gid}); os.setuid({user.pw_uid})",
        ]
    lines += [
        f"src = KubernetesSource(PodResourcesClient({str(sock)!r}))",
        "src.refresh_blocking()",
        "print(json.dumps({'state': src.state, 'message': src.message}))",
    ]
    out = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_permission_denied_on_the_socket_is_said_so(sock_dir):
    sock = sock_dir / "kubelet.sock"
    user = None
    if os.geteuid() == 0:  # root connects whatever the mode: ask as an unprivileged user
        try:
            user = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("running as root and there is no 'nobody' user to be denied")
    with fake_kubelet(sock, answer(pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", GPU0))))):
        sock.chmod(0o666)
        allowed = _run_client(sock, user=user)
        sock.chmod(0o000)
        denied = _run_client(sock, user=user)
    assert allowed["state"] == "ok"  # the same user, the same socket, readable: answered
    assert denied["state"] == "permission denied"
    assert denied["message"].startswith(f"permission denied on {sock}")


def test_socket_present_without_the_extra_says_how_to_install_it(sock_dir):
    sock = sock_dir / "kubelet.sock"
    sock.touch()  # any file: the client stops at the import before connecting
    result = _run_client(sock, block_grpc=True)
    assert result["state"] == "extra missing"
    assert "pip install 'vgpumon[kubernetes]'" in result["message"]


def test_agent_starts_without_grpc_installed():
    code = (
        "import sys; sys.modules['grpc'] = None; sys.modules['google.protobuf'] = None\n"
        "import vgpumon.agent, vgpumon.model, vgpumon.sources.kubernetes\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
