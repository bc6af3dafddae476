"""The host source names the owners of GPU processes (real psutil, real processes)."""

from __future__ import annotations

import getpass
import subprocess
import sys

from vgpumon.sources.host import HostSource, container_id_from_cgroup

CID = "3f1c0d2b9e8a7f6e5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e"


def test_process_owner_memory_and_cpu_of_a_real_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        src = HostSource()
        src.sample(0.0)
        import time

        time.sleep(0.5)
        h = src.sample(1.0, [proc.pid])
        info = h.processes[proc.pid]
        assert info.resolved and info.name.startswith("python")
        assert "time.sleep(30)" in info.cmdline
        assert info.username == getpass.getuser()
        assert info.rss_bytes > 64 << 20  # the 64 MiB it holds
        assert info.cpu_seconds_total is not None and info.start_time > 0
        assert 0 <= h.cpu_ratio <= 1 and h.memory_used_bytes < h.memory_total_bytes
    finally:
        proc.kill()
        proc.wait()


def test_gone_or_foreign_pid_is_kept_unresolved():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    h = HostSource().sample(0.0, [proc.pid])
    info = h.processes[proc.pid]
    assert not info.resolved and info.name is None
    assert "no such process" in info.unresolved_reason


def test_first_cpu_reading_is_unknown_not_zero():
    assert HostSource().sample(0.0).cpu_ratio is None


def test_container_ids_from_cgroup_v1_and_v2():
    assert container_id_from_cgroup(f"0::/system.slice/docker-{CID}.scope\n") == CID
    assert container_id_from_cgroup(f"12:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n") == CID
    assert container_id_from_cgroup(f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope\n") == CID
    assert container_id_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None
