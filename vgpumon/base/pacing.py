"""Fixed-rate pacing shared by the agent's tick loop, the vLLM poll loop and the other periodic
tasks, on as few event-loop wake-ups as the design allows.

``asyncio.wait_for(stop.wait(), timeout)`` — the obvious way to sleep until a deadline or a stop
— makes a task for ``stop.wait()`` at every call and cancels it at every timeout: two extra loop
iterations and several allocations per tick, a measurable share of an agent that otherwise idles
(docs/benchmarks.md, footprint). ``sleep_unless`` waits on one long-lived waiter per stop event
instead: a timer and a future per call, one wake-up when the timer fires. The agent's tick loop
goes further: ``next_slot`` only computes the pause, which the NVML thread sleeps before it reads
the tick, so a paced tick wakes the event loop once.
"""

from __future__ import annotations

import asyncio
import weakref

_waiters: "weakref.WeakKeyDictionary[asyncio.Event, asyncio.Task[bool]]" = weakref.WeakKeyDictionary()


def _stop_waiter(stop: asyncio.Event) -> "asyncio.Task[bool]":
    """One task per stop event (and loop) that finishes when the event is set."""
    loop = asyncio.get_running_loop()
    task = _waiters.get(stop)
    if task is None or task.get_loop() is not loop or (task.done() and not stop.is_set()):
        task = _waiters[stop] = loop.create_task(stop.wait(), name="vgpumon-stop-waiter")
    return task


async def sleep_unless(stop: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds, or less if ``stop`` is set meanwhile.

    Returns:
        True when ``stop`` is set (before or during the sleep).
    """
    if stop.is_set():
        return True
    if delay <= 0:
        await asyncio.sleep(0)
        return stop.is_set()
    await asyncio.wait((_stop_waiter(stop),), timeout=delay)
    return stop.is_set()


def next_slot(start: float, k: int, interval: float, now: float) -> tuple[int, float]:
    """The slot after ``k`` and the seconds until it (``start + slot * interval - now``, never
    negative); a loop body that overran skips the missed slots rather than bursting to catch up.

    Args:
        start: monotonic time of slot 0.
        k: the slot just served.
        interval: seconds between slots.
        now: the monotonic time now (the clock ``start`` was read from).
    """
    k += 1
    delay = start + k * interval - now
    if delay < 0:
        k += int(-delay // interval) + 1
        delay = start + k * interval - now
    return k, max(delay, 0.0)
