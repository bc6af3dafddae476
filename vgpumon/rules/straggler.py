"""Stragglers: a GPU that, under the same work as its host siblings, runs at a clock, a power or an
SM activity far from theirs — the one board that sets the pace of a synchronous job.

Over ``straggler_window_seconds`` (5 min), each GPU's mean SM clock, power and SM activity is
compared with the median of the busy GPUs of the same model on the host (itself included, as
DCGM 4.5's diagnostic compares each GPU with the system's figure: ``clocks_tolerance_pcnt``,
``power_tolerance_pcnt``). "The same work": every GPU compared was busy (mean utilization at
least ``straggler_busy_utilization_ratio``, 90 %) over the whole window, and at least
``straggler_min_gpus`` (3) of them were, so that the median is a sibling's figure and not the
straggler's. A departure beyond the tolerance (clock 10 %, power 15 %, SM activity 15 %, above
or below) fires; the finding names the clocks-event reasons active on the GPU in a larger share
of the window than on the median sibling (a thermal or power-brake slowdown), or says none does.
"""

from __future__ import annotations

from statistics import median
from typing import Iterable

from vgpumon import catalogue
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS
from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import (
    Evidence,
    Finding,
    Rule,
    Runbook,
    Twin,
    by,
    duration,
    fmt,
    gpu_labels,
    not_applicable,
    pct,
    prom,
    prom_duration,
)
from vgpumon.rules.view import HostView
from vgpumon.store import StoredGpu

G = "gpu_samples"
BY = by("gpu")
_COLUMNS = ("ts", "utilization_gpu_ratio", "sm_clock_hertz", "power_watts", "sm_active_ratio")
#: reasons that say nothing about a slow board (idle, a clock set on purpose, a display)
_IGNORED_REASONS = 0x1 | 0x2 | 0x100
#: a reason explains the departure when it is active this much more of the window than on the median sibling
_REASON_MARGIN = 0.1


def _tolerances(th: Thresholds) -> tuple[tuple[str, str, float], ...]:
    return (("sm_clock_hertz", "SM clock", th.straggler_clock_tolerance_ratio),
            ("power_watts", "power", th.straggler_power_tolerance_ratio),
            ("sm_active_ratio", "SM activity", th.straggler_activity_tolerance_ratio))


def _reason_shares(view: HostView, g: StoredGpu, window: float) -> dict[int, float] | None:
    """Per clocks-event reason bit, the share of the window's ticks it was active on this GPU."""
    known = [int(r["clocks_event_reasons"]) for r in view.series(g.id, window, ("clocks_event_reasons",))
             if r["clocks_event_reasons"] is not None]
    if not known:
        return None
    return {bit: sum(1 for v in known if v & bit) / len(known) for bit in CLOCKS_EVENT_REASONS if not bit & _IGNORED_REASONS}


def _straggler(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.straggler_window_seconds
    agg = view.window(window, _COLUMNS, ("min", "mean", "count"))

    def busy(g: StoredGpu) -> bool:
        a = agg[g.id]
        util, first = a["utilization_gpu_ratio_mean"], a["ts_min"]
        return ((a["samples"] or 0) > 0 and first is not None and first <= view.at - 0.9 * window
                and util is not None and util >= th.straggler_busy_utilization_ratio)

    peers: dict[str | None, list[StoredGpu]] = {}
    for g in view.gpus:
        if busy(g):
            peers.setdefault(g.identity.name, []).append(g)
    of_model: dict[str | None, int] = {}
    for g in view.gpus:
        of_model[g.identity.name] = of_model.get(g.identity.name, 0) + 1
    for g in view.gpus:
        labels = gpu_labels(view.hostname, g.identity.index, g.identity.uuid)
        a = agg[g.id]
        if of_model[g.identity.name] < th.straggler_min_gpus:
            # the host has too few boards of this model to compare with, however busy: by its make
            yield Finding(rule.name, labels, "unknown", reason=not_applicable(
                f"the host has {of_model[g.identity.name]} GPU(s) of its model; {int(th.straggler_min_gpus)} are needed to compare with"))
            continue
        if a["utilization_gpu_ratio_mean"] is None:
            yield Finding(rule.name, labels, "unknown", reason=f"no utilization over the last {duration(window)}")
            continue
        if not busy(g):
            yield Finding(rule.name, labels, "ok", None, {"window": duration(window), "why": "not busy for the whole window"})
            continue
        group = peers[g.identity.name]
        if len(group) < th.straggler_min_gpus:
            yield Finding(rule.name, labels, "unknown", reason=(
                f"{len(group)} busy GPU(s) of its model on the host over the last {duration(window)}; "
                f"{int(th.straggler_min_gpus)} are needed to compare with"))
            continue
        departs, worst = [], 0.0
        for column, name, tol in _tolerances(th):
            own = a[f"{column}_mean"]
            values = [v for p in group if (v := agg[p.id][f"{column}_mean"]) is not None]
            if own is None or len(values) < th.straggler_min_gpus:
                continue
            mid = median(values)
            if mid <= 0:
                continue
            dep = own / mid - 1.0
            worst = max(worst, abs(dep))
            if abs(dep) > tol:
                departs.append(f"{name} {fmt(G, column, own)}, {abs(dep) * 100:.0f} % {'below' if dep < 0 else 'above'} "
                               f"the median {fmt(G, column, mid)} (tolerance {tol * 100:.0f} %)")
        evidence: Evidence = {"peers": len(group) - 1, "model": g.identity.name or "unknown model", "window": duration(window)}
        if not departs:
            yield Finding(rule.name, labels, "ok", worst, evidence)
            continue
        yield Finding(rule.name, labels, "firing", worst,
                      {**evidence, "what": "; ".join(departs), "reasons": _explain(view, g, group, window)})


def _explain(view: HostView, g: StoredGpu, group: list[StoredGpu], window: float) -> str:
    own = _reason_shares(view, g, window)
    if own is None:
        return "Clocks-event reasons not reported."
    others = [s for p in group if p.id != g.id and (s := _reason_shares(view, p, window)) is not None]
    found = []
    for bit, share in sorted(own.items()):
        typical = median([s[bit] for s in others]) if others else 0.0
        if share >= _REASON_MARGIN and share - typical >= _REASON_MARGIN:
            found.append(f"{CLOCKS_EVENT_REASONS[bit]} active {pct(share)} of the window (median sibling {pct(typical)})")
    if not found:
        return "No clocks-event reason explains it (a board, cooling or power-delivery fault, or unequal work)."
    return "Explained by " + "; ".join(found) + "."


def _twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.straggler_window_seconds)
    info = catalogue.INFO_METRICS["gpus"]
    busy = f"max {BY} (avg_over_time({prom(G, 'utilization_gpu_ratio')}[{w}])) >= {th.straggler_busy_utilization_ratio:g}"
    parts = []
    for column, _, tol in _tolerances(th):
        # each busy GPU's mean, with its model's name (from the info metric) to compare like with like
        m = (f"(max {BY} (avg_over_time({prom(G, column)}[{w}])) and on (hostname, gpu, uuid) ({busy}))\n"
             f"    * on (hostname, gpu, uuid) group_left (name) max by (hostname, gpu, uuid, name) ({info})")
        parts.append(f"  (abs(({m})\n    / on (hostname, name) group_left quantile by (hostname, name) (0.5, {m}) - 1) > {tol:g}\n"
                     f"   and on (hostname, name) (count by (hostname, name) ({m}) >= {int(th.straggler_min_gpus)}))")
    expr = f"max {BY} (\n" + "\n  or\n".join(parts) + ")"
    return [Twin(expr, "GPU {{ $labels.gpu }} of {{ $labels.hostname }} departs from the median of its busy siblings by "
                 "{{ $value | humanizePercentage }} in SM clock, power or SM activity over " + w + " (tolerances: clock "
                 f"{th.straggler_clock_tolerance_ratio * 100:.0f} %, power {th.straggler_power_tolerance_ratio * 100:.0f} %, "
                 f"SM activity {th.straggler_activity_tolerance_ratio * 100:.0f} %).")]


RULES: tuple[Rule, ...] = (
    Rule(
        "GpuStraggler", "warning", "gpu",
        "A GPU runs far from its siblings under the same work: it sets the pace of a synchronous job.",
        "Busy like its {peers} busy siblings ({model}) over the last {window}: {what}. {reasons}",
        (f"{G}.utilization_gpu_ratio", f"{G}.sm_clock_hertz", f"{G}.power_watts", f"{G}.sm_active_ratio",
         f"{G}.clocks_event_reasons"),
        _straggler,
        _twin,
        Runbook(
            "Every GPU of the host compared was busy for the whole window, and this one's mean SM clock, power or SM "
            "activity departs from the median of them by more than its tolerance (clock 10 %, power 15 %, SM activity "
            "15 %; DCGM 4.5's diagnostic flags the same with clocks_tolerance_pcnt and power_tolerance_pcnt). In a "
            "data- or tensor-parallel job every step waits for the slowest GPU, so one board running 20 % slower costs "
            "the whole job 20 %.",
            "The finding names the clocks-event reasons active on this GPU more than on its siblings. `nvidia-smi -q -d "
            "PERFORMANCE,TEMPERATURE,POWER -i <gpu>` against a sibling; its temperature and fan or liquid-cooling loop; "
            "`vgpumon diagnose <host>` for its power limit and violation times. A job that gives this GPU less work "
            "(an uneven split) departs too: check that the same job runs on all of them.",
            "A thermal reason: fix the cooling (airflow, blanking panels, the loop) before the board. A power brake: "
            "the power supply or the board's power delivery. No reason: drain the GPU and run `dcgmi diag -r 3 -p "
            "diagnostic.clocks_tolerance_pcnt=10` to confirm, then open a hardware case.",
        ),
        every_seconds=60.0,
    ),
)
