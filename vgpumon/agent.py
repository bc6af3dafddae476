"""The per-host agent: one asyncio process that ticks the sources and feeds the store.

NVML runs on its own worker thread and the store on another, so a slow database never delays a
tick and a slow NVML call never blocks the event loop. Rows are written in batches of whole ticks
(one transaction each): a tick is either stored completely or not yet. On stop (SIGINT, SIGTERM,
``--duration`` reached, end of a replayed capture) the tick in progress completes and every pending
row is written before the process exits.

Nothing lost: a batch the store refuses (unreachable, locked, disk full) goes to the backlog
(``vgpumon.store.spool``: a spool on disk, else a bounded buffer in memory) and, while a backlog
exists, so does every newer batch; each flush then replays the backlog oldest first until the store
takes it again. One log line when an outage starts and one when it ends. The store thread is the
only writer (SQLite allows one); it also runs the retention job (rollups, pruning) in small steps
between batches, never while a backlog waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from vgpumon.catalogue import is_rejection
from vgpumon.errors import StoreUnavailableError
from vgpumon.model import HostSample, NvmlReading, Snapshot
from vgpumon.pacing import wait_for_slot
from vgpumon.sources.host import HostSource
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml_backend import EndOfCapture
from vgpumon.store import Store
from vgpumon.store.codec import encode_gpu_sample, storable
from vgpumon.store.repository import TickRows
from vgpumon.store.spool import EXTRA, RAW, ROLLUP, Backlog

if TYPE_CHECKING:
    from vgpumon.rules.runner import RuleRunner
    from vgpumon.sources.vllm import ServerSample, VllmSource
    from vgpumon.store.retention import Retention
    from vgpumon.store.vllm_repository import VllmRepository

log = logging.getLogger(__name__)


@dataclass
class AgentStats:
    """What a run did.

    Attributes:
        ticks: ticks sampled.
        rows_written: GPU rows committed to the store (spooled rows of earlier runs included).
        rows_pending: rows held in memory at exit: lost (0 unless store and spool both failed).
        rows_spooled: rows left in the spool at exit; the next run replays them.
        rows_folded: raw ticks folded into 1-minute rollups because a backlog bound was reached
            (their full resolution is lost; the rollups are stored).
        outages: times the store became unreachable.
        gpus: GPUs found.
    """

    ticks: int = 0
    rows_written: int = 0
    rows_pending: int = 0
    rows_spooled: int = 0
    rows_folded: int = 0
    outages: int = 0
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
        host_every: take a host sample (CPU, memory, GPU processes' RSS and CPU) every this many
            ticks; per-process GPU memory is stored with each host sample.
        sysfs_root: where to read the PCIe topology above the GPUs (``/sys``); ``None`` skips it
            (replays).
        vllm: the vLLM source, polled by its own task at its own interval (``None``: no vLLM).
            It sees every snapshot (GPU processes and activity); its samples are written through
            the same store thread. A slow or broken server never delays an NVML tick.
        backlog: where batches wait while the store is away; default: memory only, 8 GPU-hours
            of rows (``vgpumon agent`` passes a spool).
        retention: rollup/prune job run on the store thread every ``maintenance_every`` seconds
            of wall time; ``None`` runs none.
        maintenance_every: seconds between retention steps.
        rules: evaluates the rule catalogue over the store on its own thread and sends alerts to
            its sinks (``vgpumon.rules.runner``); ``None`` evaluates none. Needs a store.
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
        host_every: int = 5,
        vllm: VllmSource | None = None,
        backlog: Backlog | None = None,
        retention: "Retention | None" = None,
        maintenance_every: float = 60.0,
        rules: "RuleRunner | None" = None,
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
        self.host_every = max(1, host_every)
        self.topology: Any = None
        self.vllm = vllm
        self.latest: Snapshot | None = None
        self.stats = AgentStats()
        self._pending: list[TickRows] = []
        self._gpu_ids: dict[str, int] = {}
        self._host_id: int | None = None
        self._registered: tuple[Any, ...] = ()
        self._writer: asyncio.Task[None] | None = None
        self.backlog = backlog if backlog is not None else Backlog(None)
        self.retention = retention
        self.maintenance_every = maintenance_every
        self._last_maintenance = monotonic()
        self._outage_since: float | None = None
        self._outage_rows = 0
        self._folded_at_outage = 0
        self._nvml_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-nvml")
        self._store_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-store")
        self._host_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-host")
        self.rules = rules if store is not None else None

    async def _nvml(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._nvml_exec, fn, *args)

    # -- store thread ----------------------------------------------------------------------------

    def _outage_begins(self, exc: StoreUnavailableError, where: str) -> None:
        if self._outage_since is None:  # one line per outage, not one per batch
            self._outage_since = self.monotonic()
            self._outage_rows = 0
            self._folded_at_outage = self.backlog.folded_rows
            self.stats.outages += 1
            log.error("%s; holding ticks in the %s until it returns", exc, where)

    def _enqueue(self, gpu: list[tuple[Any, ...]], extra: list[TickRows]) -> str:
        """Put what a batch could not store at the new end of the backlog; returns where the GPU
        rows went (``"spool"`` or ``"memory"``)."""
        where = self.backlog.append(RAW, gpu) if gpu else "spool"
        if extra:
            self.backlog.append(EXTRA, extra)
        self._outage_rows += len(gpu)
        return where

    def _persist(self, batch: list[TickRows]) -> None:
        """Store a batch of ticks, or queue it behind the backlog; then replay the backlog oldest
        first. GPU rows (encoded tuples, COPY on Postgres) and the tick's other rows (host samples,
        XID events, GPU processes) are written one after the other. Runs on the store thread."""
        assert self.store is not None
        gpu = [r for t in batch for r in t.get("gpu_samples", ())]
        extra: list[TickRows] = [e for e in ({k: v for k, v in t.items() if k != "gpu_samples" and v} for t in batch) if e]
        if gpu or extra:
            if len(self.backlog) == 0:
                try:
                    if gpu:
                        self.store.write_gpu_rows(gpu)
                        self.stats.rows_written += len(gpu)
                        gpu = []
                    if extra:
                        self.store.write_extra_rows(extra)
                        extra = []
                except StoreUnavailableError as exc:
                    where = self._enqueue(gpu, extra)
                    self._outage_begins(exc, "spool" if where == "spool" else "memory buffer")
                    return
            else:
                self._enqueue(gpu, extra)
        while (entry := self.backlog.peek()) is not None:
            try:
                if entry.kind == ROLLUP:
                    self.store.write_rollup_rows(entry.rows)
                elif entry.kind == EXTRA:
                    self.store.write_extra_rows(entry.rows)
                else:
                    self.store.write_gpu_rows(entry.rows)
                    self.stats.rows_written += len(entry.rows)
            except StoreUnavailableError as exc:
                self._outage_begins(exc, "spool")
                return
            self.backlog.ack(entry)
        if self._outage_since is not None:
            folded = self.backlog.folded_rows - self._folded_at_outage
            log.warning(
                "store reachable again after %.0f s: replayed %d held rows in order%s",
                self.monotonic() - self._outage_since,
                self._outage_rows,
                f"; {folded} raw ticks were kept only as 1-minute rollups (buffer bound reached)" if folded else "",
            )
            self._outage_since = None
        self._maintain()

    def _maintain(self) -> None:
        if self.retention is None or self.monotonic() - self._last_maintenance < self.maintenance_every:
            return
        self._last_maintenance = self.monotonic()
        try:
            res = self.retention.step()
        except StoreUnavailableError as exc:
            log.warning("retention step skipped: %s", exc)
            return
        if res.rows_deleted or res.partitions_dropped:
            log.info("retention: %d rows deleted, partitions dropped: %s", res.rows_deleted, res.partitions_dropped)

    async def _write(self, batch: list[TickRows]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._store_exec, self._persist, batch)

    def _flush(self) -> None:
        if self.store is None or (not self._pending and len(self.backlog) == 0):
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
        if self.retention is not None:
            self.retention.active_gpus = set(self._gpu_ids.values())
        if self.sysfs_root is not None and self._host_id is not None:
            from vgpumon.sources.pcie_topology import read_topology

            self.topology = await loop.run_in_executor(self._host_exec, read_topology, self.source.gpus, self.sysfs_root)
            await loop.run_in_executor(
                self._store_exec, self.store.replace_topology, self._host_id, self.topology.hops, self._gpu_ids, time.time()
            )

    def _tick_rows(self, snap: Snapshot) -> TickRows:
        """The rows one tick writes, per table.

        Every value rejected at the door (or that cannot be encoded) becomes a
        ``rejected_values`` row beside its NULL, so reports can count them; it costs only its
        own field, never its row or the batch.
        """
        ids = self._gpu_ids
        host_id = self._host_id
        rejected: list[dict[str, Any]] = []

        def reject(ts: float, subject: str, failed: Mapping[str, str]) -> None:
            if host_id is not None:
                for name, reason in failed.items():
                    if is_rejection(reason):
                        rejected.append({"host_id": host_id, "ts": ts, "subject": subject, "field": name[:64], "reason": reason[:255]})

        gpu_rows = []
        for s in snap.samples:
            if s.uuid not in ids:
                continue
            failed: dict[str, str] = {}
            gpu_rows.append(encode_gpu_sample(ids[s.uuid], s, failed))
            reject(s.ts, f"gpu:{s.uuid}", {**s.missing, **failed})
        rows: TickRows = {
            "gpu_samples": gpu_rows,
            "xid_events": [{"gpu_id": ids[e.uuid], "ts": e.ts, "xid": e.xid} for e in snap.xid_events if e.uuid in ids],
        }
        h: HostSample | None = snap.host
        if h is not None and host_id is not None:
            host_row = {
                "host_id": host_id, "ts": h.ts, "cpu_ratio": h.cpu_ratio,
                "memory_used_bytes": h.memory_used_bytes, "memory_total_bytes": h.memory_total_bytes,
                "load1": h.load1, "load5": h.load5, "load15": h.load15,
            }
            reject(h.ts, "host", {**h.missing, **storable("host_samples", host_row)})
            rows["host_samples"] = [host_row]
            procs = []
            for s in snap.samples:
                for pid, used in s.processes:
                    p = h.processes.get(pid)
                    if p is None or s.uuid not in ids:
                        continue
                    row = {
                        "host_id": host_id, "gpu_id": ids[s.uuid], "ts": s.ts, "pid": pid,
                        "start_time": p.start_time, "name": p.name, "cmdline": p.cmdline, "username": p.username,
                        "container_id": p.container_id, "resolved": p.resolved, "used_gpu_memory_bytes": used,
                        "rss_bytes": p.rss_bytes, "cpu_seconds_total": p.cpu_seconds_total,
                    }
                    reject(s.ts, f"gpu:{s.uuid}", storable("gpu_process_samples", row))
                    procs.append(row)
            rows["gpu_process_samples"] = procs
        rows["rejected_values"] = rejected
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
            if self.store is not None:
                if len(self.backlog):
                    log.warning("replaying %d rows spooled by an earlier run", self.backlog.spooled_rows)
            if self.vllm is not None:
                vllm_task = asyncio.get_running_loop().create_task(self._run_vllm(vllm_stop))
            if self.rules is not None:  # rules (issue 11): evaluated off the sampling path
                assert self.store is not None
                await self.rules.start(self.store, self.hostname, self._store_exec)
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
                if self.host is not None and self.stats.ticks % self.host_every == 0:
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
                if self.rules is not None:
                    self.rules.poke(ts)  # never blocks: starts an evaluation cycle when one is due
                if self.on_tick is not None:
                    self.on_tick(snap)
                if self.paced:
                    k = await wait_for_slot(stop, start, k, self.interval, self.monotonic)
                else:
                    await asyncio.sleep(0)  # let writes and signals through during a fast replay
        finally:
            vllm_stop.set()
            if vllm_task is not None:
                await vllm_task
            await self._drain()
            if self.rules is not None:
                await self.rules.finish()  # a last evaluation over every row written, sinks flushed
            self.stats.rows_pending = len(self._pending) + self.backlog.memory_rows
            self.stats.rows_spooled = self.backlog.spooled_rows
            self.stats.rows_folded = self.backlog.folded_rows
            if self.stats.rows_spooled:
                log.error("%d rows left in the spool %s; the next run replays them", self.stats.rows_spooled, self.backlog.spool_dir)
            if self.stats.rows_pending:
                log.error("%d rows could not be stored or spooled before exit", self.stats.rows_pending)
            await asyncio.get_running_loop().run_in_executor(self._nvml_exec, self.source.close)
            for executor in (self._nvml_exec, self._store_exec, self._host_exec):
                executor.shutdown(wait=True)
        return self.stats
