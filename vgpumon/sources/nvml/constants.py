"""NVML's constants the collector uses (repeated from pynvml, so that a replay needs no pynvml),
the GPM metric ids, the collector's own limits and cadences, and its errors."""

from __future__ import annotations

from vgpumon.sources.nvml.backend import (
    ERROR_NAMES,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NvmlCallError,
)

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

#: A difference this large between the wall clock's and the monotonic clock's advance over one
#: tick is a wall-clock step (NTP stepping, a VM resuming), not scheduling jitter.
CLOCK_STEP_SECONDS = 2.0

#: GPM PCIe cross-check (``NvmlSource._crosscheck``): GPM below this share of the throughput
#: call while the call reads above ``CROSSCHECK_MIN_BPS``, ``CROSSCHECK_STRIKES`` checks in a
#: row, is a collector fault. The call is polled for GPM GPUs every ``CROSSCHECK_POLL_SECONDS``.
CROSSCHECK_RATIO = 0.25

CROSSCHECK_MIN_BPS = 5e9

CROSSCHECK_STRIKES = 3

CROSSCHECK_POLL_SECONDS = 30.0

#: The minute set (catalogue cadence ``minute``) is read on the first slow tick at least this
#: many seconds (tick time, 5 % slack for jitter) after its last read: each minute at the
#: defaults, on every slow tick when those are further apart. Measured on the H200 (bench/nvml_call_cpu.py, CPU per
#: call): ``nvmlDeviceGetTotalEnergyConsumption`` 2.8 ms, ``nvmlDeviceGetViolationStatus`` 0.7 ms
#: per policy, ``nvmlDeviceGetPcieReplayCounter``, ``nvmlDeviceGetBAR1MemoryInfo`` and
#: ``nvmlDeviceGetMigMode`` about 0.17 ms each: 4.7 ms a GPU, at every slow tick 0.05 % of a core,
#: a quarter of the agent's whole CPU budget. Counters lose nothing by being read less often (the
#: energy or violation time over any window is still the difference of two reads); BAR1 and MIG
#: mode change with deployments, not within a minute. The ECC and remapped-row counters, which
#: page someone, stay in the slow set (a few µs each).
MINUTE_SECONDS = 60.0

CROSSCHECK_HISTORY = 64

#: A ``nvmlDeviceGetPcieThroughput`` reading older than this is not used for a tick.
PCIE_THROUGHPUT_MAX_AGE_S = 15.0

# Field-level answers that mean "this device will never answer this": cache them.
_PERMANENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})

_PERMANENT_REASONS = frozenset(ERROR_NAMES[c] for c in _PERMANENT)

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

class Abandoned(Exception):
    """Raised in a sampling thread the agent gave up on (it was stuck in a call): its tick was
    finished by another thread, so it must not touch the source's state any more."""
