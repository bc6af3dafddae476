"""The NVML collector: reads every GPU each tick through one choke point.

Cadence by measured cost (FACTS §1, H200, driver 580): the fast set (GPM pair, memory v2,
utilization, temperature, power, clocks, clocks-event reasons, performance state, current PCIe
link, processes) costs a few hundred µs per GPU and runs every tick; the slow set (ECC counters by
type and location, remapped rows, BAR1, PCIe replay counter, energy, power limit, violation times,
modes — the energy counter alone costs 3.3 ms) runs every ``slow_every`` ticks; static facts are
read at start and after a re-initialisation. ``nvmlDeviceGetPcieThroughput`` (21 ms, blocking)
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
* impossible values (utilization 4294967295, temperature 644245923, ratios outside 0–100 %) are
  rejected: ``None`` with reason ``rejected: out of range`` and counted per field.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from vgpumon.errors import NvmlUnavailableError
from vgpumon.model import GpuIdentity, GpuSample, NvmlReading, SourceStatus, XidEvent
from vgpumon.sources.nvml_backend import (
    NOT_IN_CAPTURE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
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
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_SRAM = 7
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
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
#: Largest PID Linux can hand out (``pid_max`` limit, 2**22); anything above is not a PID.
PID_MAX = 4_194_304
#: A ``nvmlDeviceGetPcieThroughput`` reading older than this is not used for a tick.
PCIE_THROUGHPUT_MAX_AGE_S = 15.0

# Field-level answers that mean "this device will never answer this": cache them.
_PERMANENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
# Lifecycle errors of the library (whole host) rather than of one device.
_LIBRARY_DOWN = frozenset({NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH})
# At start, these mean "no NVIDIA stack on this host": the agent exits 69 instead of waiting.
_FATAL_AT_START = frozenset({NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED})
_HINTS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "is the NVIDIA driver installed on this host?",
    NVML_ERROR_DRIVER_NOT_LOADED: "is the nvidia kernel module loaded (nvidia-smi)?",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reload: reload the nvidia module or reboot",
}


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


def _describe(exc: NvmlCallError) -> str:
    hint = _HINTS.get(exc.code)
    return f"{exc.reason} ({hint})" if hint else exc.reason


class _Reader:
    """The choke point: one device, one tick. Collects values and reasons for ``None``."""

    def __init__(self, backend: NvmlBackend, index: int, unsupported: set[tuple[Any, ...]], rejected: Counter[str]) -> None:
        self.backend = backend
        self.index = index
        self.unsupported = unsupported
        self.rejected = rejected
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
        """Record an impossible value for ``field``: ``None`` in the sample, counted."""
        self.missing[field] = "rejected: out of range"
        self.rejected[field] += 1

    def ratio(self, field: str, percent: Any, v: dict[str, Any]) -> None:
        if percent is None:
            return
        value = _pct_ratio(percent)
        if value is None:
            self.reject(field)
        v[field] = value

    def count(self, field: str, value: Any, v: dict[str, Any], scale: float = 1.0) -> None:
        """Store a non-negative counter or gauge (optionally scaled); negative → rejected."""
        if value is None:
            return
        if not isinstance(value, (int, float)) or value < 0:
            self.reject(field)
            return
        v[field] = value * scale if scale != 1.0 else value


class NvmlSource:
    """Samples every NVIDIA GPU of the host through an ``NvmlBackend``.

    Not thread-safe: the agent calls ``start``/``sample``/``close`` from one worker thread.

    Args:
        backend: ``LiveBackend()`` by default; ``ReplayBackend`` / ``RecordingBackend`` for
            captures. The same code runs on all three.
        slow_every: read the slow set every this many ticks (first tick included).
        use_gpm: set False to force the pre-Hopper path (utilization as activity proxy, PCIe
            from the polled throughput call).
        max_backoff_ticks: longest wait, in ticks, between retries of a down device or library.
    """

    name = "nvml"

    def __init__(
        self,
        backend: NvmlBackend | None = None,
        *,
        slow_every: int = 10,
        use_gpm: bool = True,
        max_backoff_ticks: int = 32,
    ) -> None:
        self.backend: NvmlBackend = backend if backend is not None else LiveBackend()
        self.slow_every = max(1, slow_every)
        self.use_gpm = use_gpm
        self.max_backoff_ticks = max(1, max_backoff_ticks)
        self.gpus: tuple[GpuIdentity, ...] = ()
        self.driver_version: str | None = None
        self.rejected: Counter[str] = Counter()
        self.last_success_ts: float | None = None
        self._unsupported: dict[int, set[tuple[Any, ...]]] = {}
        self._tick = 0
        # device index → (reason, failures, next tick to retry)
        self._down: dict[int, tuple[str, int, int]] = {}
        # library down: (reason, failures, next tick to retry) or None
        self._lib_down: tuple[str, int, int] | None = None
        self._replay_prev: dict[str, tuple[float, int]] = {}
        self._xid_counts: dict[str, Counter[int]] = {}
        self._xid_last: dict[str, dict[int, float]] = {}
        self._xid_warned = False
        self._started = False

    def _backoff(self, failures: int) -> int:
        return min(2 ** max(failures - 1, 0), self.max_backoff_ticks)

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

    def _init(self) -> None:
        self.backend.init()
        count = int(self.backend.system("nvmlDeviceGetCount"))
        try:
            self.driver_version = str(self.backend.system("nvmlSystemGetDriverVersion"))
        except NvmlCallError:
            self.driver_version = None
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._identity(index))
                self._down.pop(index, None)
            except DeviceDown as exc:
                log.warning("GPU %d unavailable at start: %s", index, exc.error.reason)
                self._down[index] = (exc.error.reason, 1, self._tick + 1)
        self.gpus = tuple(gpus)

    def _reader(self, index: int) -> _Reader:
        return _Reader(self.backend, index, self._unsupported.setdefault(index, set()), self.rejected)

    def _identity(self, index: int) -> GpuIdentity:
        r = self._reader(index)
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
        sm_max = r.q("sm_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM)
        mem_max = r.q("memory_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM)
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
            sm_clock_max_hertz=None if sm_max is None else sm_max * 1e6,
            memory_clock_max_hertz=None if mem_max is None else mem_max * 1e6,
        )

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
        ts = self.backend.begin_tick(time.time() if ts is None else ts)
        tick = self._tick
        self._tick += 1
        if self._lib_down is not None and not self._retry_library(tick):
            reason = f"NVML down: {self._lib_down[0]}" if self._lib_down else "NVML down"
            samples = tuple(self._down_sample(g, ts, reason) for g in self.gpus)
            return NvmlReading(ts, samples, (), self.status(time.perf_counter() - t0))
        slow = tick % self.slow_every == 0
        samples = []
        for gpu in self.gpus:
            if self._lib_down is not None:  # the library went down earlier in this tick
                samples.append(self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}"))
                continue
            down = self._down.get(gpu.index)
            if down is not None and tick < down[2]:
                samples.append(self._down_sample(gpu, ts, f"device down: {down[0]}; retry in {down[2] - tick} ticks"))
                continue
            try:
                samples.append(self._sample_device(gpu, ts, slow))
                if down is not None:
                    log.warning("GPU %d (%s) is back after %d failed tries", gpu.index, gpu.uuid, down[1])
                    del self._down[gpu.index]
            except DeviceDown as exc:
                self.backend.forget_device(gpu.index)
                if exc.error.code in _LIBRARY_DOWN:
                    self._library_failed(tick, exc.error)
                    samples.append(self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}"))  # type: ignore[index]
                    continue
                failures = 1 if down is None else down[1] + 1
                if down is None:
                    log.warning("GPU %d (%s) down: %s", gpu.index, gpu.uuid, exc.error.reason)
                self._down[gpu.index] = (exc.error.reason, failures, tick + self._backoff(failures))
                samples.append(self._down_sample(gpu, ts, f"device down: {exc.error.reason}"))
        xids = self._poll_xids() if self._lib_down is None else ()
        if self._xid_counts:  # counts stay on every later sample, not only the event's tick
            samples = [self._with_xids(s) for s in samples]
        if self._lib_down is None:
            self.last_success_ts = ts
        return NvmlReading(ts, tuple(samples), xids, self.status(time.perf_counter() - t0))

    @staticmethod
    def _down_sample(gpu: GpuIdentity, ts: float, reason: str) -> GpuSample:
        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, up=False, missing={"*": reason})

    def _library_failed(self, tick: int, error: NvmlCallError) -> None:
        failures = 1 if self._lib_down is None else self._lib_down[1] + 1
        if self._lib_down is None:
            log.error("NVML down: %s; re-initialising with back-off", _describe(error))
        self._lib_down = (_describe(error), failures, tick + self._backoff(failures))

    def _retry_library(self, tick: int) -> bool:
        """Re-initialise NVML if the back-off allows; True when it is usable again."""
        assert self._lib_down is not None
        reason, failures, due = self._lib_down
        if tick < due:
            return False
        self.backend.shutdown()
        try:
            self._init()
        except NvmlCallError as exc:
            self._lib_down = (_describe(exc), failures + 1, tick + self._backoff(failures + 1))
            return False
        log.warning("NVML usable again after %d tries (%s); %d GPU(s)", failures, reason, len(self.gpus))
        self._lib_down = None
        return True

    def _poll_xids(self) -> tuple[XidEvent, ...]:
        try:
            raw = self.backend.xid_poll()
        except NvmlCallError as exc:
            if exc.code != NOT_IN_CAPTURE and not self._xid_warned:
                log.warning("XID events unavailable: %s", exc.reason)
                self._xid_warned = True
            return ()
        by_index = {g.index: g.uuid for g in self.gpus}
        events = []
        for e in raw:
            uuid = by_index.get(e.get("index"))
            if uuid is None:
                continue
            xid = int(e["xid"])
            events.append(XidEvent(ts=float(e["ts"]), uuid=uuid, xid=xid))
            self._xid_counts.setdefault(uuid, Counter())[xid] += 1
            self._xid_last.setdefault(uuid, {})[xid] = float(e["ts"])
            log.warning("XID %d on GPU %s", xid, uuid)
        return tuple(events)

    def _with_xids(self, s: GpuSample) -> GpuSample:
        counts = self._xid_counts.get(s.uuid)
        if not counts:
            return s
        return replace(s, xid_counts=dict(counts), xid_last_seen=dict(self._xid_last[s.uuid]))

    def _sample_device(self, gpu: GpuIdentity, ts: float, slow: bool) -> GpuSample:
        r = self._reader(gpu.index)
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
            r.ratio("utilization_gpu_ratio", util.get("gpu"), v)
            r.ratio("utilization_memory_ratio", util.get("memory"), v)
        elif "utilization_gpu_ratio" in r.missing:  # MIG mode: no device-level utilization
            r.missing["utilization_memory_ratio"] = r.missing["utilization_gpu_ratio"]

        if gpu.gpm_supported:
            v["activity_source"] = "gpm"
            self._gpm(r, gpu, v)
        else:
            v["activity_source"] = "utilization"
            self._pcie_throughput(r, gpu, ts, v)

        temp = r.q("temperature_celsius", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)
        if temp is not None:
            if isinstance(temp, (int, float)) and -50 <= temp <= 200:
                v["temperature_celsius"] = float(temp)
            else:  # e.g. 644245923 seen in the wild
                r.reject("temperature_celsius")
        r.count("power_watts", r.q("power_watts", "nvmlDeviceGetPowerUsage"), v, 1e-3)
        r.count("sm_clock_hertz", r.q("sm_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM), v, 1e6)
        r.count("memory_clock_hertz", r.q("memory_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_MEM), v, 1e6)
        v["clocks_event_reasons"] = r.q("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        pstate = r.q("performance_state", "nvmlDeviceGetPerformanceState")
        if pstate is not None:
            if 0 <= pstate <= 15:
                v["performance_state"] = pstate
            else:  # 32 = NVML_PSTATE_UNKNOWN
                r.missing["performance_state"] = "unknown"
        r.ratio("fan_speed_ratio", r.q("fan_speed_ratio", "nvmlDeviceGetFanSpeed"), v)
        v["pcie_link_gen_current"] = r.q("pcie_link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration")
        v["pcie_link_width_current"] = r.q("pcie_link_width_current", "nvmlDeviceGetCurrPcieLinkWidth")
        self._processes(r, v)
        if slow:
            self._slow(r, gpu, ts, v)
        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, missing=r.missing, **v)

    def _processes(self, r: _Reader, v: dict[str, Any]) -> None:
        procs = r.q("processes", "nvmlDeviceGetComputeRunningProcesses")
        if not isinstance(procs, list):
            return
        pids = [int(p.get("pid", 0)) for p in procs]
        if any(pid <= 0 or pid > PID_MAX for pid in pids):
            # nvidia-ml-py struct layout ≠ driver's: PIDs read as 0 / 4294967295 in a pattern.
            r.missing["processes"] = "garbage PIDs: nvidia-ml-py and driver disagree on the process struct"
            r.rejected["processes"] += 1
            return
        v["processes"] = tuple(
            (pid, None if p.get("usedGpuMemory") is None else int(p["usedGpuMemory"])) for pid, p in zip(pids, procs)
        )

    def _slow(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        for field, etype, counter in (
            ("ecc_corrected_volatile_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
            ("ecc_uncorrected_volatile_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            ("ecc_corrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
            ("ecc_uncorrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
        ):
            r.count(field, r.q(field, "nvmlDeviceGetTotalEccErrors", etype, counter), v)
        for field, etype, location in (
            ("ecc_corrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_uncorrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_corrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_SRAM),
            ("ecc_uncorrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_SRAM),
        ):
            r.count(field, r.q(field, "nvmlDeviceGetMemoryErrorCounter", etype, NVML_VOLATILE_ECC, location), v)
        r.count("energy_joules_total", r.q("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption"), v, 1e-3)
        bar1 = r.q("bar1_used_bytes", "nvmlDeviceGetBAR1MemoryInfo")
        if isinstance(bar1, dict):
            v["bar1_used_bytes"] = int(bar1["bar1Used"])
            v["bar1_total_bytes"] = int(bar1["bar1Total"])
        replays = r.q("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter")
        r.count("pcie_replay_total", replays, v)
        if "pcie_replay_total" in v:
            prev = self._replay_prev.get(gpu.uuid)
            self._replay_prev[gpu.uuid] = (ts, replays)
            if prev is not None and ts > prev[0]:
                if replays >= prev[1]:
                    v["pcie_replay_rate_per_second"] = (replays - prev[1]) / (ts - prev[0])
                else:  # driver reload or reset: the counter restarted; no negative rate
                    r.missing["pcie_replay_rate_per_second"] = "counter reset"
        remap = r.q("remapped_rows_correctable_total", "nvmlDeviceGetRemappedRows")
        if isinstance(remap, list) and len(remap) == 4:
            v["remapped_rows_correctable_total"] = int(remap[0])
            v["remapped_rows_uncorrectable_total"] = int(remap[1])
            v["remapped_rows_pending"] = bool(remap[2])
            v["remapped_rows_failure"] = bool(remap[3])
        elif "remapped_rows_correctable_total" in r.missing:
            # Pre-Ampere boards retire pages instead of remapping rows.
            sbe = r.q("retired_pages_single_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            if isinstance(sbe, list):
                v["retired_pages_single_bit_total"] = len(sbe)
                dbe = r.q("retired_pages_double_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
                if isinstance(dbe, list):
                    v["retired_pages_double_bit_total"] = len(dbe)
                pending = r.q("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus")
                if pending is not None:
                    v["retired_pages_pending"] = bool(pending)
        r.count("power_limit_watts", r.q("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit"), v, 1e-3)
        for field, policy in (
            ("violation_power_seconds_total", NVML_PERF_POLICY_POWER),
            ("violation_thermal_seconds_total", NVML_PERF_POLICY_THERMAL),
        ):
            status = r.q(field, "nvmlDeviceGetViolationStatus", policy)
            if isinstance(status, dict) and "violationTime" in status:
                r.count(field, status["violationTime"], v, 1e-9)
        persistence = r.q("persistence_mode", "nvmlDeviceGetPersistenceMode")
        if persistence is not None:
            v["persistence_mode"] = bool(persistence)
        v["compute_mode"] = r.q("compute_mode", "nvmlDeviceGetComputeMode")
        mig = r.q("mig_mode", "nvmlDeviceGetMigMode")
        if isinstance(mig, list) and mig:
            v["mig_mode"] = int(mig[0])

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
            else:
                r.ratio(field, value, v)
        for metric_id, field in ((GPM_PCIE_TX_PER_SEC, "pcie_tx_bytes_per_second"), (GPM_PCIE_RX_PER_SEC, "pcie_rx_bytes_per_second")):
            value = metrics.get(metric_id)
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif isinstance(value, (int, float)):
                if 0 <= value < 1e9:  # MiB/s; anything above ~1 PB/s is not a PCIe reading
                    v[field] = float(value) * _MIB
                else:
                    r.reject(field)

    def _pcie_throughput(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        """Pre-Hopper PCIe bytes/s: the newest reading of the backend's throughput poller (a
        20 ms window every few seconds, not an average over the tick)."""
        fields = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
        key = ("pcie_throughput", (), ())
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
        if latest is None or abs(ts - float(latest["ts"])) > PCIE_THROUGHPUT_MAX_AGE_S:
            for f in fields:
                r.missing[f] = "PCIe throughput: no recent reading"
            return
        for f, k in zip(fields, ("tx_KBps", "rx_KBps")):
            r.count(f, latest.get(k), v, 1000.0)  # NVML "KB" is 1000 bytes (FACTS §1)

    def close(self) -> None:
        """Release NVML (never raises)."""
        self.backend.shutdown()
