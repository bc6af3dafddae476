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
* every value passes the field catalogue's door (``vgpumon.catalogue.Door``): a non-number
  (``"[N/A]"``), NaN, ±Inf, a blank sentinel (4294967295, DCGM's 2147483632 or
  9223372036854775794) or a value outside the field's range (temperature 644245923, a PCIe rate
  above 1.25 × the link's capacity) is ``None`` with a ``rejected: …`` reason, counted per field.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from vgpumon import catalogue
from vgpumon.catalogue import Door, Rejected
from vgpumon.errors import NvmlUnavailableError
from vgpumon.model import GpuIdentity, GpuSample, NvmlReading, SourceStatus, XidEvent
from vgpumon.pcie import link_capacity_bytes_per_second
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
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1  # nvml.h nvmlTemperatureThresholds_t
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
NVML_FI_DEV_MEMORY_TEMP = 82  # nvml.h field id: HBM temperature, °C
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
_GPM_FIELDS = {
    GPM_SM_UTIL: "sm_active_ratio",
    GPM_SM_OCCUPANCY: "sm_occupancy_ratio",
    GPM_ANY_TENSOR_UTIL: "tensor_active_ratio",
    GPM_DRAM_BW_UTIL: "dram_active_ratio",
    GPM_PCIE_TX_PER_SEC: "pcie_tx_bytes_per_second",
    GPM_PCIE_RX_PER_SEC: "pcie_rx_bytes_per_second",
}
_GPM_PCIE = frozenset({GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC})
#: ``nvmlDeviceGetPerformanceState`` when the driver does not know the P-state.
NVML_PSTATE_UNKNOWN = 32
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


def _describe(exc: NvmlCallError) -> str:
    hint = _HINTS.get(exc.code)
    return f"{exc.reason} ({hint})" if hint else exc.reason


class _Reader:
    """The choke point: one device, one tick. Collects values and reasons for ``None``.

    Every value goes through the catalogue's door (``put``): a reading that is not a number, is
    NaN/±Inf, a blank sentinel or outside its field's range becomes ``None`` with a
    ``rejected: …`` reason and is counted.
    """

    __slots__ = ("backend", "index", "unsupported", "door", "rejected", "missing", "pcie_limit", "memory_limit")

    def __init__(
        self,
        backend: NvmlBackend,
        index: int,
        unsupported: set[tuple[Any, ...]],
        door: Door,
        gpu: GpuIdentity | None = None,
    ) -> None:
        self.backend = backend
        self.index = index
        self.unsupported = unsupported
        self.door = door
        self.rejected = door.rejected
        self.missing: dict[str, str] = {}
        # Device bounds (catalogue ``Field.limit``): a PCIe rate above 1.25 × the max link's
        # capacity, or memory above the GPU's total, is not a reading.
        capacity = None if gpu is None else link_capacity_bytes_per_second(gpu.pcie_link_gen_max, gpu.pcie_link_width_max)
        self.pcie_limit = None if capacity is None else 1.25 * capacity
        self.memory_limit = None if gpu is None else gpu.memory_total_bytes

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

    def put(self, field: str, raw: Any, v: dict[str, Any], scale: float = 1.0, limit: float | None = None) -> None:
        """Admit ``raw`` (NVML's unit) × ``scale`` as ``v[field]``; ``None`` stays absent (its
        reason was set by ``q``); an impossible value is left out with its reason."""
        if raw is None:
            return
        try:
            v[field] = self.door.value(field, raw, scale, limit)
        except Rejected as exc:
            self.missing[field] = exc.reason

    def field_value(self, field: str, field_id: int) -> Any:
        """One ``nvmlDeviceGetFieldValues`` id. The call succeeds when *any* entry was filled, so
        the entry's own return code decides: NOT_SUPPORTED there is ``None`` (remembered like a
        call that is not supported), never the zeroed value beside it.

        Raises:
            DeviceDown: the entry says the device is gone.
        """
        key = ("nvmlDeviceGetFieldValues", ((field_id,),), ())
        answer = self.q(field, "nvmlDeviceGetFieldValues", (field_id,))
        entry = answer[0] if isinstance(answer, list) and answer else answer
        ret = self.get(field, entry, "nvmlReturn")
        if ret is None:
            return None
        if ret != 0:
            exc = NvmlCallError(int(ret), "nvmlDeviceGetFieldValues")
            if exc.is_lifecycle:
                raise DeviceDown(exc)
            if exc.code in _PERMANENT:
                self.unsupported.add(key)
            self.missing[field] = exc.reason
            return None
        return self.get(field, entry, "value")

    def get(self, field: str, answer: Any, key: str) -> Any:
        """``answer[key]`` of a struct answer (a dict), or ``None`` with a reason when the
        answer is not the struct NVML defines (a binding/driver mismatch)."""
        if isinstance(answer, dict) and key in answer:
            return answer[key]
        if answer is not None:
            self.missing[field] = f"rejected: malformed answer {str(answer)[:40]!r}"
            self.rejected[field] += 1
        return None


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
        self.door = Door(
            (*catalogue.fields_of("gpu_samples"), *catalogue.fields_of("gpus"), *catalogue.fields_of("gpu_process_samples"))
        )
        self.rejected: Counter[str] = self.door.rejected
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

    def _reader(self, index: int, gpu: GpuIdentity | None = None) -> _Reader:
        return _Reader(self.backend, index, self._unsupported.setdefault(index, set()), self.door, gpu)

    def _identity(self, index: int) -> GpuIdentity:
        r = self._reader(index)
        v: dict[str, Any] = {}
        r.put("uuid", r.q("uuid", "nvmlDeviceGetUUID"), v)
        if "uuid" not in v:  # no identity, no history: the device is treated as down
            raise DeviceDown(NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetUUID"))
        pci = r.q("pci_bus_id", "nvmlDeviceGetPciInfo")
        r.put("pci_bus_id", r.get("pci_bus_id", pci, "busId") or None, v)
        r.put("memory_total_bytes", r.get("memory_total_bytes", r.q("memory_total_bytes", "nvmlDeviceGetMemoryInfo"), "total"), v)
        gpm_supported = False
        if self.use_gpm:
            support = r.q("gpm", "nvmlGpmQueryDeviceSupport")
            gpm_supported = bool(isinstance(support, dict) and support.get("isSupportedDevice"))
        r.put("name", r.q("name", "nvmlDeviceGetName"), v)
        r.put("serial", r.q("serial", "nvmlDeviceGetSerial"), v)
        r.put("pcie_link_gen_max", r.q("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"), v)
        r.put("pcie_link_width_max", r.q("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"), v)
        r.put("pcie_link_gen_gpu_max", r.q("pcie_link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"), v)
        r.put("sm_clock_max_hertz", r.q("sm_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM), v, 1e6)
        r.put("memory_clock_max_hertz", r.q("memory_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM), v, 1e6)
        r.put(
            "slowdown_temperature_celsius",
            r.q("slowdown_temperature_celsius", "nvmlDeviceGetTemperatureThreshold", NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            v,
        )
        for field, reason in r.missing.items():
            if catalogue.is_rejection(reason):
                log.warning("GPU %d: %s %s", index, field, reason)
        return GpuIdentity(index=index, gpm_supported=gpm_supported, **v)

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
        r = self._reader(gpu.index, gpu)
        v: dict[str, Any] = {}

        mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
        if mem is not None:
            total = r.get("memory_total_bytes", mem, "total")
            r.put("memory_total_bytes", total, v)
            limit = v.get("memory_total_bytes", r.memory_limit)
            r.put("memory_used_bytes", r.get("memory_used_bytes", mem, "used"), v, limit=limit)
            r.put("memory_reserved_bytes", r.get("memory_reserved_bytes", mem, "reserved"), v, limit=limit)
        else:  # drivers without memory v2: v1 "used" includes the driver-reserved memory
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo")
            if mem is not None:
                r.put("memory_total_bytes", r.get("memory_total_bytes", mem, "total"), v)
                limit = v.get("memory_total_bytes", r.memory_limit)
                r.put("memory_used_bytes", r.get("memory_used_bytes", mem, "used"), v, limit=limit)
                r.missing["memory_reserved_bytes"] = "memory v2 not available"

        util = r.q("utilization_gpu_ratio", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            r.put("utilization_gpu_ratio", r.get("utilization_gpu_ratio", util, "gpu"), v, 0.01)
            r.put("utilization_memory_ratio", r.get("utilization_memory_ratio", util, "memory"), v, 0.01)
        elif "utilization_gpu_ratio" in r.missing:  # MIG mode: no device-level utilization
            r.missing["utilization_memory_ratio"] = r.missing["utilization_gpu_ratio"]

        if gpu.gpm_supported:
            v["activity_source"] = "gpm"
            self._gpm(r, gpu, v)
        else:
            v["activity_source"] = "utilization"
            self._pcie_throughput(r, gpu, ts, v)

        r.put("temperature_celsius", r.q("temperature_celsius", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU), v)
        r.put("memory_temperature_celsius", r.field_value("memory_temperature_celsius", NVML_FI_DEV_MEMORY_TEMP), v)
        r.put("power_watts", r.q("power_watts", "nvmlDeviceGetPowerUsage"), v, 1e-3)
        r.put("sm_clock_hertz", r.q("sm_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_SM), v, 1e6)
        r.put("memory_clock_hertz", r.q("memory_clock_hertz", "nvmlDeviceGetClockInfo", NVML_CLOCK_MEM), v, 1e6)
        r.put("clocks_event_reasons", r.q("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons"), v)
        pstate = r.q("performance_state", "nvmlDeviceGetPerformanceState")
        if pstate == NVML_PSTATE_UNKNOWN:
            r.missing["performance_state"] = "unknown"
        else:
            r.put("performance_state", pstate, v)
        r.put("fan_speed_ratio", r.q("fan_speed_ratio", "nvmlDeviceGetFanSpeed"), v, 0.01)
        r.put("pcie_link_gen_current", r.q("pcie_link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"), v)
        r.put("pcie_link_width_current", r.q("pcie_link_width_current", "nvmlDeviceGetCurrPcieLinkWidth"), v)
        self._processes(r, v)
        if slow:
            self._slow(r, gpu, ts, v)
        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, missing=r.missing, **v)

    def _processes(self, r: _Reader, v: dict[str, Any]) -> None:
        procs = r.q("processes", "nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return
        if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
            r.missing["processes"] = f"rejected: malformed answer {str(procs)[:40]!r}"
            r.rejected["processes"] += 1
            return
        pids = [p.get("pid") for p in procs]
        if any(not isinstance(pid, int) or pid <= 0 or pid > PID_MAX for pid in pids):
            # nvidia-ml-py struct layout ≠ driver's: PIDs read as 0 / 4294967295 in a pattern.
            r.missing["processes"] = "garbage PIDs: nvidia-ml-py and driver disagree on the process struct"
            r.rejected["processes"] += 1
            return
        out = []
        for pid, p in zip(pids, procs):
            used = p.get("usedGpuMemory")
            if used is not None:
                one: dict[str, Any] = {}
                r.put("used_gpu_memory_bytes", used, one, limit=v.get("memory_total_bytes", r.memory_limit))
                if "used_gpu_memory_bytes" not in one:  # this process's figure only; it stays listed
                    r.missing["used_gpu_memory_bytes"] = f"{r.missing['used_gpu_memory_bytes']} (pid {pid})"
                used = one.get("used_gpu_memory_bytes")
            out.append((pid, used))
        v["processes"] = tuple(out)

    def _slow(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        for field, etype, counter in (
            ("ecc_corrected_volatile_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
            ("ecc_uncorrected_volatile_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            ("ecc_corrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
            ("ecc_uncorrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
        ):
            r.put(field, r.q(field, "nvmlDeviceGetTotalEccErrors", etype, counter), v)
        for field, etype, location in (
            ("ecc_corrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_uncorrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_corrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_SRAM),
            ("ecc_uncorrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_SRAM),
        ):
            r.put(field, r.q(field, "nvmlDeviceGetMemoryErrorCounter", etype, NVML_VOLATILE_ECC, location), v)
        r.put("energy_joules_total", r.q("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption"), v, 1e-3)
        bar1 = r.q("bar1_used_bytes", "nvmlDeviceGetBAR1MemoryInfo")
        if bar1 is not None:
            r.put("bar1_total_bytes", r.get("bar1_total_bytes", bar1, "bar1Total"), v)
            r.put("bar1_used_bytes", r.get("bar1_used_bytes", bar1, "bar1Used"), v, limit=v.get("bar1_total_bytes"))
        r.put("pcie_replay_total", r.q("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter"), v)
        replays = v.get("pcie_replay_total")
        if replays is not None:
            prev = self._replay_prev.get(gpu.uuid)
            self._replay_prev[gpu.uuid] = (ts, replays)
            if prev is not None and ts > prev[0]:
                if replays >= prev[1]:
                    v["pcie_replay_rate_per_second"] = (replays - prev[1]) / (ts - prev[0])
                else:  # driver reload or reset: the counter restarted; no negative rate
                    r.missing["pcie_replay_rate_per_second"] = "counter reset"
        remap = r.q("remapped_rows_correctable_total", "nvmlDeviceGetRemappedRows")
        if isinstance(remap, list) and len(remap) == 4:
            for field, raw in zip(
                ("remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure"),
                remap,
            ):
                r.put(field, raw, v)
        elif remap is not None:
            r.get("remapped_rows_correctable_total", remap, "")  # malformed: counted as rejected
        elif "remapped_rows_correctable_total" in r.missing:
            # Pre-Ampere boards retire pages instead of remapping rows.
            sbe = r.q("retired_pages_single_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            if isinstance(sbe, list):
                r.put("retired_pages_single_bit_total", len(sbe), v)
                dbe = r.q("retired_pages_double_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
                if isinstance(dbe, list):
                    r.put("retired_pages_double_bit_total", len(dbe), v)
                r.put("retired_pages_pending", r.q("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"), v)
        r.put("power_limit_watts", r.q("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit"), v, 1e-3)
        for field, policy in (
            ("violation_power_seconds_total", NVML_PERF_POLICY_POWER),
            ("violation_thermal_seconds_total", NVML_PERF_POLICY_THERMAL),
        ):
            status = r.q(field, "nvmlDeviceGetViolationStatus", policy)
            r.put(field, r.get(field, status, "violationTime"), v, 1e-9)
        r.put("persistence_mode", r.q("persistence_mode", "nvmlDeviceGetPersistenceMode"), v)
        r.put("compute_mode", r.q("compute_mode", "nvmlDeviceGetComputeMode"), v)
        mig = r.q("mig_mode", "nvmlDeviceGetMigMode")
        if isinstance(mig, list) and mig:
            r.put("mig_mode", mig[0], v)
        elif mig is not None:
            r.get("mig_mode", mig, "")

    def _gpm(self, r: _Reader, gpu: GpuIdentity, v: dict[str, Any]) -> None:
        try:
            metrics = self.backend.gpm(gpu.index, GPM_METRICS)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            for field in _GPM_FIELDS.values():
                r.missing[field] = f"GPM: {exc.reason}"
            return
        if metrics is None:  # first GPM sample of this device: no interval to average over yet
            for field in _GPM_FIELDS.values():
                r.missing[field] = "GPM: first sample, no interval yet"
            return
        for metric_id, field in _GPM_FIELDS.items():
            value = metrics.get(metric_id)
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif metric_id in _GPM_PCIE:  # MiB/s
                r.put(field, value, v, _MIB, r.pcie_limit)
            else:  # percent
                r.put(field, value, v, 0.01)

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
        at = r.get(fields[0], latest, "ts")
        if not isinstance(at, (int, float)) or abs(ts - float(at)) > PCIE_THROUGHPUT_MAX_AGE_S:
            for f in fields:
                r.missing.setdefault(f, "PCIe throughput: no recent reading")
            return
        for f, k in zip(fields, ("tx_KBps", "rx_KBps")):
            r.put(f, r.get(f, latest, k), v, 1000.0, r.pcie_limit)  # NVML "KB" is 1000 bytes (FACTS §1)

    def close(self) -> None:
        """Release NVML (never raises)."""
        self.backend.shutdown()
