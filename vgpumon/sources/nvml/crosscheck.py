"""PCIe throughput beside GPM's: the cross-check of GPM's PCIe counters against
``nvmlDeviceGetPcieThroughput``, and that call's readings on GPUs without GPM."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, TypeAlias

from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml.backend import NvmlCallError
from vgpumon.sources.nvml.constants import (
    _PERMANENT,
    CROSSCHECK_HISTORY,
    CROSSCHECK_MIN_BPS,
    CROSSCHECK_POLL_SECONDS,
    CROSSCHECK_RATIO,
    CROSSCHECK_STRIKES,
    PCIE_THROUGHPUT_MAX_AGE_S,
    DeviceDown,
)
from vgpumon.sources.nvml.reads import (
    CallKey,
    SampleValues,
    _Reader,
    number_of,
)

if TYPE_CHECKING:
    from vgpumon.sources.nvml.backend import NvmlBackend

#: GPM's PCIe figures of recent ticks: ``(tick time, TX bytes/s, RX bytes/s)``, ``None`` unread.
GpmHistory: TypeAlias = "deque[tuple[float, float | None, float | None]]"

log = logging.getLogger("vgpumon.sources.nvml")


class PcieChecks:
    """The PCIe cross-check and the pre-Hopper throughput path (a part of ``NvmlSource``)."""

    # what it uses of NvmlSource (set there)
    backend: NvmlBackend
    _gpm_history: dict[str, GpmHistory]
    _crosschecked: dict[str, float]
    _pcie_strikes: dict[str, int]
    _pcie_fault: dict[str, str]

    if TYPE_CHECKING:  # NvmlSource's (a stub here would shadow it in the method order)

        def _event(self, kind: str, subject: str, detail: str = "") -> None: ...

    def _crosscheck(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues, slow: bool) -> None:
        """Keep GPM's PCIe figures honest: on slow ticks, compare them with the newest
        ``nvmlDeviceGetPcieThroughput`` reading (taken on the backend's poller thread, never on
        this one: the call blocks ~21 ms per direction; the byte counters 197/198 cannot serve,
        they wrap within ~70 ms at full rate, FACTS §1). GPM below ``CROSSCHECK_RATIO`` of it
        while it reads above ``CROSSCHECK_MIN_BPS``, ``CROSSCHECK_STRIKES`` checks in a row, is a
        collector fault (a known exporter failure: a PCIe rate of 0 during a 56 GB/s copy), not
        an idle link: stored as an event, and GPM's PCIe values are withheld until a check
        agrees again."""
        history = self._gpm_history.get(gpu.uuid)
        if history is None:
            history = self._gpm_history[gpu.uuid] = deque(maxlen=CROSSCHECK_HISTORY)
        history.append((ts, number_of(v, "pcie_tx_bytes_per_second"), number_of(v, "pcie_rx_bytes_per_second")))
        if slow:
            self._crosscheck_once(r, gpu, history)
        fault = self._pcie_fault.get(gpu.uuid)
        if fault is not None:
            for f in ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"):
                v.pop(f, None)
                r.missing[f] = f"collector fault: {fault}"

    def _crosscheck_once(self, r: _Reader, gpu: GpuIdentity, history: GpmHistory) -> None:
        try:
            latest = self.backend.pcie_throughput(gpu.index, period=CROSSCHECK_POLL_SECONDS)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            return  # not supported, or not in this capture: nothing to compare with
        if not isinstance(latest, dict):
            return  # no reading yet
        at = latest.get("ts")
        if not isinstance(at, (int, float)) or at == self._crosschecked.get(gpu.uuid):
            return  # no reading yet, or the one already compared
        # the GPM tick whose interval holds the reading (GPM averages over the tick before it)
        match = next((h for h in history if h[0] >= at), None)
        if match is None:
            return
        self._crosschecked[gpu.uuid] = at
        worst = None
        for name, gpm_value, key in (("TX", match[1], "tx_KBps"), ("RX", match[2], "rx_KBps")):
            other = latest.get(key)
            if not isinstance(other, (int, float)) or gpm_value is None:
                continue
            other_bps = other * 1000.0  # NVML "KB" is 1000 bytes (FACTS §1)
            if other_bps > CROSSCHECK_MIN_BPS and gpm_value < CROSSCHECK_RATIO * other_bps:
                worst = f"GPM PCIe {name} {gpm_value / 1e9:.2f} GB/s while nvmlDeviceGetPcieThroughput reads {other_bps / 1e9:.2f} GB/s"
        strikes = self._pcie_strikes.get(gpu.uuid, 0)
        if worst is None:
            self._pcie_strikes[gpu.uuid] = 0
            if gpu.uuid in self._pcie_fault:
                log.warning("GPU %d (%s): GPM PCIe agrees with the throughput call again", gpu.index, gpu.uuid)
                self._event("collector_fault_cleared", f"gpu:{gpu.uuid}", self._pcie_fault.pop(gpu.uuid))
            return
        strikes += 1
        self._pcie_strikes[gpu.uuid] = strikes
        if strikes >= CROSSCHECK_STRIKES and gpu.uuid not in self._pcie_fault:
            detail = f"{worst} ({strikes} checks in a row)"
            log.error("GPU %d (%s): collector fault: %s; GPM PCIe figures withheld", gpu.index, gpu.uuid, detail)
            self._pcie_fault[gpu.uuid] = detail
            self._event("collector_fault", f"gpu:{gpu.uuid}", detail)

    def _pcie_throughput(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues) -> None:
        """Pre-Hopper PCIe bytes/s: the newest reading of the backend's throughput poller (a
        20 ms window every few seconds, not an average over the tick)."""
        fields = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
        key: CallKey = ("pcie_throughput", (), ())
        if key in r.unsupported:
            for f in fields:
                r.missing[f] = "not supported"
            return
        try:
            latest = self.backend.pcie_throughput(gpu.index)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            if exc.code in _PERMANENT:
                r.unsupported.add(key)
            for f in fields:
                r.missing[f] = exc.reason
            return
        at = r.get(fields[0], latest, "ts")
        if not isinstance(at, (int, float)) or abs(ts - float(at)) > PCIE_THROUGHPUT_MAX_AGE_S:
            for f in fields:
                r.missing.setdefault(f, "PCIe throughput: no recent reading")
            return
        for f, k in zip(fields, ("tx_KBps", "rx_KBps")):
            r.put(f, r.get(f, latest, k), v, 1000.0, r.pcie_limit)  # NVML "KB" is 1000 bytes (FACTS §1)
