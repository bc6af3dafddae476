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
from typing import TYPE_CHECKING, Any, Callable

from vgpumon.errors import StoreUnavailableError
from vgpumon.model import Snapshot
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml_backend import EndOfCapture
from vgpumon.store import Store
from vgpumon.store.spool import RAW, ROLLUP, Backlog

if TYPE_CHECKING:
    from vgpumon.store.retention import Retention

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
        backlog: where batches wait while the store is away; default: memory only, 8 GPU-hours
            of rows (``vgpumon agent`` passes a spool).
        retention: rollup/prune job run on the store thread every ``maintenance_every`` seconds
            of wall time; ``None`` runs none.
        maintenance_every: seconds between retention steps.
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
        backlog: Backlog | None = None,
        retention: "Retention | None" = None,
        maintenance_every: float = 30.0,
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
        self.latest: Snapshot | None = None
        self.stats = AgentStats()
        self._pending: list[tuple[Any, ...]] = []
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

    def _persist(self, batch: list[tuple[Any, ...]]) -> None:
        """Store a batch, or queue it behind the backlog; then replay the backlog oldest first.
        Runs on the store thread."""
        assert self.store is not None
        if batch:
            if len(self.backlog) == 0:
                try:
                    self.store.write_gpu_rows(batch)
                    self.stats.rows_written += len(batch)
                    batch = []
                except StoreUnavailableError as exc:
                    where = self.backlog.append(RAW, batch)
                    self._outage_begins(exc, "spool" if where == "spool" else "memory buffer")
                    self._outage_rows += len(batch)
                    return
            else:
                self.backlog.append(RAW, batch)
                self._outage_rows += len(batch)
        while (entry := self.backlog.peek()) is not None:
            try:
                if entry.kind == ROLLUP:
                    self.store.write_rollup_rows(entry.rows)
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

    async def _write(self, batch: list[tuple[Any, ...]]) -> None:
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

    async def run(self, stop: asyncio.Event | None = None) -> AgentStats:
        """Sample until ``stop`` is set, ``duration`` has passed or a replay ends.

        Raises:
            NvmlUnavailableError: NVML cannot start on this host.
            StoreUnavailableError: the store cannot register the host's GPUs at start.
        """
        stop = stop or asyncio.Event()
        try:
            gpus = await self._nvml(self.source.start)
            self.stats.gpus = len(gpus)
            gpu_ids: dict[str, int] = {}
            if self.store is not None:
                gpu_ids = await asyncio.get_running_loop().run_in_executor(
                    self._store_exec, self.store.register_gpus, self.hostname, gpus
                )
                if self.retention is not None:
                    self.retention.active_gpus = set(gpu_ids.values())
                if len(self.backlog):
                    log.warning("replaying %d rows spooled by an earlier run", self.backlog.spooled_rows)
            start = self.monotonic()
            first_ts: float | None = None
            last_flush = start
            k = 0
            while not stop.is_set():
                t0 = self.monotonic()
                try:
                    ts, samples = await self._nvml(self.source.sample)
                except EndOfCapture:
                    break
                if first_ts is None:
                    first_ts = ts
                if self.duration is not None and ts - first_ts >= self.duration:
                    break
                snap = Snapshot(
                    ts=ts, hostname=self.hostname, gpus=self.source.gpus, samples=samples,
                    collect_seconds=self.monotonic() - t0,
                )
                self.latest = snap
                self.stats.ticks += 1
                if self.store is not None:
                    self._pending.extend(Store.sample_row(gpu_ids[s.uuid], s) for s in samples if s.uuid in gpu_ids)
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
            await self._drain()
            self.stats.rows_pending = len(self._pending) + self.backlog.memory_rows
            self.stats.rows_spooled = self.backlog.spooled_rows
            self.stats.rows_folded = self.backlog.folded_rows
            if self.stats.rows_spooled:
                log.error("%d rows left in the spool %s; the next run replays them", self.stats.rows_spooled, self.backlog.spool_dir)
            if self.stats.rows_pending:
                log.error("%d rows could not be stored or spooled before exit", self.stats.rows_pending)
            await asyncio.get_running_loop().run_in_executor(self._nvml_exec, self.source.close)
            self._nvml_exec.shutdown(wait=True)
            self._store_exec.shutdown(wait=True)
        return self.stats
