"""GPU fields: identity (``gpus``), per-tick samples (``gpu_samples``), per-process samples and XID
events. Order of ``SAMPLES`` is the column order of ``gpu_samples`` (new fields go last)."""

from __future__ import annotations

from vgpumon.catalogue.core import (
    BOOL,
    BYTES_PER_SECOND,
    CELSIUS,
    COUNT_MAX,
    HERTZ,
    INT16,
    INT32,
    INT64,
    JOULES,
    RATIO,
    SECONDS_MS,
    WATTS,
    Encoding,
    Field,
    text,
)

#: ``nvmlDeviceGetCurrentClocksEventReasons`` bits (nvml.h ``nvmlClocksEventReason*``; FACTS §2).
CLOCKS_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: ``nvmlDeviceGetPerformanceState``: P0 (fastest) … P15; 32 is ``NVML_PSTATE_UNKNOWN``.
PERFORMANCE_STATES: dict[int, str] = {i: f"P{i}" for i in range(16)}
#: ``nvmlDeviceGetComputeMode`` (``nvmlComputeMode_t``).
COMPUTE_MODES: dict[int, str] = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
#: ``nvmlDeviceGetMigMode`` current mode.
MIG_MODES: dict[int, str] = {0: "disabled", 1: "enabled"}
#: Where SM activity comes from: GPM (Hopper+), or the pre-Hopper busy-time proxy.
ACTIVITY_SOURCES: dict[str, int] = {"gpm": 1, "utilization": 2}

#: XID codes the exporter serves from the agent's start, at 0 until the first event, so that
#: ``increase()`` sees the first one (a counter series that starts at 1 hides its own rise, and
#: XID 79 — fallen off the bus — comes once). The codes NVIDIA's tooling and the alert allowlists
#: name (FACTS §4, §7); any other code is served from its first event on.
XID_NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

_GIB48 = float(2**48)  # 256 TiB: far above any GPU's memory (H200: 141 GB), far below a sentinel
_PCIE_MAX = 128e9 * 1.25  # Gen6 x16 raw rate × the 1.25 headroom: the bound when the link is unknown
_COUNT = dict(lo=0, hi=COUNT_MAX)


def _sample(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, **kw: object) -> Field:
    kw.setdefault("cadence", "fast")
    return Field(name=name, table="gpu_samples", kind=kind, unit=unit, help=help, source=source, encoding=encoding, **kw)  # type: ignore[arg-type]


def _ecc(name: str, kind_word: str, counter: str, where: str, smi: str, dcgm: str | None, nvml: str) -> Field:
    return _sample(
        name, "counter", "count",
        f"{kind_word.capitalize()} ECC errors, {counter}{where}.",
        nvml, INT64, cadence="slow", **_COUNT,
        prometheus=f"vgpumon_gpu_ecc_{name[len('ecc_'):-len('_total')]}_errors_total",
        smi=smi, dcgm=dcgm, display="count", label=f"ECC {kind_word} {counter}{where}",
    )


IDENTITY: tuple[Field, ...] = (
    Field(
        "uuid", "gpus", "info", "text", "GPU UUID: the GPU's identity in the store (with its host).",
        "nvmlDeviceGetUUID", "static", text(64), prom_label="uuid", smi="uuid", dcgm="UUID", label="UUID",
        required=True,
    ),
    Field(
        "name", "gpus", "info", "text", "Product name, e.g. NVIDIA H200.", "nvmlDeviceGetName", "static", text(96),
        prom_label="name", smi="name", dcgm="modelName",
    ),
    Field(
        "serial", "gpus", "info", "text", "Board serial number; None on boards without one.", "nvmlDeviceGetSerial",
        "static", text(64), prom_label="serial", smi="serial",
    ),
    Field(
        "pci_bus_id", "gpus", "info", "text", "PCI bus id (NVML form, 8-digit domain).", "nvmlDeviceGetPciInfo().busId",
        "static", text(32), prom_label="pci_bus_id", smi="pci.bus_id", dcgm="pci_bus_id", label="bus id",
    ),
    Field(
        "memory_total_bytes", "gpus", "info", "bytes", "Memory total as read at start.",
        "nvmlDeviceGetMemoryInfo().total", "static", INT64, lo=0, hi=_GIB48, smi="memory.total",
        label="memory total",
    ),
    Field(
        "pcie_link_gen_max", "gpus", "info", "generation", "Max PCIe generation of device and slot together.",
        "nvmlDeviceGetMaxPcieLinkGeneration", "static", INT16, lo=1, hi=7,
        prometheus="vgpumon_gpu_pcie_link_max_generation", smi="pcie.link.gen.max", label="PCIe max generation",
        note="device ∧ slot; the capacity denominator (FACTS §2)",
    ),
    Field(
        "pcie_link_width_max", "gpus", "info", "lanes", "Max PCIe width of device and slot together.",
        "nvmlDeviceGetMaxPcieLinkWidth", "static", INT16, lo=1, hi=32,
        prometheus="vgpumon_gpu_pcie_link_max_width", smi="pcie.link.width.max", label="PCIe max width",
    ),
    Field(
        "pcie_link_gen_gpu_max", "gpus", "info", "generation", "Max PCIe generation of the device alone.",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration", "static", INT16, lo=1, hi=7,
        prometheus="vgpumon_gpu_pcie_link_gpu_max_generation", smi="pcie.link.gen.gpumax", label="PCIe GPU max generation",
        note="above pcie_link_gen_max: the card sits in a slower slot",
    ),
    Field(
        "gpm_supported", "gpus", "info", "bool", "GPM (SM activity, PCIe bytes over the tick) is available.",
        "nvmlGpmQueryDeviceSupport", "static", BOOL, lo=0, hi=1, prom_label="gpm_supported", note="Hopper and newer",
        required=True,
    ),
    Field(
        "sm_clock_max_hertz", "gpus", "info", "hertz", "Max SM clock.", "nvmlDeviceGetMaxClockInfo(SM) MHz × 1e6",
        "static", HERTZ, lo=0, hi=10e9, prometheus="vgpumon_gpu_sm_clock_max_hertz", smi="clocks.max.sm",
        label="SM clock max",
    ),
    Field(
        "memory_clock_max_hertz", "gpus", "info", "hertz", "Max memory clock.",
        "nvmlDeviceGetMaxClockInfo(MEM) MHz × 1e6", "static", HERTZ, lo=0, hi=10e9,
        prometheus="vgpumon_gpu_memory_clock_max_hertz", smi="clocks.max.memory", label="memory clock max",
    ),
    Field(
        "slowdown_temperature_celsius", "gpus", "info", "celsius",
        "GPU temperature at which the driver starts to slow the clocks down (this GPU's own threshold).",
        "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) °C", "static", CELSIUS, lo=-40, hi=150,
        prometheus="vgpumon_gpu_slowdown_temperature_celsius", smi="-q: GPU Slowdown Temp",
        dcgm="DCGM_FI_DEV_SLOWDOWN_TEMP", label="slowdown temperature",
        note="the thermal rule's threshold: a fixed 85 °C pages daily on SKUs that run hot (FACTS §7)",
    ),
)

SAMPLES: tuple[Field, ...] = (
    _sample(
        "up", "state", "bool", "1 when the GPU answered this tick, 0 when it could not be read (lost, reset, wedged).",
        "every call of the tick", BOOL, lo=0, hi=1, prometheus="vgpumon_gpu_up", display="up_down", rollup=(),
        label="readable", required=True,
    ),
    _sample(
        "activity_source", "state", "code", "Where SM figures come from: gpm, or utilization (pre-Hopper proxy).",
        "nvmlGpmQueryDeviceSupport", Encoding("code", bits=16, codes=ACTIVITY_SOURCES), rollup=(), label="activity source",
    ),
    _sample(
        "memory_used_bytes", "gauge", "bytes", "Device memory used by processes (memory v2: driver-reserved excluded).",
        "nvmlDeviceGetMemoryInfo(v2).used; v1 used (reserved included) on drivers without v2", INT64, lo=0, hi=_GIB48,
        limit="memory_total", rollup=("min", "mean", "max", "p50", "p95", "p99"),
        prometheus="vgpumon_gpu_memory_used_bytes", otel="hw.gpu.memory.usage", smi="memory.used", dcgm="DCGM_FI_DEV_FB_USED",
        diagnose=("window", "last"), label="memory used",
    ),
    _sample(
        "memory_reserved_bytes", "gauge", "bytes", "Device memory the driver reserves.",
        "nvmlDeviceGetMemoryInfo(v2).reserved", INT64, lo=0, hi=_GIB48, limit="memory_total",
        prometheus="vgpumon_gpu_memory_reserved_bytes", smi="memory.reserved", dcgm="DCGM_FI_DEV_FB_RESERVED",
        diagnose=("last",), label="driver reserved",
    ),
    _sample(
        "memory_total_bytes", "gauge", "bytes", "Device memory total.", "nvmlDeviceGetMemoryInfo.total", INT64,
        lo=0, hi=_GIB48, rollup=("last",), prometheus="vgpumon_gpu_memory_total_bytes", otel="hw.gpu.memory.limit", smi="memory.total",
        dcgm="DCGM_FI_DEV_FB_TOTAL", diagnose=("last",), label="memory total",
    ),
    _sample(
        "utilization_gpu_ratio", "gauge", "ratio",
        "Share of time any kernel or copy ran (utilization.gpu): not SM activity; a copy reads 1.",
        "nvmlDeviceGetUtilizationRates().gpu % / 100", RATIO, lo=0, hi=1,
        rollup=("min", "mean", "max", "p50", "p95", "p99"), prometheus="vgpumon_gpu_utilization_ratio", otel="hw.gpu.utilization", otel_attrs={"hw.gpu.task": "general"},
        smi="utilization.gpu", dcgm="DCGM_FI_DEV_GPU_UTIL", diagnose=("window",), label="GPU util (busy time)",
        note="None under MIG",
    ),
    _sample(
        "utilization_memory_ratio", "gauge", "ratio", "Share of time device memory was read or written.",
        "nvmlDeviceGetUtilizationRates().memory % / 100", RATIO, lo=0, hi=1,
        prometheus="vgpumon_gpu_memory_utilization_ratio", smi="utilization.memory", dcgm="DCGM_FI_DEV_MEM_COPY_UTIL",
        label="memory util",
    ),
    _sample(
        "sm_active_ratio", "gauge", "ratio", "Share of SMs with work, averaged over the tick (GPM).",
        "GPM SM_UTIL (2) % / 100 over the tick", RATIO, lo=0, hi=1,
        rollup=("min", "mean", "max", "p50", "p95", "p99"), prometheus="vgpumon_gpu_sm_active_ratio",
        dcgm="DCGM_FI_PROF_SM_ACTIVE", diagnose=("window",), label="SM activity",
    ),
    _sample(
        "sm_occupancy_ratio", "gauge", "ratio", "Resident warps over the SMs' maximum, averaged over the tick (GPM).",
        "GPM SM_OCCUPANCY (3) % / 100", RATIO, lo=0, hi=1, prometheus="vgpumon_gpu_sm_occupancy_ratio",
        dcgm="DCGM_FI_PROF_SM_OCCUPANCY", diagnose=("window",), label="SM occupancy",
    ),
    _sample(
        "tensor_active_ratio", "gauge", "ratio", "Share of cycles any tensor pipe was active (GPM).",
        "GPM ANY_TENSOR_UTIL (5) % / 100", RATIO, lo=0, hi=1, prometheus="vgpumon_gpu_tensor_active_ratio",
        dcgm="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", diagnose=("window",), label="tensor activity",
    ),
    _sample(
        "dram_active_ratio", "gauge", "ratio", "Share of cycles the memory interface was busy (GPM).",
        "GPM DRAM_BW_UTIL (10) % / 100", RATIO, lo=0, hi=1, rollup=("min", "mean", "max", "p50", "p95", "p99"),
        prometheus="vgpumon_gpu_dram_active_ratio", dcgm="DCGM_FI_PROF_DRAM_ACTIVE", diagnose=("window",),
        label="DRAM activity",
    ),
    _sample(
        "pcie_tx_bytes_per_second", "gauge", "bytes_per_second",
        "PCIe bytes sent by the GPU per second, averaged over the tick (GPM), protocol overhead included.",
        "GPM PCIE_TX_PER_SEC (20) MiB/s × 2^20; without GPM nvmlDeviceGetPcieThroughput(TX) KB/s × 1000 "
        "(20 ms window, poller thread)", BYTES_PER_SECOND, lo=0, hi=_PCIE_MAX, limit="pcie_link",
        rollup=("min", "mean", "max", "p50", "p95", "p99"), prometheus="vgpumon_gpu_pcie_tx_bytes_per_second", otel="hw.gpu.io", otel_attrs={"network.io.direction": "transmit"},
        smi="-q: PCI Tx Throughput", dcgm="DCGM_FI_PROF_PCIE_TX_BYTES", diagnose=("window",), label="PCIe TX",
    ),
    _sample(
        "pcie_rx_bytes_per_second", "gauge", "bytes_per_second",
        "PCIe bytes received by the GPU per second, averaged over the tick (GPM), protocol overhead included.",
        "GPM PCIE_RX_PER_SEC (21) MiB/s × 2^20; without GPM nvmlDeviceGetPcieThroughput(RX) KB/s × 1000 "
        "(20 ms window, poller thread)", BYTES_PER_SECOND, lo=0, hi=_PCIE_MAX, limit="pcie_link",
        rollup=("min", "mean", "max", "p50", "p95", "p99"), prometheus="vgpumon_gpu_pcie_rx_bytes_per_second", otel="hw.gpu.io", otel_attrs={"network.io.direction": "receive"},
        smi="-q: PCI Rx Throughput", dcgm="DCGM_FI_PROF_PCIE_RX_BYTES", diagnose=("window",), label="PCIe RX",
    ),
    _sample(
        "pcie_link_gen_current", "gauge", "generation", "PCIe generation the link runs at now (down-trains when idle).",
        "nvmlDeviceGetCurrPcieLinkGeneration", INT16, lo=1, hi=7, prometheus="vgpumon_gpu_pcie_link_generation",
        smi="pcie.link.gen.current", dcgm="DCGM_FI_DEV_PCIE_LINK_GEN", diagnose=("last",), label="PCIe generation",
    ),
    _sample(
        "pcie_link_width_current", "gauge", "lanes", "PCIe lanes the link runs with now.",
        "nvmlDeviceGetCurrPcieLinkWidth", INT16, lo=1, hi=32, prometheus="vgpumon_gpu_pcie_link_width",
        smi="pcie.link.width.current", dcgm="DCGM_FI_DEV_PCIE_LINK_WIDTH", diagnose=("last",), label="PCIe width",
    ),
    _sample(
        "temperature_celsius", "gauge", "celsius", "GPU core temperature.", "nvmlDeviceGetTemperature(GPU) °C",
        CELSIUS, lo=-40, hi=150, rollup=("min", "mean", "max", "p50", "p95", "p99"),
        prometheus="vgpumon_gpu_temperature_celsius", smi="temperature.gpu", dcgm="DCGM_FI_DEV_GPU_TEMP",
        diagnose=("window",), label="temperature",
    ),
    _sample(
        "power_watts", "gauge", "watts", "Power draw of the board.", "nvmlDeviceGetPowerUsage mW / 1000", WATTS,
        lo=0, hi=5000, rollup=("min", "mean", "max", "p50", "p95", "p99"), prometheus="vgpumon_gpu_power_usage_watts", otel="hw.power",
        smi="power.draw", dcgm="DCGM_FI_DEV_POWER_USAGE", diagnose=("window",), label="power",
        note="5 kW bound: above any board (H200 700 W, GB300 1.4 kW)",
    ),
    _sample(
        "sm_clock_hertz", "gauge", "hertz", "SM clock.", "nvmlDeviceGetClockInfo(SM) MHz × 1e6", HERTZ, lo=0, hi=10e9,
        prometheus="vgpumon_gpu_sm_clock_hertz", smi="clocks.sm", dcgm="DCGM_FI_DEV_SM_CLOCK", diagnose=("window",),
        label="SM clock",
    ),
    _sample(
        "memory_clock_hertz", "gauge", "hertz", "Memory clock.", "nvmlDeviceGetClockInfo(MEM) MHz × 1e6", HERTZ,
        lo=0, hi=10e9, prometheus="vgpumon_gpu_memory_clock_hertz", smi="clocks.mem", dcgm="DCGM_FI_DEV_MEM_CLOCK",
        label="memory clock",
    ),
    _sample(
        "clocks_event_reasons", "bitmask", "code", "Why clocks are below their maximum (bits decoded by name).",
        "nvmlDeviceGetCurrentClocksEventReasons", INT64, lo=0, hi=2**32 - 2, decode=CLOCKS_EVENT_REASONS,
        prometheus="vgpumon_gpu_clocks_event_reason_active", smi="clocks_event_reasons.active",
        dcgm="DCGM_FI_DEV_CLOCKS_EVENT_REASONS", display="bits", label="clocks event reasons",
        note="exported as one 0/1 series per known reason (label reason); rolled up as the OR of the minute",
    ),
    _sample(
        "ecc_corrected_volatile_total", "counter", "count",
        "Corrected (single-bit) ECC errors since the driver loaded.",
        "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)", INT64, cadence="slow", **_COUNT,
        prometheus="vgpumon_gpu_ecc_corrected_volatile_errors_total", otel="hw.errors", otel_attrs={"error.type": "ecc_corrected"}, smi="ecc.errors.corrected.volatile.total",
        dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", display="count", diagnose=("cumulative",), label="ECC corrected volatile",
    ),
    _sample(
        "ecc_uncorrected_volatile_total", "counter", "count",
        "Uncorrected (double-bit) ECC errors since the driver loaded: any is a reason to drain and reset.",
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)", INT64, cadence="slow", **_COUNT,
        prometheus="vgpumon_gpu_ecc_uncorrected_volatile_errors_total", otel="hw.errors", otel_attrs={"error.type": "ecc_uncorrected"}, smi="ecc.errors.uncorrected.volatile.total",
        dcgm="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", display="count", diagnose=("cumulative",),
        label="ECC uncorrected volatile",
    ),
    _sample(
        "ecc_corrected_aggregate_total", "counter", "count", "Corrected ECC errors over the board's life.",
        "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)", INT64, cadence="slow", **_COUNT,
        prometheus="vgpumon_gpu_ecc_corrected_aggregate_errors_total", smi="ecc.errors.corrected.aggregate.total",
        dcgm="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", display="count", diagnose=("cumulative",), label="ECC corrected aggregate",
    ),
    _sample(
        "ecc_uncorrected_aggregate_total", "counter", "count", "Uncorrected ECC errors over the board's life.",
        "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)", INT64, cadence="slow", **_COUNT,
        prometheus="vgpumon_gpu_ecc_uncorrected_aggregate_errors_total", smi="ecc.errors.uncorrected.aggregate.total",
        dcgm="DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", display="count", diagnose=("cumulative",),
        label="ECC uncorrected aggregate",
    ),
    _sample(
        "energy_joules_total", "counter", "joules", "Energy the board used since the driver loaded.",
        "nvmlDeviceGetTotalEnergyConsumption mJ / 1000", JOULES, cadence="minute", lo=0, hi=COUNT_MAX / 1000,
        prometheus="vgpumon_gpu_energy_joules_total", otel="hw.energy", dcgm="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", label="energy",
        note="2.8–3.3 ms of CPU per call on the H200 (FACTS §1): read each minute",
    ),
    _sample(
        "performance_state", "enum", "code", "Performance state: P0 (fastest) to P15.",
        "nvmlDeviceGetPerformanceState", INT16, lo=0, hi=15, decode=PERFORMANCE_STATES,
        prometheus="vgpumon_gpu_performance_state", smi="pstate", dcgm="DCGM_FI_DEV_PSTATE", display="decoded",
        label="P-state", note="32 (NVML_PSTATE_UNKNOWN) is None with reason 'unknown'",
    ),
    _sample(
        "fan_speed_ratio", "gauge", "ratio", "Fan speed as a share of its maximum.", "nvmlDeviceGetFanSpeed % / 100",
        RATIO, lo=0, hi=1, prometheus="vgpumon_gpu_fan_speed_ratio", smi="fan.speed", dcgm="DCGM_FI_DEV_FAN_SPEED",
        label="fan", note="None on passively cooled boards (H200)",
    ),
    _ecc("ecc_corrected_volatile_dram_total", "corrected", "volatile", " in DRAM", "ecc.errors.corrected.volatile.dram",
         None, "nvmlDeviceGetMemoryErrorCounter(CORRECTED, VOLATILE, DRAM)"),
    _ecc("ecc_uncorrected_volatile_dram_total", "uncorrected", "volatile", " in DRAM",
         "ecc.errors.uncorrected.volatile.dram", None, "nvmlDeviceGetMemoryErrorCounter(UNCORRECTED, VOLATILE, DRAM)"),
    _ecc("ecc_corrected_volatile_sram_total", "corrected", "volatile", " in SRAM", "ecc.errors.corrected.volatile.sram",
         None, "nvmlDeviceGetMemoryErrorCounter(CORRECTED, VOLATILE, SRAM)"),
    _ecc("ecc_uncorrected_volatile_sram_total", "uncorrected", "volatile", " in SRAM",
         "ecc.errors.uncorrected.volatile.sram", None, "nvmlDeviceGetMemoryErrorCounter(UNCORRECTED, VOLATILE, SRAM)"),
    _sample(
        "bar1_used_bytes", "gauge", "bytes", "BAR1 (host-visible device memory window) in use.",
        "nvmlDeviceGetBAR1MemoryInfo().bar1Used", INT64, cadence="minute", lo=0, hi=_GIB48,
        prometheus="vgpumon_gpu_bar1_used_bytes", smi="-q: BAR1 Memory Usage Used", dcgm="DCGM_FI_DEV_BAR1_USED",
        label="BAR1 used",
    ),
    _sample(
        "bar1_total_bytes", "gauge", "bytes", "BAR1 size.", "nvmlDeviceGetBAR1MemoryInfo().bar1Total", INT64,
        cadence="minute", lo=0, hi=_GIB48, rollup=("last",), prometheus="vgpumon_gpu_bar1_total_bytes",
        dcgm="DCGM_FI_DEV_BAR1_TOTAL", label="BAR1 total",
    ),
    _sample(
        "pcie_replay_total", "counter", "count", "PCIe replays (link-level retransmissions) since reset.",
        "nvmlDeviceGetPcieReplayCounter", INT64, cadence="minute", **_COUNT, prometheus="vgpumon_gpu_pcie_replays_total",
        smi="-q: Replays Since Reset", dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER", display="count", diagnose=("cumulative",),
        label="PCIe replays", note="DCGM's budget per minute: Gen3 8, Gen4 16, Gen5 31 (x16; FACTS §4)",
    ),
    _sample(
        "remapped_rows_correctable_total", "counter", "count", "Rows remapped after correctable errors.",
        "nvmlDeviceGetRemappedRows()[0]", INT32, cadence="slow", lo=0, hi=2**31 - 1,
        prometheus="vgpumon_gpu_remapped_rows_correctable_total", smi="remapped_rows.correctable",
        dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", display="count", label="remapped rows (correctable)",
        note="Ampere and newer",
    ),
    _sample(
        "remapped_rows_uncorrectable_total", "counter", "count", "Rows remapped after uncorrectable errors.",
        "nvmlDeviceGetRemappedRows()[1]", INT32, cadence="slow", lo=0, hi=2**31 - 1,
        prometheus="vgpumon_gpu_remapped_rows_uncorrectable_total", smi="remapped_rows.uncorrectable",
        dcgm="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", display="count", diagnose=("cumulative",),
        label="remapped rows (uncorrectable)", note="≥ 512: warning (FACTS §4)",
    ),
    _sample(
        "remapped_rows_pending", "flag", "bool", "A row remap waits for a GPU reset.",
        "nvmlDeviceGetRemappedRows()[2]", BOOL, cadence="slow", lo=0, hi=1,
        prometheus="vgpumon_gpu_remapped_rows_pending", smi="remapped_rows.pending",
        dcgm="DCGM_FI_DEV_ROW_REMAP_PENDING", diagnose=("cumulative",), label="row remap pending",
    ),
    _sample(
        "remapped_rows_failure", "flag", "bool", "A row remap failed: the GPU needs replacing.",
        "nvmlDeviceGetRemappedRows()[3]", BOOL, cadence="slow", lo=0, hi=1,
        prometheus="vgpumon_gpu_remapped_rows_failure", smi="remapped_rows.failure",
        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE", diagnose=("cumulative",), label="row remap failure",
    ),
    _sample(
        "retired_pages_single_bit_total", "counter", "count", "Pages retired after multiple single-bit errors.",
        "len(nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT_ECC_ERRORS))", INT32, cadence="slow", lo=0, hi=2**31 - 1,
        prometheus="vgpumon_gpu_retired_pages_single_bit_total", smi="retired_pages.sbe", dcgm="DCGM_FI_DEV_RETIRED_SBE",
        display="count", label="retired pages (SBE)", note="pre-Ampere only",
    ),
    _sample(
        "retired_pages_double_bit_total", "counter", "count", "Pages retired after a double-bit error.",
        "len(nvmlDeviceGetRetiredPages(DOUBLE_BIT_ECC_ERROR))", INT32, cadence="slow", lo=0, hi=2**31 - 1,
        prometheus="vgpumon_gpu_retired_pages_double_bit_total", smi="retired_pages.dbe", dcgm="DCGM_FI_DEV_RETIRED_DBE",
        display="count", label="retired pages (DBE)", note="pre-Ampere only; ≥ 63 total: fail (FACTS §4)",
    ),
    _sample(
        "retired_pages_pending", "flag", "bool", "A page retirement waits for a reboot.",
        "nvmlDeviceGetRetiredPagesPendingStatus", BOOL, cadence="slow", lo=0, hi=1,
        prometheus="vgpumon_gpu_retired_pages_pending", smi="retired_pages.pending", dcgm="DCGM_FI_DEV_RETIRED_PENDING",
        label="page retirement pending", note="pre-Ampere only",
    ),
    _sample(
        "power_limit_watts", "gauge", "watts", "Power limit the driver enforces.",
        "nvmlDeviceGetEnforcedPowerLimit mW / 1000", WATTS, cadence="slow", lo=0, hi=5000, rollup=("last",),
        prometheus="vgpumon_gpu_power_limit_watts", smi="enforced.power.limit", dcgm="DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        label="power limit",
    ),
    _sample(
        "violation_power_seconds_total", "counter", "seconds", "Time clocks were held down by the power limit.",
        "nvmlDeviceGetViolationStatus(POWER).violationTime ns / 1e9", SECONDS_MS, cadence="minute", lo=0,
        hi=COUNT_MAX / 1000, prometheus="vgpumon_gpu_power_violation_seconds_total",
        smi="clocks_event_reasons_counters.sw_power_cap", dcgm="DCGM_FI_DEV_POWER_VIOLATION",
        label="power violation time",
    ),
    _sample(
        "violation_thermal_seconds_total", "counter", "seconds", "Time clocks were held down by temperature.",
        "nvmlDeviceGetViolationStatus(THERMAL).violationTime ns / 1e9", SECONDS_MS, cadence="minute", lo=0,
        hi=COUNT_MAX / 1000, prometheus="vgpumon_gpu_thermal_violation_seconds_total",
        smi="clocks_event_reasons_counters.sw_thermal_slowdown", dcgm="DCGM_FI_DEV_THERMAL_VIOLATION",
        label="thermal violation time",
    ),
    _sample(
        "persistence_mode", "flag", "bool", "The driver stays loaded without clients.", "nvmlDeviceGetPersistenceMode",
        BOOL, cadence="slow", lo=0, hi=1, rollup=("last",), prometheus="vgpumon_gpu_persistence_mode",
        smi="persistence_mode", label="persistence mode",
    ),
    _sample(
        "compute_mode", "enum", "code", "Compute mode: default, exclusive_process or prohibited.",
        "nvmlDeviceGetComputeMode", INT16, cadence="slow", lo=0, hi=3, decode=COMPUTE_MODES,
        prometheus="vgpumon_gpu_compute_mode", smi="compute_mode", display="decoded", label="compute mode",
    ),
    _sample(
        "mig_mode", "enum", "code", "MIG mode (current).", "nvmlDeviceGetMigMode()[0]", INT16, cadence="minute",
        lo=0, hi=1, decode=MIG_MODES, prometheus="vgpumon_gpu_mig_mode", smi="mig.mode.current",
        dcgm="DCGM_FI_DEV_MIG_MODE", display="decoded", label="MIG mode",
    ),
    _sample(
        "memory_temperature_celsius", "gauge", "celsius", "HBM (device memory) temperature.",
        "nvmlDeviceGetFieldValues([NVML_FI_DEV_MEMORY_TEMP (82)]) °C, the entry's own nvmlReturn checked", CELSIUS,
        lo=-40, hi=150, prometheus="vgpumon_gpu_memory_temperature_celsius", smi="temperature.memory",
        dcgm="DCGM_FI_DEV_MEMORY_TEMP", label="memory temperature",
        note="a one-id field-values call costs ~2 µs on the H200 (FACTS §1); None where the board has no HBM sensor",
    ),
)

DERIVED: tuple[Field, ...] = (
    Field(
        "pcie_replay_rate_per_second", None, "derived", "per_second",
        "PCIe replays per second since the previous read; None after a counter reset.",
        "Δ pcie_replay_total / Δt", "minute", Encoding("fixed", 1_000), lo=0, hi=COUNT_MAX,
        label="PCIe replay rate", note="not stored: the store keeps the counter",
    ),
)

PROCESSES: tuple[Field, ...] = (
    Field(
        "used_gpu_memory_bytes", "gpu_process_samples", "gauge", "bytes", "GPU memory a process holds on one GPU.",
        "nvmlDeviceGetComputeRunningProcesses()[].usedGpuMemory", "host", INT64, lo=0, hi=_GIB48,
        limit="memory_total", prometheus="vgpumon_gpu_process_memory_used_bytes",
        smi="--query-compute-apps=used_memory", label="GPU memory", note="None where the driver withholds it",
    ),
    Field(
        "rss_bytes", "gpu_process_samples", "gauge", "bytes", "Resident host memory of a GPU process.",
        "psutil.Process.memory_info().rss", "host", INT64, lo=0, hi=_GIB48,
        prometheus="vgpumon_gpu_process_resident_memory_bytes", label="RSS",
    ),
    Field(
        "cpu_seconds_total", "gpu_process_samples", "counter", "seconds", "CPU time (user + system) of a GPU process.",
        "psutil.Process.cpu_times() user + system", "host", SECONDS_MS, lo=0, hi=COUNT_MAX / 1000,
        prometheus="vgpumon_gpu_process_cpu_seconds_total", label="CPU time",
    ),
)

EVENTS: tuple[Field, ...] = (
    Field(
        "xid", "xid_events", "event", "code", "XID events (driver-reported GPU errors) by code; every event is stored.",
        "nvmlEventSetWait(nvmlEventTypeXidCriticalError), waiter thread", "event", INT32, lo=0, hi=2**31 - 1,
        prometheus="vgpumon_gpu_xid_events_total", prom_type="counter", dcgm="DCGM_FI_DEV_XID_ERRORS",
        display="code", label="XID", required=True,
        note="a counter per code (label xid), never a 'last XID' gauge; the codes of XID_NAMES are served at 0 "
        "from the agent's start so that increase() sees their first event",
    ),
)
