"""vLLM SLO attainment (goodput): a server whose share of requests with time to first token within
its target, or of inter-token intervals within theirs, fell below its objective over the SLO
window.

The figure is the vLLM source's (``vgpumon.sources.vllm.slo``: bucket increments over the window,
intervals flagged unreliable left out, a target between bucket bounds interpolated and flagged);
the rule reads the newest poll of the server's current start. No figure (no request in the
window) is no verdict: the rule says unknown, never firing.
"""

from __future__ import annotations

from typing import Iterable

from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, pct, prom, prom_duration
from vgpumon.rules.view import HostView
from vgpumon.rules.vllm import current_starts

V = "vllm_samples"
BY = by("vllm")

#: vLLM's default bucket bounds (``vllm/v1/metrics/loggers.py``, 0.8 to 0.33), as its ``le`` labels
#: read; the twin counts the bucket at or just below the target (docs/vllm.md, "SLO attainment")
VLLM_BOUNDS = {
    "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0),
    "itl": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
}
_WHAT = {"ttft": ("TTFT", "requests"), "itl": ("inter-token latency", "token intervals")}


def _targets(th: Thresholds) -> dict[str, tuple[float, float]]:
    """histogram → (target seconds, objective ratio)."""
    return {"ttft": (th.vllm_slo_ttft_seconds, th.vllm_slo_ttft_objective_ratio),
            "itl": (th.vllm_slo_itl_seconds, th.vllm_slo_itl_objective_ratio)}


def _attainment_low(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.vllm_slo_window_seconds
    for inst in current_starts(view, window):
        labels = {"hostname": view.hostname, "server": f"{inst['address']}:{inst['port']}"}
        rows = view.vllm_samples(inst["id"], 120.0)
        row = rows[-1] if rows else None
        figures = []
        for h, (target, objective) in _targets(th).items():
            ratio = None if row is None else row[f"{h}_slo_attainment_ratio"]
            if ratio is not None:
                figures.append((ratio / objective, h, ratio, target, objective,
                                row[f"{h}_slo_observations"], row[f"{h}_slo_interpolated"]))  # type: ignore[index]
        if not figures:
            yield Finding(rule.name, labels, "unknown",
                          reason=f"no request completed in the last {duration(window)} (or only flagged histograms): no attainment")
            continue
        _, h, ratio, target, objective, n, interpolated = min(figures)
        name, unit = _WHAT[h]
        yield Finding(rule.name, labels, "firing" if ratio < objective else "ok", ratio, {
            "server": inst["url"], "model": inst["model"] or "unknown model", "what": name, "target": f"{target:g} s",
            "share": pct(ratio), "objective": pct(objective), "n": f"{n:.0f}" if n is not None else "N/A", "unit": unit,
            "window": duration(window), "how": " (interpolated inside its bucket)" if interpolated else "",
        })


def bound_at_or_below(h: str, target: float) -> str:
    """The ``le`` label of vLLM's largest default bound at or below ``target`` (its lowest bound
    when the target is below all of them), as vLLM writes it (``0.5``, ``1.0``)."""
    bounds = VLLM_BOUNDS[h]
    return repr(max((b for b in bounds if b <= target * (1 + 1e-9)), default=bounds[0]))


def _twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.vllm_slo_window_seconds)
    up = f"max {BY} ({prom(V, 'telemetry_up')}) * 0 + 1"  # the agent's hostname for vLLM's instance
    names = {"ttft": ("vllm:time_to_first_token_seconds",),
             "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")}
    exprs, words = [], []
    for h, (target, objective) in _targets(th).items():
        le = bound_at_or_below(h, target)

        def inc(suffix: str, match: str = "", metrics: tuple[str, ...] = names[h]) -> str:
            parts = [f"sum by (instance) (increase({m}_{suffix}{match}[{w}]))" for m in metrics]
            return 'label_replace(' + " or ".join(parts) + ', "server", "$1", "instance", "(.*)")'

        unreliable = prom(V, "latency_unreliable", histogram=h)
        at = '{le="' + le + '"}'
        exprs.append(f"(\n  max {BY} (\n    ({inc('bucket', at)}\n     / on (server) {inc('count')})\n"
                     f"    * on (server) group_left (hostname) ({up})\n  ) < {objective:g}\n"
                     f"  unless on (hostname, server) max {BY} ({unreliable}) == 1\n)")
        words.append(f"{_WHAT[h][0]} ≤ {le} s: {objective:.0%}")
    # one alert per server (one twin: Prometheus refuses two rules of one name and labels)
    return [Twin("\nor\n".join(exprs), "{{ $value | humanizePercentage }} of the requests (or token intervals) of vLLM server "
                 "{{ $labels.server }} on {{ $labels.hostname }} met their target over " + w + ", below the objective ("
                 + "; ".join(words) + ").")]


RULES: tuple[Rule, ...] = (
    Rule(
        "VllmSloAttainmentLow", "warning", "vllm",
        "Fewer of a vLLM server's requests met their latency target than its objective asks.",
        "{server} ({model}): {share} of {n} {unit} met {what} ≤ {target} over {window}{how}, objective {objective}.",
        (f"{V}.ttft_slo_attainment_ratio", f"{V}.itl_slo_attainment_ratio", f"{V}.ttft_slo_observations",
         f"{V}.itl_slo_observations", f"{V}.ttft_slo_interpolated", f"{V}.itl_slo_interpolated"),
        _attainment_low,
        _twin,
        Runbook(
            "Goodput fell: over the SLO window the share of requests whose time to first token stayed within "
            "vllm_slo_ttft_seconds, or of token intervals within vllm_slo_itl_seconds, is below its objective. Long "
            "TTFT comes from queueing and long prefills (too many requests for the batch, long prompts, preemptions); "
            "long inter-token latency from large batches, prefills interleaved with decodes, or a slow GPU. Read from "
            "vLLM's histograms; a target between bucket bounds is interpolated and said to be (docs/vllm.md).",
            "`vgpumon diagnose <host>` (the SLO line and the latency quantiles); `curl <server>/metrics | grep -e "
            "num_requests_waiting -e num_preemptions -e time_to_first_token`; the GPU rules on its GPUs.",
            "Add replicas or shed load; cap --max-num-batched-tokens to shorten prefills that stall decodes; enable "
            "chunked prefill; move long-prompt traffic to its own pool.",
        ),
        for_seconds=300.0,
        every_seconds=30.0,
    ),
)
