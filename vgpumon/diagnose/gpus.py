"""Per GPU, what the store says about the report's window (pure data): SM activity and utilization
side by side, memory, PCIe against the max link, ECC, temperature, power, clocks, and health per
area in the spirit of NVIDIA's DCGM health watches (PASS / WARN / FAIL).

Values are in base units; ``None`` where unknown, with the reason under the GPU's ``unknown``.
"""

from __future__ import annotations

from typing import Mapping

from vgpumon import catalogue
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.diagnose.schema import AreaHealth, Ecc, GpuBlock, GpuPcie, HealthStatus, PcieDirection, PcieHopEntry
from vgpumon.model import PcieTopology
from vgpumon.store import Store, StoredGpu

_REPORTED = catalogue.fields_of("gpu_samples")
#: Columns summarised as mean and max over the window (catalogue: ``diagnose`` has ``window``).
WINDOW_COLUMNS = tuple(f.name for f in _REPORTED if "window" in f.diagnose)
#: Columns reported as their newest value (``last``: in the window; ``cumulative``: at or before
#: its end — counters and latched flags the slow set reads every few ticks).
LAST_COLUMNS = tuple(f.name for f in _REPORTED if {"last", "cumulative"} & set(f.diagnose))
CUMULATIVE = frozenset(f.name for f in _REPORTED if "cumulative" in f.diagnose)

#: Health areas of a GPU and the rules that judge each (DCGM's health watches group by system:
#: PCIe, memory, thermal, power, driver/XID; "readable" is ours: whether NVML can read the GPU
#: at all). Rules about how a GPU is used (memory nearly full, held idle, leaks, saturation by
#: load) are findings, not health. ``tests/cli/test_diagnose.py`` checks that every GPU rule is
#: placed in an area or in ``NOT_HEALTH``.
HEALTH_AREAS: dict[str, tuple[str, ...]] = {
    "readable": ("GpuLost", "GpuUnreadable", "GpuMissing", "GpuStuck"),
    "memory": ("GpuEccUncorrectable", "GpuRowRemapFailed", "GpuRowRemapPending", "GpuRemappedRowsHigh"),
    "pcie": ("GpuPcieLinkDegraded", "GpuPcieSlotSlower", "GpuPcieReplaysHigh"),
    "thermal": ("GpuThermalSlowdown",),
    "power": ("GpuPowerBrakeSlowdown",),
    "xid": ("GpuXidCritical", "GpuXidWarning", "GpuXidOther", "GpuXidRepeated"),
}
# GpuStraggler compares a GPU with its siblings under production load: a finding about the
# host's balance, not a verdict on the board's own health (docs/rules.md, "Stragglers");
# VgpumonCollectorFault is the collector's own fault: a finding about vgpumon, not the GPU
NOT_HEALTH = ("GpuMemoryNearlyFull", "GpuMemoryHeldIdle", "GpuMemoryLeak", "GpuProcessMemoryLeak", "GpuPcieSaturated",
              "GpuStraggler", "VgpumonCollectorFault")
_AREA_OF = {rule: area for area, rules in HEALTH_AREAS.items() for rule in rules}


def rejected_reason(item: tuple[int, str] | None) -> str | None:
    """``reported impossible values N times (reason)`` for a field refused at the door."""
    if item is None:
        return None
    count, reason = item
    return f"reported impossible values {count} times ({reason})"


def pcie_path(topology: PcieTopology, uuid: str, index_of: Mapping[str, int]) -> list[PcieHopEntry]:
    """The GPU's PCIe path (GPU first) with, per upstream hop, the other GPUs that share it."""
    out: list[PcieHopEntry] = []
    for hop in topology.path(uuid):
        others = [index_of[u] for u in topology.gpus_below(hop.bdf) if u != uuid and u in index_of]
        out.append(
            {
                "bdf": hop.bdf,
                "kind": hop.kind,
                "link_current": {"generation": hop.link_gen_current, "width": hop.link_width_current},
                "link_max": {"generation": hop.link_gen_max, "width": hop.link_width_max},
                "capacity_bytes_per_second": link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max),
                "shared_with_gpus": sorted(others),
            }
        )
    return out


def gpu_block(
    store: Store,
    gpu: StoredGpu,
    start: float,
    end: float,
    agg: Mapping[str, float | None],
    *,
    topology: PcieTopology | None = None,
    index_of: Mapping[str, int] | None = None,
    rejected: Mapping[str, tuple[int, str]] | None = None,
    down: tuple[float, str] | None = None,
    last: Mapping[str, tuple[float, float | None] | None] | None = None,
    xid_counts: dict[str, int] | None = None,
    rules_unknown: dict[str, str] | None = None,
    areas: dict[str, AreaHealth] | None = None,
    rules_not_applicable: dict[str, str] | None = None,
) -> GpuBlock:
    """One GPU's block of the report.

    Args:
        store: an open store.
        gpu: the GPU.
        start, end: the window (epoch seconds).
        agg: its ``window_aggregates_many`` row over ``WINDOW_COLUMNS``.
        topology: the host's ``PcieTopology`` (its path is listed), or ``None``.
        index_of: UUID → index of the host's GPUs (who shares a port).
        rejected: field → (count, reason) of values refused at the door in the window.
        down: ``(since, reason)`` when the GPU is unreadable at ``end``.
        last: its ``last_values`` of ``LAST_COLUMNS`` at ``end`` (read here when ``None``).
        xid_counts: XID code (as text) → its events on this GPU in the window.
        rules_unknown: rule → why it could not judge this GPU.
        rules_not_applicable: rule → why it does not apply to this GPU (no GPM, no ECC).
        areas: its health per area (``health``).

    Returns:
        The ``GpuBlock`` (JSON as it is); ``findings`` is filled in by the caller once the
        report's findings are ordered.
    """
    g = gpu.identity
    last = last if last is not None else store.last_values(gpu.id, end, LAST_COLUMNS)
    # counts of rows: the store gives integers (int() only tells the type checker so)
    n = int(agg["samples"] or 0)
    no_data = "no samples in window" if n == 0 else "not reported by this GPU in the window"
    rejected = rejected or {}

    def lv(name: str) -> float | None:
        # Cumulative counters (ECC, remapped rows, replays) are read by the slow set only every
        # few ticks: their newest reading up to the window's end is the current count even when
        # it is older than the window's start. Gauges must fall inside the window.
        item = last.get(name)
        if item is None:
            return None
        return item[1] if item[0] >= start or name in CUMULATIVE else None

    unknown: dict[str, str] = {}

    def flag(name: str) -> bool | None:
        value = lv(name)
        return None if value is None else bool(value)  # a Boolean column: bool already

    def stat(name: str, kind: str, reason: str | None = None) -> float | None:
        value = agg.get(f"{name}_{kind}")
        if value is None:
            unknown[f"{name}.{kind}"] = reason or rejected_reason(rejected.get(name)) or no_data
        return value

    # short: it is printed in a table cell; docs/diagnose.md says what GPM is and which GPUs have it
    no_gpm = "no GPM on this GPU"
    sm_reason = None if g.gpm_supported else no_gpm
    capacity = link_capacity_bytes_per_second(g.pcie_link_gen_max, g.pcie_link_width_max)

    def direction(name: str) -> PcieDirection:
        col = f"pcie_{name}_bytes_per_second"
        reason = None if g.gpm_supported else no_gpm
        mean, mx = stat(col, "mean", reason), stat(col, "max", reason)
        return {
            "mean_bytes_per_second": mean,
            "max_bytes_per_second": mx,
            "mean_share_of_max_link": None if mean is None or not capacity else mean / capacity,
            "max_share_of_max_link": None if mx is None or not capacity else mx / capacity,
        }

    path = pcie_path(topology, g.uuid, index_of or {}) if topology is not None else []
    tx = direction("tx")  # tx before rx: the order of their reasons under ``unknown``
    rx = direction("rx")
    pcie: GpuPcie = {
        "link_max": {"generation": g.pcie_link_gen_max, "width": g.pcie_link_width_max, "capacity_bytes_per_second": capacity},
        "link_current": {"generation": _int(lv("pcie_link_gen_current")), "width": _int(lv("pcie_link_width_current"))},
        "gpu_max_generation": g.pcie_link_gen_gpu_max,
        "path": path,
        "tx": tx,
        "rx": rx,
    }
    if capacity is None:
        unknown["pcie.link_max"] = "max link generation/width not reported"

    ecc: Ecc = {
        "corrected_volatile": lv("ecc_corrected_volatile_total"),
        "uncorrected_volatile": lv("ecc_uncorrected_volatile_total"),
        "corrected_aggregate": lv("ecc_corrected_aggregate_total"),
        "uncorrected_aggregate": lv("ecc_uncorrected_aggregate_total"),
    }
    for k in ("corrected_volatile", "uncorrected_volatile", "corrected_aggregate", "uncorrected_aggregate"):
        if ecc[k] is None:
            unknown[f"ecc.{k}"] = rejected_reason(rejected.get(f"ecc_{k}_total")) or (
                "ECC not reported (disabled or not supported)" if n else no_data
            )
    mem_last, mem_total = lv("memory_used_bytes"), lv("memory_total_bytes") or g.memory_total_bytes
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "serial": g.serial,
        "pci_bus_id": g.pci_bus_id,
        "samples": n,
        "up_samples": int(agg["up_samples"] or 0),
        "readable": {
            "now": down is None and n > 0,
            "since": down[0] if down else None,
            "reason": down[1] if down else (None if n else "no samples in window"),
        },
        # SM activity (GPM) and utilization side by side, never one standing in for the other:
        # a host→device copy reads utilization 100 % with the SMs at 0 % (FACTS §1)
        "sm_active": {
            "source": "gpm" if g.gpm_supported else None,
            "mean_ratio": stat("sm_active_ratio", "mean", sm_reason),
            "max_ratio": stat("sm_active_ratio", "max", sm_reason),
        },
        "utilization": {"mean_ratio": stat("utilization_gpu_ratio", "mean"), "max_ratio": stat("utilization_gpu_ratio", "max")},
        "sm_occupancy": {
            "mean_ratio": stat("sm_occupancy_ratio", "mean", sm_reason),
            "max_ratio": stat("sm_occupancy_ratio", "max", sm_reason),
        },
        "memory": {
            "used_last_bytes": mem_last,
            "used_max_bytes": stat("memory_used_bytes", "max"),
            "reserved_last_bytes": lv("memory_reserved_bytes"),
            "total_bytes": mem_total,
            "used_last_ratio": None if mem_last is None or not mem_total else mem_last / mem_total,
        },
        "pcie": pcie,
        "ecc": ecc,
        "temperature": {"mean_celsius": stat("temperature_celsius", "mean"), "max_celsius": stat("temperature_celsius", "max")},
        "power": {"mean_watts": stat("power_watts", "mean"), "max_watts": stat("power_watts", "max")},
        "sm_clock": {"mean_hertz": stat("sm_clock_hertz", "mean"), "max_hertz": stat("sm_clock_hertz", "max")},
        "remapped_rows": {
            "uncorrectable": lv("remapped_rows_uncorrectable_total"),
            "pending": flag("remapped_rows_pending"),
            "failure": flag("remapped_rows_failure"),
        },
        "rejected": {k: {"count": c, "reason": r} for k, (c, r) in sorted(rejected.items())},
        "findings": [],
        "unknown": unknown,
        "xid_counts": xid_counts if xid_counts is not None else {},
        "rules_unknown": rules_unknown if rules_unknown is not None else {},
        "rules_not_applicable": rules_not_applicable if rules_not_applicable is not None else {},
        "health": areas if areas is not None else {},
    }


def _int(value: float | None) -> int | None:
    """A stored integer column's value (the link generation and width) as the type checker
    knows it; the store gives an ``int`` already."""
    return None if value is None else int(value)


def health(states: Mapping[str, str], severities: Mapping[str, str], reasons: Mapping[str, str],
           down: str | None = None) -> dict[str, AreaHealth]:
    """Health per area of one GPU, as DCGM's health watches report it.

    Args:
        states: rule name → the GPU's state at the window's end: ``firing`` (an alert firing),
            ``pending``, ``ok``, ``unknown`` or ``n/a`` (the rule does not apply to this GPU).
        severities: rule name → severity (critical, warning, info).
        reasons: rule name → why it is unknown or does not apply.
        down: ``GPU lost`` or ``GPU unreadable`` when NVML cannot read the GPU at the window's
            end: its other areas would be judged from the readings before, which say nothing of
            it now, so those that would PASS are UNKNOWN with that reason; an area with a firing
            or pending alert keeps it (the alert is the agent's verdict, XID 79 beside a loss).

    Returns:
        area → ``{"status": "PASS"|"WARN"|"FAIL"|"UNKNOWN"|"N/A", "rules": {rule: state}, "reason": str | None}``:
        FAIL when a critical rule of the area fires, WARN when a warning rule fires or any rule
        is pending, PASS when no rule fires and at least one judged the GPU ok, N/A when no rule
        of the area applies to the GPU, UNKNOWN when every rule of the area lacks its inputs
        (the reason is the first one's).
    """
    out: dict[str, AreaHealth] = {}
    for area, rules in HEALTH_AREAS.items():
        here = {r: states[r] for r in rules if r in states}
        firing = [r for r, s in here.items() if s == "firing" and severities.get(r) != "info"]
        status: HealthStatus
        if any(severities.get(r) == "critical" for r in firing):
            status = "FAIL"
        elif firing or any(s == "pending" for s in here.values()):
            status = "WARN"
        elif any(s in ("ok", "firing") for s in here.values()):
            status = "PASS"
        elif here and all(s == "n/a" for s in here.values()):
            status = "N/A"  # no rule of the area applies to this GPU (a board without ECC): nothing is missing
        else:
            status = "UNKNOWN"
        reason = next((reasons[r] for r in rules if r in reasons and (status == "N/A" or here.get(r) != "n/a")), None) \
            if status in ("UNKNOWN", "N/A") else None
        if down is not None and area != "readable" and status in ("PASS", "UNKNOWN"):
            status, reason = "UNKNOWN", down
        out[area] = {"status": status, "rules": here, "reason": reason}
    return out


def area_of(rule: str) -> str | None:
    """The health area a rule belongs to, ``None`` for usage findings."""
    return _AREA_OF.get(rule)
