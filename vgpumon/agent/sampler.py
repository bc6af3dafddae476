"""The paced sampler: its own thread reads each tick at its slot under ``call_deadline``, watched by
a SIGALRM timer (or a watchdog thread off the main thread), and gives a wedged read up."""



from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from vgpumon.base.pacing import next_slot
from vgpumon.base.workers import DaemonExecutor, Latch, name_os_thread
from vgpumon.model import HostSample, NvmlReading
from vgpumon.sources.nvml.backend import EndOfCapture

if TYPE_CHECKING:
    pass
from vgpumon.agent.state import AgentState

log = logging.getLogger("vgpumon.agent")


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



class PacedSampler(AgentState):
    """Reads the ticks of a paced run and watches each read (a part of ``Agent``)."""

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

    async def _run_paced(self) -> None:
        """A paced run: the ticks are read and taken in on the sampling thread (``_paced_ticks``),
        which sleeps to each slot itself and hands the event loop only what needs it — a flush
        every ``flush_interval`` seconds, a rules cycle when one is due, ``on_tick`` when set. An
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
        # the first tick is written at once: the API's diagnose reads the store, and an agent just
        # started answered UNKNOWN for a flush interval while /metrics already had its data
        self._last_flush = self._start - self.flush_interval
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

        self._run_loop().call_soon_threadsafe(settle)

    def _paced_ticks(self, gen: int, resume: bool) -> None:
        """On the sampling thread: sleep to each slot, read the tick (``resume``: first finish the
        one a wedged call interrupted), take the host sample when due, take the tick in; until
        stopped, ``--duration`` or the end of a replay. Returns at once when the watchdog gave up
        on this thread (``gen`` is no longer current) while a call hung."""
        loop = self._run_loop()
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
            if self.store is not None and self.monotonic() - self._last_flush >= self.flush_interval:
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
