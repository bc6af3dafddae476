"""Recent GPU activity per GPU, from the agent's snapshots: what the vLLM source's prewarm figure
(the mean activity of a server's GPUs while it started) is read from."""

from __future__ import annotations

import bisect
from array import array
from typing import Iterable

from vgpumon.model import Snapshot


class GpuActivityLog:
    """Recent per-GPU activity from the agent's snapshots, for the prewarm window.

    Keeps ``max_age`` seconds (default 2 h: a cold start with graph capture can take many minutes).
    SM activity comes from GPM (``sm_active_ratio``); a GPU without GPM contributes
    ``utilization.gpu``, labelled as such. Held per GPU in typed arrays (17 bytes a reading, not a
    tuple of objects: 2 h of 8 GPUs at 1 s is 1 MB instead of about 7), appended by the agent's
    sampling thread and read by the event loop (``mean`` reads no further than all three arrays
    reach).
    """

    _SOURCES = ("gpm", "utilization")

    def __init__(self, max_age: float = 7200.0) -> None:
        self.max_age = max_age
        # GPU UUID → (times, ratios, source: 0 gpm, 1 utilization), oldest first
        self._gpus: dict[str, tuple[array, array, array]] = {}

    def observe(self, snap: Snapshot) -> None:
        cutoff = snap.ts - self.max_age
        for s in snap.samples:
            if s.sm_active_ratio is not None:
                ratio, src = s.sm_active_ratio, 0
            elif s.utilization_gpu_ratio is not None:
                ratio, src = s.utilization_gpu_ratio, 1
            else:
                continue
            log_ = self._gpus.get(s.uuid)
            if log_ is None:
                log_ = self._gpus[s.uuid] = (array("d"), array("d"), array("b"))
            times = log_[0]
            if times and times[0] < cutoff:
                old = bisect.bisect_left(times, cutoff)
                if old >= 256 or old * 8 >= len(times):  # in batches: a copy per tick would cost more
                    log_ = self._gpus[s.uuid] = (times[old:], log_[1][old:], log_[2][old:])  # replaced whole
            log_[0].append(s.ts)
            log_[1].append(ratio)
            log_[2].append(src)

    def mean(self, uuids: Iterable[str], start: float, end: float) -> tuple[float, str] | None:
        """Mean activity ratio of these GPUs over ``start <= ts <= end`` and its source
        (``"gpm"``, ``"utilization"`` or ``"mixed"``); ``None`` without samples."""
        total, n = 0.0, 0
        srcs: set[int] = set()
        for uuid in set(uuids):
            log_ = self._gpus.get(uuid)
            if log_ is None:
                continue
            times, ratios, sources = log_
            reach = min(len(times), len(ratios), len(sources))  # an append may be half done
            lo = bisect.bisect_left(times, start, 0, reach)
            hi = bisect.bisect_right(times, end, lo, reach)
            if hi > lo:
                total += sum(ratios[lo:hi])
                n += hi - lo
                srcs.update(sources[lo:hi])
        if not n:
            return None
        return total / n, (self._SOURCES[srcs.pop()] if len(srcs) == 1 else "mixed")
