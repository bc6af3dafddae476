"""PCIe rules: a card's link saturated, a shared switch or root port saturated by the cards below
it, a link down-trained while busy, a card in a slower slot, replays above NVIDIA's budget.

Shares divide by the **max** link (device ∧ slot generation × width; FACTS §2 and §3): an idle link
down-trains, and a burst on it would otherwise read over 100 %. Shared ports come from the stored
topology (``pcie_links``, read from sysfs by the agent): the 16-card host of our story saturated
its root complex while each card carried a modest load.
"""

from __future__ import annotations

from typing import Iterable

from vgpumon.base.pcie import LANE_GT_PER_S, link_capacity_bytes_per_second, replay_budget_per_minute
from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, gpu_labels, pct, prom, prom_duration
from vgpumon.rules.view import HostView, row_ts
from vgpumon.store.rollup import percentile

G = "gpu_samples"
BY = by("gpu")
_DIRS = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


def _gbps(v: float | None) -> str:
    return "N/A" if v is None else f"{v / 1e9:.1f} GB/s"


def _link(gen: float | None, width: float | None) -> str:
    return f"Gen{gen or '?'} x{width or '?'}"


def _limit(view: HostView, th: Thresholds, rule: Rule, labels: dict[str, str]) -> float:
    # hysteresis: an active alert clears only below the lower ratio
    return th.pcie_clear_ratio if view.is_active(rule.name, labels) else th.pcie_saturation_ratio


def _saturated(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.pcie_window_seconds
    span = view.window(window, ("ts",), ("min",))
    for g in view.gpus:
        ident = g.identity
        labels = gpu_labels(view.hostname, ident.index, ident.uuid)
        cap = link_capacity_bytes_per_second(ident.pcie_link_gen_max, ident.pcie_link_width_max)
        a = span[g.id]
        if cap is None:
            yield Finding(rule.name, labels, "unknown", reason="max link generation/width not reported")
            continue
        first = a["ts_min"]  # None only without samples
        if not a["samples"] or first is None or first > view.at - 0.1 * window:
            yield Finding(rule.name, labels, "unknown", reason=f"less than {duration(0.1 * window)} of samples in the window")
            continue
        p95 = view.percentiles(g.id, window, _DIRS, (0.95,))
        tx, rx = p95[_DIRS[0]][0.95], p95[_DIRS[1]][0.95]
        if tx is None and rx is None:
            reason = "PCIe bytes/s not reported" + ("" if ident.gpm_supported else " (no GPM and no throughput reading)")
            yield Finding(rule.name, labels, "unknown", reason=reason)
            continue
        share = max(v / cap for v in (tx, rx) if v is not None)
        limit = _limit(view, th, rule, labels)
        yield Finding(rule.name, labels, "firing" if share >= limit else "ok", share,
                      {"share": pct(share), "tx": _gbps(tx), "rx": _gbps(rx), "link": _link(ident.pcie_link_gen_max, ident.pcie_link_width_max),
                       "capacity": _gbps(cap), "window": duration(window), "limit": pct(th.pcie_saturation_ratio)})


def _max_of(a: str, b: str) -> str:
    """PromQL for the element-wise max of two vectors with the same labels (either may be absent)."""
    return f"((({a}) >= ({b})) or ({b}) or ({a}))"  # parenthesised: "or" binds last in PromQL


def _saturated_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.pcie_window_seconds)
    cap = prom("exporter", "pcie_link_capacity_bytes_per_second")
    tx, rx = (f"max {BY} (quantile_over_time(0.95, {prom(G, d)}[{w}])) / on (hostname, gpu, uuid) max {BY} ({cap})" for d in _DIRS)
    return [Twin(f"{_max_of(tx, rx)} >= {th.pcie_saturation_ratio}",
                 "PCIe p95 over " + w + " at {{ $value | humanizePercentage }} of GPU {{ $labels.gpu }}'s max link on "
                 "{{ $labels.hostname }}.")]


def _uplink(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    topo = view.topology
    by_uuid = {g.identity.uuid: g for g in view.gpus}
    window = th.pcie_window_seconds
    for bdf, uuids in sorted(topo.shared().items()):
        hop = topo.hop(bdf)
        if hop is None or hop.kind == "host_bridge":
            continue  # the root complex has no link of its own in sysfs: nothing to divide by
        labels = {"hostname": view.hostname, "port": bdf}
        gpus = [by_uuid[u] for u in uuids if u in by_uuid]
        cap = link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max)
        if cap is None or not gpus:
            yield Finding(rule.name, labels, "unknown", reason="the port's max link is not known" if cap is None else "no GPU below it is stored")
            continue
        rows = view.summed([g.id for g in gpus], window, _DIRS)
        p95 = {}
        for d in _DIRS:
            values = sorted(v for v in (r[d] for r in rows) if v is not None)
            p95[d] = percentile(values, 0.95) if len(values) >= 10 else None
        if all(v is None for v in p95.values()):
            yield Finding(rule.name, labels, "unknown", reason=f"PCIe bytes/s of the GPUs below not reported over {duration(window)}")
            continue
        share = max(v / cap for v in p95.values() if v is not None)
        limit = _limit(view, th, rule, labels)
        yield Finding(rule.name, labels, "firing" if share >= limit else "ok", share,
                      {"share": pct(share), "kind": "root port" if hop.kind == "root" else "switch port", "port": bdf,
                       "link": _link(hop.link_gen_max, hop.link_width_max), "capacity": _gbps(cap),
                       "tx": _gbps(p95[_DIRS[0]]), "rx": _gbps(p95[_DIRS[1]]), "n": len(gpus),
                       "gpus": ", ".join(str(g.identity.index) for g in sorted(gpus, key=lambda g: g.identity.index)),
                       "window": duration(window)})


def _uplink_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.pcie_window_seconds)
    port_of = prom("exporter", "pcie_upstream_gpu_info")
    cap = prom("exporter", "pcie_upstream_link_capacity_bytes_per_second")
    per_port = [
        f"max by (hostname, port) (quantile_over_time(0.95, (sum by (hostname, port) "
        f"({prom(G, d)} * on (hostname, uuid) group_right {port_of}))[{w}:15s])) "
        f"/ on (hostname, port) max by (hostname, port) ({cap})"
        for d in _DIRS
    ]
    return [Twin(f"{_max_of(*per_port)} >= {th.pcie_saturation_ratio}",
                 "The GPUs behind PCIe port {{ $labels.port }} of {{ $labels.hostname }} together use "
                 "{{ $value | humanizePercentage }} of its link (p95 over " + w + ").")]


def _degraded(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.pcie_degraded_window_seconds
    agg = view.window(window, ("ts", "utilization_gpu_ratio", "pcie_link_gen_current", "pcie_link_width_current"))
    for g in view.gpus:
        ident, a = g.identity, agg[g.id]
        labels = gpu_labels(view.hostname, ident.index, ident.uuid)
        gen, width = a["pcie_link_gen_current_max"], a["pcie_link_width_current_max"]
        if ident.pcie_link_gen_max is None or ident.pcie_link_width_max is None or gen is None or width is None:
            yield Finding(rule.name, labels, "unknown", reason="current or max PCIe link not reported")
            continue
        util = a["utilization_gpu_ratio_min"]
        first = a["ts_min"]  # None only without samples (and then util is None too)
        busy = util is not None and util >= th.pcie_busy_utilization_ratio and first is not None and first <= view.at - 0.9 * window
        low = gen < ident.pcie_link_gen_max or width < ident.pcie_link_width_max
        yield Finding(rule.name, labels, "firing" if busy and low else "ok", float(gen),
                      {"current": _link(gen, width), "max": _link(ident.pcie_link_gen_max, ident.pcie_link_width_max),
                       "util": pct(util), "window": duration(window)})


def _degraded_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.pcie_degraded_window_seconds)
    gen, width = prom(G, "pcie_link_gen_current"), prom(G, "pcie_link_width_current")
    gmax, wmax = prom("gpus", "pcie_link_gen_max"), prom("gpus", "pcie_link_width_max")
    on = "on (hostname, gpu, uuid)"
    expr = (
        f"(max {BY} ({gen}) < {on} max {BY} ({gmax})\n"
        f" or max {BY} ({width}) < {on} max {BY} ({wmax}))\n"
        f"and {on} max {BY} ({prom(G, 'utilization_gpu_ratio')}) >= {th.pcie_busy_utilization_ratio}"
    )
    return [Twin(expr, "GPU {{ $labels.gpu }} of {{ $labels.hostname }} ran busy for " + w
                 + " on a PCIe link below its max generation or width.", for_seconds=th.pcie_degraded_window_seconds)]


def _slot(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    for g in view.gpus:
        ident = g.identity
        labels = gpu_labels(view.hostname, ident.index, ident.uuid)
        if ident.pcie_link_gen_max is None or ident.pcie_link_gen_gpu_max is None:
            yield Finding(rule.name, labels, "unknown", reason="max PCIe generation of the card or the slot not reported")
            continue
        on = ident.pcie_link_gen_max < ident.pcie_link_gen_gpu_max
        yield Finding(rule.name, labels, "firing" if on else "ok", float(ident.pcie_link_gen_max),
                      {"card": f"Gen{ident.pcie_link_gen_gpu_max}", "slot": f"Gen{ident.pcie_link_gen_max}"})


def _slot_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({prom('gpus', 'pcie_link_gen_max')}) < on (hostname, gpu, uuid) max {BY} ({prom('gpus', 'pcie_link_gen_gpu_max')})",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} supports a newer PCIe generation than its slot "
                 "(slot Gen{{ $value }}).")]


def _replays(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.replay_window_seconds
    for g in view.gpus:
        ident = g.identity
        labels = gpu_labels(view.hostname, ident.index, ident.uuid)
        budget = replay_budget_per_minute(ident.pcie_link_gen_max, ident.pcie_link_width_max)
        # present: every row has the counter (the test only narrows its type)
        rows = [(row_ts(r), n) for r in view.series(g.id, window, ("pcie_replay_total",), present=True)
                if (n := r["pcie_replay_total"]) is not None]
        # a driver reload resets the counter: count only since the newest reset
        for i in range(len(rows) - 1, 0, -1):
            if rows[i][1] < rows[i - 1][1]:
                rows = rows[i:]
                break
        if budget is None or len(rows) < 2 or rows[-1][0] <= rows[0][0]:
            # a counter never read is not reported, not "too few reads": a capture or driver without it
            reason = ("max link not reported" if budget is None
                      else f"replay counter not reported in the last {duration(window)}" if not rows
                      else f"one replay-counter read in the last {duration(window)}; a rate needs two")
            yield Finding(rule.name, labels, "unknown", reason=reason)
            continue
        rate = (rows[-1][1] - rows[0][1]) / (rows[-1][0] - rows[0][0]) * 60
        yield Finding(rule.name, labels, "firing" if rate > budget else "ok", rate,
                      {"rate": f"{rate:.1f}", "budget": budget, "link": _link(ident.pcie_link_gen_max, ident.pcie_link_width_max),
                       "window": duration(window)})


def _replays_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.replay_window_seconds)
    gen, width = prom("gpus", "pcie_link_gen_max"), prom("gpus", "pcie_link_width_max")
    rate = " + ".join(f"{gt * 1e9:.0f} * ({gen} == bool {g})" for g, gt in sorted(LANE_GT_PER_S.items()))
    budget = f"ceil(1e-12 * 60 * {width} * ({rate}))"
    expr = (f"max {BY} (rate({prom(G, 'pcie_replay_total')}[{w}]) * 60)\n"
            f"> on (hostname, gpu, uuid) max {BY} ({budget})")
    return [Twin(expr, "{{ $value | humanize }} PCIe replays per minute on GPU {{ $labels.gpu }} of {{ $labels.hostname }}, "
                 "above DCGM's budget for its link.")]


RULES: tuple[Rule, ...] = (
    Rule(
        "GpuPcieSaturated", "warning", "gpu",
        "A GPU's PCIe link runs near its capacity.",
        "p95 over {window}: TX {tx}, RX {rx} — {share} of the {link} max link ({capacity} per direction; alert at {limit}).",
        (f"{G}.pcie_tx_bytes_per_second", f"{G}.pcie_rx_bytes_per_second", "gpus.pcie_link_gen_max", "gpus.pcie_link_width_max"),
        _saturated,
        _saturated_twin,
        Runbook(
            "For most of the window the card moved data over PCIe at its saturation ratio or more (80 % of its link by "
            "default, `pcie_saturation_ratio`) in one direction: "
            "weight loading, KV-cache offload or host↔device copies are limited by the link, and the GPU waits. "
            "Counters read 94–96 % of the ceiling under a pure copy, protocol overhead included (FACTS §1).",
            "`vgpumon diagnose <host>` shows TX/RX mean and max per GPU against the link; `nvidia-smi dmon -s t`.",
            "Find the transfer (model reloads, CPU offload, swap-space of vLLM); check the link runs at its max "
            "(`GpuPcieLinkDegraded`); spread the load over cards on other root ports.",
        ),
        for_seconds=300.0,
        keep_firing_seconds=300.0,
        every_seconds=60.0,
    ),
    Rule(
        "PcieUplinkSaturated", "warning", "pcie_port",
        "A PCIe switch or root port shared by several GPUs runs near its capacity.",
        "The {n} GPUs behind {kind} {port} ({gpus}) together moved TX {tx}, RX {rx} at p95 over {window}: {share} of its "
        "{link} link ({capacity} per direction).",
        (f"{G}.pcie_tx_bytes_per_second", f"{G}.pcie_rx_bytes_per_second", "pcie_links"),
        _uplink,
        _uplink_twin,
        Runbook(
            "Cards behind one switch or root port share its upstream link: eight cards that each use a modest share "
            "can together fill it, and every card behind it slows down. The capacity review's question ('can this host "
            "take two more cards?') starts here.",
            "`vgpumon diagnose <host>` shows each GPU's PCIe path and which GPUs share each port; `lspci -tv` on the host.",
            "Move traffic-heavy work to cards behind other ports; do not add cards behind this port.",
        ),
        for_seconds=300.0,
        keep_firing_seconds=300.0,
        every_seconds=60.0,
    ),
    Rule(
        "GpuPcieLinkDegraded", "warning", "gpu",
        "A busy GPU's PCIe link runs below its max generation or width.",
        "The link ran at {current} (max {max}) while the GPU was busy (utilization ≥ {util}) for {window}.",
        (f"{G}.pcie_link_gen_current", f"{G}.pcie_link_width_current", f"{G}.utilization_gpu_ratio",
         "gpus.pcie_link_gen_max", "gpus.pcie_link_width_max"),
        _degraded,
        _degraded_twin,
        Runbook(
            "Links down-train when idle and come back under load (FACTS §2); one that stays below its max generation or "
            "width while the GPU is busy has trained down: a seating, riser or signal problem, or a BIOS setting.",
            "`nvidia-smi -q -d PCIE -i <gpu>` under load (Link Width/Generation current vs max); `lspci -vv -s <bdf>` "
            "LnkSta vs LnkCap.",
            "Reseat the card or riser at the next window; check BIOS PCIe settings; `GpuPcieReplaysHigh` often comes along.",
        ),
        every_seconds=30.0,
    ),
    Rule(
        "GpuPcieSlotSlower", "warning", "gpu",
        "A GPU sits in a PCIe slot slower than the card.",
        "The card supports PCIe {card} but the slot allows {slot}.",
        ("gpus.pcie_link_gen_max", "gpus.pcie_link_gen_gpu_max"),
        _slot,
        _slot_twin,
        Runbook(
            "NVML's max generation of device ∧ slot is below the card's own max: the slot (or a riser, or a BIOS "
            "setting) caps the link, halving its capacity per generation lost.",
            "`nvidia-smi -q -d PCIE -i <gpu>` (Max vs Device Max); `lspci -vv -s <bdf>` LnkCap of the port above.",
            "Move the card to a full-speed slot or fix the BIOS setting.",
        ),
        every_seconds=300.0,
    ),
    Rule(
        "GpuPcieReplaysHigh", "warning", "gpu",
        "A GPU's PCIe link retransmits more than NVIDIA's budget.",
        "{rate} PCIe replays per minute over {window}, above DCGM's budget of {budget}/min for {link}.",
        (f"{G}.pcie_replay_total", "gpus.pcie_link_gen_max", "gpus.pcie_link_width_max"),
        _replays,
        _replays_twin,
        Runbook(
            "Replays are link-level retransmissions after bit errors. DCGM warns above ceil(1e-12 × lane rate × 60 × "
            "lanes) per minute (x16: Gen3 8, Gen4 16, Gen5 31; FACTS §4): the link is marginal.",
            "`nvidia-smi -q -d PCIE -i <gpu>` (Replays Since Reset) twice a minute apart; `GpuPcieLinkDegraded`.",
            "Reseat the card and riser; if it persists, swap slot or card to find the faulty part.",
        ),
        every_seconds=60.0,
    ),
)
