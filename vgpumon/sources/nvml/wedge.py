"""A call that does not return (a wedged driver): the agent's watchdog asks what is in flight,
gives up on the stuck sampling thread, and the device is skipped until the call returns on the
abandoned thread (a part of ``NvmlSource``; the watchdog itself is ``vgpumon.agent.sampler``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from vgpumon.model import GpuIdentity, HostEvent

if TYPE_CHECKING:
    from vgpumon.sources.nvml.backend import NvmlBackend
    from vgpumon.sources.nvml.reads import _Watch

log = logging.getLogger("vgpumon.sources.nvml")


class Wedges:
    """The wedge bookkeeping of ``NvmlSource``: ``inflight``, ``abandon``, the return of a stuck
    call, ``wedged``."""

    # what it uses of NvmlSource (set there)
    backend: "NvmlBackend"
    gpus: tuple[GpuIdentity, ...]
    _watch: "_Watch"
    _wedged: dict[int, tuple[str, float]]
    _events: list[HostEvent]
    _now: float

    def _event(self, kind: str, subject: str, detail: str = "") -> None:
        raise NotImplementedError  # NvmlSource's

    def inflight(self) -> tuple[int, str, float] | None:
        """The device being read now, the NVML call in flight and since when (monotonic), or
        ``None`` between devices and ticks. Read by the agent's watchdog from another thread."""
        w = self._watch
        device = w.device
        return None if device is None else (device, w.fn, w.since)

    def abandon(self, index: int, fn: str, since: float, then: Callable[[], None] | None = None) -> bool:
        """Give up on the sampling thread stuck in ``fn`` on device ``index`` (as ``inflight``
        named it): the device is wedged (down, reason "wedged: <call> for N s", an event) and
        skipped until the call returns; the stuck thread stops when it does. Call ``resume`` on
        a fresh thread next.

        Args:
            then: called once the read is abandoned, before the stuck thread can see it (the
                agent's own bookkeeping of which thread samples).

        Returns:
            False, abandoning nothing, when that read is no longer in flight: it ended between
            ``inflight`` and this call (the device was slow, not wedged).
        """
        w = self._watch
        with w.lock:
            if w.device != index or w.since != since:
                return False
            w.generation += 1
            w.device = None
            self._wedged[index] = (fn, since)
            if then is not None:
                then()
        gpu = next((g for g in self.gpus if g.index == index), None)
        log.error("GPU %d: %s did not return; skipping the GPU until it does", index, fn)
        self._event("gpu_wedged", f"gpu:{gpu.uuid}" if gpu else f"index:{index}", f"{fn} did not return")
        return True

    def _unwedge(self, index: int, fn: str) -> None:
        """The stuck call returned (on the abandoned thread): sample the device again. Its GPM pair
        and handle, which began before the hang, are dropped while it is still marked wedged (the
        sampling thread skips it until the mark goes, so never reads it as they are dropped)."""
        self.backend.forget_device(index)
        began = self._wedged.pop(index, (fn, time.monotonic()))[1]
        hung = time.monotonic() - began
        gpu = next((g for g in self.gpus if g.index == index), None)
        log.warning("GPU %d: %s returned after %.1f s; sampling it again", index, fn, hung)
        self._events.append(
            HostEvent(ts=self._now, kind="gpu_unwedged", subject=f"gpu:{gpu.uuid}" if gpu else f"index:{index}",
                      detail=f"{fn} returned after {hung:.1f} s")
        )

    @property
    def wedged(self) -> bool:
        """A call on some device has not returned (NVML must then not be shut down)."""
        return bool(self._wedged)
