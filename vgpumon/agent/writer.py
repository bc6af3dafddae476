"""The store writer: batches of whole ticks onto the store thread, the backlog (spool, memory) while
the store is away, dead letters, retention between batches, and the cut-off of a store that has
gone silent. One writer per process (SQLite allows one)."""



from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, cast

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.store.engine import describe_store
from vgpumon.store.spool import EXTRA, RAW, ROLLUP, VLLM
from vgpumon.store.tables import TickRows

if TYPE_CHECKING:
    from concurrent.futures import Future
    from typing import TypeVar

    from typing_extensions import TypeVarTuple, Unpack  # typing's from 3.11; annotations only

    from vgpumon.store.codec import GpuRow

    _R = TypeVar("_R")
    _Args = TypeVarTuple("_Args")
from vgpumon.agent.state import AgentState

log = logging.getLogger("vgpumon.agent")


#: At stop, the longest wait for a silent store before its connections are cut (the systemd unit
#: gives the agent 30 s to stop; a live store's writes take milliseconds).
STOP_GRACE_S = 10.0

#: Seconds between batched writes of a live agent: each flush is two transactions (GPU rows;
#: the ticks' other rows) and a wake-up of the store thread, a fixed cost whatever the batch
#: holds, so the interval sets the store's share of the agent's CPU (docs/benchmarks.md,
#: "Agent footprint"). 10 s, as Telegraf's default ``flush_interval``: a process killed outright
#: (SIGKILL, the OOM killer) loses at most 10 s of 1-Hz ticks, and the rules and ``diagnose``
#: see a tick up to 10 s after it was taken (``/metrics`` and ``/api/v1/snapshot`` serve the
#: newest tick from memory). docs/architecture.md.
LIVE_FLUSH_S = 10.0
#: A replay as fast as possible: its rows pile up in memory between flushes.
REPLAY_FLUSH_S = 5.0


class _Interrupted(Exception):
    """The store became unavailable part-way through a batch; ``rest`` is what it has not taken
    (stored and dead-lettered rows left out), in order."""

    def __init__(self, rest: list[Any], cause: StoreUnavailableError) -> None:
        super().__init__(str(cause))
        self.rest = rest
        self.cause = cause



class StoreWriter(AgentState):
    """The agent's store writer (a part of ``Agent``: it shares the agent's state, its store thread
    and its stats)."""

    def _outage_begins(self, exc: StoreUnavailableError, where: str) -> None:
        if self._outage_since is None:  # one line per outage, not one per batch
            cut, self._cut = self._cut, None
            # an outage found by a cut began when the store went silent, not at the cut
            silent = cut[1] if cut is not None and time.monotonic() - cut[0] < 60.0 else 0.0
            self._outage_since = self.monotonic() - silent
            self._outage_rows = 0
            self._folded_at_outage = self.backlog.folded_rows
            self.stats.outages += 1
            log.error("%s; holding ticks in the %s until it returns", exc, where)

    def _enqueue(self, entries: list[tuple[str, list[Any]]]) -> str:
        """Put what a batch could not store at the new end of the backlog, in order; returns
        where its first rows went (``"spool"`` or ``"memory"``)."""
        where = None
        for kind, rows in entries:
            went = self.backlog.append(kind, rows)
            where = where or went
            if kind != EXTRA:
                self._outage_rows += len(rows)
        return where or "spool"

    @staticmethod
    def _entries(batch: list[TickRows]) -> list[tuple[str, list[Any]]]:
        """A batch of ticks as backlog entries, in the order they are written: GPU rows, the
        ticks' other rows (host samples, XID events, GPU processes), vLLM samples."""
        gpu = [r for t in batch for r in t.get("gpu_samples", ())]
        extra: list[TickRows] = [
            e for e in ({k: v for k, v in t.items() if k not in ("gpu_samples", "vllm_samples") and v} for t in batch) if e
        ]
        vllm = [r for t in batch for r in t.get("vllm_samples", ())]
        return [(kind, rows) for kind, rows in ((RAW, gpu), (EXTRA, extra), (VLLM, vllm)) if rows]

    def _write_kind(self, kind: str, rows: list[Any]) -> None:
        assert self.store is not None
        if kind == RAW:
            inserted = self.store.write_gpu_rows(rows)
            self.stats.rows_written += inserted
            self.stats.rows_duplicate += len(rows) - inserted
        elif kind == ROLLUP:
            self.store.write_rollup_rows(rows)
        elif kind == EXTRA:
            self.store.write_extra_rows(rows)
        elif kind == VLLM:
            if self._vllm_repo is None:
                from vgpumon.store.vllm_repository import VllmRepository

                self._vllm_repo = VllmRepository(self.store.engine)
            self._vllm_repo.write_rows(rows)
        else:
            raise ValueError(f"unknown backlog kind {kind!r}")

    def _write_isolating(self, kind: str, rows: list[Any]) -> None:
        """Write one batch. A failure other than "store unavailable" is retried once; if it
        fails again the batch is split in halves, and halves again, until each failing row
        stands alone (a tick's other rows down to single rows): that row goes to the dead-letter
        file and every other row is stored. Runs on the store thread.

        Raises:
            _Interrupted: the store became unavailable; carries the rows not yet taken.
        """
        chunks: deque[list[Any]] = deque([list(rows)])
        retried = False
        while chunks:
            chunk = chunks[0]
            try:
                self._write_kind(kind, chunk)
            except StoreUnavailableError as exc:
                raise _Interrupted([r for c in chunks for r in c], exc) from None
            except Exception as exc:  # noqa: BLE001 - a row the store refuses; isolated below
                if not retried:
                    retried = True
                    log.warning("a batch of %d %s rows failed (%s: %s); retrying it", len(chunk), kind, type(exc).__name__, exc)
                    continue
                chunks.popleft()
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    chunks.extendleft((chunk[half:], chunk[:half]))
                elif kind == EXTRA and sum(len(v) for v in chunk[0].values()) > 1:
                    chunks.extendleft(reversed([[{t: [r]}] for t, rs in chunk[0].items() for r in rs]))
                else:
                    self.backlog.dead_letter(kind, chunk[0], exc)
                    self.stats.dead_letters += 1
                continue
            chunks.popleft()

    def _persist(self, batch: list[TickRows]) -> None:
        """Store a batch of ticks, or queue it behind the backlog; then replay the backlog oldest
        first. GPU rows (encoded tuples, COPY on Postgres), the ticks' other rows (host samples,
        XID events, GPU processes) and vLLM samples are written one after the other. Runs on the
        store thread."""
        assert self.store is not None
        entries = self._entries(batch)
        outage = self._outage_since is not None
        if len(self.backlog) == 0:
            for i, (kind, rows) in enumerate(entries):
                try:
                    self._write_isolating(kind, rows)
                except _Interrupted as it:
                    where = self._enqueue([(kind, it.rest), *entries[i + 1 :]])
                    self._outage_begins(it.cause, "spool" if where == "spool" else "memory buffer")
                    return
        elif entries:
            self._enqueue(entries)
        if self._outage_since is not None and self._stopping.is_set():
            return  # stopping during an outage: what is held stays in the spool for the next run
        while (entry := self.backlog.peek()) is not None:
            try:
                self._write_isolating(entry.kind, entry.rows)
            except _Interrupted as it:
                self.backlog.shrink_head(entry, it.rest)  # nothing stored or set aside twice
                self._outage_begins(it.cause, "spool")
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
        if self.rules is not None:  # stored: the rules' windows take the batch's GPU rows (or,
            # after an outage whose rows came back from the spool, restore from the store)
            self.rules.stored([r for t in batch for r in cast("list[GpuRow]", t.get("gpu_samples", ()))], whole=not outage)
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
        except Exception:  # noqa: BLE001 - upkeep must never cost a tick; the next step retries
            log.exception("retention step failed")
            return
        if res.rows_deleted or res.partitions_dropped:
            log.info("retention: %d rows deleted, partitions dropped: %s", res.rows_deleted, res.partitions_dropped)

    async def _write(self, batch: list[TickRows]) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._store_exec, self._persist, batch)
        except Exception:  # noqa: BLE001 - a bug on the store thread: keep the batch, say so
            log.exception("store thread failed; %d ticks kept for the next flush", len(batch))
            self._pending.extendleft(reversed(batch))  # writes skip stored rows: a second attempt is harmless

    def _silence(self) -> dict[int | None, float]:
        """For each call running on the store's or the rules' thread: seconds it has run with no
        movement of that thread in the store's pool (no connection opened, lent or taken back),
        by thread; empty when none runs."""
        if self.store is None:
            return {}
        now, watch = time.monotonic(), self.store.watch
        out: dict[int | None, float] = {}
        for executor in (self._store_exec, getattr(self.rules, "executor", None)):
            since = executor.running_since if executor is not None else None
            if since is not None and executor is not None:
                out[executor.thread_id] = now - max(since, watch.moved_at(executor.thread_id))
        return out

    def _cut_if_silent(self, deadline: float) -> bool:
        """When a store call has gone ``deadline`` seconds without an answer (``_silence``), the
        store is silent: cut its connections so that the call fails as a lost connection and the
        usual outage path (backlog, retries) takes over. Safe from any thread (the event loop's
        flush, a registration waiting for the store thread); True after a cut."""
        silences = self._silence()
        silent = max(silences.values(), default=0.0)
        if silent < deadline:
            return False
        assert self.store is not None
        watch = self.store.watch
        for thread, seconds in silences.items():
            if seconds >= deadline:
                watch.moved(thread)  # the next look only after another deadline without movement
        cut = watch.cut()
        if not cut:  # connecting: libpq's connect_timeout ends that wait
            log.debug("store silent for %.0f s while connecting; no connection to cut", silent)
            return False
        self.stats.store_stalls += 1
        self._cut = (time.monotonic(), silent)
        log.error(
            "store %s has not answered for %.0f s: %d connection(s) closed; the rows in flight go to the %s, "
            "and it is retried at each flush", describe_store(self.store.engine), silent, cut,
            "spool" if self.backlog.spool_dir is not None else "memory buffer",
        )
        return True

    async def _settle(self, task: "asyncio.Future[Any] | None", what: str) -> None:
        """At stop: wait for ``task`` (store work), cutting a silent store's connections after
        ``min(store_deadline, STOP_GRACE_S)`` seconds without an answer; when the call still
        has not returned ``STOP_GRACE_S`` later (a connection attempt ends by its own
        ``connect_timeout``, 5 s by default, and its batch is then spooled), leave it behind and
        say so: the process must exit."""
        if task is None:
            return
        deadline = min(self.store_deadline, STOP_GRACE_S)
        silent_at: float | None = None
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return
            if silent_at is None:
                if max(self._silence().values(), default=0.0) >= deadline:
                    silent_at = time.monotonic()
                    self._cut_if_silent(deadline)
            elif time.monotonic() - silent_at >= STOP_GRACE_S:
                log.error("%s did not end after the store's connections were closed; left behind", what)
                self._store_abandoned = True
                return

    def _flush(self) -> None:
        if self.store is None:
            return
        self._cut_if_silent(self.store_deadline)
        if not self._pending and len(self.backlog) == 0:
            return
        if self._writer is not None and not self._writer.done():
            return  # the next flush takes these rows along
        batch = [self._pending.popleft() for _ in range(len(self._pending))]
        self._writer = asyncio.get_running_loop().create_task(self._write(batch))

    async def _drain(self) -> None:
        await self._settle(self._writer, "a store write")
        if self._store_abandoned:
            return
        self._flush()
        await self._settle(self._writer, "the last store write")

    def _register_blocking(self) -> None:
        """Register the source's GPUs (and the PCIe topology above them) through the store thread;
        blocks the calling thread, which must not be the store thread."""
        self._registered = self.source.gpus
        if self.store is None:
            return
        self._gpu_ids = self._store_call(self.store.register_gpus, self.hostname, self.source.gpus)
        self._host_id = self._store_call(self.store.host_id, self.hostname)
        if self.retention is not None:
            self.retention.active_gpus = set(self._gpu_ids.values())
            self.retention.host_id = self._host_id
        if self.sysfs_root is not None and self._host_id is not None:
            from vgpumon.sources.pcie_topology import read_topology

            self.topology = read_topology(self.source.gpus, self.sysfs_root)
            self._store_call(self.store.replace_topology, self._host_id, self.topology.hops, self._gpu_ids, time.time())

    def _store_call(self, fn: Callable[[Unpack[_Args]], _R], *args: Unpack[_Args]) -> _R:
        """``fn(*args)`` on the store thread, waited for from another thread (not the event loop),
        cutting a silent store's connections (``_cut_if_silent``) so that it raises instead of
        waiting for ever."""
        fut: Future[_R] = self._store_exec.submit(fn, *args)
        while True:
            try:
                return fut.result(timeout=1.0)
            except FutureTimeout:
                self._cut_if_silent(self.store_deadline)

    async def _register(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._host_exec, self._register_blocking)
