"""The per-host agent: one asyncio process that ticks the sources and feeds the store.

NVML runs on its own worker thread and the store on another, so a slow database never delays a
tick and a slow NVML call never blocks the event loop. Rows are written in batches of whole ticks
(one transaction each): a tick is either stored completely or not yet. On stop (SIGINT, SIGTERM,
``--duration`` reached, end of a replayed capture) the tick in progress completes and every pending
row is written before the process exits.

Nothing lost: a batch the store refuses (unreachable, locked, disk full) goes to the backlog
(``vgpumon.store.spool``: a spool on disk, else a bounded buffer in memory) and, while a backlog
exists, so does every newer batch; each flush then replays the backlog oldest first until the store
takes it again. One log line when an outage starts and one when it ends. A batch refused for what
it holds (a value a column cannot hold, a foreign key that no longer exists) is retried once, then
split in halves until the failing rows stand alone: those go to the dead-letter file beside the
spool and are counted, every other row is stored. The store thread is the only writer (SQLite
allows one); it also runs the retention job (rollups, pruning) in small steps between batches,
never while a backlog waits.

The vLLM source runs in its own task, supervised: if it fails it is restarted with back-off
(counted in ``AgentStats.vllm_restarts``), and whatever it does, the GPU rows are stored at
shutdown. Its samples ride the same batches and the same backlog as the GPU rows.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.base.pacing import next_slot, sleep_unless
from vgpumon.base.workers import DaemonExecutor, Latch, name_os_thread
from vgpumon.catalogue import is_rejection
from vgpumon.model import HostSample, NvmlReading, Snapshot
from vgpumon.sources.host import HostSource
from vgpumon.sources.nvml import CLOCK_STEP_SECONDS, NvmlSource
from vgpumon.sources.nvml_backend import EndOfCapture
from vgpumon.store import Store
from vgpumon.store.codec import encode_gpu_sample, storable
from vgpumon.store.engine import describe_store
from vgpumon.store.repository import TickRows
from vgpumon.store.spool import EXTRA, RAW, ROLLUP, VLLM, Backlog

if TYPE_CHECKING:
    from vgpumon.rules.runner import RuleRunner
    from vgpumon.sources.kubernetes import KubernetesSource
    from vgpumon.sources.vllm import ServerSample, VllmSource
    from vgpumon.store.retention import Retention
    from vgpumon.store.vllm_repository import VllmRepository

log = logging.getLogger(__name__)


@dataclass
class AgentStats:
    """What a run did.

    Attributes:
        ticks: ticks sampled.
        rows_written: GPU rows inserted into the store (spooled rows of earlier runs included).
        rows_duplicate: GPU rows skipped because the store held them already (a spool replayed
            after a restart, a capture replayed twice): reported apart, never as stored.
        rows_pending: rows held in memory at exit: lost (0 unless store and spool both failed).
        rows_spooled: rows left in the spool at exit; the next run replays them.
        rows_folded: raw ticks folded into 1-minute rollups because a backlog bound was reached
            (their full resolution is lost; the rollups are stored).
        outages: times the store became unreachable (or silent: see ``store_stalls``).
        store_stalls: times a store call went ``store_deadline`` seconds without an answer and the
            store's connections were cut (each also begins an outage when rows were in flight).
        gpus: GPUs found.
        vllm_samples: vLLM samples taken (one per server per poll).
        vllm_rows_folded: vLLM samples folded away while a backlog bound was reached (their
            server's state changes and last sample per minute are kept).
        vllm_restarts: times the vLLM source failed and was restarted.
        dead_letters: rows the store refused for what they hold, set aside in the dead-letter
            file beside the spool (``Backlog.dead_letter_path``) instead of being stored.
        ticks_skipped: slots of a paced run with no tick, because the tick before ran past them
            (a call slow but within ``call_deadline``, a starved host); logged.
    """

    ticks: int = 0
    rows_written: int = 0
    rows_duplicate: int = 0
    rows_pending: int = 0
    rows_spooled: int = 0
    rows_folded: int = 0
    outages: int = 0
    store_stalls: int = 0
    gpus: int = 0
    vllm_samples: int = 0
    vllm_rows_folded: int = 0
    vllm_restarts: int = 0
    dead_letters: int = 0
    ticks_skipped: int = 0


def quiet_wakeup_fd() -> None:
    """Let the signal wakeup fd that asyncio set drop bytes silently when full. With its default
    (``warn_on_full_buffer=True``) a flood of signals (a script sending SIGALRM in a loop) makes
    CPython queue a warning from inside the signal handler, and every thread can deadlock on the
    interpreter's pending-calls lock (seen with CPython 3.11: the agent stopped answering, and
    only SIGKILL ended it). Bytes are dropped with a full pipe either way (the flag only decides
    whether a warning is queued), so nothing that worked before is lost; a watchdog alarm whose
    byte is dropped is re-armed by the next read. On the main thread only."""
    try:
        fd = signal.set_wakeup_fd(-1)
        if fd != -1:
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread, or no fd: nothing to quiet
        pass


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


class Agent:
    """Ticks an ``NvmlSource`` every ``interval`` seconds and writes each tick to a ``Store``.

    Args:
        source: the NVML collector (live, recording or replaying backend).
        store: where rows go; ``None`` samples without storing (``vgpumon record``).
        hostname: the host's identity in the store.
        interval: seconds between ticks (wall clock); ignored when ``paced`` is false.
        duration: stop after this many seconds of sample time (capture time in a replay);
            ``None`` runs until stopped.
        paced: sleep ``interval`` between ticks (live sampling); false replays a capture as fast
            as possible, or at its recorded pace with ``recorded_pace``.
        recorded_pace: a replay at the capture's own pace: each tick is taken in when as much
            wall time (``monotonic``) has passed since the first as capture time has, whatever
            ``interval`` says (a capture recorded at 0.5 s, or with gaps, replays as recorded).
        flush_every: seconds of wall time between batched writes; ``None``: ``LIVE_FLUSH_S``
            (10 s) for a live or recorded-pace run, ``REPLAY_FLUSH_S`` (5 s) for a replay as fast
            as possible (whose rows pile up in memory between flushes at thousands of ticks a
            second). A process killed outright loses at most this much of its ticks.
        monotonic: injected clock for pacing, ``--duration`` and the intervals between ticks
            (``time.monotonic``).
        clock: injected wall clock for tick times (``time.time``); a step of it against
            ``monotonic`` (NTP, a VM resuming) is detected, logged and stored as an event.
        on_tick: called with each ``Snapshot`` on the event loop (progress display, tests); a
            paced run wakes the loop for it each tick, so the daemon sets none (the exporter is
            one of ``observers``).
        host: the host source (psutil); ``None`` skips host samples (replays of another host's
            capture skip them by default: this host's CPU says nothing about that one).
        host_every: take a host sample (CPU, memory, GPU processes' RSS and CPU) every this many
            ticks; per-process GPU memory is stored with each host sample.
        sysfs_root: where to read the PCIe topology above the GPUs (``/sys``); ``None`` skips it
            (replays).
        vllm: the vLLM source, polled by its own task at its own interval (``None``: no vLLM).
            It sees every snapshot (GPU processes and activity); its samples join the GPU rows'
            batches (same store thread, same backlog). A slow or broken server never delays an
            NVML tick; a source that fails is restarted after ``vllm_backoff`` seconds, doubling
            up to ``vllm_backoff_max`` while it keeps failing. At stop it gets
            ``vllm_stop_timeout`` seconds to finish its poll, then it is cancelled: the GPU rows
            are stored whatever it does.
        backlog: where batches wait while the store is away; default: memory only, 8 GPU-hours
            of rows (``vgpumon agent`` passes a spool).
        retention: rollup/prune job run on the store thread every ``maintenance_every`` seconds
            of wall time; ``None`` runs none.
        maintenance_every: seconds between retention steps.
        kubernetes: the kubelet's pod-resources source, refreshed by its own task (every 30 s,
            off the event loop); each snapshot gets its GPU and process owners attached
            (``Snapshot.kubernetes``) and the source's status in ``sources``. ``None``: off.
        call_deadline: seconds a device's read may take before the device counts as wedged
            (default: half the interval, 0.25–5 s; a normal read takes under a millisecond).
        rules: evaluates the rule catalogue over the store on its own thread and sends alerts to
            its sinks (``vgpumon.rules.runner``); ``None`` evaluates none. Needs a store.
        store_deadline: seconds a store call (a write, a rules read, a registration) may go
            without the store's pool moving before the store counts as silent: its connections
            are cut (``ConnectionWatch.cut``), the call fails as a lost connection, the rows go
            to the backlog and an outage begins. ``vgpumon agent`` sets it above the longest
            wait the store's own settings allow (docs/store.md). At stop the agent waits at most
            ``min(store_deadline, STOP_GRACE_S)`` for a silent store.
        watchdog: how a paced run watches its NVML reads (``_run_paced``): ``"auto"``, a
            SIGALRM timer armed around each read when the run's event loop is on the main thread
            (no wake-up unless a read overruns), else a watchdog thread that wakes once per tick;
            ``"thread"``, always the thread.
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
        recorded_pace: bool = False,
        flush_every: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        on_tick: Callable[[Snapshot], None] | None = None,
        host: HostSource | None = None,
        sysfs_root: str | None = None,
        host_every: int = 5,
        vllm: VllmSource | None = None,
        backlog: Backlog | None = None,
        retention: "Retention | None" = None,
        maintenance_every: float = 60.0,
        vllm_backoff: float = 1.0,
        vllm_backoff_max: float = 60.0,
        vllm_stop_timeout: float = 10.0,
        kubernetes: "KubernetesSource | None" = None,
        call_deadline: float | None = None,
        rules: "RuleRunner | None" = None,
        store_deadline: float = 75.0,
        watchdog: str = "auto",
    ) -> None:
        self.source = source
        self.store = store
        self.hostname = hostname
        self.interval = interval
        self.duration = duration
        self.paced = paced
        self.recorded_pace = recorded_pace
        if flush_every is None:
            flush_every = LIVE_FLUSH_S if paced or recorded_pace else REPLAY_FLUSH_S
        self.flush_every = flush_every
        self.monotonic = monotonic
        self.clock = clock
        self._last_clock: tuple[float, float] | None = None  # (wall, monotonic) of the last tick
        self.on_tick = on_tick
        #: called with each snapshot on the thread that takes the tick (the sampling thread of a
        #: paced run, the event loop in a replay): quick, and safe beside the event loop's reads
        #: (the exporter keeps the snapshot for /metrics)
        self.observers: list[Callable[[Snapshot], None]] = []
        self.host = host
        self.sysfs_root = sysfs_root
        self.host_every = max(1, host_every)
        self.topology: Any = None
        self.vllm = vllm
        self.vllm_backoff = vllm_backoff
        self.vllm_backoff_max = vllm_backoff_max
        self.vllm_stop_timeout = vllm_stop_timeout
        self._vllm_repo: VllmRepository | None = None
        self.latest: Snapshot | None = None
        self.stats = AgentStats()
        # ticks' rows waiting for the next flush; appended by the sampling thread (paced runs) and
        # the event loop, taken by the event loop only (deque: append and popleft are atomic)
        self._pending: deque[TickRows] = deque()
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
        # NVML's thread is a daemon one that can be given up on: a call that never returns (a
        # wedged driver) must not keep the other GPUs from their ticks, nor the process from
        # exiting on SIGTERM (ThreadPoolExecutor joins its threads at exit).
        self._nvml_exec = DaemonExecutor("vgpumon-nvml")
        self._stopping = Latch()  # set with the run's stop: ends the sampling thread's pause
        self._host_sample: HostSample | None = None  # taken on the NVML thread after its tick
        self.call_deadline = call_deadline if call_deadline is not None else min(max(interval / 2, 0.25), 5.0)
        self.store_deadline = store_deadline
        self._store_abandoned = False  # a call on a silent store outlived its cut: left behind at exit
        self._cut: tuple[float, float] | None = None  # (monotonic, seconds silent) of the last cut
        self._loop: asyncio.AbstractEventLoop | None = None
        # a daemon thread too: a call stuck on a silent store that even a cut cannot end must
        # not keep the process from exiting
        self._store_exec = DaemonExecutor("vgpumon-store")
        self._host_exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-host", initializer=name_os_thread)
        self.rules = rules if store is not None else None
        self.kubernetes = kubernetes
        self._last_host: HostSample | None = None
        self._first: tuple[float, float] | None = None  # (capture time, monotonic) of the first tick read
        self._gen = 0  # the sampling thread's generation: one given up on (wedged call) is no longer current
        if watchdog not in ("auto", "thread"):
            raise ValueError(f"watchdog must be 'auto' or 'thread', not {watchdog!r}")
        self.watchdog = watchdog
        self._alarm = False  # this run's watchdog is the timer
        self._alarm_lock = threading.Lock()
        self._reading: int | None = None  # the generation whose read the timer is armed for

    @property
    def _replaying(self) -> bool:
        """True when the ticks' times come from a capture, not from this host's clock."""
        return bool(getattr(self.source.backend, "replays_time", False))

    def _tick_time(self) -> float:
        """The wall-clock time of the tick about to be taken. A wall clock that moved by more
        than ``CLOCK_STEP_SECONDS`` beyond what the monotonic clock measured since the last tick
        stepped (NTP, a VM resumed): the source stores the event and voids rates across it."""
        wall, mono = self.clock(), self.monotonic()
        if self._last_clock is not None and not self._replaying:
            drift = (wall - self._last_clock[0]) - (mono - self._last_clock[1])
            if abs(drift) > CLOCK_STEP_SECONDS:
                self.source.clock_stepped(drift, at=self._last_clock[0])
        self._last_clock = (wall, mono)
        return wall

    async def _nvml(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._nvml_exec, fn, *args)

    def _sample_after(self, host_due: bool = False) -> NvmlReading:
        """On the NVML thread: read the tick (and, when ``host_due``, the host sample into
        ``_host_sample``), so that a replayed tick wakes the event loop once, not twice."""
        reading = self.source.sample(self._tick_time())
        if host_due:
            self._host_sample = self._host_of(reading)
        return reading

    def _host_of(self, reading: NvmlReading) -> HostSample | None:
        """The host sample for a tick (its GPU processes' owners, RSS and CPU); ``None`` without a
        host source or when psutil fails (logged: the host's figures never cost a tick)."""
        if self.host is None:
            return None
        try:
            return self.host.sample(reading.ts, {pid for s in reading.samples for pid, _ in s.processes})
        except Exception:  # noqa: BLE001 - the host's figures must never cost a tick
            log.exception("host sample failed")
            return None

    def _give_up(self, stuck: tuple[int, str, float], then: Callable[[], None] | None = None) -> bool:
        """A call past its deadline: the source marks its device wedged, and the NVML thread stuck
        in it is left behind for a fresh one (it exits when the call returns). False, changing
        nothing, when the call returned meanwhile (``NvmlSource.abandon``); ``then`` runs once the
        read is abandoned, before the stuck thread can see it."""
        if not self.source.abandon(*stuck, then=then):
            return False
        self._nvml_exec.abandon()
        self._nvml_exec = DaemonExecutor("vgpumon-nvml")
        return True

    async def _sample(self, host_due: bool = False) -> NvmlReading:
        """One tick from the NVML source (replays), under a per-device deadline: a device whose
        read has not finished ``call_deadline`` seconds after it began is wedged — the source
        marks it, the stuck thread is left behind and the tick is finished on a fresh one, so the
        other GPUs keep their schedule. Raises ``EndOfCapture`` at the end of a replay."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._nvml_exec, self._sample_after, host_due)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=self.call_deadline)
            if done:
                return fut.result()
            stuck = self.source.inflight()
            if stuck is None or time.monotonic() - stuck[2] < self.call_deadline:
                continue  # between devices, or one that is slow but within its deadline
            if not self._give_up(stuck):
                continue  # it returned just now: its result is on the way
            fut.cancel()  # its result, when the call comes back, is of no use
            fut = loop.run_in_executor(self._nvml_exec, self.source.resume)

    # -- store thread ----------------------------------------------------------------------------

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
            if since is not None:
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
        if self.sysfs_root is not None and self._host_id is not None:
            from vgpumon.sources.pcie_topology import read_topology

            self.topology = read_topology(self.source.gpus, self.sysfs_root)
            self._store_call(self.store.replace_topology, self._host_id, self.topology.hops, self._gpu_ids, time.time())

    def _store_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store thread, waited for from another thread (not the event loop),
        cutting a silent store's connections (``_cut_if_silent``) so that it raises instead of
        waiting for ever."""
        fut = self._store_exec.submit(fn, *args)
        while True:
            try:
                return fut.result(timeout=1.0)
            except FutureTimeout:
                self._cut_if_silent(self.store_deadline)

    async def _register(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._host_exec, self._register_blocking)

    def _rejected_rows(self, ts: float, subject: str, failed: Mapping[str, str]) -> list[dict[str, Any]]:
        """``rejected_values`` rows for the values refused at the door (reasons ``rejected: …``)."""
        if self._host_id is None:
            return []
        return [
            {"host_id": self._host_id, "ts": ts, "subject": subject[:160], "field": name[:64], "reason": reason[:255]}
            for name, reason in failed.items()
            if is_rejection(reason)
        ]

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
            rejected.extend(self._rejected_rows(ts, subject, failed))

        gpu_rows = []
        for s in snap.samples:
            if s.uuid not in ids:
                continue
            failed: dict[str, str] = {}
            gpu_rows.append(encode_gpu_sample(ids[s.uuid], s, failed))
            reject(s.ts, f"gpu:{s.uuid}", {**s.missing, **failed})
        rows: TickRows = {
            "gpu_samples": gpu_rows,
            "xid_events": [
                {"gpu_id": ids[e.uuid], "ts": e.ts, "xid": e.xid, "seq": e.seq} for e in snap.xid_events if e.uuid in ids
            ],
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
        if host_id is not None:
            rows["host_events"] = [
                {"host_id": host_id, "ts": e.ts, "kind": e.kind, "subject": e.subject[:160], "detail": e.detail[:255]}
                for e in snap.events
            ]
        return rows

    # -- vLLM: its own task and pace; rows through the store thread ----------------------------

    def _take_vllm(self, samples: list[ServerSample]) -> None:
        """Queue a poll's samples with the GPU rows (next flush, same backlog)."""
        self.stats.vllm_samples += len(samples)
        if self.store is None or self._host_id is None or not samples:
            return
        from vgpumon.store.vllm_repository import VllmRepository

        self._pending.append(
            {
                "vllm_samples": [VllmRepository.encode_sample(self._host_id, s) for s in samples],
                "rejected_values": [
                    r for s in samples for r in self._rejected_rows(s.ts, f"vllm:{s.instance.url}", s.rejected)
                ],
            }
        )

    async def _run_vllm(self, stop: asyncio.Event) -> None:
        """Run the vLLM source until ``stop``; restart it with back-off whenever it fails."""
        assert self.vllm is not None
        failures = 0
        try:
            while not stop.is_set():
                try:
                    async for samples in self.vllm.run(stop):
                        failures = 0
                        self._take_vllm(samples)
                except Exception as exc:  # noqa: BLE001 - the vLLM source must never take the GPU sampling down
                    failures += 1
                    self.stats.vllm_restarts += 1
                    delay = min(self.vllm_backoff * 2 ** (failures - 1), self.vllm_backoff_max)
                    log.error(
                        "vLLM source failed (%s: %s); restart %d in %.1f s",
                        type(exc).__name__, exc, self.stats.vllm_restarts, delay, exc_info=exc,
                    )
                    await sleep_unless(stop, delay)
        finally:
            try:
                await self.vllm.close()
            except Exception:  # noqa: BLE001 - closing must not cost the GPU rows their drain
                log.exception("closing the vLLM source failed")

    async def _stop_vllm(self, task: asyncio.Task[None]) -> None:
        """Let the vLLM task end its poll (its requests have timeouts, a process-table read may
        not), for at most ``vllm_stop_timeout`` seconds; then cancel it. Never raises: the GPU
        rows are drained after this whatever the source did."""
        done, _ = await asyncio.wait({task}, timeout=self.vllm_stop_timeout)
        if not done:
            log.error("vLLM source did not stop within %.0f s; cancelled", self.vllm_stop_timeout)
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        elif not task.cancelled() and task.exception() is not None:  # supervised already: a bug
            log.error("vLLM source ended with an error", exc_info=task.exception())

    # -- Kubernetes attribution: its own task and pace; owners attached to each snapshot ------

    def _attribute(self, snap: Snapshot) -> Snapshot:
        """The snapshot with the kubelet's newest allocations attached (pod, namespace, container
        of its GPUs and GPU processes); unchanged while there are none (no kubelet). The source's
        status is put beside NVML's when the snapshot is built."""
        from vgpumon.sources.kubernetes import attach

        assert self.kubernetes is not None
        if snap.host is not None:
            self._last_host = snap.host
        return attach(snap, self.kubernetes.current(), host=self._last_host)

    # -- the tick loop: replays on the event loop, paced runs on the sampling thread ----------

    def _host_due(self) -> bool:
        return self.host is not None and self.stats.ticks % self.host_every == 0

    def _past_duration(self, ts: float) -> bool:
        """True when a tick read at ``ts`` is at or past ``--duration`` (it is not taken). The
        first tick read starts the clock: a live run's duration is monotonic time, a replay's is
        the capture's time."""
        if self._first is None:
            self._first = (ts, self.monotonic())
        first_ts, first_mono = self._first
        elapsed = ts - first_ts if self._replaying else self.monotonic() - first_mono
        if self.paced and not self.recorded_pace:
            # ticks are read on their slots: the one due at the duration itself is not in the run
            # (10 s at 2 s: the ticks at 0, 2, 4, 6 and 8 s), whichever way the few milliseconds
            # of scheduling jitter fall
            elapsed += min(self.interval / 2, 0.05)
        return self.duration is not None and elapsed >= self.duration

    def _take(self, reading: NvmlReading, host: HostSample | None) -> Snapshot:
        """Take a tick in: its snapshot (``latest``, what ``/metrics`` serves), the vLLM source's
        view of the GPUs, and its rows queued for the next flush. Runs on the event loop (replays)
        or the sampling thread (paced runs)."""
        statuses = tuple(s for s in (reading.status,) if s is not None)
        if self.kubernetes is not None:
            statuses = (*statuses, self.kubernetes.status())
        snap = Snapshot(
            ts=reading.ts, hostname=self.hostname, gpus=self.source.gpus, samples=reading.samples,
            xid_events=reading.xid_events, sources=statuses, host=host, events=reading.events,
        )
        if self.kubernetes is not None:
            snap = self._attribute(snap)
        self.latest = snap
        for observe in self.observers:
            observe(snap)
        if self.vllm is not None:
            self.vllm.observe(snap)
        self.stats.ticks += 1
        if self.store is not None:
            self._pending.append(self._tick_rows(snap))
        return snap

    async def _run_on_loop(self, stop: asyncio.Event) -> None:
        """Replays: each tick read on the NVML thread under ``_sample``'s deadline and taken in on
        the event loop, as fast as the store takes them or at the capture's own pace."""
        loop = asyncio.get_running_loop()
        last_flush = self.monotonic()
        while not stop.is_set():
            try:
                host_due = self._host_due()
                self._host_sample = None
                reading = await self._sample(host_due)
            except EndOfCapture:
                break
            if self._past_duration(reading.ts):
                break
            if self.recorded_pace:
                assert self._first is not None
                wait = self._first[1] + (reading.ts - self._first[0]) - self.monotonic()
                if wait > 0:  # a tick read is a tick stored: a stop only ends the wait
                    await sleep_unless(stop, wait)
            if self.source.gpus != self._registered:  # GPUs found after a re-initialisation
                self.stats.gpus = len(self.source.gpus)
                await self._register()
            host = self._host_sample if host_due else None
            if host_due and host is None:  # the tick was resumed after a wedge
                host = await loop.run_in_executor(self._host_exec, self._host_of, reading)
            snap = self._take(reading, host)
            if self.store is not None and self.monotonic() - last_flush >= self.flush_every:
                self._flush()
                last_flush = self.monotonic()
            if self.rules is not None:
                self.rules.poke(snap.ts)  # never blocks: starts an evaluation cycle when one is due
            if self.on_tick is not None:
                self.on_tick(snap)
            await asyncio.sleep(0)  # let writes and signals through during a fast replay

    async def _run_paced(self) -> None:
        """A paced run: the ticks are read and taken in on the sampling thread (``_paced_ticks``),
        which sleeps to each slot itself and hands the event loop only what needs it — a flush
        every ``flush_every`` seconds, a rules cycle when one is due, ``on_tick`` when set. An
        idle agent's event loop so wakes a few times a minute instead of once per tick (each
        wake-up costs more CPU than the Python work of a tick: docs/benchmarks.md).

        A read that overruns ``call_deadline`` is given up on: the device is marked wedged and
        the tick is finished on a fresh sampling thread. The sampling thread arms a real-time
        timer (``setitimer``) for ``call_deadline`` around each read and disarms it after: an
        ordinary read costs two system calls and no wake-up, and SIGALRM reaches the event loop
        (``_on_alarm``) only when a read overruns. Where the loop is not on the main thread
        (signals reach only that one), or with ``watchdog = "thread"``, a watchdog thread
        (``_watchdog``) wakes once per tick instead, ``call_deadline`` after the tick's slot.
        Returns when the sampling thread ends (stop, ``--duration``, end of a replay);
        re-raises what ended it otherwise.
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._sampler_done: asyncio.Future[None] = loop.create_future()
        self._sampler_over = Latch()
        self._start = self.monotonic()
        self._k, self._delay = 0, 0.0
        self._last_flush = self._start
        self._next_read_at = time.monotonic()
        self._overrun_logged: float | None = None
        if self.call_deadline >= self.interval:
            log.warning(
                "the call deadline (%.3g s) is not shorter than the interval (%.3g s): a GPU whose call is slow but "
                "within it delays every GPU's tick, and slots are skipped", self.call_deadline, self.interval,
            )
        self._alarm = self.watchdog == "auto" and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        previous_alarm = signal.getsignal(signal.SIGALRM) if self._alarm else None
        if self._alarm:
            try:
                loop.add_signal_handler(signal.SIGALRM, self._on_alarm)
            except (RuntimeError, ValueError, NotImplementedError):
                self._alarm = False
            else:
                quiet_wakeup_fd()
        self._start_sampler(resume=False)
        watchdog = None
        if not self._alarm:
            watchdog = threading.Thread(target=self._watchdog, name="vgpumon-watch", daemon=True)
            watchdog.start()
        try:
            await self._sampler_done
        finally:
            self._stopping.set()
            self._sampler_over.set()
            if self._alarm:
                with self._alarm_lock:
                    self._reading = None
                    signal.setitimer(signal.ITIMER_REAL, 0)
                loop.remove_signal_handler(signal.SIGALRM)
                if previous_alarm is not None:  # the embedding application's, or the default
                    signal.signal(signal.SIGALRM, previous_alarm)
            if watchdog is not None:
                watchdog.join(timeout=1.0)

    def _arm(self, gen: int) -> None:
        """On the sampling thread, before a read: SIGALRM in ``call_deadline`` unless disarmed."""
        if self._alarm:
            with self._alarm_lock:
                if gen == self._gen:
                    self._reading = gen
                    signal.setitimer(signal.ITIMER_REAL, self.call_deadline)

    def _disarm(self, gen: int) -> None:
        """On the sampling thread, after a read (never a fresh thread's timer: ``gen``)."""
        if self._alarm:
            with self._alarm_lock:
                if self._reading == gen:
                    self._reading = None
                    signal.setitimer(signal.ITIMER_REAL, 0)

    def _on_alarm(self) -> None:
        """On the event loop: a read overran ``call_deadline``. A call in flight that long is
        given up on as the watchdog thread would (``_give_up``); otherwise (between two calls, one
        that began later, or one that returned just now) the timer is armed again for what is
        left. Under ``_alarm_lock`` throughout, so the sampling thread's ``_disarm`` comes
        strictly before or after."""
        with self._alarm_lock:
            gen = self._reading
            if gen is None or gen != self._gen or self._sampler_over.is_set():
                return  # the read ended as the signal came
            now = time.monotonic()
            stuck = self.source.inflight()
            if stuck is not None and now - stuck[2] >= self.call_deadline and self._take_over(stuck):
                self._reading = None  # the fresh thread's first read arms the timer again
                return
            left = self.call_deadline - (now - stuck[2]) if stuck is not None else 0.0
            signal.setitimer(signal.ITIMER_REAL, left if left > 0.001 else self.call_deadline / 4)

    def _take_over(self, stuck: tuple[int, str, float]) -> bool:
        """Both paced watchdogs (timer and thread): give up on the sampling thread stuck in
        ``stuck`` and start a fresh one that finishes the tick. False, changing nothing, when the
        call returned meanwhile."""

        def next_generation() -> None:  # before the stuck thread can see it abandoned
            self._gen += 1

        if not self._give_up(stuck, then=next_generation):
            return False
        self._start_sampler(resume=True)
        return True

    def _start_sampler(self, resume: bool) -> None:
        gen = self._gen
        fut = self._nvml_exec.submit(self._paced_ticks, gen, resume)
        fut.add_done_callback(lambda f: self._sampler_ended(gen, f))

    def _sampler_ended(self, gen: int, fut: "Future[None]") -> None:
        """The sampling thread's call returned or raised: settle ``_sampler_done`` on the loop
        (an abandoned thread's late return is ignored)."""
        if gen != self._gen:
            return
        self._sampler_over.set()
        exc = fut.exception()

        def settle() -> None:
            if not self._sampler_done.done():
                if exc is None:
                    self._sampler_done.set_result(None)
                else:
                    self._sampler_done.set_exception(exc)

        self._loop.call_soon_threadsafe(settle)

    def _paced_ticks(self, gen: int, resume: bool) -> None:
        """On the sampling thread: sleep to each slot, read the tick (``resume``: first finish the
        one a wedged call interrupted), take the host sample when due, take the tick in; until
        stopped, ``--duration`` or the end of a replay. Returns at once when the watchdog gave up
        on this thread (``gen`` is no longer current) while a call hung."""
        loop = self._loop
        if self._alarm:  # SIGALRM is for the event loop's thread, never this one's NVML calls
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            host_due = self._host_due()
            reading = None
            if resume:
                resume = False
                self._arm(gen)
                try:
                    reading = self.source.resume()
                except RuntimeError:  # the call returned just as it was given up on: read on
                    log.warning("the tick given up on had finished meanwhile; sampling goes on")
                    self._k, self._delay = next_slot(self._start, self._k, self.interval, self.monotonic())
                finally:
                    self._disarm(gen)
            if reading is None:
                if self._stopping.is_set():
                    return
                self._next_read_at = time.monotonic() + self._delay
                if self._delay > 0 and self._stopping.wait(self._delay):
                    return
                if gen != self._gen:  # given up on while it slept: the fresh thread reads on
                    return
                self._arm(gen)
                try:
                    reading = self.source.sample(self._tick_time())
                except EndOfCapture:
                    return
                finally:
                    self._disarm(gen)
            if gen != self._gen:  # given up on while a call hung: the fresh thread carries on
                return
            if self._past_duration(reading.ts):
                return
            host = self._host_of(reading) if host_due else None
            if self.source.gpus != self._registered:  # GPUs found after a re-initialisation
                self.stats.gpus = len(self.source.gpus)
                self._register_blocking()
            snap = self._take(reading, host)
            if self.store is not None and self.monotonic() - self._last_flush >= self.flush_every:
                self._last_flush = self.monotonic()
                loop.call_soon_threadsafe(self._flush)
            if self.rules is not None and self.rules.due(snap.ts):
                loop.call_soon_threadsafe(self.rules.poke, snap.ts)
            if self.on_tick is not None:
                loop.call_soon_threadsafe(self.on_tick, snap)
            k = self._k
            self._k, self._delay = next_slot(self._start, k, self.interval, self.monotonic())
            if self._k > k + 1:
                self._overran(self._k - k - 1)

    def _overran(self, skipped: int) -> None:
        """A tick ran past the next slot(s): count the slots left without a tick; say so at most
        once a minute."""
        self.stats.ticks_skipped += skipped
        now = self.monotonic()
        if self._overrun_logged is None or now - self._overrun_logged >= 60.0:
            self._overrun_logged = now
            log.warning(
                "a tick ran past the %.3g s interval: %d slot(s) without a tick (%d in this run); a slow GPU call "
                "(see --call-deadline) or a starved host", self.interval, skipped, self.stats.ticks_skipped,
            )

    def _watchdog(self) -> None:
        """On the watchdog thread: wake ``call_deadline`` after each tick's slot (or after the
        call in flight began); a call older than that is given up on — the source marks its
        device wedged, the stuck thread is left behind and a fresh one finishes the tick and
        carries on. Ends with the sampling thread."""
        name_os_thread()
        while not self._sampler_over.is_set():
            now = time.monotonic()
            stuck = self.source.inflight()
            if stuck is not None and now - stuck[2] >= self.call_deadline:
                self._take_over(stuck)
                continue
            since = stuck[2] if stuck is not None else max(self._next_read_at, now)
            self._sampler_over.wait(max(since + self.call_deadline - now, 0.01))

    async def run(self, stop: asyncio.Event | None = None) -> AgentStats:
        """Sample until ``stop`` is set, ``duration`` has passed or a replay ends.

        A paced run (the daemon) samples on its own thread (``_paced``): the event loop is not
        woken per tick, only to flush, start a rules cycle, serve HTTP and poll vLLM. A replay
        (as fast as possible, or at its recorded pace) ticks on the event loop.

        Raises:
            NvmlUnavailableError: NVML cannot start on this host.
            StoreUnavailableError: the store cannot register the host's GPUs at start.
        """
        stop = stop or asyncio.Event()
        stop_watch = asyncio.get_running_loop().create_task(stop.wait())
        stop_watch.add_done_callback(lambda _: self._stopping.set())
        vllm_stop = asyncio.Event()
        vllm_task: asyncio.Task[None] | None = None
        k8s_stop = asyncio.Event()
        k8s_task: asyncio.Task[None] | None = None
        try:
            gpus = await self._nvml(self.source.start)
            self.stats.gpus = len(gpus)
            await self._register()
            if self.store is not None:
                if len(self.backlog):
                    log.warning("replaying %d rows spooled by an earlier run", self.backlog.spooled_rows)
                why = self.backlog.unwritable()
                if why is not None and not self.backlog.spool_failed:  # said now, not first during an outage
                    # (a spool that could not even be read was reported as the backlog loaded)
                    log.warning("spool %s cannot be written (%s): while the store is away, ticks will be held in "
                                "memory only (bounded) and lost if the agent stops before it is back",
                                self.backlog.spool_dir, why)
            if self.vllm is not None:
                vllm_task = asyncio.get_running_loop().create_task(self._run_vllm(vllm_stop))
            if self.kubernetes is not None:
                k8s_task = asyncio.get_running_loop().create_task(self.kubernetes.run(k8s_stop))
            if self.rules is not None:  # rules (issue 11): evaluated off the sampling path
                assert self.store is not None
                await self.rules.start(self.store, self.hostname, self._store_exec)
            self._first = None
            if self.paced and not self.recorded_pace:
                await self._run_paced()
            else:
                await self._run_on_loop(stop)

        finally:
            self._stopping.set()
            stop_watch.cancel()
            vllm_stop.set()
            if vllm_task is not None:
                await self._stop_vllm(vllm_task)
            k8s_stop.set()
            if k8s_task is not None:
                await k8s_task
                self.kubernetes.close()  # type: ignore[union-attr]
            await self._drain()
            if self.rules is not None:  # a last evaluation over every row written (not during an outage), sinks flushed
                finish = asyncio.ensure_future(self.rules.finish(evaluate=self._outage_since is None and not self._store_abandoned))
                await self._settle(finish, "the rules' last evaluation")
            self.stats.rows_pending = len(self._pending) + self.backlog.memory_rows
            self.stats.rows_spooled = self.backlog.spooled_rows
            self.stats.rows_folded = self.backlog.folded_rows
            self.stats.vllm_rows_folded = self.backlog.folded_vllm_rows
            if self.stats.dead_letters:
                log.error(
                    "%d rows the store refused were set aside in %s", self.stats.dead_letters,
                    self.backlog.dead_letter_path or "the log (no spool)",
                )
            if self.stats.rows_spooled:
                log.error("%d rows left in the spool %s; the next run replays them", self.stats.rows_spooled, self.backlog.spool_dir)
            if self.stats.rows_pending:
                log.error("%d rows could not be stored or spooled before exit", self.stats.rows_pending)
            await asyncio.get_running_loop().run_in_executor(self._nvml_exec, self.source.close)
            for executor in (self._nvml_exec, self._host_exec):
                executor.shutdown(wait=True)
            if self._store_abandoned:
                self._store_exec.abandon()
            else:
                self._store_exec.shutdown(wait=True)
        return self.stats
