"""Thresholds of the rules: one typed dataclass with defaults, loadable from a plain mapping (the
``[rules.thresholds]`` table of the settings file plugs in here: ``Thresholds.from_mapping(settings)``).
Defined in the settings package, below the rules, so that the settings check validates the table
with them; the rules (``vgpumon.rules``) read them from here.

Every default cites where it comes from. Units are base units (seconds, bytes, ratio 0–1,
celsius); durations may also be written as strings (``"5m"``, ``"6h"``, ``"90s"``, ``"2d"``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(value: object) -> float:
    """A duration in seconds from a number or a string such as ``"90s"``, ``"15m"``, ``"6h"``
    (``value`` as a file or a flag gave it: anything, checked here).

    Raises:
        ValueError: not a duration.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.fullmatch(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration (e.g. 90s, 15m, 6h)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _finite(value: object) -> TypeGuard[float]:
    """A real number that is neither NaN nor infinite (an int too large for a float is not)."""
    try:
        return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:
        return False


def _shown(value: object, is_duration: bool) -> str:
    """A value as an error shows it: durations as people write them (``45 d``, ``-1 min``)."""
    if not _finite(value):
        return repr(value)
    if is_duration:
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if abs(value) >= size and value % size == 0:
                return f"{value / size:g} {unit}"
        return f"{value:g} s"
    return f"{value:g}"


def _seconds_of(key: str, value: object) -> float:
    """``seconds(value)``, its error naming the key; a duration that is not finite
    (TOML's ``inf``, ``nan``) or does not fit a float is refused here."""
    try:
        out = seconds(value)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{key}: {exc}") from None
    if not math.isfinite(out):
        raise ValueError(f"{key}: {value!r} is not a duration (e.g. 90s, 15m, 6h)")
    return out


def _number_of(key: str, value: object, whole: bool) -> float | int:
    """A threshold's number from a parsed value: finite, and whole where the threshold counts
    (``*_polls``); its error names the key and the value as written."""
    written = repr(value) if len(repr(value)) <= 24 else f"{repr(value)[:12]}… ({len(repr(value))} characters)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: {written} is not a number")
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{key}: {written} is too large") from None
    if not math.isfinite(x):
        raise ValueError(f"{key}: {value!r} is not a finite number")
    if whole:
        if not x.is_integer():
            raise ValueError(f"{key}: {value!r} is not a whole number")
        return int(x)
    return x


#: Longest duration a threshold or ``for`` takes: a year (GpuMissing looks back a day by default).
_MAX_SECONDS = 366 * 86400.0


def _range_of(name: str) -> tuple[Callable[[float], bool], str]:
    """(test, words for the error) of a threshold, by the kind its name ends in. The ranges
    refuse what would silence a rule or is a unit slip (80 for 0.8), not unusual settings: a
    ratio of 0 compared with ``<=`` means "exactly idle", a byte floor of 0 "any"."""
    if name.endswith("_min_seconds"):  # a floor under a relative limit: 0 is no floor
        return (lambda v: 0 <= v <= _MAX_SECONDS), "not a duration from 0 s to 366 days"
    if name.endswith("_seconds"):
        return (lambda v: 0 < v <= _MAX_SECONDS), "not a duration above 0 s and at most 366 days"
    if name.endswith("_ratio"):
        return (lambda v: 0 <= v <= 1), "outside 0 ≤ x ≤ 1 (a ratio: 0.8 is 80 %)"
    if name.endswith("_factor"):
        return (lambda v: 1 <= v <= 1000), "outside 1 ≤ x ≤ 1000 (how many times slower)"
    if name.endswith("_celsius"):
        return (lambda v: -50 <= v <= 50), "outside −50 °C to 50 °C (a margin)"
    if name.endswith("_gpus") or name.endswith("_windows"):  # 1 would make every XID "spread" or "repeated"
        return (lambda v: 2 <= v <= 1024), "not a count from 2 to 1024"
    if name.endswith("_polls"):
        return (lambda v: 1 <= v <= 1000), "not a number of polls from 1 to 1000"
    if name.endswith("_bytes"):
        return (lambda v: 0 <= v <= 2**60), "not a number of bytes from 0 to 2^60"
    return (lambda v: 0 < v <= 1e18), "not above 0"


@dataclass(frozen=True)
class Thresholds:
    """What the rules compare with. Field names are the keys of the ``[rules.thresholds]`` settings table
    (docs/rules.md lists them with their rule).

    Attributes (by rule):
        xid_window_seconds: XIDs count as current for this long (10 min: nvidia_gpu_exporter's
            allowlist alert, FACTS §7).
        xid_burst_seconds: XID windows are this long (aligned to multiples of it): a code's
            events in one window count once (``GpuXidRepeated``, ``HostXidSpread``).
        xid_repeat_lookback_seconds: ``GpuXidRepeated`` looks back this far …
        xid_repeat_windows: … for this many windows with the same code on one GPU alone.
        xid_spread_gpus: the same code on this many GPUs of the host in one window is
            ``HostXidSpread`` (and such windows do not count as repeats).
        straggler_window_seconds: ``GpuStraggler`` compares the GPUs' means over this window …
        straggler_busy_utilization_ratio: … among the GPUs of one model busy at least this much
            (mean utilization) over all of it …
        straggler_min_gpus: … when at least this many are;
        straggler_clock_tolerance_ratio, straggler_power_tolerance_ratio,
        straggler_activity_tolerance_ratio: a GPU whose mean SM clock, power or SM activity
            departs from the median of them by more than this (above or below) is a straggler.
        lost_for_seconds: a GPU unreadable this long now is ``GpuLost``.
        unreadable_window_seconds: ``GpuUnreadable`` looks back this far for unreadable ticks.
        missing_after_seconds: a GPU registered for the host without a sample for this long,
            while another GPU of the host reports, is ``GpuMissing`` …
        missing_lookback_seconds: … if it reported within this lookback (a card taken out on
            purpose stops being expected a day after its last sample).
        silent_after_seconds: a source whose newest data is older than this is
            ``VgpumonSourceSilent``.
        stuck_window_seconds: ``GpuStuck`` holds when every tick of this window qualifies (5 min,
            issue 11).
        stuck_utilization_ratio: utilization.gpu at or above this …
        stuck_engine_ratio: … while SM, tensor and DRAM activity (GPM) all stay at or below this
            …
        stuck_pcie_ratio: … and PCIe TX+RX stays below this share of the max link (a
            host→device copy reads utilization 1 with SM 0: FACTS §1 — it is busy, not stuck).
        memory_full_ratio: ``GpuMemoryNearlyFull`` at this share of memory used.
        memory_idle_window_seconds, memory_idle_min_bytes, memory_idle_sm_ratio,
            memory_idle_utilization_ratio: memory above ``min_bytes`` held for the whole window
            while SM activity and utilization never exceed their ratios — nothing ran, not even a
            copy (``GpuMemoryHeldIdle``; GPUs of a live vLLM server are left out: its KV cache is
            allocated by design).
        thermal_window_seconds: ``GpuThermalSlowdown`` looks at this window …
        thermal_margin_celsius: … and fires at the GPU's own slowdown threshold minus this, or
            when a thermal clocks-event reason is active (never a fixed 85 °C: FACTS §7).
        power_brake_window_seconds: ``GpuPowerBrakeSlowdown`` looks at this window.
        leak_fit_seconds: the memory trend is fitted over this much of an unbroken segment (6 h:
            issue 11; node-mixin's disk-fill prediction uses a 6 h fit too, FACTS §7).
        leak_min_slope_bytes_per_day: the least slope that is a leak (0.1 GB/day; the story's leak
            was 0.3 GB/day).
        leak_step_bytes: a change of the level by more than this within ``leak_step_seconds`` is
            a step (model load, KV-cache allocation, restart), not a trend: the fit starts after
            it.
        leak_step_seconds: see above.
        leak_halves_ratio: the slopes of the fit window's two halves must agree within this ratio
            (a trend, not a ramp that plateaus).
        pcie_window_seconds: PCIe p95 is taken over this window …
        pcie_saturation_ratio: … and a link is saturated when the p95 of TX or RX reaches this
            share of its max capacity (80 %, FACTS §3) …
        pcie_clear_ratio: … and stays so until the p95 falls below this (hysteresis).
        pcie_busy_utilization_ratio: a link below its max generation or width is degraded only
            while the GPU is this busy (idle links down-train: FACTS §2).
        pcie_degraded_window_seconds: for this long.
        replay_window_seconds: PCIe replays are counted over this window against DCGM's
            per-generation budget per minute (FACTS §4).
        vllm_ready_limit_seconds: a server not ready this long after its process started is
            ``VllmNotReady``.
        vllm_prewarm_slower_factor, vllm_prewarm_slower_min_seconds: a prewarm this many times the
            median of earlier starts of the same model on the host, and at least this much longer,
            is ``VllmPrewarmSlow``.
        vllm_early_seconds: requests in this long after ready are "early" …
        vllm_steady_after_seconds: … the steady state is what comes this long after ready …
        vllm_early_ttft_factor: … and early TTFT p95 this many times the steady p50 of TTFT p95,
            and above ``vllm_early_ttft_min_seconds``, is ``VllmTrafficBeforeWarm``.
        vllm_early_ttft_min_seconds: see above.
        vllm_slo_ttft_seconds: a request's time to first token within this meets its SLO …
        vllm_slo_itl_seconds: … and an inter-token interval within this (the vLLM source reads
            both targets; docs/vllm.md, "SLO attainment").
        vllm_slo_window_seconds: attainment is the share over this sliding window.
        vllm_slo_ttft_objective_ratio, vllm_slo_itl_objective_ratio: attainment below this is
            ``VllmSloAttainmentLow`` (for its ``for``, 5 min by default).
        vllm_hung_for_seconds: ``VllmServerHung`` after this long hung.
        vllm_dead_window_seconds: a dead server stays ``VllmServerDead`` this long after its last
            poll (the agent stops polling a start whose process is gone).
        vllm_recent_start_seconds: prewarm rules look at starts that became ready this recently.
        vllm_engine_lost_polls: an engine absent from this many newest polls of a server that
            still answers is lost.
        kv_window_seconds: KV rules look at this window.
        kv_fragmentation_ratio: mean estimated KV waste at or above this is
            ``VllmKvCacheFragmented``.
        kv_stuck_usage_ratio: KV usage at or above this with nothing running or waiting for the
            whole window is ``VllmKvCacheStuckHigh``.
        queued_kv_usage_ratio: requests waiting for the whole window while KV usage stays below
            this (the batch is far below what the cache holds) is ``VllmRequestsQueuedUnderused``.
        runbook_base_url: prefix of every ``runbook_url`` (default: the path in this repository).
        for_seconds: per-rule override of ``for`` (rule name → seconds).
        disabled: rule names not evaluated.
    """

    xid_window_seconds: float = 600.0
    xid_burst_seconds: float = 180.0
    xid_repeat_lookback_seconds: float = 86400.0
    xid_repeat_windows: int = 2
    xid_spread_gpus: int = 2
    straggler_window_seconds: float = 300.0
    straggler_busy_utilization_ratio: float = 0.9
    straggler_min_gpus: int = 3
    straggler_clock_tolerance_ratio: float = 0.10
    straggler_power_tolerance_ratio: float = 0.15
    straggler_activity_tolerance_ratio: float = 0.15
    lost_for_seconds: float = 60.0
    unreadable_window_seconds: float = 900.0
    missing_after_seconds: float = 120.0
    missing_lookback_seconds: float = 86400.0
    silent_after_seconds: float = 120.0
    stuck_window_seconds: float = 300.0
    stuck_utilization_ratio: float = 0.95
    stuck_engine_ratio: float = 0.01
    stuck_pcie_ratio: float = 0.01
    memory_full_ratio: float = 0.95
    memory_idle_window_seconds: float = 3600.0
    memory_idle_min_bytes: float = 2**30
    memory_idle_sm_ratio: float = 0.01
    memory_idle_utilization_ratio: float = 0.05
    thermal_window_seconds: float = 120.0
    thermal_margin_celsius: float = 0.0
    power_brake_window_seconds: float = 120.0
    leak_fit_seconds: float = 6 * 3600.0
    leak_min_slope_bytes_per_day: float = 0.1e9
    leak_step_bytes: float = 1e9
    leak_step_seconds: float = 600.0
    leak_halves_ratio: float = 0.5
    pcie_window_seconds: float = 600.0
    pcie_saturation_ratio: float = 0.80
    pcie_clear_ratio: float = 0.75
    pcie_busy_utilization_ratio: float = 0.5
    pcie_degraded_window_seconds: float = 300.0
    replay_window_seconds: float = 600.0
    vllm_ready_limit_seconds: float = 600.0
    vllm_prewarm_slower_factor: float = 2.0
    vllm_prewarm_slower_min_seconds: float = 60.0
    vllm_early_seconds: float = 180.0
    vllm_steady_after_seconds: float = 300.0
    vllm_early_ttft_factor: float = 5.0
    vllm_early_ttft_min_seconds: float = 1.0
    vllm_slo_ttft_seconds: float = 0.5
    vllm_slo_itl_seconds: float = 0.05
    vllm_slo_window_seconds: float = 300.0
    vllm_slo_ttft_objective_ratio: float = 0.99
    vllm_slo_itl_objective_ratio: float = 0.95
    vllm_hung_for_seconds: float = 60.0
    vllm_dead_window_seconds: float = 3600.0
    vllm_recent_start_seconds: float = 3600.0
    vllm_engine_lost_polls: int = 3
    kv_window_seconds: float = 900.0
    kv_fragmentation_ratio: float = 0.25
    kv_stuck_usage_ratio: float = 0.9
    queued_kv_usage_ratio: float = 0.5
    runbook_base_url: str = "docs/runbooks/"
    for_seconds: Mapping[str, float] = field(default_factory=dict)
    disabled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """Every threshold inside the range its kind allows (a ratio written as a percentage,
        ``pcie_saturation_ratio = 80``, would silence its rule without a word).

        Raises:
            ValueError: ``<key>: <value> …`` naming the range.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("runbook_base_url", "disabled"):
                continue
            if f.name == "for_seconds":
                for rule, v in value.items():
                    if not (_finite(v) and 0 <= v <= _MAX_SECONDS):
                        raise ValueError(f"for.{rule}: {_shown(v, True)} is not a duration from 0 s to 366 days")
                continue
            ok, what = _range_of(f.name)
            if not (_finite(value) and ok(value)):
                raise ValueError(f"{f.name}: {_shown(value, f.name.endswith('_seconds'))} is {what}")
        if self.pcie_clear_ratio > self.pcie_saturation_ratio:
            raise ValueError(
                f"pcie_clear_ratio: {self.pcie_clear_ratio:g} is above pcie_saturation_ratio "
                f"({self.pcie_saturation_ratio:g}); an alert clears below the ratio it fires at"
            )


    @classmethod
    def from_mapping(cls, values: Mapping[str, object],
                     rule_names: Callable[[], Collection[str]] | None = None) -> "Thresholds":
        """Thresholds from a plain mapping (a parsed ``[rules.thresholds]`` table): unnamed keys keep their
        defaults; durations (``*_seconds``) may be strings like ``"5m"``; ``for`` (or
        ``for_seconds``) maps rule names to durations; ``disabled`` lists rule names, checked
        against ``rule_names()`` (the caller's ``vgpumon.rules.catalogue.rule_names``, which the
        settings cannot import: called only when they are used, since the catalogue imports every
        rule and, through their views, the store; without it every name is unknown).

        Raises:
            ValueError: an unknown key, a value of the wrong type, or an unknown rule name.
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        names: set[str] = set()
        if rule_names is not None and any(k in ("for", "for_seconds", "disabled") for k in values):
            names = set(rule_names())
        kw: dict[str, Any] = {}  # each value of the type of its field, by key: checked here, one by one
        for key, value in values.items():
            key = "for_seconds" if key == "for" else key
            f = known.get(key)
            if f is None:
                raise ValueError(f"{key}: unknown threshold (docs/rules.md lists them)")
            if key == "for_seconds":
                if not isinstance(value, Mapping):
                    raise ValueError("for: not a table of rule = duration (e.g. GpuLost = \"2m\")")
                unknown = set(value) - names
                if unknown:
                    raise ValueError(f"for: unknown rule {sorted(unknown)[0]}")
                kw[key] = {k: _seconds_of(f"for.{k}", v) for k, v in value.items()}
            elif key == "disabled":
                if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
                    raise ValueError('disabled: not a list of rule names (e.g. ["GpuMemoryNearlyFull"])')
                unknown = {str(v) for v in value} - names
                if unknown:
                    raise ValueError(f"disabled: unknown rule {sorted(unknown)[0]}")
                kw[key] = frozenset(value)
            elif key == "runbook_base_url":
                kw[key] = str(value)
            elif key.endswith("_seconds"):
                kw[key] = _seconds_of(key, value)
            else:
                kw[key] = _number_of(key, value, whole=f.type == "int")
        if "pcie_saturation_ratio" in kw and "pcie_clear_ratio" not in kw and 0 < kw["pcie_saturation_ratio"] <= 1:
            # the clearing ratio follows a saturation ratio set alone, 0.75 : 0.80 as the defaults
            ratio = kw["pcie_saturation_ratio"]
            kw["pcie_clear_ratio"] = min(cls.pcie_clear_ratio, ratio * cls.pcie_clear_ratio / cls.pcie_saturation_ratio)
        return cls(**kw)
