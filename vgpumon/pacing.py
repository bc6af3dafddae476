"""Fixed-rate pacing shared by the agent's tick loop and the vLLM poll loop."""

from __future__ import annotations

import asyncio
from typing import Callable


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
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(delay, 0))
    except asyncio.TimeoutError:
        pass
    return k
