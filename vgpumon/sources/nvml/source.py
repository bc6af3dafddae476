"""The NVML collector: reads every GPU each tick through one choke point.

Cadence by measured cost (FACTS §1, H200, driver 580): the fast set (GPM pair, memory v2,
utilization, temperature, power, clocks, clocks-event reasons, performance state, current PCIe
link, processes) costs a few hundred µs per GPU and runs every tick; the slow set (ECC counters by
type and location, remapped rows, power limit, persistence and compute modes) runs every
``slow_every`` ticks; the minute set (energy, violation times, BAR1, PCIe replay counter, MIG mode:
calls that keep the driver busy for 0.2–3.3 ms of CPU each, on counters or facts that rarely
change) on the first slow tick at least ``MINUTE_SECONDS`` after its last read; static facts
are read at start and after a
re-initialisation. ``nvmlDeviceGetPcieThroughput`` (21 ms, blocking)
is never called on the sampling thread: with GPM, PCIe bytes/s come from GPM averaged over the
whole tick; without GPM the backend polls the throughput call on a thread of its own.

Every call goes through ``_Reader.q``:

* a field-level error (not supported, no permission, function not found, not in capture) makes
  that field ``None`` with a reason; "not supported" and "function not found" are remembered per
  device so the call is not retried every tick;
* a device lifecycle error (GPU lost, reset required, GPU not found, unknown) marks that device
  down; it is retried with exponential back-off in ticks (1, 2, 4, … ``max_backoff_ticks``) and
  comes back by itself;
* a library lifecycle error (uninitialized, driver not loaded, library/driver version mismatch)
  marks NVML down for the host; it is re-initialised with the same back-off and the static facts
  are read again;
* every value passes the field catalogue's door (``vgpumon.catalogue.Door``): a non-number
  (``"[N/A]"``), NaN, ±Inf, a blank sentinel (4294967295, DCGM's 2147483632 or
  9223372036854775794) or a value outside the field's range (temperature 644245923, a PCIe rate
  above 1.25 × the link's capacity) is ``None`` with a ``rejected: …`` reason, counted per field.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from typing import TypedDict

from vgpumon import catalogue
from vgpumon.base.errors import NvmlUnavailableError
from vgpumon.catalogue import Door
from vgpumon.model import GpuIdentity, GpuSample, HostEvent, NvmlReading, SourceStatus, XidEvent
from vgpumon.sources.nvml.backend import NOT_IN_CAPTURE, LiveBackend, NvmlBackend, NvmlCallError
from vgpumon.sources.nvml.constants import (
    _FATAL_AT_START,
    _LIBRARY_DOWN,
    CLOCK_STEP_SECONDS,
    MINUTE_SECONDS,
    Abandoned,
    DeviceDown,
    _describe,
)
from vgpumon.sources.nvml.crosscheck import GpmHistory, PcieChecks
from vgpumon.sources.nvml.device import DeviceReads
from vgpumon.sources.nvml.fastpath import _FastPath
from vgpumon.sources.nvml.lifecycle import Lifecycle
from vgpumon.sources.nvml.reads import (
    _Reader,
    _Unsupported,
    _Watch,
)
from vgpumon.sources.nvml.wedge import Wedges

log = logging.getLogger("vgpumon.sources.nvml")













class _TickState(TypedDict):
    """The tick being read (``sample``), kept so that ``resume`` can finish it after a wedge."""

    ts: float
    tick: int
    slow: bool
    t0: float  # perf_counter at its start
    mono: float  # monotonic at its start
    done: dict[int, GpuSample]  # device index → its sample, in the order of ``gpus``
    late: bool  # resumed: samples read from now on take their own time


class NvmlSource(Lifecycle, DeviceReads, PcieChecks, Wedges):
    """Samples every NVIDIA GPU of the host through an ``NvmlBackend``.

    Not thread-safe: the agent calls ``start``/``sample``/``close`` from one worker thread.

    Args:
        backend: ``LiveBackend()`` by default; ``ReplayBackend`` / ``RecordingBackend`` for
            captures. The same code runs on all three.
        slow_every: read the slow set every this many ticks (first tick included).
        minute_seconds: read the minute set (energy, violation times, BAR1, PCIe replays, MIG
            mode) on the first slow tick at least this long after its last read (the first slow
            tick included): ``MINUTE_SECONDS``; 0 reads it on every slow tick.
        use_gpm: set False to force the pre-Hopper path (utilization as activity proxy, PCIe
            from the polled throughput call).
        max_backoff_ticks: longest wait, in ticks, between retries of a down device or library.
        reprobe_every: ask again, every this many ticks, the calls a device answered "not
            supported" or "function not found" (a driver upgrade or a MIG change can make them
            answer); the cache is also cleared at every re-initialisation and recovery.
    """

    name = "nvml"

    def __init__(
        self,
        backend: NvmlBackend | None = None,
        *,
        slow_every: int = 10,
        minute_seconds: float = MINUTE_SECONDS,
        use_gpm: bool = True,
        max_backoff_ticks: int = 32,
        reprobe_every: int = 600,
    ) -> None:
        self.backend: NvmlBackend = backend if backend is not None else LiveBackend()
        self.slow_every = max(1, slow_every)
        self.minute_seconds = max(0.0, minute_seconds)
        self.use_gpm = use_gpm
        self.max_backoff_ticks = max(1, max_backoff_ticks)
        self.gpus: tuple[GpuIdentity, ...] = ()
        self.driver_version: str | None = None
        self.door = Door(
            (*catalogue.fields_of("gpu_samples"), *catalogue.fields_of("gpus"), *catalogue.fields_of("gpu_process_samples"))
        )
        self.rejected: Counter[str] = self.door.rejected
        self.last_success_ts: float | None = None
        self._unsupported: dict[int, _Unsupported] = {}
        self._readers: dict[int, _Reader] = {}
        #: the straight-line reader per device (``_FastPath``; ``None`` where it cannot serve) and
        #: the state it was built for (reader, identity, "not supported" cache, memory API)
        self._fast: dict[int, _FastPath | None] = {}
        self._fast_built: dict[int, tuple[_Reader, GpuIdentity, int, str | None]] = {}
        #: use ``_FastPath`` where the backend allows (the live one); False: the general path only
        self.fast_path = True
        self._minute_last: float | None = None  # tick time of the minute set's last read
        self._minute_due = True
        self._tick = 0
        # device index → (reason, failures, next tick to retry)
        self._down: dict[int, tuple[str, int, int]] = {}
        # library down: (reason, failures, next tick to retry) or None
        self._lib_down: tuple[str, int, int] | None = None
        self._replay_prev: dict[str, tuple[float, float] | None] = {}
        self._xid_counts: dict[str, Counter[int]] = {}
        self._xid_last: dict[str, dict[int, float]] = {}
        self._xid_warned = False
        self._xid_seq: dict[str, int] = {}
        self._last_ts: float | None = None
        self._step_noted = False
        self._behind = False
        # Wedged calls (``abandon``): device index → (NVML call, monotonic time it started)
        self._watch = _Watch(self)
        self._wedged: dict[int, tuple[str, float]] = {}
        self._tick_state: _TickState | None = None
        self._started = False
        self.reprobe_every = max(1, reprobe_every)
        # Devices NVML counts but could not name (UUID unreadable): index → (reason, failures,
        # next tick to retry); retried with the same back-off as a lost GPU.
        self._unidentified: dict[int, tuple[str, int, int]] = {}
        self._device_count: int | None = None
        self._named_once = False
        # Memory API per device, decided by the first read after each (re-)initialisation and
        # kept until the next one, so that v1 (reserved memory included) and v2 never mix.
        self._mem_api: dict[int, str] = {}
        self._mem_api_of: dict[str, str] = {}  # UUID → API decided last (to tell a change)
        self._events: list[HostEvent] = []
        # GPM PCIe cross-check (``_crosscheck``), per GPU UUID
        self._gpm_history: dict[str, GpmHistory] = {}
        self._crosschecked: dict[str, float] = {}
        self._pcie_strikes: dict[str, int] = {}
        self._pcie_fault: dict[str, str] = {}
        self._now = 0.0  # the current tick's time, for events

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> tuple[GpuIdentity, ...]:
        """Initialise NVML and read every device's static facts.

        Returns:
            One ``GpuIdentity`` per readable device, by NVML index (empty when the host has no
            GPU, or when NVML is down for a reason that may pass — then ``sample`` retries).

        Raises:
            NvmlUnavailableError: no NVIDIA stack on this host (library not found, driver not
                loaded); the message names the cause.

        Calling it again returns the same GPUs (the CLI starts NVML before it opens the store,
        so that a host without a driver leaves no empty store behind).
        """
        if self._started:
            return self.gpus
        try:
            self._init()
        except NvmlCallError as exc:
            if exc.code in _FATAL_AT_START:
                raise NvmlUnavailableError(f"NVML unavailable: {_describe(exc)}") from None
            log.error("NVML unavailable: %s; retrying with back-off", _describe(exc))
            self._lib_down = (_describe(exc), 1, self._tick + self._backoff(1))
        self._started = True
        return self.gpus

    def _event(self, kind: str, subject: str, detail: str = "") -> None:
        # Events noticed before the first tick (at start) take the first tick's time.
        self._events.append(HostEvent(ts=self._now, kind=kind, subject=subject, detail=detail))

    def _reader(self, index: int, gpu: GpuIdentity | None = None) -> _Reader:
        unsupported = self._unsupported.get(index)
        if unsupported is None:
            unsupported = self._unsupported[index] = _Unsupported()
        calls = None
        bound_calls = getattr(self.backend, "bound_calls", None)
        if bound_calls is not None and gpu is not None:
            try:
                calls = bound_calls(index)
            except NvmlCallError:
                pass  # no handle: the first call through the backend says why
        if gpu is None:
            return _Reader(self.backend, index, unsupported, self.door, gpu, self._watch, calls)
        # one reader per device, kept while nothing it holds changed: a tick only resets its reasons
        r = self._readers.get(index)
        if (r is None or r.gpu is not gpu or r.unsupported is not unsupported or r.bound is not calls
                or r.generation != self._watch.generation):
            r = self._readers[index] = _Reader(self.backend, index, unsupported, self.door, gpu, self._watch, calls)
        else:
            r.missing = {}
        return r

    # -- every tick ----------------------------------------------------------------------------

    def status(self, collect_seconds: float = 0.0) -> SourceStatus:
        """Self-metrics as of the last tick."""
        return SourceStatus(
            name=self.name,
            up=self._lib_down is None,
            last_success_ts=self.last_success_ts,
            collect_seconds=collect_seconds,
            rejected=dict(self.rejected),
            message=None if self._lib_down is None else f"NVML down: {self._lib_down[0]}",
        )

    def sample(self, ts: float | None = None) -> NvmlReading:
        """Read one tick from every device.

        Args:
            ts: the tick's time (seconds since the epoch); ``time.time()`` when ``None``. A replay
                backend substitutes the capture's timestamp.

        Returns:
            ``NvmlReading``: one ``GpuSample`` per device in ``self.gpus`` (a device that could
            not be read has ``up=False``, all values ``None`` and the reason in ``missing["*"]``),
            the XID events received since the last tick, and the source's status.

        Raises:
            EndOfCapture: a replay has no more ticks.
        """
        t0 = time.perf_counter()
        ts = self._stamp(self.backend.begin_tick(time.time() if ts is None else ts))
        self._now = ts
        tick = self._tick
        self._tick += 1
        if self._lib_down is not None and not self._retry_library(tick):
            reason = f"NVML down: {self._lib_down[0]}" if self._lib_down else "NVML down"
            samples = tuple(self._down_sample(g, ts, reason) for g in self.gpus)
            return NvmlReading(ts, samples, (), self.status(time.perf_counter() - t0), self._take_events())
        slow = tick % self.slow_every == 0
        if slow:
            last = self._minute_last
            # a wall clock stepped back (ts before the last read) makes it due too
            self._minute_due = last is None or not 0 <= ts - last < self.minute_seconds * 0.95
            if self._minute_due:
                self._minute_last = ts
        if tick and tick % self.reprobe_every == 0:
            self._reprobe()
        if self._unidentified:
            self._retry_unidentified(tick)
        if slow and tick:
            self._check_device_count(tick)
        self._tick_state = {"ts": ts, "tick": tick, "slow": slow, "t0": t0, "mono": time.monotonic(), "done": {}, "late": False}
        return self._finish_tick()

    def resume(self) -> NvmlReading:
        """Finish the tick the agent gave up waiting for (a call on one device did not return
        within its deadline, ``abandon``): the devices read already keep their samples, the
        wedged one is down, the rest are read now and carry the time they were read.

        Raises:
            RuntimeError: no tick is in progress.
        """
        if self._tick_state is None:
            raise RuntimeError("no tick to resume")
        self._tick_state["late"] = True
        return self._finish_tick()

    def _finish_tick(self) -> NvmlReading:
        state = self._tick_state
        assert state is not None
        ts, tick, slow, t0 = state["ts"], state["tick"], state["slow"], state["t0"]
        done: dict[int, GpuSample] = state["done"]
        watch = self._watch
        generation = watch.generation
        late, wedged_devices = state["late"], self._wedged
        for gpu in self.gpus:
            if gpu.index in done:
                continue
            if watch.generation != generation:
                raise Abandoned("tick given up")
            wedged = wedged_devices.get(gpu.index) if wedged_devices else None
            if wedged is not None:
                done[gpu.index] = self._down_sample(gpu, ts, f"wedged: {wedged[0]} for {time.monotonic() - wedged[1]:.0f} s")
                continue
            # a device read after the tick was resumed carries the time it was read
            at = ts + (time.monotonic() - state["mono"]) if late else ts
            # since first: ``inflight`` reads nothing while ``device`` is None, so it never pairs
            # this device with the previous read's start
            watch.since = time.monotonic()
            watch.device = gpu.index
            sample = self._read_device(gpu, at, tick, slow)
            with watch.lock:
                given_up = watch.generation != generation
                if not given_up:
                    watch.device = None
            if given_up:  # abandoned after its last call returned: not wedged after all
                watch.returned(gpu.index, watch.fn)
            done[gpu.index] = sample
        self._tick_state = None
        samples = list(done.values())  # filled in the order of self.gpus, a resumed tick too
        xids = self._poll_xids() if self._lib_down is None else ()
        if self._xid_counts:  # counts stay on every later sample, not only the event's tick
            samples = [self._with_xids(s) for s in samples]
        if self._lib_down is None:
            self.last_success_ts = ts
        return NvmlReading(ts, tuple(samples), xids, self.status(time.perf_counter() - t0), self._take_events())

    def _read_device(self, gpu: GpuIdentity, ts: float, tick: int, slow: bool) -> GpuSample:
        """One device's sample for this tick, or its down sample (lost, back-off, NVML down)."""
        if self._lib_down is not None:  # the library went down earlier in this tick
            return self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}")
        down = self._down.get(gpu.index)
        if down is not None and tick < down[2]:
            return self._down_sample(gpu, ts, f"device down: {down[0]}; retry in {down[2] - tick} ticks")
        try:
            if down is not None:  # a retry after a reset: what it supports may differ
                self._unsupported.pop(gpu.index, None)
                self._mem_api.pop(gpu.index, None)
            sample = self._sample_device(gpu, ts, slow)
            if down is not None:
                log.warning("GPU %d (%s) is back after %d failed tries", gpu.index, gpu.uuid, down[1])
                self._event("gpu_recovered", f"gpu:{gpu.uuid}", f"after {down[1]} failed tries ({down[0]})")
                del self._down[gpu.index]
            return sample
        except DeviceDown as exc:
            self.backend.forget_device(gpu.index)
            if exc.error.code in _LIBRARY_DOWN:
                self._library_failed(tick, exc.error)
                return self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}")  # type: ignore[index]
            failures = 1 if down is None else down[1] + 1
            if down is None:
                log.warning("GPU %d (%s) down: %s", gpu.index, gpu.uuid, exc.error.reason)
                self._event("gpu_down", f"gpu:{gpu.uuid}", exc.error.reason)
            self._down[gpu.index] = (exc.error.reason, failures, tick + self._backoff(failures))
            return self._down_sample(gpu, ts, f"device down: {exc.error.reason}")

    def _stamp(self, ts: float) -> float:
        """The tick's stored time: the wall clock (or the capture's), never at or before the
        previous tick's millisecond. Ticks are keyed by (GPU, millisecond): a tick in the same
        millisecond as the last one would be dropped as a duplicate, and after the wall clock
        steps back the newest ticks must still be the newest in the store. A step back seen
        here (a replayed capture; the live agent tells ``clock_stepped`` itself) is an event."""
        last = self._last_ts
        if last is not None and ts < last + 0.001:
            if ts < last - CLOCK_STEP_SECONDS and not self._behind:
                if not self._step_noted:
                    self.clock_stepped(ts - last, at=last)
                self._behind = True  # one event per step, however long it takes to catch up
            ts = round(last + 0.001, 3)
        else:
            self._behind = False
        self._step_noted = False
        self._last_ts = ts
        return ts

    def clock_stepped(self, delta: float, at: float | None = None) -> None:
        """The wall clock jumped by ``delta`` seconds (NTP, a VM resumed): store the event and
        make the rates that span it unknown (``pcie_replay_rate_per_second``: reason
        "wall-clock step"). Ticks stay in order (``_stamp``)."""
        when = at if at is not None else (self._last_ts or 0.0)
        direction = "forward" if delta > 0 else "back"
        log.warning("wall clock stepped %s by %.3f s; rates across the step are unknown", direction, abs(delta))
        self._events.append(HostEvent(ts=when, kind="clock_step", subject="host", detail=f"{delta:+.3f} s ({direction})"))
        for uuid in list(self._replay_prev):
            self._replay_prev[uuid] = None
        self._step_noted = True

    def _take_events(self) -> tuple[HostEvent, ...]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return tuple(e if e.ts else replace(e, ts=self._now) for e in events)

    def _poll_xids(self) -> tuple[XidEvent, ...]:
        try:
            raw = self.backend.xid_poll()
        except NvmlCallError as exc:
            if exc.code != NOT_IN_CAPTURE and not self._xid_warned:
                log.warning("XID events unavailable: %s", exc.reason)
                self._xid_warned = True
            return ()
        if not raw:  # the common tick
            return ()
        by_index: dict[int | None, str] = {g.index: g.uuid for g in self.gpus}
        events = []
        for e in raw:
            uuid = by_index.get(e.get("index"))
            if uuid is None:
                continue
            xid = int(e["xid"])
            seq = self._xid_seq.get(uuid, 0)
            self._xid_seq[uuid] = seq + 1
            events.append(XidEvent(ts=float(e["ts"]), uuid=uuid, xid=xid, seq=seq))
            self._xid_counts.setdefault(uuid, Counter())[xid] += 1
            self._xid_last.setdefault(uuid, {})[xid] = float(e["ts"])
            log.warning("XID %d on GPU %s", xid, uuid)
        return tuple(events)

    def _with_xids(self, s: GpuSample) -> GpuSample:
        counts = self._xid_counts.get(s.uuid)
        if not counts:
            return s
        return replace(s, xid_counts=dict(counts), xid_last_seen=dict(self._xid_last[s.uuid]))

    def close(self) -> None:
        """Release NVML (never raises). Not while a call is stuck: shutting the library down
        under a thread that is inside it can hang as well, and the process is exiting anyway."""
        if self._wedged:
            log.warning("NVML not shut down: %s %s not returned", ", ".join(f"{fn} on GPU {i}" for i, (fn, _) in self._wedged.items()),
                        "has" if len(self._wedged) == 1 else "have")
            return
        self.backend.shutdown()
