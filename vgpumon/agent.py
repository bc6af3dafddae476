"""The per-host agent: one asyncio process that ticks the sources and feeds the store.

NVML runs on its own worker thread and the store on another, so a slow database never delays a
tick and a slow NVML call never blocks the event loop. Rows are written in batches of whole ticks
(one transaction each): a tick is either stored completely or not yet. On stop (SIGINT, SIGTERM,
``--duration`` reached, end of a replayed capture) the tick in progress completes and every pending
row is written before the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from vgpumon.errors import StoreUnavailableError
from vgpumon.model import HostSample, NvmlReading, Snapshot
from vgpumon.sources.host import HostSource
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml_backend import EndOfCapture
from vgpumon.store import Store
from vgpumon.store.repository import TickRows

if TYPE_CHECKING:
    from vgpumon.sources.vllm import ServerSample, VllmSource
    from vgpumon.store.vllm_repository import VllmRepository

log = logging.getLogger(__name__)


@dataclass
class AgentStats:
    """What a run did: ticks sampled, rows written, rows still pending at exit (0 unless the
    store was unreachable at shutdown)."""

    ticks: int = 0
    rows_written: int = 0
    rows_pending: int = 0
    gpus: int = 0
    vllm_samples: int = 0


class Agent:
    """Ticks an ``NvmlSource`` every ``interval`` seconds and writes each tick to a ``Store``.

    Args:
        source: the NVML collector (live, recording or replaying backend).
        store: where rows go; ``None`` samples without storing (``vgpumon record``).
        hostname: the host's identity in the store.
        interval: seconds between ticks (wall clock); ignored when ``paced`` is false.
        duration: stop after this many seconds of sample time (capture time in a replay);
            ``None`` runs until stopped.
        paced: sleep between ticks (live sampling, or a replay at recorded pace); false replays a
            capture as fast as possible.
        flush_every: seconds of wall time between batched writes.
        monotonic: injected clock for pacing (``time.monotonic``).
        on_tick: called with each ``Snapshot`` on the event loop (progress display, exporter).
        host: the host source (psutil); ``None`` skips host samples (replays of another host's
            capture skip them by default: this host's CPU says nothing about that one).
        sysfs_root: where to read the PCIe topology above the GPUs (``/sys``); ``None`` skips it
            (replays).
        vllm: the vLLM source, polled by its own task at its own interval (``None``: no vLLM).
            It sees every snapshot (GPU processes and activity); its samples are written through
            the same store thread. A slow or broken server never delays an NVML tick.
    """

    def __init__(
        self,
        source: NvmlSource,
        store: Store | None,
        *,
        hostname: str,
        interval: float = 1.0,
        duration: float | None = None,
        paced: bool = True,
        flush_every: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        on_tick: Callable[[Snapshot], None] | None = None,
        host: HostSource | None = None,
        sysfs_root: str | None = None,
        vllm: VllmSource | None = None,
    ) -> None:
        self.source = source
        self.store = store
        self.hostname = hostname
        self.interval = interval
        self.duration = duration
        self.paced = paced
        self.flush_every = flush_every
        self.monotonic = monotonic
        self.on_tick = on_tick
        self.host = host
        self.sysfs_root = sysfs_root
        self.topology: Any = None
        self.vllm = vllm
        self.latest: Snapshot | None = None
        self.stats = AgentStats()
        self._pending: list[TickRows] = []
        self._gpu_ids: dict[str, int] = {}
        self._host_id: int | None = None
        self._registered: tuple[Any, ...] = ()
        self._writer: asyncio.Task[None] | None = None
        self._outage = False
        self._nvml_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-nvml")
        self._store_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-store")
        self._host_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-host")

    async def _nvml(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._nvml_exec, fn, *args)

    async def _write(self, batch: list[TickRows]) -> None:
        assert self.store is not None
        try:
            await asyncio.get_running_loop().run_in_executor(self._store_exec, self.store.write_ticks, batch)
        except StoreUnavailableError as exc:
            if not self._outage:  # one line per outage, not one per batch
                log.error("%s; keeping samples in memory and retrying", exc)
                self._outage = True
            self._pending[:0] = batch  # keep tick order for the retry
            return
        self.stats.rows_written += sum(len(t.get("gpu_samples", ())) for t in batch)
        if self._outage:
            log.warning("store reachable again; wrote %d held ticks", len(batch))
            self._outage = False

    def _flush(self) -> None:
        if self.store is None or not self._pending:
            return
        if self._writer is not None and not self._writer.done():
            return  # the next flush takes these rows along
        batch, self._pending = self._pending, []
        self._writer = asyncio.get_running_loop().create_task(self._write(batch))

    async def _drain(self) -> None:
        if self._writer is not None:
            await self._writer
        self._flush()
        if self._writer is not None:
            await self._writer

    async def _register(self) -> None:
        self._registered = self.source.gpus
        if self.store is None:
            return
        loop = asyncio.get_running_loop()
        self._gpu_ids = await loop.run_in_executor(self._store_exec, self.store.register_gpus, self.hostname, self.source.gpus)
        self._host_id = await loop.run_in_executor(self._store_exec, self.store.host_id, self.hostname)
        if self.sysfs_root is not None and self._host_id is not None:
            from vgpumon.sources.pcie_topology import read_topology

            self.topology = await loop.run_in_executor(self._host_exec, read_topology, self.source.gpus, self.sysfs_root)
            await loop.run_in_executor(
                self._store_exec, self.store.replace_topology, self._host_id, self.topology.hops, self._gpu_ids, time.time()
            )

    def _tick_rows(self, snap: Snapshot) -> TickRows:
        """The rows one tick writes, per table."""
        ids = self._gpu_ids
        rows: TickRows = {
            "gpu_samples": [Store.sample_row(ids[s.uuid], s) for s in snap.samples if s.uuid in ids],
            "xid_events": [{"gpu_id": ids[e.uuid], "ts": e.ts, "xid": e.xid} for e in snap.xid_events if e.uuid in ids],
        }
        h: HostSample | None = snap.host
        if h is not None and self._host_id is not None:
            rows["host_samples"] = [
                {
                    "host_id": self._host_id, "ts": h.ts, "cpu_ratio": h.cpu_ratio,
                    "memory_used_bytes": h.memory_used_bytes, "memory_total_bytes": h.memory_total_bytes,
                    "load1": h.load1, "load5": h.load5, "load15": h.load15,
                }
            ]
            procs = []
            for s in snap.samples:
                for pid, used in s.processes:
                    p = h.processes.get(pid)
                    if p is None or s.uuid not in ids:
                        continue
                    procs.append(
                        {
                            "host_id": self._host_id, "gpu_id": ids[s.uuid], "ts": s.ts, "pid": pid,
                            "start_time": p.start_time, "name": p.name, "cmdline": p.cmdline, "username": p.username,
                            "container_id": p.container_id, "resolved": p.resolved, "used_gpu_memory_bytes": used,
                            "rss_bytes": p.rss_bytes, "cpu_seconds_total": p.cpu_seconds_total,
                        }
                    )
            rows["gpu_process_samples"] = procs
        return rows
    # -- vLLM: its own task and pace; rows through the store thread ----------------------------

    async def _write_vllm(self, repo: VllmRepository, batch: list[ServerSample]) -> list[ServerSample]:
        """Write a batch of vLLM samples; returns what is still pending (all of it while the
        store is away)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._store_exec, repo.write, self.hostname, batch)
        except StoreUnavailableError as exc:
            log.error("vLLM samples not stored yet: %s", exc)
            return batch
        return []

    async def _run_vllm(self, stop: asyncio.Event) -> None:
        assert self.vllm is not None
        from vgpumon.store.vllm_repository import VllmRepository

        repo = VllmRepository(self.store.engine) if self.store is not None else None
        pending: list[ServerSample] = []
        last_flush = self.monotonic()
        try:
            async for samples in self.vllm.run(stop):
                self.stats.vllm_samples += len(samples)
                pending.extend(samples)
                if repo is not None and pending and self.monotonic() - last_flush >= self.flush_every:
                    pending = await self._write_vllm(repo, pending)
                    last_flush = self.monotonic()
        except Exception:  # noqa: BLE001 - the vLLM source must never take the GPU sampling down
            log.exception("vLLM source stopped")
        finally:
            if repo is not None and pending:
                pending = await self._write_vllm(repo, pending)
            await self.vllm.close()

    async def run(self, stop: asyncio.Event | None = None) -> AgentStats:
        """Sample until ``stop`` is set, ``duration`` has passed or a replay ends.

        Raises:
            NvmlUnavailableError: NVML cannot start on this host.
            StoreUnavailableError: the store cannot register the host's GPUs at start.
        """
        stop = stop or asyncio.Event()
        vllm_stop = asyncio.Event()
        vllm_task: asyncio.Task[None] | None = None
        try:
            gpus = await self._nvml(self.source.start)
            self.stats.gpus = len(gpus)
            await self._register()
            if self.vllm is not None:
                vllm_task = asyncio.get_running_loop().create_task(self._run_vllm(vllm_stop))
            start = self.monotonic()
            first_ts: float | None = None
            last_flush = start
            k = 0
            while not stop.is_set():
                try:
                    reading: NvmlReading = await self._nvml(self.source.sample)
                except EndOfCapture:
                    break
                ts = reading.ts
                if first_ts is None:
                    first_ts = ts
                if self.duration is not None and ts - first_ts >= self.duration:
                    break
                if self.source.gpus != self._registered:  # GPUs found after a re-initialisation
                    self.stats.gpus = len(self.source.gpus)
                    await self._register()
                host = None
                if self.host is not None:
                    pids = {pid for s in reading.samples for pid, _ in s.processes}
                    host = await asyncio.get_running_loop().run_in_executor(self._host_exec, self.host.sample, ts, pids)
                statuses = tuple(s for s in (reading.status,) if s is not None)
                snap = Snapshot(
                    ts=ts, hostname=self.hostname, gpus=self.source.gpus, samples=reading.samples,
                    xid_events=reading.xid_events, sources=statuses, host=host,
                )
                self.latest = snap
                if self.vllm is not None:
                    self.vllm.observe(snap)
                self.stats.ticks += 1
                if self.store is not None:
                    self._pending.append(self._tick_rows(snap))
                    if self.monotonic() - last_flush >= self.flush_every:
                        self._flush()
                        last_flush = self.monotonic()
                if self.on_tick is not None:
                    self.on_tick(snap)
                if self.paced:
                    k += 1
                    delay = start + k * self.interval - self.monotonic()
                    if delay < 0:  # overran: skip the missed slots rather than burst to catch up
                        k += int(-delay // self.interval) + 1
                        delay = start + k * self.interval - self.monotonic()
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=max(delay, 0))
                    except asyncio.TimeoutError:
                        pass
                else:
                    await asyncio.sleep(0)  # let writes and signals through during a fast replay
        finally:
            vllm_stop.set()
            if vllm_task is not None:
                await vllm_task
            await self._drain()
            self.stats.rows_pending = len(self._pending)
            if self._pending:
                log.error("%d ticks could not be stored before exit", len(self._pending))
            await asyncio.get_running_loop().run_in_executor(self._nvml_exec, self.source.close)
            for executor in (self._nvml_exec, self._store_exec, self._host_exec):
                executor.shutdown(wait=True)
        return self.stats
