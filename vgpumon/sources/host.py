"""The host source (psutil): CPU, memory, load, and the owners of GPU processes.

NVML reports which PIDs hold GPU memory; this source says who they are (name, command line,
user, start time, container) and how much host memory and CPU they use — a leak that keeps request
objects alive shows in the process's RSS as well as in its GPU memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from vgpumon import catalogue
from vgpumon.base.masking import mask_command_line
from vgpumon.catalogue import Door, Rejected
from vgpumon.model import HostSample, ProcessInfo, SourceStatus

if TYPE_CHECKING:
    import psutil

_T = TypeVar("_T")

# Container ids in cgroup paths: docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope,
# /docker/<id>, /kubepods/.../<id> — all 64 hex digits.
_CONTAINER_ID = re.compile(r"(?:docker-|cri-containerd-|crio-|containerd-|/docker/|/)([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def container_id_from_cgroup(text: str) -> str | None:
    """Container id in the content of ``/proc/<pid>/cgroup`` (v1 or v2); ``None`` if none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CONTAINER_ID.search(path)
        if m:
            return m.group(1)
    return None


def _bounded(cmdline: str) -> str:
    """A masked command line held to ``COMMAND_LINE_LENGTH`` characters (cut after masking: a
    secret cut in half would not be recognised), NUL-free as every store can hold it."""
    limit = catalogue.host.COMMAND_LINE_LENGTH
    cmdline = cmdline.replace("\0", " ")
    return cmdline if len(cmdline) <= limit else cmdline[: limit - 1] + "…"


class HostSource:
    """Samples the host with psutil.

    Args:
        psutil_module: the ``psutil`` module (tests may pass a stand-in at this process edge).
        proc_root: where ``/proc`` is (the agent in a container may see the host's at
            ``/host/proc``).
    """

    name = "host"

    def __init__(self, psutil_module: ModuleType | None = None, *, proc_root: str | Path = "/proc") -> None:
        if psutil_module is None:
            import psutil as default_psutil

            psutil_module = default_psutil
        self.psutil: ModuleType = psutil_module
        self.proc_root = Path(proc_root)
        self._static: dict[tuple[int, float], ProcessInfo] = {}
        self._primed = False
        # Every psutil figure passes the catalogue's door like NVML's do.
        self.door = Door((*catalogue.fields_of("host_samples"), *catalogue.fields_of("gpu_process_samples")))
        self.rejected = self.door.rejected

    def status(self, last: HostSample | None) -> SourceStatus:
        """This source's status for a tick whose newest host sample is ``last`` (``None``: none
        taken yet), with its values refused at the door so far."""
        return SourceStatus(self.name, last is not None, last.ts if last is not None else None, float("nan"), dict(self.rejected))

    def sample(self, ts: float, pids: Iterable[int] = ()) -> HostSample:
        """Read the host and the given GPU-holding PIDs.

        Returns:
            ``HostSample``; values the platform cannot give are ``None``.
        """
        ps = self.psutil
        missing: dict[str, str] = {}
        values: dict[str, Any] = {}  # HostSample's keyword arguments, as the door admitted them

        def put(name: str, raw: float | None, scale: float = 1.0) -> None:
            if raw is None:
                return
            try:
                values[name] = self.door.value(name, raw, scale)
            except Rejected as exc:
                missing[name] = exc.reason

        cpu = ps.cpu_percent(interval=None)
        if self._primed:  # the first call has no interval
            put("cpu_ratio", cpu, 0.01)
        self._primed = True
        vm = ps.virtual_memory()
        put("memory_total_bytes", vm.total)
        put("memory_used_bytes", vm.total - vm.available)
        loads: tuple[float | None, float | None, float | None]
        try:
            loads = os.getloadavg()
        except OSError:
            loads = (None, None, None)
        for name, raw in zip(("load1", "load5", "load15"), loads):
            put(name, raw)
        procs = {pid: self._checked(self._process(pid), missing) for pid in sorted(set(pids))}
        live = {(p.pid, p.start_time) for p in procs.values() if p.resolved}
        for key in [k for k in self._static if k not in live]:
            del self._static[key]
        return HostSample(ts=ts, processes=procs, missing=missing, **values)

    def _checked(self, p: ProcessInfo, missing: dict[str, str]) -> ProcessInfo:
        """The process with its RSS and CPU time checked at the door (an impossible one is
        ``None``, its reason in ``missing`` with the pid)."""
        bad: set[str] = set()
        for name in ("rss_bytes", "cpu_seconds_total"):
            raw = getattr(p, name)
            if raw is None:
                continue
            try:
                self.door.value(name, raw)
            except Rejected as exc:
                bad.add(name)
                missing[name] = f"{exc.reason} (pid {p.pid})"
        if not bad:
            return p
        return replace(
            p,
            rss_bytes=None if "rss_bytes" in bad else p.rss_bytes,
            cpu_seconds_total=None if "cpu_seconds_total" in bad else p.cpu_seconds_total,
        )

    def _process(self, pid: int) -> ProcessInfo:
        ps = self.psutil
        try:
            proc = ps.Process(pid)
            with proc.oneshot():
                start = proc.create_time()
                static = self._static.get((pid, start))
                if static is None:
                    static = self._describe(proc, pid, start)
                    self._static[(pid, start)] = static
                mem = proc.memory_info()
                cpu = proc.cpu_times()
            return ProcessInfo(
                pid=pid,
                resolved=True,
                start_time=start,
                name=static.name,
                cmdline=static.cmdline,
                username=static.username,
                container_id=static.container_id,
                rss_bytes=mem.rss,
                cpu_seconds_total=cpu.user + cpu.system,
            )
        except ps.NoSuchProcess:
            return ProcessInfo(pid=pid, resolved=False, unresolved_reason="no such process here (exited, or another PID namespace)")
        except ps.AccessDenied:
            return ProcessInfo(pid=pid, resolved=False, unresolved_reason="access denied")

    def _describe(self, proc: psutil.Process, pid: int, start: float) -> ProcessInfo:
        ps = self.psutil

        def attempt(fn: Callable[[], _T]) -> _T | None:
            try:
                return fn()
            except ps.AccessDenied:
                return None

        cmdline = attempt(proc.cmdline)
        try:
            cgroup = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            cgroup = ""
        return ProcessInfo(
            pid=pid,
            resolved=True,
            start_time=start,
            name=attempt(proc.name),
            cmdline=_bounded(mask_command_line(cmdline)) if cmdline else None,  # its secrets never stored
            username=attempt(proc.username),
            container_id=container_id_from_cgroup(cgroup),
        )
