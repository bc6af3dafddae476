"""Fixed-rate pacing shared by the agent's tick loop, the vLLM poll loop and the other periodic
tasks, on as few event-loop wake-ups as the design allows.

``asyncio.wait_for(stop.wait(), timeout)`` — the obvious way to sleep until a deadline or a stop
— makes a task for ``stop.wait()`` at every call and cancels it at every timeout: two extra loop
iterations and several allocations per tick, a measurable share of an agent that otherwise idles
(docs/benchmarks.md, footprint). ``sleep_unless`` waits on one long-lived waiter per stop event
instead: a timer and a future per call, one wake-up when the timer fires.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Callable

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


async def wait_for_slot(
    stop: asyncio.Event, start: float, k: int, interval: float, monotonic: Callable[[], float]
) -> int:
    """Sleep until slot ``k + 1`` (``start + (k + 1) * interval``) or until ``stop`` is set.

    A loop body that overran skips the missed slots rather than bursting to catch up.

    Args:
        stop: ends the wait early when set.
        start: monotonic time of slot 0.
        k: the slot just served.
        interval: seconds between slots.
        monotonic: the clock ``start`` was read from.

    Returns:
        The slot now due (``k + 1``, or later after an overrun).
    """
    k += 1
    delay = start + k * interval - monotonic()
    if delay < 0:
        k += int(-delay // interval) + 1
        delay = start + k * interval - monotonic()
    await sleep_unless(stop, max(delay, 0))
    return k
