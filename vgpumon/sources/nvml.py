"""The NVML collector: reads every GPU each tick through one choke point.

Cadence by measured cost (FACTS §1, H200, driver 580): the fast set (GPM pair, memory v2,
utilization, temperature, power, clocks, clocks-event reasons, current PCIe link, processes)
costs about 0.33 ms per GPU and runs every tick; the slow set (ECC counters, energy — the energy
counter alone costs 3.3 ms) runs every ``slow_every`` ticks; static facts are read at start and
after a re-initialisation. ``nvmlDeviceGetPcieThroughput`` (21 ms, blocking) is never called here:
PCIe bytes/s come from GPM, averaged over the whole interval between two ticks.

Every call goes through ``_Reader.q``: a field-level error (not supported, no permission, function
not found, not in capture) makes that field ``None`` with a reason, and a "not supported" answer is
remembered so the call is not retried every tick. A lifecycle error (GPU lost, reset required,
...) marks the device down for the tick and drops its handle; the next tick tries again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from vgpumon.errors import NvmlUnavailableError
from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.sources.nvml_backend import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    LiveBackend,
    NvmlBackend,
    NvmlCallError,
)

log = logging.getLogger(__name__)

# pynvml constants, repeated so that the collector does not need pynvml to replay a capture.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24

# GPM metric ids (nvml.h nvmlGpmMetricId_t); values are percent or MiB/s.
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_METRICS = (
    GPM_SM_UTIL,
    GPM_SM_OCCUPANCY,
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_PCIE_TX_PER_SEC,
    GPM_PCIE_RX_PER_SEC,
)
_MIB = 1 << 20

# Field-level answers that mean "this device will never answer this": cache them.
_PERMANENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})


class DeviceDown(Exception):
    """A lifecycle error on one device; carries the NVML error."""

    def __init__(self, error: NvmlCallError) -> None:
        super().__init__(str(error))
        self.error = error


def _pct_ratio(value: Any) -> float | None:
    """NVML percent → ratio 0–1; out-of-range readings (e.g. 4294967295) → ``None``."""
    if not isinstance(value, (int, float)) or not 0 <= value <= 100.0 + 1e-6:
        return None
    return min(float(value) / 100.0, 1.0)


class _Reader:
    """The choke point: one device, one tick. Collects values and reasons for ``None``."""

    def __init__(self, backend: NvmlBackend, index: int, unsupported: set[tuple[Any, ...]]) -> None:
        self.backend = backend
        self.index = index
        self.unsupported = unsupported
        self.missing: dict[str, str] = {}

    def q(self, field: str, fn: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` for this device; ``None`` (reason in ``missing[field]``) on field errors.

        Raises:
            DeviceDown: on a lifecycle error (GPU lost, reset required, driver gone, ...).
        """
        key = (fn, args, tuple(kwargs.items()))
        if key in self.unsupported:
            self.missing[field] = "not supported"
            return None
        try:
            return self.backend.device(self.index, fn, *args, **kwargs)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            if exc.code in _PERMANENT:
                self.unsupported.add(key)
            self.missing[field] = exc.reason
            return None

    def reject(self, field: str) -> None:
        self.missing[field] = "rejected: out of range"


class NvmlSource:
    """Samples every NVIDIA GPU of the host through an ``NvmlBackend``.

    Not thread-safe: the agent calls ``start``/``sample``/``close`` from one worker thread.

    Args:
        backend: ``LiveBackend()`` by default; ``ReplayBackend`` / ``RecordingBackend`` for
            captures. The same code runs on all three.
        slow_every: read the slow set (ECC, energy) every this many ticks (first tick included).
        use_gpm: set False to force the pre-Hopper path (utilization as activity proxy).
    """

    name = "nvml"

    def __init__(self, backend: NvmlBackend | None = None, *, slow_every: int = 10, use_gpm: bool = True) -> None:
        self.backend: NvmlBackend = backend if backend is not None else LiveBackend()
        self.slow_every = max(1, slow_every)
        self.use_gpm = use_gpm
        self.gpus: tuple[GpuIdentity, ...] = ()
        self.driver_version: str | None = None
        self._unsupported: dict[int, set[tuple[Any, ...]]] = {}
        self._tick = 0
        self._down: dict[int, str] = {}

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> tuple[GpuIdentity, ...]:
        """Initialise NVML and read every device's static facts.

        Returns:
            One ``GpuIdentity`` per device, by NVML index (empty when the host has no GPU).

        Raises:
            NvmlUnavailableError: NVML cannot be used on this host (library not found, driver
                not loaded, library/driver version mismatch); the message names the cause.
        """
        try:
            self.backend.init()
            count = int(self.backend.system("nvmlDeviceGetCount"))
        except NvmlCallError as exc:
            hints = {
                NVML_ERROR_LIBRARY_NOT_FOUND: "is the NVIDIA driver installed on this host?",
                NVML_ERROR_DRIVER_NOT_LOADED: "is the nvidia kernel module loaded (nvidia-smi)?",
                NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded; reload it or reboot",
            }
            hint = hints.get(exc.code)
            raise NvmlUnavailableError(f"NVML unavailable: {exc.reason}" + (f" ({hint})" if hint else "")) from None
        try:
            self.driver_version = str(self.backend.system("nvmlSystemGetDriverVersion"))
        except NvmlCallError:
            self.driver_version = None
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._identity(index))
            except DeviceDown as exc:
                log.warning("GPU %d unavailable at start: %s", index, exc.error.reason)
                self._down[index] = exc.error.reason
        self.gpus = tuple(gpus)
        return self.gpus

    def _identity(self, index: int) -> GpuIdentity:
        r = _Reader(self.backend, index, self._unsupported.setdefault(index, set()))
        uuid = r.q("uuid", "nvmlDeviceGetUUID")
        if uuid is None:
            raise DeviceDown(NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetUUID"))
        pci = r.q("pci_bus_id", "nvmlDeviceGetPciInfo")
        mem = r.q("memory_total_bytes", "nvmlDeviceGetMemoryInfo")
        gpm_supported = False
        if self.use_gpm:
            support = r.q("gpm", "nvmlGpmQueryDeviceSupport")
            gpm_supported = bool(support and support.get("isSupportedDevice"))
        bus_id = pci.get("busId") if isinstance(pci, dict) else None
        return GpuIdentity(
            index=index,
            uuid=str(uuid),
            name=r.q("name", "nvmlDeviceGetName"),
            serial=r.q("serial", "nvmlDeviceGetSerial"),
            pci_bus_id=str(bus_id) if bus_id else None,
            memory_total_bytes=int(mem["total"]) if isinstance(mem, dict) else None,
            pcie_link_gen_max=r.q("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            pcie_link_width_max=r.q("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
            pcie_link_gen_gpu_max=r.q("pcie_link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
            gpm_supported=gpm_supported,
        )

    # -- every tick ----------------------------------------------------------------------------

    def sample(self, ts: float | None = None) -> tuple[float, tuple[GpuSample, ...]]:
        """Read one tick from every device.

        Args:
            ts: the tick's time (seconds since the epoch); ``time.time()`` when ``None``. A replay
                backend substitutes the capture's timestamp.

        Returns:
            ``(ts, samples)`` with one ``GpuSample`` per device in ``self.gpus``; a device that
            failed this tick has ``up=False`` and all values ``None``.

        Raises:
            EndOfCapture: a replay has no more ticks.
        """
        ts = self.backend.begin_tick(time.time() if ts is None else ts)
        slow = self._tick % self.slow_every == 0
        self._tick += 1
        samples = []
        for gpu in self.gpus:
            try:
                samples.append(self._sample_device(gpu, ts, slow))
                if gpu.index in self._down:
                    log.warning("GPU %d (%s) is back", gpu.index, gpu.uuid)
                    del self._down[gpu.index]
            except DeviceDown as exc:
                if gpu.index not in self._down:
                    log.warning("GPU %d (%s) down: %s", gpu.index, gpu.uuid, exc.error.reason)
                self._down[gpu.index] = exc.error.reason
                self.backend.forget_device(gpu.index)
                samples.append(
                    GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, up=False, missing={"*": f"device down: {exc.error.reason}"})
                )
        return ts, tuple(samples)

    def _sample_device(self, gpu: GpuIdentity, ts: float, slow: bool) -> GpuSample:
        r = _Reader(self.backend, gpu.index, self._unsupported.setdefault(gpu.index, set()))
        v: dict[str, Any] = {}

        mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
        if isinstance(mem, dict):
            v["memory_used_bytes"] = int(mem["used"])
            v["memory_reserved_bytes"] = int(mem["reserved"])
            v["memory_total_bytes"] = int(mem["total"])
        else:  # drivers without memory v2: v1 "used" includes the driver-reserved memory
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo")
            if isinstance(mem, dict):
                v["memory_used_bytes"] = int(mem["used"])
                v["memory_total_bytes"] = int(mem["total"])
                r.missing["memory_reserved_bytes"] = "memory v2 not available"

        util = r.q("utilization_gpu_ratio", "nvmlDeviceGetUtilizationRates")
        if isinstance(util, dict):
            for key, field in (("gpu", "utilization_gpu_ratio"), ("memory", "utilization_memory_ratio")):
                ratio = _pct_ratio(util.get(key))
                if ratio is None:
                    r.reject(field)
                v[field] = ratio

        if gpu.gpm_supported:
            v["activity_source"] = "gpm"
            self._gpm(r, gpu, v)
        else:
            v["activity_source"] = "utilization"

        temp = r.q("temperature_celsius", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)
        if temp is not None:
            if -50 <= temp <= 200:
                v["temperature_celsius"] = float(temp)
            else:  # e.g. 644245923 seen in the wild
                r.reject("temperature_celsius")
        power = r.q("power_watts", "nvmlDeviceGetPowerUsage")
        if power is not None:
            v["power_watts"] = power / 1000.0
        sm_clock = r.q("sm_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM)
        if sm_clock is not None:
            v["sm_clock_hertz"] = sm_clock * 1e6
        mem_clock = r.q("memory_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_MEM)
        if mem_clock is not None:
            v["memory_clock_hertz"] = mem_clock * 1e6
        v["clocks_event_reasons"] = r.q("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        v["pcie_link_gen_current"] = r.q("pcie_link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration")
        v["pcie_link_width_current"] = r.q("pcie_link_width_current", "nvmlDeviceGetCurrPcieLinkWidth")
        procs = r.q("processes", "nvmlDeviceGetComputeRunningProcesses")
        if isinstance(procs, list):
            v["processes"] = tuple(
                (int(p["pid"]), None if p.get("usedGpuMemory") is None else int(p["usedGpuMemory"])) for p in procs
            )

        if slow:
            for field, etype, counter in (
                ("ecc_corrected_volatile_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
                ("ecc_uncorrected_volatile_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
                ("ecc_corrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
                ("ecc_uncorrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
            ):
                v[field] = r.q(field, "nvmlDeviceGetTotalEccErrors", etype, counter)
            energy = r.q("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption")
            if energy is not None:
                v["energy_joules_total"] = energy / 1000.0

        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, missing=r.missing, **v)

    def _gpm(self, r: _Reader, gpu: GpuIdentity, v: dict[str, Any]) -> None:
        try:
            metrics = self.backend.gpm(gpu.index, GPM_METRICS)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            for field in ("sm_active_ratio", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"):
                r.missing[field] = f"GPM: {exc.reason}"
            return
        if metrics is None:  # first GPM sample of this device: no interval to average over yet
            for field in ("sm_active_ratio", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"):
                r.missing[field] = "GPM: first sample, no interval yet"
            return
        for metric_id, field in (
            (GPM_SM_UTIL, "sm_active_ratio"),
            (GPM_SM_OCCUPANCY, "sm_occupancy_ratio"),
            (GPM_ANY_TENSOR_UTIL, "tensor_active_ratio"),
            (GPM_DRAM_BW_UTIL, "dram_active_ratio"),
        ):
            value = metrics.get(metric_id)
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif value is not None:
                ratio = _pct_ratio(value)
                if ratio is None:
                    r.reject(field)
                v[field] = ratio
        for metric_id, field in ((GPM_PCIE_TX_PER_SEC, "pcie_tx_bytes_per_second"), (GPM_PCIE_RX_PER_SEC, "pcie_rx_bytes_per_second")):
            value = metrics.get(metric_id)
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif isinstance(value, (int, float)):
                if 0 <= value < 1e9:  # MiB/s; anything above ~1 PB/s is not a PCIe reading
                    v[field] = float(value) * _MIB
                else:
                    r.reject(field)

    def close(self) -> None:
        """Release NVML (never raises)."""
        self.backend.shutdown()

