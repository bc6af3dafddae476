"""The per-host agent (``Agent``): composes its parts — one asyncio process that ticks the sources and feeds the store.

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
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from vgpumon.base.pacing import sleep_unless
from vgpumon.base.workers import DaemonExecutor, Latch, name_os_thread
from vgpumon.model import HostSample, NvmlReading, Snapshot
from vgpumon.sources.host import HostSource
from vgpumon.sources.nvml import CLOCK_STEP_SECONDS, NvmlSource
from vgpumon.sources.nvml.backend import EndOfCapture
from vgpumon.store import Store
from vgpumon.store.spool import Backlog
from vgpumon.store.tables import TickRows

if TYPE_CHECKING:
    from typing import TypeVar

    from typing_extensions import TypeVarTuple, Unpack  # typing's from 3.11; annotations only

    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.model import GpuIdentity, PcieTopology
    from vgpumon.sources.kubernetes import KubernetesSource
    from vgpumon.sources.vllm import VllmSource
    from vgpumon.store.retention import Retention
    from vgpumon.store.vllm_repository import VllmRepository

    _R = TypeVar("_R")
    _Args = TypeVarTuple("_Args")
from vgpumon.agent.rows import TickEncoder
from vgpumon.agent.sampler import PacedSampler
from vgpumon.agent.stats import AgentStats
from vgpumon.agent.tasks import Supervision
from vgpumon.agent.writer import LIVE_FLUSH_S, REPLAY_FLUSH_S, StoreWriter

log = logging.getLogger("vgpumon.agent")



class Agent(StoreWriter, TickEncoder, Supervision, PacedSampler):
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
        flush_interval: seconds of wall time between batched writes; ``None``: ``LIVE_FLUSH_S``
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
        data_time: the ticks are a replay's, in the capture's time: the retention job's "now" is
            the newest tick's time, not today's (a capture days old lost its raw rows as soon as
            they were rolled up, and the rules that read them went blind mid-replay).
        maintenance_every: seconds between retention steps.
        kubernetes: the kubelet's pod-resources source, refreshed by its own task (every 30 s,
            off the event loop); each snapshot gets its GPU and process owners attached
            (``Snapshot.kubernetes``) and the source's status in ``sources``. ``None``: off.
        call_deadline: seconds a device's read may take before the device counts as wedged
            (default: half the interval, 0.25–5 s; a normal read takes under a millisecond).
        rules: evaluates the rule catalogue over the store on its own thread and sends alerts to
            its sinks (``vgpumon.alerts.runner``); ``None`` evaluates none. Needs a store.
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
        flush_interval: float | None = None,
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
        data_time: bool = False,
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
        if flush_interval is None:
            flush_interval = LIVE_FLUSH_S if paced or recorded_pace else REPLAY_FLUSH_S
        self.flush_interval = flush_interval
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
        self.topology: PcieTopology | None = None
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
        self._registered: tuple[GpuIdentity, ...] = ()
        self._writer: asyncio.Task[None] | None = None
        self.backlog = backlog if backlog is not None else Backlog(None)
        self.retention = retention
        if retention is not None and data_time:
            retention.clock = lambda: self.latest.ts if self.latest is not None else 0.0
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

    async def _nvml(self, fn: Callable[[Unpack[_Args]], _R], *args: Unpack[_Args]) -> _R:
        return await asyncio.get_running_loop().run_in_executor(self._nvml_exec, fn, *args)

    # -- store thread ----------------------------------------------------------------------------

    # -- vLLM: its own task and pace; rows through the store thread ----------------------------

    # -- Kubernetes attribution: its own task and pace; owners attached to each snapshot ------

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
        if host is not None:
            self._last_host = host
        if self.host is not None:
            statuses = (*statuses, self.host.status(self._last_host))
        snap = Snapshot(
            ts=reading.ts, hostname=self.hostname, gpus=self.source.gpus, samples=reading.samples,
            xid_events=reading.xid_events, sources=statuses, host=host, events=reading.events,
        )
        if self.kubernetes is not None:
            snap = self._attribute(snap)
        if self.vllm is not None:  # the exporter and the API read vLLM from the tick, never the source
            snap = self.vllm.attach(snap)
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
        last_flush = self.monotonic() - self.flush_interval  # the first tick is written at once, as the paced loop does
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
            if self.store is not None and self.monotonic() - last_flush >= self.flush_interval:
                self._flush()
                last_flush = self.monotonic()
            if self.rules is not None:
                self.rules.poke(snap.ts)  # never blocks: starts an evaluation cycle when one is due
            if self.on_tick is not None:
                self.on_tick(snap)
            await asyncio.sleep(0)  # let writes and signals through during a fast replay

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
