"""The one catalogue of GPU fields: name, unit, NVML call, ``nvidia-smi`` field, cadence.

``docs/metrics.md`` is generated from it (``python -m vgpumon.catalogue > docs/metrics.md``) and a
test fails when the two differ or when a ``GpuSample``/``GpuIdentity`` field has no entry.
Prometheus names follow ``vgpumon_gpu_<field>`` (counters end in ``_total``; static facts are
labels of ``vgpumon_gpu_info``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One field: where it comes from and how often it is read."""

    name: str
    unit: str
    nvml: str
    smi: str
    cadence: str  # fast | slow | static | derived
    note: str = ""


FAST, SLOW, STATIC, DERIVED = "fast (every tick)", "slow (every N ticks)", "static (start, re-init)", "derived"

FIELDS: tuple[Field, ...] = (
    # identity
    Field("uuid", "—", "nvmlDeviceGetUUID", "uuid", STATIC, "store identity of a GPU"),
    Field("name", "—", "nvmlDeviceGetName", "name", STATIC),
    Field("serial", "—", "nvmlDeviceGetSerial", "serial", STATIC),
    Field("pci_bus_id", "—", "nvmlDeviceGetPciInfo().busId", "pci.bus_id", STATIC),
    Field("pcie_link_gen_max", "generation", "nvmlDeviceGetMaxPcieLinkGeneration", "pcie.link.gen.max", STATIC, "device ∧ slot"),
    Field("pcie_link_width_max", "lanes", "nvmlDeviceGetMaxPcieLinkWidth", "pcie.link.width.max", STATIC, "device ∧ slot"),
    Field("pcie_link_gen_gpu_max", "generation", "nvmlDeviceGetGpuMaxPcieLinkGeneration", "pcie.link.gen.gpumax", STATIC, "device alone; above gen_max = slower slot"),
    Field("gpm_supported", "bool", "nvmlGpmQueryDeviceSupport", "—", STATIC, "Hopper and newer"),
    Field("sm_clock_max_hertz", "Hz", "nvmlDeviceGetMaxClockInfo(SM)", "clocks.max.sm", STATIC),
    Field("memory_clock_max_hertz", "Hz", "nvmlDeviceGetMaxClockInfo(MEM)", "clocks.max.memory", STATIC),
    # fast set
    Field("memory_used_bytes", "bytes", "nvmlDeviceGetMemoryInfo(v2).used", "memory.used", FAST, "v2 excludes driver-reserved memory; v1 fallback includes it"),
    Field("memory_reserved_bytes", "bytes", "nvmlDeviceGetMemoryInfo(v2).reserved", "memory.reserved", FAST),
    Field("memory_total_bytes", "bytes", "nvmlDeviceGetMemoryInfo.total", "memory.total", FAST),
    Field("utilization_gpu_ratio", "ratio", "nvmlDeviceGetUtilizationRates.gpu", "utilization.gpu", FAST, "time any kernel or copy ran — not SM activity; None under MIG"),
    Field("utilization_memory_ratio", "ratio", "nvmlDeviceGetUtilizationRates.memory", "utilization.memory", FAST),
    Field("activity_source", "—", "—", "—", FAST, "gpm, or utilization (pre-Hopper proxy)"),
    Field("sm_active_ratio", "ratio", "GPM SM_UTIL (2) over the tick", "—", FAST, "DCGM SM_ACTIVE"),
    Field("sm_occupancy_ratio", "ratio", "GPM SM_OCCUPANCY (3)", "—", FAST, "DCGM SM_OCCUPANCY"),
    Field("tensor_active_ratio", "ratio", "GPM ANY_TENSOR_UTIL (5)", "—", FAST, "DCGM PIPE_TENSOR_ACTIVE"),
    Field("dram_active_ratio", "ratio", "GPM DRAM_BW_UTIL (10)", "—", FAST, "DCGM DRAM_ACTIVE"),
    Field("pcie_tx_bytes_per_second", "bytes/s", "GPM PCIE_TX_PER_SEC (20) × 2^20; without GPM nvmlDeviceGetPcieThroughput(TX) × 1000 (poller thread)", "-q: PCI Tx Throughput (KB/s, 20 ms)", FAST, "GPM: average over the whole tick"),
    Field("pcie_rx_bytes_per_second", "bytes/s", "GPM PCIE_RX_PER_SEC (21) × 2^20; without GPM nvmlDeviceGetPcieThroughput(RX) × 1000 (poller thread)", "-q: PCI Rx Throughput (KB/s, 20 ms)", FAST, "GPM: average over the whole tick"),
    Field("pcie_link_gen_current", "generation", "nvmlDeviceGetCurrPcieLinkGeneration", "pcie.link.gen.current", FAST, "down-trains when idle"),
    Field("pcie_link_width_current", "lanes", "nvmlDeviceGetCurrPcieLinkWidth", "pcie.link.width.current", FAST),
    Field("temperature_celsius", "°C", "nvmlDeviceGetTemperature(GPU)", "temperature.gpu", FAST),
    Field("power_watts", "W", "nvmlDeviceGetPowerUsage / 1000", "power.draw", FAST),
    Field("sm_clock_hertz", "Hz", "nvmlDeviceGetClockInfo(SM) × 1e6", "clocks.sm", FAST),
    Field("memory_clock_hertz", "Hz", "nvmlDeviceGetClockInfo(MEM) × 1e6", "clocks.mem", FAST),
    Field("clocks_event_reasons", "bitmask", "nvmlDeviceGetCurrentClocksEventReasons", "clocks_event_reasons.active", FAST, "GpuIdle 0x1 … HwPowerBrake 0x80"),
    Field("performance_state", "P-state", "nvmlDeviceGetPerformanceState", "pstate", FAST),
    Field("fan_speed_ratio", "ratio", "nvmlDeviceGetFanSpeed / 100", "fan.speed", FAST, "None on passively cooled boards"),
    Field("processes", "pid, bytes", "nvmlDeviceGetComputeRunningProcesses", "--query-compute-apps=pid,used_memory", FAST, "garbage PIDs (0, 4294967295) rejected"),
    # slow set
    Field("ecc_corrected_volatile_total", "count", "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)", "ecc.errors.corrected.volatile.total", SLOW),
    Field("ecc_uncorrected_volatile_total", "count", "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)", "ecc.errors.uncorrected.volatile.total", SLOW, "any > 0: drain and reset"),
    Field("ecc_corrected_aggregate_total", "count", "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)", "ecc.errors.corrected.aggregate.total", SLOW),
    Field("ecc_uncorrected_aggregate_total", "count", "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)", "ecc.errors.uncorrected.aggregate.total", SLOW),
    Field("ecc_corrected_volatile_dram_total", "count", "nvmlDeviceGetMemoryErrorCounter(CORRECTED, VOLATILE, DRAM)", "ecc.errors.corrected.volatile.dram", SLOW),
    Field("ecc_uncorrected_volatile_dram_total", "count", "nvmlDeviceGetMemoryErrorCounter(UNCORRECTED, VOLATILE, DRAM)", "ecc.errors.uncorrected.volatile.dram", SLOW),
    Field("ecc_corrected_volatile_sram_total", "count", "nvmlDeviceGetMemoryErrorCounter(CORRECTED, VOLATILE, SRAM)", "ecc.errors.corrected.volatile.sram", SLOW),
    Field("ecc_uncorrected_volatile_sram_total", "count", "nvmlDeviceGetMemoryErrorCounter(UNCORRECTED, VOLATILE, SRAM)", "ecc.errors.uncorrected.volatile.sram", SLOW),
    Field("remapped_rows_correctable_total", "rows", "nvmlDeviceGetRemappedRows[0]", "remapped_rows.correctable", SLOW, "Ampere and newer"),
    Field("remapped_rows_uncorrectable_total", "rows", "nvmlDeviceGetRemappedRows[1]", "remapped_rows.uncorrectable", SLOW, "≥ 512: warning"),
    Field("remapped_rows_pending", "bool", "nvmlDeviceGetRemappedRows[2]", "remapped_rows.pending", SLOW, "needs a reset"),
    Field("remapped_rows_failure", "bool", "nvmlDeviceGetRemappedRows[3]", "remapped_rows.failure", SLOW, "fail: replace"),
    Field("retired_pages_single_bit_total", "pages", "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT)", "retired_pages.sbe", SLOW, "pre-Ampere only"),
    Field("retired_pages_double_bit_total", "pages", "nvmlDeviceGetRetiredPages(DOUBLE_BIT)", "retired_pages.dbe", SLOW, "pre-Ampere only"),
    Field("retired_pages_pending", "bool", "nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages.pending", SLOW, "pre-Ampere only"),
    Field("bar1_used_bytes", "bytes", "nvmlDeviceGetBAR1MemoryInfo.bar1Used", "-q: BAR1 Memory Usage Used", SLOW),
    Field("bar1_total_bytes", "bytes", "nvmlDeviceGetBAR1MemoryInfo.bar1Total", "—", SLOW),
    Field("pcie_replay_total", "count", "nvmlDeviceGetPcieReplayCounter", "-q: Replays Since Reset", SLOW, "Gen5 x16 budget: 31/min"),
    Field("pcie_replay_rate_per_second", "1/s", "Δ pcie_replay_total / Δt", "—", DERIVED, "None after a counter reset"),
    Field("energy_joules_total", "J", "nvmlDeviceGetTotalEnergyConsumption / 1000", "—", SLOW, "since driver load; 3.3 ms per call"),
    Field("power_limit_watts", "W", "nvmlDeviceGetEnforcedPowerLimit / 1000", "enforced.power.limit", SLOW),
    Field("violation_power_seconds_total", "s", "nvmlDeviceGetViolationStatus(POWER).violationTime / 1e9", "clocks_event_reasons_counters.sw_power_cap", SLOW),
    Field("violation_thermal_seconds_total", "s", "nvmlDeviceGetViolationStatus(THERMAL).violationTime / 1e9", "clocks_event_reasons_counters.sw_thermal_slowdown", SLOW),
    Field("persistence_mode", "bool", "nvmlDeviceGetPersistenceMode", "persistence_mode", SLOW),
    Field("compute_mode", "enum", "nvmlDeviceGetComputeMode", "compute_mode", SLOW),
    Field("mig_mode", "enum", "nvmlDeviceGetMigMode[current]", "mig.mode.current", SLOW),
    # events
    Field("xid_counts", "count per code", "nvmlEventSetWait (XidCriticalError), waiter thread", "—", "event", "every event stored with its time; never a 'last XID' value"),
    Field("xid_last_seen", "s (epoch)", "nvmlEventSetWait", "—", "event"),
)


def render_markdown() -> str:
    """The metrics reference as Markdown (the content of ``docs/metrics.md``)."""
    lines = [
        "# GPU metrics reference",
        "",
        "Generated from `vgpumon/catalogue.py` by `python -m vgpumon.catalogue > docs/metrics.md`;",
        "do not edit by hand. Units are base units; `None` (NULL in the store) means not known, with",
        "the reason kept in the sample. Cadence: fast = every tick (default 1 s), slow = every",
        "`--slow-every` ticks (default 10), static = at start and after a re-initialisation.",
        "",
        "| field | unit | NVML call | nvidia-smi field | cadence | note |",
        "|---|---|---|---|---|---|",
    ]
    for f in FIELDS:
        lines.append(f"| `{f.name}` | {f.unit} | `{f.nvml}` | `{f.smi}` | {f.cadence} | {f.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
