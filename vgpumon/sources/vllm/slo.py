"""SLO attainment (goodput) of one server: the share of requests whose time to first token, and of
inter-token intervals whose latency, stayed within a target, over a sliding window.

Read from vLLM's histograms (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:time_per_output_token_seconds`` before 0.11) the
way their buckets allow: the observations at or below a target are the cumulative count of the
bucket whose bound is the target; a target between two bounds is interpolated linearly inside
its bucket (as ``histogram_quantile`` interpolates) and the figure says so (``interpolated``).
A target above the highest finite bound counts only what lies at or below that bound (a lower
bound of the truth), interpolated too.

An interval whose histogram is flagged unreliable (``derive.implausible``) adds nothing to the
window; a window without observations has no figure (``None``: not 100 %, not 0).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

#: histograms an attainment is computed for
SLO_HISTOGRAMS = ("ttft", "itl")


@dataclass(frozen=True, slots=True)
class SloTargets:
    """Targets and window (``[rules.thresholds]`` ``vllm_slo_ttft_seconds``,
    ``vllm_slo_itl_seconds``, ``vllm_slo_window_seconds``; defaults as there)."""

    ttft_seconds: float = 0.5
    itl_seconds: float = 0.05
    window_seconds: float = 300.0

    def target(self, histogram: str) -> float:
        return self.ttft_seconds if histogram == "ttft" else self.itl_seconds


def share_within(buckets: Sequence[tuple[float, float]], target: float) -> tuple[float, float, bool] | None:
    """Observations at or below ``target`` in one interval's cumulative ``(le, count)`` pairs.

    Returns:
        ``(within, observations, interpolated)``; ``None`` without buckets or observations.
        ``interpolated`` is true when ``target`` is no bucket bound (within 1 ppm): ``within``
        is then linear inside the bucket that holds the target.
    """
    if not buckets:
        return None
    n = buckets[-1][1] if math.isinf(buckets[-1][0]) else max(c for _, c in buckets)
    if n <= 0:
        return None
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if math.isinf(le):
            return prev_c, n, True  # beyond the last finite bound: nothing more is known
        if abs(le - target) <= 1e-6 * max(abs(target), 1e-12):
            return c, n, False
        if le > target:
            lower = prev_le if prev_le < le else 0.0
            return prev_c + (c - prev_c) * (target - lower) / (le - lower), n, True
        prev_le, prev_c = le, c
    return prev_c, n, True


@dataclass
class SloWindow:
    """The intervals of one histogram of one server within the window: ``add`` one, ``figure``
    the window's attainment."""

    window_seconds: float
    _parts: deque[tuple[float, float, float, bool]] = field(default_factory=deque)  # (ts, within, n, interpolated)

    def add(self, ts: float, part: tuple[float, float, bool] | None) -> None:
        """An interval ending at ``ts`` (``None``: no observation, or flagged unreliable)."""
        if part is not None:
            self._parts.append((ts, *part))
        while self._parts and self._parts[0][0] <= ts - self.window_seconds:
            self._parts.popleft()

    def figure(self) -> tuple[float | None, float, bool]:
        """``(attainment ratio or None, observations, interpolated)`` over the window."""
        n = sum(p[2] for p in self._parts)
        if n <= 0:
            return None, 0.0, False
        within = sum(p[1] for p in self._parts)
        return min(max(within / n, 0.0), 1.0), n, any(p[3] for p in self._parts)
