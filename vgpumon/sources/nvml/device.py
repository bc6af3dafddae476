"""One device's reading in a tick by the general path: memory, utilization, processes, the slow
and minute sets, GPM; the fast path (``fastpath``) answers the same where it applies."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.sources.nvml.backend import NvmlCallError
from vgpumon.sources.nvml.constants import (
    _GPM_FIELDS,
    _GPM_PCIE,
    _MIB,
    _PERMANENT_REASONS,
    GPM_METRICS,
    NVML_AGGREGATE_ECC,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_MEMORY_LOCATION_DRAM,
    NVML_MEMORY_LOCATION_SRAM,
    NVML_MEMORY_V2,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_PERF_POLICY_POWER,
    NVML_PERF_POLICY_THERMAL,
    NVML_PSTATE_UNKNOWN,
    NVML_VOLATILE_ECC,
    DeviceDown,
)
from vgpumon.sources.nvml.fastpath import _FastPath
from vgpumon.sources.nvml.reads import (
    _FAST_SCALARS,
    SampleValues,
    _admit_processes,
    _Reader,
    number_of,
)

if TYPE_CHECKING:
    from vgpumon.sources.nvml.backend import NvmlBackend

log = logging.getLogger("vgpumon.sources.nvml")


class DeviceReads:
    """Reads one device's fields (a part of ``NvmlSource``)."""

    # what it uses of NvmlSource (set there)
    backend: NvmlBackend
    fast_path: bool
    _mem_api: dict[int, str]
    _mem_api_of: dict[str, str]
    _fast: dict[int, _FastPath | None]
    _fast_built: dict[int, tuple[_Reader, GpuIdentity, int, str | None]]
    _replay_prev: dict[str, tuple[float, float] | None]
    _minute_due: bool

    if TYPE_CHECKING:  # NvmlSource's and its other parts' (stubs here would shadow them in the method order)

        def _reader(self, index: int, gpu: GpuIdentity | None = None) -> _Reader: ...

        def _event(self, kind: str, subject: str, detail: str = "") -> None: ...

        def _unwedge(self, index: int, fn: str) -> None: ...

        def _crosscheck(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues, slow: bool) -> None: ...

        def _pcie_throughput(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues) -> None: ...

    def _fast_path(self, r: _Reader, gpu: GpuIdentity) -> _FastPath | None:
        """The device's straight-line reader, kept while its reader and "not supported" cache
        stay the same; ``None`` where the general path serves."""
        key = (r, gpu, r.unsupported.version, self._mem_api.get(gpu.index))
        if self._fast_built.get(gpu.index) == key:
            return self._fast[gpu.index]  # built (or refused: None) for this very state
        fp = self._fast[gpu.index] = _FastPath.build(self, r, gpu)
        self._fast_built[gpu.index] = key
        return fp

    def _sample_device(self, gpu: GpuIdentity, ts: float, slow: bool) -> GpuSample:
        r = self._reader(gpu.index, gpu)
        v: SampleValues = {}
        fast = self._fast_path(r, gpu) if self.fast_path else None

        if fast is not None:
            read = fast.read
            assert read is not None  # ``_FastPath.build`` gives none without its ``read``
            read(v)  # GPM included where the device has it
            if gpu.gpm_supported:
                self._crosscheck(r, gpu, ts, v, slow)
            else:
                v["activity_source"] = "utilization"
                self._pcie_throughput(r, gpu, ts, v)
        else:
            self._memory(r, gpu, v)
            self._utilization(r, v)
            if gpu.gpm_supported:
                v["activity_source"] = "gpm"
                self._gpm(r, gpu, v)
                self._crosscheck(r, gpu, ts, v, slow)
            else:
                v["activity_source"] = "utilization"
                self._pcie_throughput(r, gpu, ts, v)
            r.put("memory_temperature_celsius", r.field_value("memory_temperature_celsius", NVML_FI_DEV_MEMORY_TEMP), v)
            r.scalars(_FAST_SCALARS, v)
            pstate = r.q("performance_state", "nvmlDeviceGetPerformanceState")
            if pstate == NVML_PSTATE_UNKNOWN:
                r.missing["performance_state"] = "unknown"
            else:
                r.put("performance_state", pstate, v)
            self._processes(r, v)
        if slow:
            self._slow(r, gpu, ts, v)
        return GpuSample.of(ts, gpu.uuid, gpu.index, r.missing, v)

    def _memory(self, r: _Reader, gpu: GpuIdentity, v: SampleValues) -> None:
        """Memory used/reserved/total through the API decided for this device since the last
        (re-)initialisation: v2 (driver-reserved memory apart) where the driver has it, else v1
        (whose ``used`` includes ~615 MiB reserved on the H200). A failed read is ``None`` for
        the tick — never a v1 value in a v2 series (a +615 MiB step a trend would take for a
        leak). A change of API across a re-initialisation is stored as an event."""
        api = self._mem_api.get(gpu.index)
        mem = None
        if api != "v1":
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
            if mem is not None and api is None:
                api = self._decide_memory_api(gpu, "v2")
            elif mem is None and api is None and r.missing.get("memory_used_bytes") in _PERMANENT_REASONS:
                api = self._decide_memory_api(gpu, "v1")
                r.missing.pop("memory_used_bytes", None)
        if api == "v1":
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo")
            r.missing["memory_reserved_bytes"] = "memory v2 not available"
        if mem is None:
            if "memory_used_bytes" in r.missing:
                r.missing.setdefault("memory_total_bytes", r.missing["memory_used_bytes"])
            return
        r.put("memory_total_bytes", r.get("memory_total_bytes", mem, "total"), v)
        limit = number_of(v, "memory_total_bytes", r.memory_limit)
        r.put("memory_used_bytes", r.get("memory_used_bytes", mem, "used"), v, limit=limit)
        if api == "v2":
            r.put("memory_reserved_bytes", r.get("memory_reserved_bytes", mem, "reserved"), v, limit=limit)

    @staticmethod
    def _utilization(r: _Reader, v: SampleValues) -> None:
        util = r.q("utilization_gpu_ratio", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            r.put("utilization_gpu_ratio", r.get("utilization_gpu_ratio", util, "gpu"), v, 0.01)
            r.put("utilization_memory_ratio", r.get("utilization_memory_ratio", util, "memory"), v, 0.01)
        elif "utilization_gpu_ratio" in r.missing:  # MIG mode: no device-level utilization
            r.missing["utilization_memory_ratio"] = r.missing["utilization_gpu_ratio"]

    def _decide_memory_api(self, gpu: GpuIdentity, api: str) -> str:
        self._mem_api[gpu.index] = api
        before = self._mem_api_of.get(gpu.uuid)
        self._mem_api_of[gpu.uuid] = api
        if before is not None and before != api:
            log.warning("GPU %d (%s): memory API %s → %s (used memory %s driver-reserved memory from now on)",
                        gpu.index, gpu.uuid, before, api, "includes" if api == "v1" else "excludes")
            self._event("memory_api_changed", f"gpu:{gpu.uuid}", f"{before} → {api}")
        return api

    def _processes(self, r: _Reader, v: SampleValues) -> None:
        procs = r.q("processes", "nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return
        if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
            r.missing["processes"] = f"rejected: malformed answer {str(procs)[:40]!r}"
            r.rejected["processes"] += 1
            return
        _admit_processes(r, v, [(p.get("pid"), p.get("usedGpuMemory")) for p in procs])

    def _slow(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues) -> None:
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
        if self._minute_due:
            self._minute(r, gpu, ts, v)
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
        r.put("persistence_mode", r.q("persistence_mode", "nvmlDeviceGetPersistenceMode"), v)
        r.put("compute_mode", r.q("compute_mode", "nvmlDeviceGetComputeMode"), v)

    def _minute(self, r: _Reader, gpu: GpuIdentity, ts: float, v: SampleValues) -> None:
        """The minute set (``MINUTE_SECONDS``): the calls that cost the driver most CPU."""
        r.put("energy_joules_total", r.q("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption"), v, 1e-3)
        bar1 = r.q("bar1_used_bytes", "nvmlDeviceGetBAR1MemoryInfo")
        if bar1 is not None:
            r.put("bar1_total_bytes", r.get("bar1_total_bytes", bar1, "bar1Total"), v)
            r.put("bar1_used_bytes", r.get("bar1_used_bytes", bar1, "bar1Used"), v, limit=number_of(v, "bar1_total_bytes"))
        r.put("pcie_replay_total", r.q("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter"), v)
        replays = number_of(v, "pcie_replay_total")
        if replays is not None:
            stepped = gpu.uuid in self._replay_prev and self._replay_prev[gpu.uuid] is None
            prev = self._replay_prev.get(gpu.uuid)
            self._replay_prev[gpu.uuid] = (ts, replays)
            if stepped:
                r.missing["pcie_replay_rate_per_second"] = "wall-clock step"
            elif prev is not None and ts > prev[0]:
                if replays >= prev[1]:
                    v["pcie_replay_rate_per_second"] = (replays - prev[1]) / (ts - prev[0])
                else:  # driver reload or reset: the counter restarted; no negative rate
                    r.missing["pcie_replay_rate_per_second"] = "counter reset"
        for field, policy in (
            ("violation_power_seconds_total", NVML_PERF_POLICY_POWER),
            ("violation_thermal_seconds_total", NVML_PERF_POLICY_THERMAL),
        ):
            status = r.q(field, "nvmlDeviceGetViolationStatus", policy)
            r.put(field, r.get(field, status, "violationTime"), v, 1e-9)
        mig = r.q("mig_mode", "nvmlDeviceGetMigMode")
        if isinstance(mig, list) and mig:
            r.put("mig_mode", mig[0], v)
        elif mig is not None:
            r.get("mig_mode", mig, "")

    def _gpm(self, r: _Reader, gpu: GpuIdentity, v: SampleValues) -> None:
        watch = r.watch
        if watch is not None:
            watch.fn = "nvmlGpmSampleGet"
        try:
            metrics = self.backend.gpm(gpu.index, GPM_METRICS)
            if watch is not None and watch.generation != r.generation:
                watch.returned(gpu.index, "nvmlGpmSampleGet")
        except NvmlCallError as exc:
            if watch is not None and watch.generation != r.generation:
                watch.returned(gpu.index, "nvmlGpmSampleGet")
            self._gpm_failed(r, exc)
            return
        if metrics is None:  # first GPM sample of this device: no interval to average over yet
            for field in _GPM_FIELDS.values():
                r.missing[field] = "GPM: first sample, no interval yet"
            return
        spec, pcie_limit = r.spec, r.pcie_limit
        for metric_id, field in _GPM_FIELDS.items():
            value = metrics.get(metric_id)
            if isinstance(value, float):  # the common case, inline: a float inside the field's range
                lo, hi = spec[field][:2]
                if metric_id in _GPM_PCIE:  # MiB/s
                    x = value * _MIB
                    if lo <= x <= hi and (pcie_limit is None or x <= pcie_limit * (1 + 1e-6)):
                        v[field] = x
                        continue
                else:  # percent
                    x = value * 0.01
                    if lo <= x <= hi:
                        v[field] = x
                        continue
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif metric_id in _GPM_PCIE:
                r.put(field, value, v, _MIB, pcie_limit)
            else:
                r.put(field, value, v, 0.01)

    @staticmethod
    def _gpm_failed(r: _Reader, exc: NvmlCallError) -> None:
        """The GPM pair failed as a whole: its fields are ``None`` with the reason.

        Raises:
            DeviceDown: on a lifecycle error.
        """
        if exc.is_lifecycle:
            raise DeviceDown(exc) from None
        for field in _GPM_FIELDS.values():
            r.missing[field] = f"GPM: {exc.reason}"
